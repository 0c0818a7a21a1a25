// Package api holds the request and response types of airlock's HTTP API v1,
// shared by the server and the Go SDK. openapi.yaml beside it is the
// machine-readable contract; a test keeps the two in step.
package api

import (
	"encoding/json"
	"time"
)

// Error codes (the `code` of an error body). Stable: add, never rename.
const (
	CodeInvalidArgument    = "invalid_argument"    // 400
	CodeUnauthenticated    = "unauthenticated"     // 401
	CodePermissionDenied   = "permission_denied"   // 403
	CodeSandboxNotFound    = "sandbox_not_found"   // 404
	CodeExecNotFound       = "exec_not_found"      // 404
	CodeTemplateNotFound   = "template_not_found"  // 404
	CodeNotFound           = "not_found"           // 404
	CodeConflict           = "conflict"            // 409
	CodeInvalidState       = "invalid_state"       // 409
	CodePayloadTooLarge    = "payload_too_large"   // 413
	CodeQuotaExceeded      = "quota_exceeded"      // 429, with Retry-After
	CodeRateLimited        = "rate_limited"        // 429, with Retry-After
	CodeCapacityExhausted  = "capacity_exhausted"  // 503, with Retry-After
	CodeRuntimeUnavailable = "runtime_unavailable" // 400 the host lacks it (permanent), 503 unhealthy now (Retry-After)
	CodeInternal           = "internal"            // 500
	CodeNotImplemented     = "not_implemented"     // 501
	CodeUnavailable        = "unavailable"         // 503, with Retry-After
	CodeMethodNotAllowed   = "method_not_allowed"  // 405
	// CodeAgentUnavailable: 503 with Retry-After, the sandbox runs but its agent does not
	// answer (an exec could not start); the sandbox may recover or end in
	// state error with this code.
	CodeAgentUnavailable = "agent_unavailable"
	// CodeTemplateBuilding: 503 with Retry-After, a create whose template
	// has no ready version while a build of it runs (a shipped template's
	// first use starts that build); ErrorDetail.BuildID names the build.
	// A create with wait_for_template waits for it instead.
	CodeTemplateBuilding = "template_building"
	// CodeTemplateBuildFailed: 424, a create that waited for its
	// template's build, which failed; ErrorDetail.BuildID names the build,
	// whose log says why.
	CodeTemplateBuildFailed = "template_build_failed"
	// CodeTemplateUnsupported: 400, the sandbox's template lacks what the
	// request needs (code on a template without a kernel): use another
	// template; retrying the same request never helps.
	CodeTemplateUnsupported = "template_unsupported"
	// CodeCapabilityUnsupported: 400, the sandbox's runtime cannot do what
	// the request asks (a memory snapshot, a pause to disk or a fork on a
	// runtime whose GET /v1/info durability says it lacks it). Never
	// answered by doing less than asked: ask for less, or use another
	// runtime.
	CodeCapabilityUnsupported = "capability_unsupported"
)

// ErrorBody is the body of every non-2xx response.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail describes one error. Message never holds secrets or host paths.
type ErrorDetail struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	RequestID string `json:"request_id,omitempty"`
	SandboxID string `json:"sandbox_id,omitempty"`
	// BuildID is the template build a create is waiting on
	// (template_building, template_build_failed).
	BuildID string `json:"build_id,omitempty"`
}

// Sandbox states.
const (
	StateStarting = "starting"
	StateRunning  = "running"
	StatePaused   = "paused"
	StateStopping = "stopping"
	StateStopped  = "stopped"
	StateError    = "error"
)

// Resources are a sandbox's limits. Zero fields take server defaults.
type Resources struct {
	CPU      float64 `json:"cpu,omitempty"`
	MemoryMB int64   `json:"memory_mb,omitempty"`
	DiskMB   int64   `json:"disk_mb,omitempty"`
	PIDs     int64   `json:"pids,omitempty"`
	// DiskTmpfs puts the writable layer on tmpfs (counted against memory).
	DiskTmpfs bool `json:"disk_tmpfs,omitempty"`
}

