package api

import "time"

// Durable sandboxes (issue 15): pause to memory or disk, snapshots, fork,
// reset in place, warm pools and lifecycle rules. docs/lifecycle.md draws
// the state machine these types describe and says which parts the server
// serves yet; openapi.yaml marks the routes it does not serve yet
// `x-airlock-status: planned`.

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

// Exec error code of an exec that a reset ended (status killed).
const ExecCodeSandboxReset = "sandbox_reset"

// Snapshot states.
const (
	// SnapshotCreating: the capture runs (the create has not answered).
	SnapshotCreating = "creating"
	// SnapshotReady: usable by create and reset.
	SnapshotReady = "ready"
)

// CreateSnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshots.
// The body is optional: none is a filesystem snapshot without a name.
type CreateSnapshotRequest struct {
	// Name is optional, 1 to 64 of [A-Za-z0-9._-], unique among the
	// tenant's snapshots (a name in use is 409 conflict).
	Name string `json:"name,omitempty"`
	// Memory includes the processes and their memory, so that a sandbox
	// started from the snapshot resumes them where they were. Only where
	// the runtime can (DriverInfo.Durability.SnapshotMemory): elsewhere the
	// request is 400 capability_unsupported, never a silent filesystem-only
	// snapshot.
	Memory bool `json:"memory,omitempty"`
}

// Snapshot is a sandbox's filesystem (and memory, when Memory) at one
// instant: the body of POST /v1/sandboxes/{id}/snapshots (201, once it is
// ready) and GET /v1/snapshots/{id}. It belongs to the tenant of the
// sandbox; another tenant's snapshot is 404 not_found, exactly like a
// missing one. It holds no secrets, env, network policy, previews or
// tokens of the sandbox (docs/lifecycle.md, "What a copy carries").
type Snapshot struct {
	// ID is snap_ and 20 or more random base32 characters.
	ID string `json:"id"`
	// Tenant owns it: the snapshotted sandbox's tenant.
	Tenant string `json:"tenant"`
	// Name is the one given at its creation, if any.
	Name string `json:"name,omitempty"`
	// SandboxID is the sandbox it was taken of (which may be gone since).
	SandboxID string `json:"sandbox_id"`
	// ParentID is the snapshot that sandbox started from, if any: the
	// snapshot's filesystem is that one's layers plus its own.
	ParentID string `json:"parent_id,omitempty"`
	// Template and TemplateVersion are the template version the
	// snapshot's filesystem descends from; its layers are shared with
	// that template, not copied.
	Template        string `json:"template"`
	TemplateVersion int    `json:"template_version"`
	// Runtime took it. A memory snapshot starts only on the same runtime.
	Runtime string `json:"runtime"`
	// Resources are the sandbox's when it was taken: a sandbox from a
	// memory snapshot gets them (a create asking others is 400).
	Resources Resources `json:"resources"`
	// Memory says the snapshot holds the processes and their memory.
	Memory bool `json:"memory"`
	// State is creating or ready (Snapshot*).
	State string `json:"state"`
	// SizeBytes is what this snapshot stores of its own: its captured
	// layer and memory image. The template's layers (and a parent
	// snapshot's) are shared and not counted.
	SizeBytes int64 `json:"size_bytes"`
	// MemoryBytes is the part of SizeBytes that is the memory image.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// Layers is how many read-only layers a sandbox from it stacks (the
	// template's and every captured one): at most 40.
	Layers int `json:"layers"`
	// CreatedAt is when it was taken (the instant its state is of).
	CreatedAt time.Time `json:"created_at"`
}

// SnapshotList is the body of GET /v1/snapshots (newest first).
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
	// NextCursor continues the listing (?cursor=); absent on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork.
type ForkRequest struct {
	// Count is how many copies, 1 or more (at most the server's fork
	// limit); each is a new sandbox of the same tenant, charged to its
	// quota like any create.
	Count int `json:"count"`
	// Secrets are the copies' secrets: the parent's are never carried
	// (none when left out).
	Secrets map[string]string `json:"secrets,omitempty"`
	// Metadata replaces the parent's metadata in the copies when given.
	Metadata map[string]string `json:"metadata,omitempty"`
}

