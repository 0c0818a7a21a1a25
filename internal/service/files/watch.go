package files

import (
	"context"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/tracing"
)

// WatchDir starts watching directory pth of sandbox id (its whole tree when
// recursive) for p, as user: the agent adds the watches with the user's
// permissions, so it sees only what the user may read. When it returns the
// watch is in place. The watch lives until the caller closes it, ctx ends,
// or the sandbox stops (Next then fails with errdefs.ErrUnavailable); a
// paused sandbox reports nothing until it is resumed.
func (m *Service) WatchDir(ctx context.Context, p auth.Principal, id, pth, user string, recursive bool) (_ *Watch, err error) {
	sctx, span := tracing.StartSpan(ctx, "manager.files.watch", id)
	defer func() { tracing.EndSpan(span, err) }()
	sb, err := m.fileSandbox(sctx, p, id, user, &pth)
	if err != nil {
		return nil, err
	}
	// Safe to repeat on a dropped connection: nothing has changed yet.
	var w *agentclient.Watch
	err = sb.WithAgent(sctx, func(c *agentclient.Client) error {
		// The watch outlives the span: it is tied to ctx, not sctx.
		w, err = c.Watch(ctx, pth, user, recursive)
		return err
	})
	if err != nil {
		return nil, err
	}
	// An open watch is activity: the idle timeout does not pause the
	// sandbox under it (docs/lifecycle.md).
	return &Watch{w: w, done: sb.Active()}, nil
}

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
	w    *agentclient.Watch
	once sync.Once
	done func() // ends the watch's activity
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
func (w *Watch) Close() error {
	w.once.Do(w.done)
	return w.w.Close()
}