// Network is a sandbox's egress policy (see docs/network.md).
type Network struct {
	Mode  string   `json:"mode,omitempty"` // none | allowlist | open
	Allow []string `json:"allow,omitempty"`
	// Registries names package registry sets (debian, pypi, npm, goproxy)
	// whose hosts are allowed too (allowlist mode).
	Registries []string `json:"registries,omitempty"`
	// Offline makes every registry host fail at once (NXDOMAIN), in any mode.
	Offline bool `json:"offline,omitempty"`
	// MaxDownloadMB lowers the server's per-sandbox cap on bytes fetched
	// through the registry mirror and the egress proxy (it cannot raise it).
	MaxDownloadMB int64 `json:"max_download_mb,omitempty"`
}

// VolumeMount attaches a persistent volume to a sandbox path.
type VolumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// CreateSandboxRequest is the body of POST /v1/sandboxes. All fields optional.
type CreateSandboxRequest struct {
	Template  string            `json:"template,omitempty"`
	Runtime   string            `json:"runtime,omitempty"`
	Resources *Resources        `json:"resources,omitempty"`
	TimeoutS  *int64            `json:"timeout_s,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Secrets   map[string]string `json:"secrets,omitempty"`
	// SecretsAsFiles gives the secrets as files /run/secrets/<NAME> (mode
	// 0400, owned by the sandbox user, on a memory file system) instead of
	// exec environment variables.
	SecretsAsFiles bool              `json:"secrets_as_files,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	Network        *Network          `json:"network,omitempty"`
	Volumes        []VolumeMount     `json:"volumes,omitempty"`
	// AutoPause is lifecycle.on_timeout pause under the E2B SDKs' name;
	// it contradicting Lifecycle.OnTimeout is 400.
	AutoPause bool `json:"auto_pause,omitempty"`
	// WaitForTemplate makes a create whose template is being built (a
	// shipped template's first use) wait for the build, up to 10 minutes,
	// instead of answering template_building at once. No capacity or quota
	// is held while it waits.
	WaitForTemplate bool `json:"wait_for_template,omitempty"`
	// Snapshot (snap_…, the tenant's) starts the sandbox from a snapshot
	// instead of a template: its filesystem, and its processes with their
	// memory when it has them. Template must then be empty or the
	// snapshot's; the request's env, secrets, network, metadata and
	// lifecycle apply as at any create, nothing of the snapshotted
	// sandbox's (docs/lifecycle.md).
	Snapshot string `json:"snapshot,omitempty"`
	// Pool names a warm pool (PUT /v1/pools/{name}) to claim a member of;
	// the request's other fields must agree with the pool's template,
	// runtime and disk. Without Pool, a create that matches a pool claims
	// from it too. A pool with no ready member falls back to a cold create.
	Pool string `json:"pool,omitempty"`
	// Lifecycle are the sandbox's lifecycle rules (defaults: on_timeout
	// kill, auto_resume false, idle_timeout_s 0). AutoPause true is
	// on_timeout pause (the E2B name).
	Lifecycle *Lifecycle `json:"lifecycle,omitempty"`
}

// Sandbox is a sandbox as the API reports it.
type Sandbox struct {
	ID              string            `json:"id"`
	Tenant          string            `json:"tenant"`
	Template        string            `json:"template"`
	TemplateVersion int               `json:"template_version"`
	Runtime         string            `json:"runtime"`
	State           string            `json:"state"`
	CreatedAt       time.Time         `json:"created_at"`
	ExpiresAt       *time.Time        `json:"expires_at,omitempty"`
	Resources       Resources         `json:"resources"`
	Metadata        map[string]string `json:"metadata,omitempty"`
	Network         Network           `json:"network"`
	ReadyMS         int64             `json:"ready_ms"`
	Error           *SandboxError     `json:"error,omitempty"`
	// StopReason says why a stopped (or error) sandbox stopped (Stop*:
	// deleted, expired, oom, crashed, host, …); absent while it lives.
	StopReason string `json:"stop_reason,omitempty"`
	// EndedAt is when it stopped running.
	EndedAt *time.Time `json:"ended_at,omitempty"`
	// PausedAt is set while it is paused, PauseMemory says how (keep or
	// disk).
	PausedAt    *time.Time `json:"paused_at,omitempty"`
	PauseMemory string     `json:"pause_memory,omitempty"`
	// PausedS is the seconds it spent paused so far, the current pause
	// included: time that did not burn timeout_s and is metered apart.
	PausedS float64 `json:"paused_s,omitempty"`
	// Lifecycle are its lifecycle rules, every field set.
	Lifecycle *Lifecycle `json:"lifecycle,omitempty"`
	// LastActivityAt is the last activity (docs/lifecycle.md) that the
	// idle timeout counts from.
	LastActivityAt *time.Time `json:"last_activity_at,omitempty"`
	// Snapshot is the snapshot it started from, or was last reset to.
	Snapshot string `json:"snapshot,omitempty"`
	// Pool is the warm pool it was claimed from.
	Pool string `json:"pool,omitempty"`
}

