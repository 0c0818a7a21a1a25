// Package agentproto defines the wire protocol between the airlock daemon and airlock-agent.
//
// The protocol runs over one byte stream (a unix socket, a socketpair, stdio or a
// virtio-serial port) multiplexed with yamux: the daemon is the yamux client and
// opens one stream per request; the agent is the yamux server.
//
// Every yamux stream carries frames (see frame.go). The client's first frame is a
// Header frame holding a JSON Request; the agent answers with a Header frame
// holding a JSON Response. What follows depends on the Op:
//
//   - OpHello: nothing. The first stream of a session; both sides learn each
//     other's ProtocolVersion.
//   - OpExec, OpAttach: after an OK Response the agent sends Output frames (raw
//     bytes with stream and offset, no JSON) and finally one Header frame with
//     an exit Event, then closes the stream.
//   - OpReadFile, OpTarOut: after the Response the agent sends Data frames, then
//     an End frame (success) or a Header frame with a failing Response.
//   - OpWriteFile, OpTarIn, OpStdin: after an OK Response (the agent is ready)
//     the client sends Data frames and an End frame; the agent answers with a
//     final Response. The agent may send a failing Response at any time and
//     stop reading; the client must stop sending when it sees one.
//   - OpWatch: after an OK Response (the watch is in place) the agent sends
//     Header frames, each a JSON WatchBatch, until the client closes the
//     stream. A watch that ends by itself (its directory was removed or
//     moved away) ends with an End frame; a failing one with a Header frame
//     holding a failing Response.
//   - every other Op: just the Response.
//
// Direct connections. Where the transport can be dialled more than once (a
// unix socket), bulk transfers (OpReadFile, OpWriteFile, OpTarOut, OpTarIn)
// may run on a connection of their own instead of a yamux stream: the client
// sends DirectPreamble and then exactly what it would send on a stream, and
// the connection carries that one request. Without yamux in between, the
// bytes are copied once less on each side and may be moved by the kernel
// (splice, sendfile). A client uses them only with an agent whose Hello lists
// FeatureDirect; on a direct OpReadFile of a regular file the agent sends
// exactly the size its Response announced, or breaks the connection.
package agentproto

import (
	"io"
	"time"

	"github.com/hashicorp/yamux"
)

// ProtocolVersion is the version of this protocol. A peer refuses a session
// whose major version (this number) differs from its own.
const ProtocolVersion = 1

// Op names a request.
type Op string

// The operations an agent serves.
const (
	OpHello     Op = "hello"
	OpPing      Op = "ping"
	OpExec      Op = "exec"
	OpAttach    Op = "attach"
	OpWait      Op = "wait"
	OpStdin     Op = "stdin"
	OpSignal    Op = "signal"
	OpResize    Op = "resize"
	OpListExecs Op = "list_execs"
	OpReadFile  Op = "read_file"
	OpWriteFile Op = "write_file"
	OpStat      Op = "stat"
	OpList      Op = "list"
	OpMkdir     Op = "mkdir"
	OpMove      Op = "move"
	OpRemove    Op = "remove"
	OpTarOut    Op = "tar_out"
	OpTarIn     Op = "tar_in"
	OpWatch     Op = "watch"
)

// EndedBySIGKILL reports whether an exec ended the way a process the
// kernel's OOM killer chose ends: killed by SIGKILL, or exited with 137
// (128+SIGKILL), which is how a shell reports a child killed so. Both the
// agent and the daemon call an exec StatusOOM when it ended so and the
// sandbox's OOM kill count grew while it ran. The count does not say whose
// process was killed: an exec that ends otherwise (exits 0, 1, …) keeps
// its status even if another exec of the sandbox was OOM-killed meanwhile,
// and two execs that both end by SIGKILL while one kill happened are both
// reported StatusOOM.
func EndedBySIGKILL(r ExecResult) bool {
	return r.Signal == "SIGKILL" || (r.Signal == "" && r.ExitCode == 128+9)
}

// Exec statuses. StatusRunning is the only non-final one.
const (
	StatusRunning = "running"
	StatusExited  = "exited"
	StatusTimeout = "timeout"
	StatusKilled  = "killed"
	StatusOOM     = "oom"
	StatusError   = "error"
)

// Event types.
const (
	EventOutput = "output"
	EventExit   = "exit"
)

// Output stream names.
const (
	StreamStdout = "stdout"
	StreamStderr = "stderr"
	StreamPTY    = "pty"
)

// File types reported in FileInfo.Type.
const (
	FileTypeFile    = "file"
	FileTypeDir     = "dir"
	FileTypeSymlink = "symlink"
	FileTypeOther   = "other"
)