// ForkResponse is the 201 body of POST /v1/sandboxes/{id}/fork: the
// copies, each running (ready to run a command).
type ForkResponse struct {
	// Sandboxes are the copies, as many as the request's count.
	Sandboxes []Sandbox `json:"sandboxes"`
}

// ResetRequest is the body of POST /v1/sandboxes/{id}/reset. The body is
// optional: none resets to the sandbox's template.
type ResetRequest struct {
	// Snapshot (snap_…, the tenant's) is the state to return to; empty is
	// the sandbox's template version as it was created.
	Snapshot string `json:"snapshot,omitempty"`
}

// PutPoolRequest is the body of PUT /v1/pools/{name}: the pool's desired
// state, created or replaced.
type PutPoolRequest struct {
	// Template is a template name or name@version, as at create.
	Template string `json:"template"`
	// Runtime is as at create (the server's default when empty).
	Runtime string `json:"runtime,omitempty"`
	// Resources of every member (server defaults for zero fields).
	Resources *Resources `json:"resources,omitempty"`
	// Size is how many ready members the pool keeps (0 keeps none: a
	// pool that is drained but still defined).
	Size int `json:"size"`
}

// PoolStatus is a pool's observed state.
type PoolStatus struct {
	// Ready members wait for a claim; Starting ones are being made.
	Ready    int `json:"ready"`
	Starting int `json:"starting"`
	// Claimed counts the live sandboxes claimed from the pool.
	Claimed int `json:"claimed"`
	// Error is why the last refill failed (a missing template, the
	// tenant's quota), absent when it succeeded.
	Error string `json:"error,omitempty"`
}

// Pool is a warm pool: the body of PUT and GET /v1/pools/{name}. A create
// that names it (CreateSandboxRequest.Pool), or that matches its template,
// runtime and resources, claims a ready member and applies the request's
// env, secrets, network, limits and metadata to it before answering.
// Members belong to the pool's tenant, never ran a command before their
// claim and are never reused after it.
type Pool struct {
	// Name is the pool's, unique per tenant: 1 to 64 of [a-z0-9._-].
	Name string `json:"name"`
	// Tenant owns the pool and its members.
	Tenant string `json:"tenant"`
	// Template, Runtime, Resources and Size are the desired state (the
	// last PUT), Runtime and Resources with the server's defaults filled.
	Template  string    `json:"template"`
	Runtime   string    `json:"runtime"`
	Resources Resources `json:"resources"`
	Size      int       `json:"size"`
	// Status is the observed state.
	Status PoolStatus `json:"status"`
	// CreatedAt is the first PUT, UpdatedAt the last.
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// PoolList is the body of GET /v1/pools (by name).
type PoolList struct {
	// Pools are by name (an admin key's: by tenant, then name).
	Pools []Pool `json:"pools"`
}

// Durability says what a runtime keeps of a sandbox across pause,
// snapshot, fork and reset (DriverInfo.Durability in GET /v1/info).
type Durability struct {
	// PauseKeep: pause with memory keep (a freeze) is served.
	PauseKeep bool `json:"pause_keep"`
	// PauseDisk is what pause with memory disk keeps: "memory" (processes
	// checkpointed, resumed where they were), "filesystem" (processes
	// stop, the filesystem is kept) or "" (not served).
	PauseDisk string `json:"pause_disk"`
	// SnapshotFilesystem: snapshots of the filesystem are served.
	SnapshotFilesystem bool `json:"snapshot_filesystem"`
	// SnapshotMemory: snapshots with memory are served.
	SnapshotMemory bool `json:"snapshot_memory"`
	// Fork is what a fork's copies get: "memory" (running processes
	// copied), "filesystem" (the filesystem; processes start afresh) or
	// "" (not served).
	Fork string `json:"fork"`
	// Reset: reset in place is served.
	Reset bool `json:"reset"`
}

// What Durability.PauseDisk and Durability.Fork keep.
const (
	KeepsMemory     = "memory"
	KeepsFilesystem = "filesystem"
)