// SandboxError says why a sandbox is in state `error`.
type SandboxError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// SandboxList is the body of GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes  []Sandbox `json:"sandboxes"`
	NextCursor string    `json:"next_cursor,omitempty"`
}

// TimeoutRequest is the body of POST /v1/sandboxes/{id}/timeout.
type TimeoutRequest struct {
	TimeoutS int64 `json:"timeout_s"`
}

// Metrics is the body of GET /v1/sandboxes/{id}/metrics.
type Metrics struct {
	CPUSeconds       float64 `json:"cpu_seconds"`
	MemoryBytes      uint64  `json:"memory_bytes"`
	MemoryPeakBytes  uint64  `json:"memory_peak_bytes"`
	PIDs             uint64  `json:"pids"`
	DiskBytes        uint64  `json:"disk_bytes"`
	DiskWrittenBytes uint64  `json:"disk_written_bytes"`
	NetRxBytes       uint64  `json:"net_rx_bytes"`
	NetTxBytes       uint64  `json:"net_tx_bytes"`
	UptimeS          float64 `json:"uptime_s"`
}

// Exec statuses.
const (
	ExecRunning = "running"
	ExecExited  = "exited"
	ExecTimeout = "timeout"
	ExecKilled  = "killed"
	ExecOOM     = "oom"
	ExecError   = "error"
)

// Exec error codes: why an exec did not exit on its own. Each outcome has
// its own (status, code) pair so that clients never guess from messages.
const (
	// ExecCodeTimeout: status timeout, the exec outlived timeout_s.
	ExecCodeTimeout = "exec_timeout"
	// ExecCodeOOM: status oom, the kernel killed it for memory.
	ExecCodeOOM = "out_of_memory"
	// ExecCodeSignaled: status killed, a signal sent through the API.
	ExecCodeSignaled = "killed_by_user"
	// ExecCodeSandboxStopped: status killed, the sandbox was deleted,
	// expired or stopped under it.
	ExecCodeSandboxStopped = "sandbox_stopped"
	// ExecCodeSandboxCrashed: status error, the sandbox itself died.
	ExecCodeSandboxCrashed = "sandbox_crashed"
	// ExecCodeAgentUnavailable: status error, the platform lost the
	// sandbox's agent while the sandbox still ran.
	ExecCodeAgentUnavailable = "agent_unavailable"
	// ExecCodeExecFailed: status error, the command could not start (no
	// such executable, not executable, a missing #! interpreter, no
	// process left in the pids limit); Error says why, ExitCode is 127
	// (not found) or 126 (not runnable) as a shell reports them.
	ExecCodeExecFailed = "exec_failed"
)