// Limits on exec output kept by the agent, per stream (see OutputLog).
const (
	// DefaultMaxOutputBytes is the per-stream output cap when a request
	// gives none.
	DefaultMaxOutputBytes = 1 << 20
	// HardMaxOutputBytes bounds what a request may ask for: the log lives in
	// the agent's memory, which is charged to the sandbox.
	HardMaxOutputBytes = 64 << 20
)

// FollowInterval and FollowRate pace a follower of an exec whose output
// went past its cap: it is woken at most every FollowInterval, and no more
// often than what it was sent takes at FollowRate (bytes per second). A
// flood then reaches the daemon as samples of what the tails hold, instead
// of at the speed the sandbox writes (the daemon's CPU is shared by every
// sandbox), while a long log that merely outgrew the cap still streams
// nearly live. Output under the cap is sent at once.
const (
	FollowInterval = 250 * time.Millisecond
	FollowRate     = 8 << 20
)

// DefaultUser is the user that runs execs and file operations when a request
// names none.
const DefaultUser = "user"

// ExecIDEnv is the environment variable the agent adds to every exec's
// environment (value: the exec id) so that it can find processes that left
// the exec's session, e.g. double-forked daemons.
const ExecIDEnv = "AIRLOCK_EXEC_ID"

// Hello is exchanged on the first stream of a session.
type Hello struct {
	// Version is the sender's ProtocolVersion.
	Version int `json:"version"`
	// Agent is the agent's build version (empty from the client).
	Agent string `json:"agent,omitempty"`
	// Pid is the agent's pid in its own pid namespace (1 when it is init).
	Pid int `json:"pid,omitempty"`
	// Features lists optional parts of the protocol the agent serves
	// (FeatureDirect); a peer ignores names it does not know.
	Features []string `json:"features,omitempty"`
}

// FeatureDirect says that the agent accepts direct connections (see the
// package documentation).
const FeatureDirect = "direct"

// FeatureReadTar says that the agent serves Request.Tar on OpReadFile.
const FeatureReadTar = "read_tar"

// DirectPreamble opens a direct connection. Its first byte can never start
// a yamux session (whose first byte is the yamux version, 0), so an agent
// tells the two apart from one byte.
const DirectPreamble = "AIRLOCK-DIRECT/1\n"

// DirectChunk is the data frame size on direct connections: with no other
// stream to interleave with, larger frames only cut per-frame costs.
const DirectChunk = 1 << 20

// ExecRequest starts a process.
type ExecRequest struct {
	// ID is chosen by the client (`ex_…`) and must be unique in the agent.
	ID string `json:"id"`
	// Argv is the command; exactly one of Argv and Shell is set.
	Argv []string `json:"argv,omitempty"`
	// Shell is a command line run by `/bin/sh -c`.
	Shell string `json:"shell,omitempty"`
	// Cwd defaults to the user's home directory.
	Cwd string `json:"cwd,omitempty"`
	// Env is merged over the agent's default environment.
	Env map[string]string `json:"env,omitempty"`
	// User is a name from the sandbox's /etc/passwd; "" means DefaultUser.
	User string `json:"user,omitempty"`
	// TimeoutMS is the wall-clock limit enforced by the agent; 0 means none.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Stdin is written to the process's stdin at start.
	Stdin []byte `json:"stdin,omitempty"`
	// StdinOpen keeps stdin open after Stdin for OpStdin writes; otherwise
	// stdin is closed once Stdin is written.
	StdinOpen bool `json:"stdin_open,omitempty"`
	// MaxOutputBytes caps what the output log keeps of each stream: its
	// first half and its last half (0: DefaultMaxOutputBytes).
	MaxOutputBytes int64 `json:"max_output_bytes,omitempty"`
	// PTY runs the process on a pseudo-terminal of this size when set.
	PTY *PTYSize `json:"pty,omitempty"`
}

// PTYSize is a terminal size in character cells.
type PTYSize struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// Event is one item of an exec's event stream.
type Event struct {
	// Type is EventOutput or EventExit.
	Type string `json:"type"`
	// Stream is StreamStdout, StreamStderr or StreamPTY (output events).
	Stream string `json:"stream,omitempty"`
	// Offset is the position of Data's first byte in the exec's combined
	// output log.
	Offset int64 `json:"offset"`
	// Data is the output bytes (output events).
	Data []byte `json:"data,omitempty"`
	// Result is set on the exit event.
	Result *ExecResult `json:"result,omitempty"`
}

