package httpapi

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/exec"
)

// wantsSSE reports whether the client asked for Server-Sent Events.
func wantsSSE(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err == nil && mt == "text/event-stream" {
			return true
		}
	}
	return false
}

// exec runs a command in one of three modes: JSON (wait for the result),
// SSE (stream output as it happens) or async (202 with the id at once).
func (s *Server) exec(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req api.ExecRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	async, err := queryBool(r, "async")
	if err != nil {
		return err
	}
	sse := wantsSSE(r) && !async
	// Stdin stays open for …/stdin in the streaming modes unless the request
	// gave its stdin up front; a JSON call has no way to send more, so its
	// stdin closes at once (a command reading it sees EOF, never hangs).
	opts := exec.Options{StdinOpen: (async || sse) && req.Stdin == nil}
	e, err := s.execs.Exec(r.Context(), p, r.PathValue("id"), req, opts)
	if err != nil {
		return err
	}
	logFrom(r.Context()).Debug("exec started", "sandbox_id", r.PathValue("id"), "exec_id", e.ID())
	switch {
	case async:
		w.Header().Set("Location", "/v1/sandboxes/"+r.PathValue("id")+"/execs/"+e.ID())
		writeJSON(w, http.StatusAccepted, api.ExecStarted{ID: e.ID()})
		return nil
	case sse:
		return s.streamEvents(w, r, e.Subscribe(0), e.ID())
	}
	res, err := e.Wait(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// streamEvents writes an exec's events as SSE until the exit event or the
// client leaves. startID, when set, is sent first as the `start` event.
func (s *Server) streamEvents(w http.ResponseWriter, r *http.Request, sub *exec.Subscription, startID string) error {
	sw := newSSE(w)
	if startID != "" {
		if err := sw.event("start", "", api.ExecStarted{ID: startID}); err != nil {
			return nil
		}
	} else if err := sw.comment("attached"); err != nil {
		return nil
	}
	ctx, cancel := s.streamContext(r)
	defer cancel()
	for {
		ev, ok, err := sub.Next(ctx, s.cfg.Heartbeat)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			// The client left, the server shuts down or the key was
			// revoked: the exec goes on; the last two are said.
			endSSE(ctx, r, sw)
			return nil
		}
		if !ok {
			if err := sw.comment("heartbeat"); err != nil {
				return nil
			}
			continue
		}
		if ev.Type == exec.EventExit {
			sw.event("exit", "", ev.Result)
			return nil
		}
		name := ev.Stream
		if name == exec.StreamPTY {
			name = exec.StreamStdout // a terminal merges both streams
		}
		out := api.OutputEvent{Offset: ev.Offset}
		if utf8.Valid(ev.Data) {
			out.Data = string(ev.Data)
		} else {
			out.Data, out.Encoding = base64.StdEncoding.EncodeToString(ev.Data), "base64"
		}
		// The SSE id is where a re-attach continues (Last-Event-ID).
		id := strconv.FormatInt(ev.Offset+int64(len(ev.Data)), 10)
		if err := sw.event(name, id, out); err != nil {
			return nil
		}
	}
}

// sse writes Server-Sent Events.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func newSSE(w http.ResponseWriter) *sse {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // proxies must not buffer a live stream
	w.WriteHeader(http.StatusOK)
	s := &sse{w: w, rc: http.NewResponseController(w)}
	s.rc.Flush()
	return s
}

func (s *sse) event(name, id string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var sb strings.Builder
	sb.Grow(len(b) + len(name) + 32)
	sb.WriteString("event: ")
	sb.WriteString(name)
	sb.WriteByte('\n')
	if id != "" {
		sb.WriteString("id: ")
		sb.WriteString(id)
		sb.WriteByte('\n')
	}
	sb.WriteString("data: ")
	sb.Write(b) // JSON has no raw newlines, so one data line suffices
	sb.WriteString("\n\n")
	if _, err := io.WriteString(s.w, sb.String()); err != nil {
		return err
	}
	return s.rc.Flush()
}

func (s *sse) comment(text string) error {
	if _, err := fmt.Fprintf(s.w, ": %s\n\n", text); err != nil {
		return err
	}
	return s.rc.Flush()
}

func (s *Server) listExecs(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	limit, err := queryInt(r, "limit", 0)
	if err != nil {
		return err
	}
	out, err := s.execs.ListExecs(r.Context(), p, r.PathValue("id"), limit, r.URL.Query().Get("cursor"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getExec(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	res, err := s.execs.GetExec(r.Context(), p, r.PathValue("id"), r.PathValue("eid"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// execEvents replays an exec's output from from_offset (or Last-Event-ID)
// and follows it live.
func (s *Server) execEvents(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	from := int64(0)
	v := r.URL.Query().Get("from_offset")
	if v == "" {
		v = r.Header.Get("Last-Event-ID")
	}
	if v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return errf(errdefs.ErrInvalidArgument, "from_offset must be a non-negative integer")
		}
		from = n
	}
	sub, err := s.execs.Events(r.Context(), p, r.PathValue("id"), r.PathValue("eid"), from)
	if err != nil {
		return err
	}
	return s.streamEvents(w, r, sub, "")
}

// stdin forwards the raw body to the exec's stdin; ?eof=true closes it after.
func (s *Server) stdin(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	eof, err := queryBool(r, "eof")
	if err != nil {
		return err
	}
	if r.ContentLength > s.cfg.MaxUploadBytes {
		return errf(errdefs.ErrTooLarge, fmt.Sprintf("stdin body exceeds %d bytes", s.cfg.MaxUploadBytes))
	}
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxUploadBytes)
	n, err := s.execs.WriteStdin(r.Context(), p, r.PathValue("id"), r.PathValue("eid"), body, eof)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]int64{"written": n})
	return nil
}

func (s *Server) signal(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req api.SignalRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if err := s.execs.Signal(r.Context(), p, r.PathValue("id"), r.PathValue("eid"), req.Signal); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