// Sandbox error codes (Sandbox.Error.Code in state error).
const (
	SandboxCodeCrashed          = "sandbox_crashed"
	SandboxCodeAgentUnavailable = "agent_unavailable"
	// SandboxCodeNetworkLost: the sandbox's network was removed from
	// outside airlock and could not be wired again.
	SandboxCodeNetworkLost = "network_lost"
)

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec. Exactly one of
// Cmd and Shell is set.
type ExecRequest struct {
	Cmd            []string          `json:"cmd,omitempty"`
	Shell          *string           `json:"shell,omitempty"`
	Cwd            string            `json:"cwd,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	User           string            `json:"user,omitempty"`
	TimeoutS       *float64          `json:"timeout_s,omitempty"`
	Stdin          *string           `json:"stdin,omitempty"`
	MaxOutputBytes *int64            `json:"max_output_bytes,omitempty"`
	PTY            bool              `json:"pty,omitempty"`
}

// ExecResult is an exec's outcome (the JSON mode's response, the SSE `exit`
// event without Stdout/Stderr, and GET …/execs/{eid}).
type ExecResult struct {
	ID         string     `json:"id"`
	SandboxID  string     `json:"sandbox_id,omitempty"`
	Cmd        []string   `json:"cmd,omitempty"`
	Shell      *string    `json:"shell,omitempty"`
	User       string     `json:"user,omitempty"`
	Cwd        string     `json:"cwd,omitempty"`
	ExitCode   *int       `json:"exit_code"`
	Signal     string     `json:"signal,omitempty"`
	Status     string     `json:"status"`
	Stdout     *string    `json:"stdout,omitempty"`
	Stderr     *string    `json:"stderr,omitempty"`
	Encoding   string     `json:"encoding,omitempty"` // "base64" when stdout/stderr are not UTF-8
	Truncated  bool       `json:"truncated"`
	DurationMS int64      `json:"duration_ms"`
	StartedAt  time.Time  `json:"started_at"`
	EndedAt    *time.Time `json:"ended_at,omitempty"`
	Error      string     `json:"error,omitempty"`
	// ErrorCode says why an exec did not exit on its own (ExecCode*).
	ErrorCode string `json:"error_code,omitempty"`
	// StdoutDroppedBytes and StderrDroppedBytes count the bytes of each
	// stream past max_output_bytes that were dropped (Truncated is then
	// set): a stream keeps its first and last max_output_bytes/2 bytes,
	// and in Stdout/Stderr the dropped ones were between the two.
	StdoutDroppedBytes int64 `json:"stdout_dropped_bytes,omitempty"`
	StderrDroppedBytes int64 `json:"stderr_dropped_bytes,omitempty"`
}

// ExecStarted is the 202 body of an async exec and the SSE `start` event.
type ExecStarted struct {
	ID string `json:"id"`
}

// ExecList is the body of GET /v1/sandboxes/{id}/execs.
type ExecList struct {
	Execs      []ExecResult `json:"execs"`
	NextCursor string       `json:"next_cursor,omitempty"`
}

// OutputEvent is the data of SSE `stdout` and `stderr` events. Offset is the
// position of the chunk's first byte in the exec's combined output; a client
// re-attaches with from_offset = Offset + len(decoded Data).
type OutputEvent struct {
	Data     string `json:"data"`
	Offset   int64  `json:"offset"`
	Encoding string `json:"encoding,omitempty"` // "base64" when Data is not UTF-8
}

// SignalRequest is the body of POST …/execs/{eid}/signal.
type SignalRequest struct {
	Signal string `json:"signal"`
}

// PTYResize is the text frame a PTY WebSocket client sends to resize.
type PTYResize struct {
	Resize struct {
		Cols uint16 `json:"cols"`
		Rows uint16 `json:"rows"`
	} `json:"resize"`
}

// StdinWritten is the body of POST …/execs/{eid}/stdin.
type StdinWritten struct {
	Written int64 `json:"written"`
}

// FileWritten is the 201 body of PUT /v1/sandboxes/{id}/files.
type FileWritten struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

// FileInfo describes one file (fs/stat, fs/list).
type FileInfo struct {
	Name       string    `json:"name"`
	Path       string    `json:"path"`
	Type       string    `json:"type"` // file | dir | symlink | other
	Size       int64     `json:"size"`
	Mode       string    `json:"mode"` // octal permission bits, e.g. "0644"
	Owner      uint32    `json:"uid"`
	Group      uint32    `json:"gid"`
	ModifiedAt time.Time `json:"modified_at"`
	LinkTarget string    `json:"link_target,omitempty"`
	// Metadata are the file's user.e2b.* extended attributes (set by an
	// upload through the E2B plane, or by code in the sandbox).
	Metadata map[string]string `json:"metadata,omitempty"`
}

// FileList is the body of GET …/fs/list.
type FileList struct {
	Entries []FileInfo `json:"entries"`
}

// MkdirRequest is the body of POST …/fs/mkdir.
type MkdirRequest struct {
	Path    string `json:"path"`
	Parents *bool  `json:"parents,omitempty"` // default true
	User    string `json:"user,omitempty"`
}

// MoveRequest is the body of POST …/fs/move.
type MoveRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
	User string `json:"user,omitempty"`
}

// CreateKeyRequest is the body of POST /v1/keys (admin only).
type CreateKeyRequest struct {
	Tenant string `json:"tenant"`
	Name   string `json:"name"`
	Admin  bool   `json:"admin,omitempty"`
	// Format is the shape of the secret: KeyFormatNative (the default) or
	// KeyFormatE2B. Both are accepted alike everywhere a key is.
	Format string `json:"format,omitempty"`
	// RateLimitRPS and RateLimitBurst give the key its own request rate
	// limit instead of the server's default (0 RPS: no limit). A burst
	// without a rate keeps the default rate.
	RateLimitRPS   *float64 `json:"rate_limit_rps,omitempty"`
	RateLimitBurst *int     `json:"rate_limit_burst,omitempty"`
}

// Key formats of CreateKeyRequest.Format.
const (
	// KeyFormatNative is `ak_` and 52 base32 characters.
	KeyFormatNative = "native"
	// KeyFormatE2B is `e2b_` and 40 lowercase hex digits: the format E2B's
	// SDKs check before they send a request.
	KeyFormatE2B = "e2b"
)

// Key is an API key's record. Key (the secret) is set only in the response
// to its creation.
type Key struct {
	ID        string     `json:"id"`
	Tenant    string     `json:"tenant"`
	Name      string     `json:"name"`
	Admin     bool       `json:"admin,omitempty"`
	Key       string     `json:"key,omitempty"`
	Prefix    string     `json:"prefix,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	// RateLimitRPS and RateLimitBurst are the key's own rate limit, absent
	// when it has the server's default.
	RateLimitRPS   *float64 `json:"rate_limit_rps,omitempty"`
	RateLimitBurst *int     `json:"rate_limit_burst,omitempty"`
}

