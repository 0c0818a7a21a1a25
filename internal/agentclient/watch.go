package agentclient

import (
	"context"
	"errors"
	"io"
	"sync/atomic"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// Watch is an inotify watch on a directory in the sandbox (see
// agentproto.OpWatch). It is not safe for concurrent use; Close may be
// called from any goroutine to end a Next that is waiting.
type Watch struct {
	cl     *call
	err    error
	closed atomic.Bool
}

// Watch starts watching directory path (its whole tree when recursive) as
// user. When it returns, the watch is in place: every later change is
// reported. Cancelling ctx, or Close, ends it in the agent too.
func (c *Client) Watch(ctx context.Context, path, user string, recursive bool) (*Watch, error) {
	cl, err := c.start(ctx, agentproto.Request{Op: agentproto.OpWatch, Path: path, User: user, Recursive: recursive})
	if err != nil {
		return nil, err
	}
	return &Watch{cl: cl}, nil
}

// Next waits for the next events, in the order they happened. It returns
// io.EOF when the watch ended by itself (the directory was removed or moved
// away), and the error of a failed watch or a cancelled context.
func (w *Watch) Next() ([]agentproto.WatchEvent, error) {
	if w.err != nil {
		return nil, w.err
	}
	for {
		t, p, err := w.cl.fr.Next()
		if err != nil {
			if w.closed.Load() {
				return nil, w.fail(ErrWatchClosed)
			}
			return nil, w.fail(w.cl.fail("reading watch events", err))
		}
		switch t {
		case agentproto.FrameEnd:
			return nil, w.fail(io.EOF)
		case agentproto.FrameHeader:
		default:
			return nil, w.fail(protocolError("unexpected frame %q in watch events", byte(t)))
		}
		var m struct {
			Events []agentproto.WatchEvent `json:"events"`
			Error  *agentproto.Error       `json:"error"`
		}
		if err := decodeJSON(p, &m); err != nil {
			return nil, w.fail(err)
		}
		if m.Error != nil {
			return nil, w.fail(agentError(m.Error))
		}
		if err := checkWatchBatch(m.Events); err != nil {
			return nil, w.fail(err)
		}
		if len(m.Events) > 0 {
			return m.Events, nil
		}
	}
}

func (w *Watch) fail(err error) error {
	w.err = err
	w.cl.release()
	return err
}

// Close ends the watch. Safe to call more than once and concurrently with
// Next, which then fails.
func (w *Watch) Close() error {
	w.closed.Store(true)
	w.cl.release()
	return nil
}

// ErrWatchClosed is what Next returns after Close.
var ErrWatchClosed = errors.New("watch closed")
