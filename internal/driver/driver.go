// Package driver defines the contract between airlock and an isolation backend.
//
// A driver turns a Spec into an isolated environment with airlock-agent running
// inside it and hands the caller a connection to that agent. Everything above the
// driver (exec, files, code) talks to the agent, never to the runtime, so it is the
// same code for every driver. Optional features are small extra interfaces found
// by type assertion (Pauser, Stater, OOMCounter, LayerCapturer, Lister,
// Checkpointer); Capabilities says which ones a driver has. Nothing in the
// contract is OCI's: a driver runs a container, a user-space kernel, a
// virtual machine or a pod, as long as it hands out a connection to the
// agent (see docs/drivers.md).
package driver

import (
	"context"
	"encoding/json"
	"net"
	"time"
)

// Isolation names the kind of boundary a driver puts around a sandbox.
type Isolation string

const (
	// IsolationContainer shares the host kernel behind namespaces, cgroups and seccomp (runc).
	IsolationContainer Isolation = "container"
	// IsolationUserspaceKernel runs the sandbox on a user-space kernel (gVisor).
	IsolationUserspaceKernel Isolation = "userspace-kernel"
	// IsolationVM runs the sandbox in its own virtual machine (qemu microvm).
	IsolationVM Isolation = "vm"
	// IsolationNone is no boundary at all: the tests' fake driver
	// (internal/driver/fake), whose sandboxes are processes of the host.
	IsolationNone Isolation = "none"
)

// NetworkMode is a sandbox network policy mode.
type NetworkMode string

const (
	NetworkNone      NetworkMode = "none"      // loopback only (default)
	NetworkAllowlist NetworkMode = "allowlist" // egress to allowed names and CIDRs only
	NetworkOpen      NetworkMode = "open"      // egress anywhere but the host and private ranges
)

// Capabilities declares what a driver can do. Callers consult it before they
// use an optional interface, so they never guess.
type Capabilities struct {
	Isolation      Isolation     `json:"isolation"`
	Pause          bool          `json:"pause"`           // implements Pauser
	MemorySnapshot bool          `json:"memory_snapshot"` // implements Checkpointer
	DiskQuota      bool          `json:"disk_quota"`      // enforces Resources.DiskMB
	NetworkModes   []NetworkMode `json:"network_modes"`
	// LayerCapture says the driver implements LayerCapturer: template
	// builds can run their steps on it.
	LayerCapture bool `json:"layer_capture,omitempty"`
	// InterfacesAtStart says the sandbox sees the network interfaces its
	// namespace had when it started, not ones added later (gVisor's own
	// network stack): a running sandbox of mode none cannot gain a network.
	InterfacesAtStart bool `json:"interfaces_at_start,omitempty"`
}

// HasNetworkMode reports whether m is among c.NetworkModes.
func (c Capabilities) HasNetworkMode(m NetworkMode) bool {
	for _, x := range c.NetworkModes {
		if x == m {
			return true
		}
	}
	return false
}

// HealthState is the result of a driver's health probe.
type HealthState string

const (
	HealthHealthy    HealthState = "healthy"    // usable now
	HealthUnhealthy  HealthState = "unhealthy"  // present but broken (e.g. cgroups missing)
	HealthUndetected HealthState = "undetected" // not installed, or needs root
)

// Health is what Probe found, with a human description of what is missing.
type Health struct {
	State       HealthState `json:"state"`
	Description string      `json:"description,omitempty"`
}

// Resources are the limits of one sandbox. Zero means the server default.
type Resources struct {
	CPU       float64 `json:"cpu"`        // CPUs (quota over period), e.g. 0.5
	MemoryMB  int64   `json:"memory_mb"`  // memory limit; OOM kills are reported
	DiskMB    int64   `json:"disk_mb"`    // size of the writable layer
	PIDs      int64   `json:"pids"`       // maximum number of tasks
	DiskTmpfs bool    `json:"disk_tmpfs"` // writable layer on tmpfs (counts against memory) instead of a loop ext4 image
}

// Template is a resolved, read-only root filesystem a sandbox starts from.
type Template struct {
	Name    string `json:"name"`
	Version int    `json:"version"`
	// Layers are read-only directories on the host, lowest first, that the
	// driver stacks under the sandbox's writable layer. They are shared by
	// every sandbox of the template and must never be written to.
	Layers []string `json:"layers"`
}

