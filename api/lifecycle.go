package api

// Durable sandboxes (issue 15): pause to memory or disk, lifecycle rules
// and why a sandbox stopped. docs/lifecycle.md draws the state machine;
// openapi.yaml marks the routes not served yet `x-airlock-status: planned`.

// Pause memory modes (PauseRequest.Memory, Sandbox.PauseMemory).
const (
	// PauseMemoryKeep freezes every process in RAM: resume takes
	// milliseconds, the sandbox keeps its memory (the default).
	PauseMemoryKeep = "keep"
	// PauseMemoryDisk releases the sandbox's RAM. Where the runtime
	// checkpoints memory (gVisor) the processes are written to disk and
	// resume where they were; elsewhere (runc) only the filesystem is kept:
	// the processes stop and resume starts the template's start command
	// again (DriverInfo.Durability.PauseDisk says which).
	PauseMemoryDisk = "disk"
)

// PauseRequest is the body of POST /v1/sandboxes/{id}/pause. The body is
// optional: none is memory keep.
type PauseRequest struct {
	// Memory is keep (default) or disk (PauseMemory*).
	Memory string `json:"memory,omitempty"`
}

// Lifecycle on_timeout values.
const (
	// OnTimeoutKill stops the sandbox when its TTL runs out (stop_reason
	// expired): the default.
	OnTimeoutKill = "kill"
	// OnTimeoutPause pauses it to disk instead (memory kept where the
	// runtime can checkpoint it); it can be resumed later.
	OnTimeoutPause = "pause"
)

// Lifecycle are a sandbox's lifecycle rules, given at create
// (CreateSandboxRequest.Lifecycle) and changed with PATCH
// /v1/sandboxes/{id}. In a request a field left out keeps its value (its
// default at create); a Sandbox reports every field.
type Lifecycle struct {
	// OnTimeout is what the TTL's end does: kill (default) or pause
	// (OnTimeout*).
	OnTimeout string `json:"on_timeout,omitempty"`
	// AutoResume resumes a paused sandbox on the next request to it (an
	// exec, a file or code request, a PTY, a preview request, a keepalive)
	// instead of answering 409 invalid_state. Default false.
	AutoResume *bool `json:"auto_resume,omitempty"`
	// IdleTimeoutS pauses the sandbox (memory keep) once it has had no
	// activity for this many seconds: no running exec, no open stream, no
	// preview request, no keepalive (docs/lifecycle.md, "Activity"). 0, the
	// default, never pauses it for idleness.
	IdleTimeoutS *int64 `json:"idle_timeout_s,omitempty"`
}

// PatchSandboxRequest is the body of PATCH /v1/sandboxes/{id}: the fields
// given replace the sandbox's, the others stay.
type PatchSandboxRequest struct {
	// Lifecycle changes the rules field by field (a field left out stays).
	Lifecycle *Lifecycle `json:"lifecycle,omitempty"`
	// Metadata replaces the sandbox's metadata as a whole ({} clears it).
	Metadata map[string]string `json:"metadata,omitempty"`
}

// Stop reasons (Sandbox.StopReason): why a sandbox stopped running. Stable:
// add, never rename.
const (
	// StopDeleted: DELETE /v1/sandboxes/{id} (or the E2B kill).
	StopDeleted = "deleted"
	// StopExpired: its TTL ran out with on_timeout kill, or a paused
	// sandbox outlived the server's paused retention.
	StopExpired = "expired"
	// StopOOM: the sandbox's init (the agent) was killed by the kernel for
	// memory, so every process went.
	StopOOM = "oom"
	// StopCrashed: the sandbox died on its own (its init exited, the
	// runtime failed); Sandbox.Error says more.
	StopCrashed = "crashed"
	// StopHost: the host lost it: the machine restarted or the runtime's
	// processes were killed from outside while the daemon was away.
	StopHost = "host"
	// StopCreateFailed: it never became ready (the create answered the
	// error).
	StopCreateFailed = "create_failed"
	// StopNetworkLost: its network was removed from outside airlock and
	// could not be wired again.
	StopNetworkLost = "network_lost"
	// StopPoolDrained: an unclaimed warm pool member removed because its
	// pool shrank or was deleted (never seen by a client: members are not
	// listed before a claim).
	StopPoolDrained = "pool_drained"
)