// ExecResult is the outcome of an exec.
type ExecResult struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	// ExitCode is the exit status; for a process killed by a signal it is
	// 128+signal number, as shells report it. For a command that could not
	// start (StatusError) it is 127 when the executable was not found, 126
	// when it was found but could not be run, as a shell reports them, and
	// -1 otherwise.
	ExitCode int `json:"exit_code"`
	// Signal names the signal that killed the process ("SIGKILL"), if any.
	Signal string `json:"signal,omitempty"`
	// Truncated is set when a stream went past the exec's MaxOutputBytes
	// and bytes between its head and its tail were dropped.
	Truncated bool `json:"truncated"`
	// StdoutDropped and StderrDropped count the dropped bytes (PTY output
	// counts as stdout).
	StdoutDropped int64     `json:"stdout_dropped,omitempty"`
	StderrDropped int64     `json:"stderr_dropped,omitempty"`
	StartedAt     time.Time `json:"started_at"`
	EndedAt       time.Time `json:"ended_at"`
	// DurationMS is EndedAt-StartedAt in milliseconds.
	DurationMS int64 `json:"duration_ms"`
	// StdoutBytes and StderrBytes count all output, also the discarded part;
	// PTY output counts as stdout.
	StdoutBytes int64 `json:"stdout_bytes"`
	StderrBytes int64 `json:"stderr_bytes"`
	// Error says why the process could not start (StatusError, the only
	// status the agent gives a command that did not run): the executable
	// was not found or could not be run, the process could not be made.
	// An unknown user or a missing cwd is not an exec: the request fails.
	Error string `json:"error,omitempty"`
	// Cwd is the directory the command ran in (or would have, for one
	// that could not start): the request's, else the user's home, else
	// "/". Empty when the exec failed before its directory was known, and
	// from an agent older than this field (the field is optional: the
	// protocol's version did not change).
	Cwd string `json:"cwd,omitempty"`
}

// ExecInfo describes an exec in a listing.
type ExecInfo struct {
	ID        string    `json:"id"`
	Argv      []string  `json:"argv,omitempty"`
	Shell     string    `json:"shell,omitempty"`
	User      string    `json:"user"`
	Cwd       string    `json:"cwd"`
	Status    string    `json:"status"`
	StartedAt time.Time `json:"started_at"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	// Pid is the main process's pid in the sandbox (0 if it never started).
	Pid int `json:"pid"`
	// MaxOutputBytes is the exec's per-stream output cap.
	MaxOutputBytes int64 `json:"max_output_bytes,omitempty"`
}

// FileInfo describes a file in the sandbox.
type FileInfo struct {
	// Name is the base name.
	Name string `json:"name"`
	// Path is the absolute path in the sandbox.
	Path string `json:"path"`
	// Type is one of the FileType constants.
	Type string `json:"type"`
	Size int64  `json:"size"`
	// Mode holds the permission bits (and setuid, setgid, sticky).
	Mode    uint32    `json:"mode"`
	Uid     uint32    `json:"uid"`
	Gid     uint32    `json:"gid"`
	ModTime time.Time `json:"mod_time"`
	// LinkTarget is the target of a symlink.
	LinkTarget string `json:"link_target,omitempty"`
	// Metadata are the file's user.e2b.<key> extended attributes (a
	// regular file's or a directory's), as written with OpWriteFile or by
	// anything in the sandbox: bounded (MaxMetadataKeys, MaxMetadataBytes),
	// valid UTF-8 only.
	Metadata map[string]string `json:"metadata,omitempty"`
}

// Bounds of a file's metadata (FileInfo.Metadata, Request.Metadata): the
// keys, and the bytes of keys and values together.
const (
	MaxMetadataKeys  = 64
	MaxMetadataBytes = 16 << 10
	// MetadataXattrPrefix is the extended attribute namespace of a file's
	// metadata.
	MetadataXattrPrefix = "user.e2b."
)

// Watch event types.
const (
	WatchCreate = "create"
	WatchWrite  = "write"
	WatchRemove = "remove"
	// WatchRename is a rename inside the watched tree: From is the old
	// path, Path the new one. A file moved out of the tree is a
	// WatchRemove, one moved in a WatchCreate.
	WatchRename = "rename"
	// WatchChmod is a change of mode, owner, timestamps or link count.
	WatchChmod = "chmod"
	// WatchOverflow says that events were lost (the agent's or the
	// kernel's queue was full, or the tree has more directories than a
	// watch may hold): a client that keeps a view of the tree re-reads it.
	WatchOverflow = "overflow"
)

// Limits of OpWatch.
const (
	// MaxWatchDirs bounds the directories one watch holds (one inotify
	// watch each, charged to the sandbox's kernel memory).
	MaxWatchDirs = 8192
	// MaxWatchQueue bounds the events a watch queues for a client that
	// reads slower than the tree changes; past it they are dropped and one
	// WatchOverflow event says so.
	MaxWatchQueue = 4096
)

// WatchEvent is one change in a watched tree. Writes to a file are
// coalesced: one WatchWrite stands for all the writes since the last one the
// client received, and comes after them.
type WatchEvent struct {
	// Type is one of the Watch constants.
	Type string `json:"type"`
	// Path is the absolute sandbox path the event is about (empty for
	// WatchOverflow).
	Path string `json:"path,omitempty"`
	// From is a WatchRename's old path.
	From string `json:"from,omitempty"`
	// Dir is set when the path is a directory.
	Dir bool `json:"dir,omitempty"`
	// Time is when the agent read the event.
	Time time.Time `json:"time"`
}

// WatchBatch is one Header frame of an OpWatch stream.
type WatchBatch struct {
	Events []WatchEvent `json:"events"`
}

// Request is the JSON header that opens every stream. Fields not used by an
// Op are left empty.
type Request struct {
	Op    Op           `json:"op"`
	Hello *Hello       `json:"hello,omitempty"`
	Exec  *ExecRequest `json:"exec,omitempty"`
	// ExecID names the exec of OpAttach, OpWait, OpStdin, OpSignal, OpResize.
	ExecID string `json:"exec_id,omitempty"`
	// FromOffset is where OpAttach starts in the output log.
	FromOffset int64 `json:"from_offset,omitempty"`
	// Signal is a name ("SIGTERM", "TERM") or number ("15") for OpSignal.
	Signal string `json:"signal,omitempty"`
	// Cols and Rows are the new size for OpResize.
	Cols uint16 `json:"cols,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	// EOF closes stdin after the data of OpStdin.
	EOF bool `json:"eof,omitempty"`
	// Path is the file or directory of a file operation; To is OpMove's target.
	Path string `json:"path,omitempty"`
	To   string `json:"to,omitempty"`
	// User runs the file operation ("" means DefaultUser).
	User string `json:"user,omitempty"`
	// Mode is the permission of a written file or made directory (0: default).
	Mode uint32 `json:"mode,omitempty"`
	// MaxBytes limits OpWriteFile (0: no limit); past it the agent answers
	// CodeTooLarge.
	MaxBytes int64 `json:"max_bytes,omitempty"`
	// Metadata are an OpWriteFile's key/value pairs, kept on the file as
	// its user.e2b.<key> extended attributes (see FileInfo.Metadata); a
	// write replaces the file's earlier ones.
	Metadata map[string]string `json:"metadata,omitempty"`
	// Depth is OpList's depth (<=0 means 1).
	Depth int `json:"depth,omitempty"`
	// Parents makes OpMkdir create missing parents and accept an existing dir.
	Parents bool `json:"parents,omitempty"`
	// Recursive lets OpRemove remove a non-empty directory; OpWatch then
	// watches the whole tree below Path, also directories made later.
	Recursive bool `json:"recursive,omitempty"`
	// Tar makes OpReadFile of a directory (Path itself, not a symlink to
	// one) answer as OpTarOut does, its Response describing the directory,
	// instead of failing with CodeIsADirectory: one call downloads either.
	// Sent only to an agent that lists FeatureReadTar.
	Tar bool `json:"tar,omitempty"`
}