// Spec is everything a driver needs to create one sandbox.
type Spec struct {
	ID        string    `json:"id"` // sbx_…; unique, safe as a file and cgroup name
	Template  Template  `json:"template"`
	Resources Resources `json:"resources"`
	Hostname  string    `json:"hostname"`
	// NetNSPath, when set, is a network namespace prepared by the caller that
	// the sandbox joins; empty means a fresh namespace with loopback only.
	NetNSPath string `json:"netns_path,omitempty"`
	// ResolvConfPath, when set with NetNSPath, is a host file the driver
	// mounts read-only at /etc/resolv.conf: it names the sandbox's own
	// resolver (airlock's DNS, which answers only allowed names).
	ResolvConfPath string `json:"resolv_conf_path,omitempty"`
	// SecretsTmpfs asks for a small memory file system at /run/secrets,
	// writable by every user of the sandbox (sticky), where the manager
	// writes the sandbox's secrets as files: they never touch a disk.
	SecretsTmpfs bool `json:"secrets_tmpfs,omitempty"`
}

// Handle identifies a sandbox to its driver across daemon restarts. The store
// persists it; State is opaque to everything but the driver that wrote it.
type Handle struct {
	ID      string          `json:"id"`
	Driver  string          `json:"driver"`
	Version int             `json:"version"`
	State   json.RawMessage `json:"state,omitempty"`
}

// State is the observed state of a sandbox's runtime.
type State string

const (
	StateCreated State = "created" // prepared, not started
	StateRunning State = "running"
	StatePaused  State = "paused"
	StateStopped State = "stopped" // its init exited or it was stopped
	StateUnknown State = "unknown" // the runtime has no record of it
)

// Status is what Inspect observed.
type Status struct {
	State State `json:"state"`
	// Pid is the host pid of the sandbox's init (the agent), 0 if none.
	Pid int `json:"pid,omitempty"`
	// OOMKills counts processes of the sandbox the kernel killed for memory.
	OOMKills uint64 `json:"oom_kills"`
	// ExitCode and ExitSignal describe how init ended once State is stopped.
	ExitCode   int    `json:"exit_code,omitempty"`
	ExitSignal string `json:"exit_signal,omitempty"`
}

// Driver is one isolation backend. Every method is safe for concurrent use on
// different ids; calls for the same id are serialised by the caller.
type Driver interface {
	// Name is the runtime name clients ask for: "runc", "gvisor", "microvm".
	Name() string
	// Capabilities says what the driver supports; it does not change at run time.
	Capabilities() Capabilities
	// Probe checks that the driver can run sandboxes on this host now.
	Probe(ctx context.Context) Health
	// Create prepares storage, limits and the runtime bundle for spec and
	// returns the handle to persist. Nothing runs yet. On error nothing is left.
	Create(ctx context.Context, spec Spec) (*Handle, error)
	// Start runs the sandbox's init (the agent) and returns once it runs.
	// The agent may not accept connections yet: DialAgent retries.
	Start(ctx context.Context, id string) error
	// Stop ends every process of the sandbox, waiting up to timeout for a
	// graceful exit before it kills. Storage is kept.
	Stop(ctx context.Context, id string, timeout time.Duration) error
	// Destroy kills every process and removes all the sandbox's mounts, loop
	// devices, cgroups, namespaces and files. Idempotent: an unknown id is nil.
	Destroy(ctx context.Context, id string) error
	// Recover re-adopts a sandbox from a handle persisted by an earlier daemon.
	// It returns an error wrapping errdefs.ErrNotFound when the sandbox is gone.
	Recover(ctx context.Context, h *Handle) error
	// Inspect reports the runtime's view of the sandbox.
	Inspect(ctx context.Context, id string) (Status, error)
	// DialAgent connects to the sandbox's agent, waiting until ctx is done for
	// it to listen. Each call gives a new connection.
	DialAgent(ctx context.Context, id string) (net.Conn, error)
}

// Pauser is implemented by drivers whose Capabilities().Pause is true.
type Pauser interface {
	// Pause freezes every process of the sandbox.
	Pause(ctx context.Context, id string) error
	// Resume thaws a paused sandbox.
	Resume(ctx context.Context, id string) error
}

// RootResetter is implemented by drivers that return a running sandbox to
// fresh layers in place, faster than a Destroy and a Create (POST
// /v1/sandboxes/{id}/reset): every process but the sandbox's init (the
// agent) is killed, and the init is moved onto a new root of tmpl's
// layers over an empty writable layer of the same size. Its id, handle,
// namespaces (the network too), cgroup, limits and agent socket are kept;
// the caller drops its agent connection first and dials again after.
type RootResetter interface {
	// ResetRoot resets running sandbox id. An error wrapping
	// errdefs.ErrNotImplemented means this sandbox cannot be (nothing was
	// changed: destroy and create it instead); after any other error its
	// processes may be gone and it is to be destroyed.
	ResetRoot(ctx context.Context, id string, tmpl Template) error
}

