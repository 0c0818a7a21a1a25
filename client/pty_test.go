package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/airlockhq/airlock/api"
)

// fakePTY plays GET …/pty: binary frames are echoed upper-cased, a resize
// text frame is answered with "COLSxROWS" as output, "exit" ends the session
// with an exit frame and a normal close.
func fakePTY(t *testing.T, gotQuery chan<- string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer ak_test" {
			writeAPIError(w, 401, api.CodeUnauthenticated, "missing key")
			return
		}
		if r.URL.Path != "/v1/sandboxes/sbx_1/pty" {
			writeAPIError(w, 404, api.CodeSandboxNotFound, "sandbox not found")
			return
		}
		gotQuery <- r.URL.RawQuery
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.CloseNow()
		ctx := r.Context()
		for {
			typ, b, err := conn.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageText {
				var rs api.PTYResize
				if err := json.Unmarshal(b, &rs); err != nil {
					conn.Close(websocket.StatusPolicyViolation, "bad control frame")
					return
				}
				out := []byte(string(rune('0'+rs.Resize.Cols/10)) + string(rune('0'+rs.Resize.Cols%10)) + "x" +
					string(rune('0'+rs.Resize.Rows/10)) + string(rune('0'+rs.Resize.Rows%10)))
				conn.Write(ctx, websocket.MessageBinary, out)
				continue
			}
			if string(b) == "exit" {
				code := 7
				ctl, _ := json.Marshal(map[string]any{"exit": api.ExecResult{ID: "ex_p", ExitCode: &code, Status: api.ExecExited}})
				conn.Write(ctx, websocket.MessageText, ctl)
				conn.Close(websocket.StatusNormalClosure, "")
				return
			}
			conn.Write(ctx, websocket.MessageBinary, bytes.ToUpper(b))
		}
	})
}

func TestPTY(t *testing.T) {
	q := make(chan string, 1)
	c := newTestClient(t, fakePTY(t, q))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := c.PTY(ctx, "sbx_1", PTYOptions{Cols: 100, Rows: 30, Cmd: []string{"/bin/bash", "-l"}, User: "root", Cwd: "/tmp"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if got := <-q; got != "cmd=%2Fbin%2Fbash&cmd=-l&cols=100&cwd=%2Ftmp&rows=30&user=root" {
		t.Errorf("query = %q", got)
	}
	read := func(n int) string {
		buf := make([]byte, n)
		if _, err := io.ReadFull(p, buf); err != nil {
			t.Fatalf("read: %v", err)
		}
		return string(buf)
	}
	if _, err := p.Write([]byte("ls -l\r")); err != nil {
		t.Fatal(err)
	}
	// Read in pieces smaller than a message: the rest must not be lost.
	if got := read(3) + read(3); got != "LS -L\r" {
		t.Errorf("echo = %q", got)
	}
	if err := p.Resize(42, 17); err != nil {
		t.Fatal(err)
	}
	if got := read(5); got != "42x17" {
		t.Errorf("resize answer = %q", got)
	}
	if p.ExitResult() != nil {
		t.Error("exit result before exit")
	}
	p.Write([]byte("exit"))
	if n, err := p.Read(make([]byte, 10)); err != io.EOF {
		t.Fatalf("read after exit = %d, %v; want io.EOF", n, err)
	}
	res := p.ExitResult()
	if res == nil || res.ExitCode == nil || *res.ExitCode != 7 {
		t.Errorf("ExitResult = %+v", res)
	}
	if err := p.Close(); err != nil {
		t.Errorf("Close after server close: %v", err)
	}
}

func TestPTYErrors(t *testing.T) {
	q := make(chan string, 1)
	srv := fakePTY(t, q)
	c := newTestClient(t, srv)
	_, err := c.PTY(context.Background(), "sbx_nope", PTYOptions{})
	if !errors.Is(err, ErrNotFound) {
		t.Errorf("PTY on a missing sandbox: %v, want ErrNotFound", err)
	}
	anon := newTestClient(t, srv)
	anon.apiKey = ""
	if _, err := anon.PTY(context.Background(), "sbx_1", PTYOptions{}); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("PTY without key: %v, want ErrUnauthenticated", err)
	}
}

func TestPTYClientClose(t *testing.T) {
	q := make(chan string, 1)
	c := newTestClient(t, fakePTY(t, q))
	p, err := c.PTY(context.Background(), "sbx_1", PTYOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := <-q; got != "" {
		t.Errorf("query without options = %q, want empty (server defaults)", got)
	}
	done := make(chan error, 1)
	go func() {
		_, err := p.Read(make([]byte, 8))
		done <- err
	}()
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	select {
	case err := <-done:
		if err != io.EOF {
			t.Errorf("blocked Read after Close = %v, want io.EOF", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Read still blocked after Close")
	}
}