// Response answers a Request. Error is set when the request failed.
type Response struct {
	Error  *Error      `json:"error,omitempty"`
	Hello  *Hello      `json:"hello,omitempty"`
	Result *ExecResult `json:"result,omitempty"`
	Execs  []ExecInfo  `json:"execs,omitempty"`
	File   *FileInfo   `json:"file,omitempty"`
	Files  []FileInfo  `json:"files,omitempty"`
	// Written is the number of bytes OpWriteFile stored.
	Written int64 `json:"written,omitempty"`
}

// Error codes an agent returns.
const (
	CodeNotFound         = "not_found"
	CodeAlreadyExists    = "already_exists"
	CodeNotADirectory    = "not_a_directory"
	CodeIsADirectory     = "is_a_directory"
	CodePermissionDenied = "permission_denied"
	CodeNoSpace          = "no_space"
	CodeTooLarge         = "too_large"
	CodeInvalidArgument  = "invalid_argument"
	CodeUnsupported      = "unsupported"
	CodeInternal         = "internal"
)

// Error is a failed request: a stable Code and a short, lowercase message
// that is safe to show to the sandbox's user.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Error implements error.
func (e *Error) Error() string { return e.Code + ": " + e.Message }

// YamuxConfig returns the yamux settings both peers use.
//
// Keepalive is off: a sandbox may be paused (frozen) for minutes, and a
// keepalive timeout would tear down a session that is merely waiting; a dead
// peer shows up as EOF on the transport, and callers bound their calls with
// contexts. The stream window is large so that one file transfer can keep a
// fast transport busy.
func YamuxConfig() *yamux.Config {
	cfg := yamux.DefaultConfig()
	cfg.EnableKeepAlive = false
	cfg.MaxStreamWindowSize = 8 << 20
	// A peer that does not answer a half-close within this time gets a RST,
	// which frees the stream on both sides.
	cfg.StreamCloseTimeout = 10 * time.Second
	cfg.ConnectionWriteTimeout = 30 * time.Second
	cfg.LogOutput = io.Discard
	return cfg
}
