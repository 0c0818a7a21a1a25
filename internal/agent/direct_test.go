package agent_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agent"
	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
)

// serve runs srv on one end of a new socketpair and returns the other end
// and ServeConn's result.
func serve(t *testing.T, srv *agent.Server) (net.Conn, <-chan error) {
	t.Helper()
	a, b := socketPair(t)
	done := make(chan error, 1)
	go func() { done <- srv.ServeConn(context.Background(), b) }()
	t.Cleanup(func() { a.Close() })
	return a, done
}

func waitDone(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("ServeConn did not return")
		return nil
	}
}

func TestHelloOffersDirect(t *testing.T) {
	e := newEnv(t)
	if !slices.Contains(e.c.Agent().Features, agentproto.FeatureDirect) {
		t.Fatalf("hello %+v does not offer direct connections", e.c.Agent())
	}
}

// TestDirectConnection speaks the direct protocol by hand: one request per
// connection, the same frames as on a stream, and the connection closed
// after the answer.
func TestDirectConnection(t *testing.T) {
	cfg, _ := fixture(t)
	cfg.Root = t.TempDir()
	srv := agent.NewServer(cfg)
	t.Cleanup(func() { srv.Close() })
	data := bytes.Repeat([]byte("direct!"), 300000) // two direct frames

	conn, done := serve(t, srv)
	fw, fr := agentproto.NewFrameWriter(conn), agentproto.NewFrameReader(conn)
	if _, err := io.WriteString(conn, agentproto.DirectPreamble); err != nil {
		t.Fatal(err)
	}
	if err := fw.WriteJSON(&agentproto.Request{Op: agentproto.OpWriteFile, Path: "/up.bin", User: "root"}); err != nil {
		t.Fatal(err)
	}
	var resp agentproto.Response
	if err := fr.ReadJSON(&resp); err != nil || resp.Error != nil {
		t.Fatalf("ready %+v %v", resp, err)
	}
	if _, err := fw.CopyFrom(bytes.NewReader(data), agentproto.DirectChunk); err != nil {
		t.Fatal(err)
	}
	if err := fw.WriteEnd(); err != nil {
		t.Fatal(err)
	}
	if err := fr.ReadJSON(&resp); err != nil || resp.Error != nil || resp.Written != int64(len(data)) {
		t.Fatalf("final %+v %v", resp, err)
	}
	if _, _, err := fr.Next(); err != io.EOF {
		t.Fatalf("after the answer: %v, want the connection closed", err)
	}
	if err := waitDone(t, done); err != nil {
		t.Fatalf("ServeConn = %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(cfg.Root, "up.bin")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("file differs (%d bytes, %v)", len(got), err)
	}

	// A download announces the size, then sends exactly that.
	conn, done = serve(t, srv)
	fw, fr = agentproto.NewFrameWriter(conn), agentproto.NewFrameReader(conn)
	io.WriteString(conn, agentproto.DirectPreamble)
	if err := fw.WriteJSON(&agentproto.Request{Op: agentproto.OpReadFile, Path: "/up.bin", User: "root"}); err != nil {
		t.Fatal(err)
	}
	if err := fr.ReadJSON(&resp); err != nil || resp.File == nil || resp.File.Size != int64(len(data)) {
		t.Fatalf("read response %+v %v", resp, err)
	}
	var got []byte
	for {
		typ, p, err := fr.Next()
		if err != nil {
			t.Fatal(err)
		}
		if typ == agentproto.FrameEnd {
			break
		}
		if typ != agentproto.FrameData || len(p) > agentproto.DirectChunk {
			t.Fatalf("frame %q of %d bytes", typ, len(p))
		}
		got = append(got, p...)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("download differs: %d bytes", len(got))
	}
	waitDone(t, done)
}

// TestNotAProtocol checks that a connection that opens with neither yamux
// nor the direct preamble is dropped without an answer, and one that sends
// nothing ends with the peer.
func TestNotAProtocol(t *testing.T) {
	cfg, _ := fixture(t)
	srv := agent.NewServer(cfg)
	t.Cleanup(func() { srv.Close() })
	tests := []struct {
		name string
		send string
	}{
		{"wrong_preamble", "AIRLOCK-DIRECT/9\n"},
		{"short_preamble", "AIR"},
		{"nothing", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, done := serve(t, srv)
			io.WriteString(conn, tt.send)
			if uc, ok := conn.(*net.UnixConn); ok {
				uc.CloseWrite()
			}
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			if b, err := io.ReadAll(conn); err != nil || len(b) != 0 {
				t.Fatalf("answer %q %v, want a silent close", b, err)
			}
			waitDone(t, done)
		})
	}
	// The server still serves sessions.
	e := newEnv(t)
	if err := e.c.Ping(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// TestCloseEndsWaitingConnections checks that Close ends a connection that
// has not said a word yet, and that ServeConn after Close refuses.
func TestCloseEndsWaitingConnections(t *testing.T) {
	cfg, _ := fixture(t)
	srv := agent.NewServer(cfg)
	_, done := serve(t, srv)
	time.Sleep(20 * time.Millisecond) // let it wait for the first byte
	srv.Close()
	waitDone(t, done)
	_, done = serve(t, srv)
	if err := waitDone(t, done); err == nil {
		t.Fatal("ServeConn after Close did not refuse")
	}
}

// TestDirectCancelledByContext checks that ServeConn's context ends a
// direct connection whose client stalls in the middle of an upload, and
// that the half upload leaves no file.
func TestDirectCancelledByContext(t *testing.T) {
	cfg, _ := fixture(t)
	cfg.Root = t.TempDir()
	srv := agent.NewServer(cfg)
	t.Cleanup(func() { srv.Close() })
	a, b := socketPair(t)
	t.Cleanup(func() { a.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.ServeConn(ctx, b) }()
	fw, fr := agentproto.NewFrameWriter(a), agentproto.NewFrameReader(a)
	io.WriteString(a, agentproto.DirectPreamble)
	fw.WriteJSON(&agentproto.Request{Op: agentproto.OpWriteFile, Path: "/half", User: "root"})
	var resp agentproto.Response
	if err := fr.ReadJSON(&resp); err != nil {
		t.Fatal(err)
	}
	fw.WriteHeader(agentproto.FrameData, 100)
	a.Write([]byte("only part of it"))
	cancel()
	if err := waitDone(t, done); !errors.Is(err, context.Canceled) {
		t.Fatalf("ServeConn = %v, want context.Canceled", err)
	}
	ents, _ := os.ReadDir(cfg.Root)
	if len(ents) != 0 {
		t.Fatalf("a broken upload left %v", ents)
	}
}

// TestSessionAndDirectTogether runs a client with a dialer against the
// server: file transfers go direct while execs use the session.
func TestSessionAndDirectTogether(t *testing.T) {
	cfg, _ := fixture(t)
	cfg.Root = t.TempDir()
	srv := agent.NewServer(cfg)
	t.Cleanup(func() { srv.Close() })
	first, _ := serve(t, srv)
	dials := 0
	c, err := agentclient.New(first, agentclient.WithDialer(func(context.Context) (net.Conn, error) {
		dials++
		conn, _ := serve(t, srv)
		return conn, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := ctxT(t)
	if _, err := c.WriteFile(ctx, "/f", "root", 0, bytes.NewReader([]byte("x")), 0); err != nil {
		t.Fatal(err)
	}
	if out := runShell(t, c, "cat "+filepath.Join(cfg.Root, "f")); out != "x" {
		t.Fatalf("exec saw %q", out)
	}
	if dials != 1 {
		t.Fatalf("%d direct connections, want 1 (the upload only)", dials)
	}
}

func runShell(t *testing.T, c *agentclient.Client, shell string) string {
	t.Helper()
	s, err := c.Exec(ctxT(t), agentproto.ExecRequest{ID: "ex_sh", Shell: shell, User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out []byte
	for {
		ev, err := s.Next()
		if err == io.EOF {
			return string(out)
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ev.Data...)
	}
}
