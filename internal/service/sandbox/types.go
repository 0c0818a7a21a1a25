package sandbox

import (
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/store"
)

// This file holds the manager's own names for what the planes see of
// execs, watches and files: the agent's wire types (agentproto,
// agentclient) and the store's records stay below the manager. Where a
// value is the agent's, the constant is defined by it, so the two cannot
// drift apart.

// Types of Event.
const (
	EventOutput = agentproto.EventOutput
	EventExit   = agentproto.EventExit
)

// Output streams of an output Event.
const (
	StreamStdout = agentproto.StreamStdout
	StreamStderr = agentproto.StreamStderr
	// StreamPTY is a terminal's output: stdout and stderr merged.
	StreamPTY = agentproto.StreamPTY
)

// DefaultUser runs the execs and file operations of a request that names
// no user, in a sandbox whose template sets no USER.
const DefaultUser = agentproto.DefaultUser

// ExecIDEnv is the environment variable every exec gets (its exec id): a
// request may not set it.
const ExecIDEnv = agentproto.ExecIDEnv

// MaxPageSize bounds one page of a listing (audit events, execs): a
// larger limit is cut to it.
const MaxPageSize = store.MaxPageSize

// PTYSize is a terminal size in character cells.
type PTYSize struct {
	Cols, Rows uint16
}

// SocketBody is an upload whose bytes are still in the client's socket:
// Head (what the HTTP server read ahead), then exactly N bytes from Conn.
// Given to WriteFile as its body, it lets the bytes go from the client's
// socket to the agent's by splice(2), without copies in the daemon.
type SocketBody = agentproto.SocketBody

// Watch event types (WatchEvent.Type).
const (
	WatchCreate = agentproto.WatchCreate
	WatchWrite  = agentproto.WatchWrite
	WatchRemove = agentproto.WatchRemove
	// WatchRename is a rename inside the watched tree: From is the old
	// path, Path the new one. A file moved out of the tree is a
	// WatchRemove, one moved in a WatchCreate.
	WatchRename = agentproto.WatchRename
	// WatchChmod is a change of mode, owner, timestamps or link count.
	WatchChmod = agentproto.WatchChmod
	// WatchOverflow says that events were lost: a client that keeps a
	// view of the tree reads it again.
	WatchOverflow = agentproto.WatchOverflow
)

// WatchEvent is one change in a watched tree. Writes to a file are
// coalesced: one WatchWrite stands for all the writes since the last one
// reported, and comes after them.
type WatchEvent struct {
	// Type is one of the Watch constants.
	Type string
	// Path is the absolute sandbox path (empty for WatchOverflow).
	Path string
	// From is a WatchRename's old path.
	From string
	// Dir is set when the path is a directory.
	Dir bool
	// Time is when the sandbox's agent read the event.
	Time time.Time
}

// Watch is a directory watch in a sandbox (WatchDir). It is not safe for
// concurrent use; Close may be called from any goroutine to end a Next
// that is waiting.
type Watch struct {
	w *agentclient.Watch
}

// Next waits for the next events, in the order they happened. It returns
// io.EOF when the watch ended by itself (the directory was removed or
// moved away), and the error of a failed watch (errdefs.ErrUnavailable
// when the sandbox stopped), a cancelled context or Close.
func (w *Watch) Next() ([]WatchEvent, error) {
	evs, err := w.w.Next()
	if err != nil {
		return nil, err
	}
	out := make([]WatchEvent, len(evs))
	for i, e := range evs {
		out[i] = WatchEvent{Type: e.Type, Path: e.Path, From: e.From, Dir: e.Dir, Time: e.Time}
	}
	return out, nil
}

// Close ends the watch. Safe to call more than once and concurrently with
// Next, which then fails.
func (w *Watch) Close() error { return w.w.Close() }
