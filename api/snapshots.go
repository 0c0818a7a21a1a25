package api

import "time"

// Snapshots, fork and reset in place (issue 15), and what each runtime
// keeps (Durability). See docs/lifecycle.md.

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