// Stats is a sample of a sandbox's resource use.
type Stats struct {
	CPUSeconds       float64 `json:"cpu_seconds"`
	MemoryBytes      uint64  `json:"memory_bytes"`
	MemoryPeakBytes  uint64  `json:"memory_peak_bytes"`
	PIDs             uint64  `json:"pids"`
	DiskBytes        uint64  `json:"disk_bytes"`
	DiskWrittenBytes uint64  `json:"disk_written_bytes"`
	NetRxBytes       uint64  `json:"net_rx_bytes"`
	NetTxBytes       uint64  `json:"net_tx_bytes"`
	OOMKills         uint64  `json:"oom_kills"`
}

// Stater is implemented by drivers that can sample resource use.
type Stater interface {
	// Stats samples the sandbox's current resource use.
	Stats(ctx context.Context, id string) (Stats, error)
}

// OOMCounter is implemented by drivers that read a sandbox's OOM kill count
// more cheaply than a whole Stats sample. The manager reads it at the start of
// every exec (to tell an OOM kill from any other SIGKILL), so its cost is exec
// latency.
type OOMCounter interface {
	// OOMKills returns how many of the sandbox's processes the kernel's OOM
	// killer has killed so far.
	OOMKills(ctx context.Context, id string) (uint64, error)
}

// LayerCapturer is implemented by drivers whose Capabilities().LayerCapture
// is true: they hand out a stopped sandbox's writable layer, which a
// template build turns into a template layer (internal/build). Nothing
// above the driver knows where or how the layer is kept.
type LayerCapturer interface {
	// WritableLayer returns the writable layer of sandbox id, which must
	// be stopped (Stop) or paused (Pauser), so that nothing changes it
	// while it is read; an error wrapping errdefs.ErrInvalidState if it
	// runs. Of a paused sandbox the driver first makes what its processes
	// wrote visible in the returned directory (a snapshot of a running
	// sandbox pauses it, reads, resumes). The layer stays readable until
	// the sandbox is started again, resumed, or destroyed.
	WritableLayer(ctx context.Context, id string) (WritableLayer, error)
}

// WritableLayer is a stopped sandbox's writable layer on the host, as
// overlayfs keeps it.
type WritableLayer struct {
	// Dir is the layer's directory on the host: what the sandbox changed
	// over its template, with overlayfs whiteouts (0/0 character devices)
	// and opaque directories (the trusted.overlay.opaque xattr). It
	// belongs to the sandbox and is hostile: nothing in it may be followed.
	Dir string
	// UIDBase and IDCount map the owners: host uid (and gid) UIDBase+n is
	// n inside the sandbox, for n below IDCount.
	UIDBase, IDCount uint32
	// RuntimeNames are top-level names in Dir that the runtime made
	// (mount points a template lacked, the agent's directory), not the
	// sandbox's processes: a capture leaves them out.
	RuntimeNames []string
}

// Lister is implemented by drivers that can list the sandboxes they hold on
// this host, those an earlier daemon made included: what a restarted daemon
// sweeps when the store does not know a sandbox (template builds' own).
type Lister interface {
	// List returns the ids of the sandboxes created and not destroyed.
	List(ctx context.Context) ([]string, error)
}

// Checkpointer is implemented by drivers whose Capabilities().MemorySnapshot
// is true: a running sandbox's processes and memory are written to a host
// directory and a sandbox is later started from it instead of from its init
// (pause to disk, memory snapshots, fork). See docs/drivers.md.
type Checkpointer interface {
	// Checkpoint writes the processes and memory of running sandbox id
	// into dir, a new empty host directory of the caller's. Without
	// opts.LeaveRunning it leaves the sandbox stopped with its storage
	// kept (its writable layer is the checkpoint's disk): a pause to disk.
	// Connections to the agent end (close them first; dial anew after).
	// A sandbox the runtime cannot checkpoint now is refused with an error
	// wrapping errdefs.ErrInvalidState and runs on (gVisor: a TCP
	// connection open); any other error may leave it stopped, storage
	// kept (Inspect says which).
	Checkpoint(ctx context.Context, id, dir string, opts CheckpointOptions) error
	// Restore runs sandbox id from the checkpoint in dir, in place of
	// Start: its processes resume where Checkpoint left them. id is either
	// the checkpointed sandbox itself, stopped by Checkpoint (a resume
	// from disk), or a new created sandbox whose read-only layers hold
	// the checkpointed sandbox's files (its template's layers and its
	// writable layer captured over them: a snapshot, a fork).
	Restore(ctx context.Context, id, dir string) error
}

// CheckpointOptions tune a Checkpoint.
type CheckpointOptions struct {
	// LeaveRunning keeps the sandbox running once its image is written (a
	// memory snapshot, a fork) instead of stopping it (a pause to disk).
	LeaveRunning bool
}
