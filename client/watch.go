package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// Types of WatchEvent.
const (
	WatchCreate = "create"
	WatchWrite  = "write"
	WatchRemove = "remove"
	// WatchRename is a rename inside the watched tree (From is the old path).
	WatchRename = "rename"
	// WatchChmod is a change of mode, owner or timestamps.
	WatchChmod = "chmod"
	// WatchOverflow says that events were lost: re-list the directory.
	WatchOverflow = "overflow"
)

// WatchEvent is one change below a watched directory. Writes to a file are
// coalesced while the client is behind: one write event stands for all
// writes since the previous one and comes after them.
type WatchEvent struct {
	Type string `json:"type"`
	// Path is the absolute sandbox path (empty for WatchOverflow).
	Path string `json:"path,omitempty"`
	// From is a WatchRename's old path.
	From string `json:"from,omitempty"`
	// Dir is set when Path is a directory.
	Dir  bool      `json:"dir,omitempty"`
	Time time.Time `json:"time"`
}

// WatchOptions configure WatchDir.
type WatchOptions struct {
	// Recursive watches the whole tree, also directories made later.
	Recursive bool
	// User whose permissions the watch has (default "user").
	User string
}

// DirWatch is a running directory watch. Next is not safe for concurrent
// use; Close may be called from any goroutine.
type DirWatch struct {
	ctx    context.Context // the caller's
	wctx   context.Context // ends with Close or an idle stream
	body   io.Closer
	r      *sseReader
	cancel context.CancelCauseFunc
	once   sync.Once
	done   bool
}

// WatchDir watches directory path of the sandbox (GET
// /v1/sandboxes/{id}/fs/watch). It returns once the watch is in place: every
// later change is reported. A watch is not resumed after a dropped
// connection (changes in between would be lost): watch again and re-list.
func (c *Client) WatchDir(ctx context.Context, sandboxID, path string, opts WatchOptions) (*DirWatch, error) {
	q := url.Values{"path": {path}}
	if opts.Recursive {
		q.Set("recursive", strconv.FormatBool(true))
	}
	if opts.User != "" {
		q.Set("user", opts.User)
	}
	wctx, cancel := context.WithCancelCause(ctx)
	req, err := c.newRequest(wctx, http.MethodGet, sandboxPath(sandboxID, "fs", "watch"), q, nil)
	if err != nil {
		cancel(nil)
		return nil, err
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.send(req)
	if err != nil {
		cancel(nil)
		return nil, err
	}
	if ct := resp.Header.Get("Content-Type"); !isEventStream(ct) {
		resp.Body.Close()
		cancel(nil)
		return nil, fmt.Errorf("watch: server answered %q, not text/event-stream", ct)
	}
	touch := func() {}
	if c.streamIdle > 0 {
		timer := time.AfterFunc(c.streamIdle, func() { cancel(errStreamIdle) })
		touch = func() { timer.Reset(c.streamIdle) }
		context.AfterFunc(wctx, func() { timer.Stop() })
	}
	w := &DirWatch{ctx: ctx, wctx: wctx, body: resp.Body, r: newSSEReader(resp.Body, touch), cancel: cancel}
	ev, err := w.r.next()
	if err != nil || ev.Event != "start" {
		w.Close()
		if err == nil {
			err = fmt.Errorf("watch: first event is %q, want start", ev.Event)
		}
		return nil, w.fail(err)
	}
	return w, nil
}

// Next waits for the next change. It returns io.EOF when the watched
// directory itself was removed or moved away, and an error when the watch
// failed or ctx ended.
func (w *DirWatch) Next() (WatchEvent, error) {
	if w.done {
		return WatchEvent{}, io.EOF
	}
	for {
		ev, err := w.r.next()
		if err != nil {
			return WatchEvent{}, w.fail(err)
		}
		switch ev.Event {
		case "end":
			w.done = true
			w.Close()
			return WatchEvent{}, io.EOF
		case "error":
			w.Close()
			return WatchEvent{}, streamError(ev.Data)
		case WatchCreate, WatchWrite, WatchRemove, WatchRename, WatchChmod, WatchOverflow:
			var out WatchEvent
			if err := json.Unmarshal([]byte(ev.Data), &out); err != nil {
				return WatchEvent{}, fmt.Errorf("decoding %s event: %w", ev.Event, err)
			}
			return out, nil
		}
		// Unknown events are for newer clients.
	}
}

// fail explains an error of the stream: the caller's cancellation, or an
// idle stream, rather than the broken read they caused.
func (w *DirWatch) fail(err error) error {
	if w.ctx.Err() != nil {
		return fmt.Errorf("watch: %w", context.Cause(w.ctx))
	}
	if errors.Is(context.Cause(w.wctx), errStreamIdle) {
		return errStreamIdle
	}
	return err
}

// Close ends the watch.
func (w *DirWatch) Close() error {
	w.once.Do(func() {
		w.cancel(nil)
		w.body.Close()
	})
	return nil
}
