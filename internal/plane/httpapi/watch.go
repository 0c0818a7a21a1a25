package httpapi

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/service/files"
)

// watchRoute is the directory watch: Server-Sent Events of the changes
// below a directory of the sandbox.
const watchRoute = "GET /v1/sandboxes/{id}/fs/watch"

// watchEvent is the data of one change event of the watch route; the SSE
// event's name is its Type.
type watchEvent struct {
	// Type is create, write, remove, rename or chmod; overflow says that
	// events were lost (re-list the directory).
	Type string `json:"type"`
	// Path is the absolute sandbox path (none for overflow).
	Path string `json:"path,omitempty"`
	// From is a rename's old path.
	From string `json:"from,omitempty"`
	// Dir is set for a directory.
	Dir  bool      `json:"dir,omitempty"`
	Time time.Time `json:"time"`
}

// registerWatch adds the watch route; register() calls it with its
// authenticated-handler wrapper.
func (s *Server) registerWatch(a func(handlerFunc) http.Handler) {
	s.handle(watchRoute, a(s.fsWatch))
}

// fsWatch streams the changes below ?path= (its whole tree with
// recursive=true) as ?user= (default "user"): `event: start` once the watch
// is in place, then one event per change named by its type, heartbeat
// comments while quiet, and `event: end` when the directory itself is
// removed or moved away. A failure after the start is one `event: error`
// with the API's error body. Errors before it are plain JSON errors.
func (s *Server) fsWatch(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	recursive, err := queryBool(r, "recursive")
	if err != nil {
		return err
	}
	q := r.URL.Query()
	ctx, cancel := s.streamContext(r)
	defer cancel()
	fw, err := s.files.WatchDir(ctx, p, r.PathValue("id"), q.Get("path"), q.Get("user"), recursive)
	if err != nil {
		return err
	}
	defer fw.Close()
	sw := newSSE(w)
	if err := sw.event("start", "", struct{}{}); err != nil {
		return nil
	}
	batches := watchBatches(ctx, fw)
	beat := time.NewTicker(s.cfg.Heartbeat)
	defer beat.Stop()
	for {
		select {
		case <-ctx.Done():
			endSSE(ctx, r, sw)
			return nil
		case <-beat.C:
			if err := sw.comment("heartbeat"); err != nil {
				return nil
			}
		case b := <-batches:
			if errors.Is(b.err, io.EOF) {
				sw.event("end", "", struct{}{})
				return nil
			}
			if b.err != nil {
				if ctx.Err() != nil {
					endSSE(ctx, r, sw)
				} else {
					c := classify(b.err)
					logFrom(r.Context()).Warn("watch failed", "sandbox_id", r.PathValue("id"), "err", b.err)
					sw.event("error", "", errorBody(r, c.Code, c.Message))
				}
				return nil
			}
			for _, ev := range b.evs {
				out := watchEvent{Type: ev.Type, Path: ev.Path, From: ev.From, Dir: ev.Dir, Time: ev.Time}
				if err := sw.event(ev.Type, "", out); err != nil {
					return nil
				}
			}
			beat.Reset(s.cfg.Heartbeat)
		}
	}
}

// watchBatch is one Next of a sandbox's watch.
type watchBatch struct {
	evs []files.WatchEvent
	err error
}

// watchBatches reads fw in a goroutine until it fails or ctx ends.
func watchBatches(ctx context.Context, fw *files.Watch) <-chan watchBatch {
	ch := make(chan watchBatch)
	go func() {
		for {
			evs, err := fw.Next()
			select {
			case ch <- watchBatch{evs, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}
