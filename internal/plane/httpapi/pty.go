package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/exec"
)

// ptyIdle is how often an idle terminal is pinged, so that proxies keep the
// connection and a vanished client is noticed.
const ptyIdle = 30 * time.Second

// maxPTYFrame bounds one incoming WebSocket message (keystrokes and pastes).
const maxPTYFrame = 1 << 20

// pty runs an interactive terminal over a WebSocket: binary frames carry
// terminal bytes both ways, text frames {"resize": {"cols", "rows"}} resize.
// When the command ends the server sends a text frame {"exit": result} and
// closes; when the client closes, the command gets SIGHUP like a terminal
// hang-up.
func (s *Server) pty(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	q := r.URL.Query()
	size := &exec.PTYSize{Cols: 80, Rows: 24}
	for name, dst := range map[string]*uint16{"cols": &size.Cols, "rows": &size.Rows} {
		if v := q.Get(name); v != "" {
			n, err := strconv.ParseUint(v, 10, 16)
			if err != nil || n == 0 {
				return errf(errdefs.ErrInvalidArgument, name+" must be a positive integer")
			}
			*dst = uint16(n)
		}
	}
	req := api.ExecRequest{PTY: true, User: q.Get("user"), Cwd: q.Get("cwd")}
	if cmd := q["cmd"]; len(cmd) > 0 {
		req.Cmd = cmd
	} else {
		// The user's login shell, as a terminal would start it.
		sh := `exec "${SHELL:-/bin/sh}" -l`
		req.Shell = &sh
	}
	if !isWebSocketHandshake(r) {
		// Checked before anything starts (after what makes a request bad
		// anyway: a sandbox that is not the caller's is still 404): a plain
		// GET gets the API's error body, not the WebSocket library's
		// text/plain answer.
		if _, err := s.sandboxes.Get(r.Context(), p, r.PathValue("id")); err != nil {
			return err
		}
		return errf(errdefs.ErrInvalidArgument,
			"this endpoint is a websocket: send GET with Connection: Upgrade, Upgrade: websocket, Sec-WebSocket-Version: 13 and a Sec-WebSocket-Key")
	}
	// Start the command before upgrading, so that a bad request still gets
	// the API's error body rather than a closed socket.
	e, err := s.execs.Exec(r.Context(), p, r.PathValue("id"), req, exec.Options{StdinOpen: true, PTYSize: size})
	if err != nil {
		return err
	}
	id, eid := r.PathValue("id"), e.ID()
	log := logFrom(r.Context()).With("sandbox_id", id, "exec_id", eid)
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		// Accept wrote the HTTP error itself; nobody will use the terminal.
		s.execs.Signal(context.WithoutCancel(r.Context()), p, id, eid, "SIGKILL")
		return nil
	}
	conn.SetReadLimit(maxPTYFrame)
	ctx, cancel := s.streamContext(r)
	defer cancel()

	// Input: client → stdin / resize.
	inputDone := make(chan struct{})
	go func() {
		defer close(inputDone)
		defer cancel()
		for {
			typ, data, err := conn.Read(ctx)
			if err != nil {
				if ctx.Err() == nil || websocket.CloseStatus(err) != -1 {
					// The client hung up: like a terminal, send SIGHUP.
					hctx, hcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
					s.execs.Signal(hctx, p, id, eid, "SIGHUP")
					hcancel()
				}
				return
			}
			switch typ {
			case websocket.MessageBinary:
				if _, err := s.execs.WriteStdin(ctx, p, id, eid, bytes.NewReader(data), false); err != nil {
					log.Debug("pty stdin", "err", err)
				}
			case websocket.MessageText:
				var rz api.PTYResize
				if err := json.Unmarshal(data, &rz); err != nil || rz.Resize.Cols == 0 || rz.Resize.Rows == 0 {
					conn.Close(websocket.StatusUnsupportedData, "text frames must be {\"resize\":{\"cols\":N,\"rows\":N}}")
					return
				}
				if err := s.execs.Resize(ctx, p, id, eid, rz.Resize.Cols, rz.Resize.Rows); err != nil {
					log.Debug("pty resize", "err", err)
				}
			}
		}
	}()

	// Output: terminal bytes → client, then the exit frame.
	sub := e.Subscribe(0)
	for {
		ev, ok, err := sub.Next(ctx, ptyIdle)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			// The server ending it says why in the close frame (going away:
			// re-attach later; policy: the key was revoked).
			if b, ok := streamEnd(ctx, r); ok {
				code := websocket.StatusGoingAway
				if b.Error.Code == api.CodeUnauthenticated {
					code = websocket.StatusPolicyViolation
				}
				cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Second)
				go func() { <-cctx.Done(); conn.CloseNow() }()
				conn.Close(code, b.Error.Message)
				ccancel()
			} else {
				conn.CloseNow()
			}
			<-inputDone
			return nil
		}
		if !ok {
			pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
			err := conn.Ping(pctx)
			pcancel()
			if err != nil {
				conn.CloseNow()
				<-inputDone
				return nil
			}
			continue
		}
		if ev.Type == exec.EventExit {
			b, _ := json.Marshal(map[string]any{"exit": ev.Result})
			wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
			conn.Write(wctx, websocket.MessageText, b)
			wcancel()
			continue // io.EOF comes next
		}
		if err := conn.Write(ctx, websocket.MessageBinary, ev.Data); err != nil {
			conn.CloseNow()
			<-inputDone
			return nil
		}
	}
	conn.Close(websocket.StatusNormalClosure, "exited")
	cancel()
	<-inputDone
	return nil
}

// isWebSocketHandshake reports whether r asks for a WebSocket upgrade
// (RFC 6455 §4.2.1, what websocket.Accept checks besides the origin).
func isWebSocketHandshake(r *http.Request) bool {
	return r.Method == http.MethodGet && r.ProtoAtLeast(1, 1) &&
		headerHasToken(r.Header, "Connection", "upgrade") && headerHasToken(r.Header, "Upgrade", "websocket") &&
		r.Header.Get("Sec-WebSocket-Version") == "13" && r.Header.Get("Sec-WebSocket-Key") != ""
}

// headerHasToken reports whether the comma-separated header name holds
// token (case-insensitively).
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}