// KeyList is the body of GET /v1/keys.
type KeyList struct {
	Keys []Key `json:"keys"`
}

// Info is the body of GET /v1/info.
type Info struct {
	Version string       `json:"version"`
	Drivers []DriverInfo `json:"drivers"`
	Limits  Limits       `json:"limits"`
	// Host is shown to admin keys only: the host-wide names this daemon
	// owns (its host slot), so that an operator can tell two daemons on
	// one host apart.
	Host *HostInfo `json:"host,omitempty"`
}

// HostInfo names the host-wide resources of one daemon (its host slot).
type HostInfo struct {
	Slot         int    `json:"slot"`
	NftTable     string `json:"nft_table"`
	VethPrefix   string `json:"veth_prefix"`
	Subnet       string `json:"subnet"`
	NflogGroup   uint16 `json:"nflog_group"`
	CgroupParent string `json:"cgroup_parent"`
}

// DriverInfo describes one runtime on this host.
type DriverInfo struct {
	Name         string          `json:"name"`
	Health       string          `json:"health"` // healthy | unhealthy | undetected
	Description  string          `json:"description,omitempty"`
	Capabilities json.RawMessage `json:"capabilities,omitempty"`
	Default      bool            `json:"default,omitempty"`
	// Durability says what the runtime keeps across pause, snapshot, fork
	// and reset; absent from a server that serves none of them yet.
	Durability *Durability `json:"durability,omitempty"`
}

// Limits are the server's configured limits and defaults.
type Limits struct {
	MaxSandboxes          int       `json:"max_sandboxes"`
	MaxSandboxesPerTenant int       `json:"max_sandboxes_per_tenant"`
	DefaultTimeoutS       int64     `json:"default_timeout_s"`
	MaxTimeoutS           int64     `json:"max_timeout_s"`
	DefaultResources      Resources `json:"default_resources"`
	MaxResources          Resources `json:"max_resources"`
	MaxUploadBytes        int64     `json:"max_upload_bytes"`
}
