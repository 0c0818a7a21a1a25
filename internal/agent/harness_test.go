package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agent"
	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// socketPair returns two connected unix stream sockets as net.Conns.
func socketPair(t testing.TB) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "sp")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	return conns[0], conns[1]
}

// env is an in-process agent with a connected client.
type env struct {
	t    testing.TB
	srv  *agent.Server
	c    *agentclient.Client
	home string // the test user's home
	root string // file root ("" = "/")
	done chan error
}

// fixture writes passwd and group files for users root and user (uid 1000,
// also in group "extra" 1500) and returns the config pointing at them.
func fixture(t testing.TB) (agent.Config, string) {
	t.Helper()
	dir := t.TempDir()
	// uid 1000 must reach its home inside the test's temp dir.
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	home := filepath.Join(dir, "home", "user")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(home, 1000, 1000); err != nil {
			t.Fatal(err)
		}
	}
	passwd := filepath.Join(dir, "passwd")
	group := filepath.Join(dir, "group")
	me := "user"
	uid := 1000
	if os.Geteuid() != 0 {
		uid = os.Geteuid()
	}
	writeFile(t, passwd, fmt.Sprintf("root:x:0:0:root:/root:/bin/sh\n%s:x:%d:%d:User:%s:/bin/sh\nnohome:x:1001:1001::/nonexistent:/bin/sh\n", me, uid, uid, home))
	writeFile(t, group, "root:x:0:\nuser:x:1000:\nextra:x:1500:user,other\n")
	return agent.Config{PasswdFile: passwd, GroupFile: group, Subreaper: true}, home
}

func writeFile(t testing.TB, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func newEnv(t testing.TB, mod ...func(*agent.Config)) *env {
	t.Helper()
	cfg, home := fixture(t)
	for _, m := range mod {
		m(&cfg)
	}
	a, b := socketPair(t)
	srv := agent.NewServer(cfg)
	e := &env{t: t, srv: srv, home: home, root: cfg.Root, done: make(chan error, 1)}
	go func() { e.done <- srv.ServeConn(context.Background(), b) }()
	c, err := agentclient.New(a)
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	t.Cleanup(func() {
		c.Close()
		select {
		case <-e.done:
		case <-time.After(10 * time.Second):
			t.Error("ServeConn did not return after the client closed")
		}
		srv.Close()
	})
	return e
}

// connect opens one more client session to the same server.
func (e *env) connect() *agentclient.Client {
	e.t.Helper()
	a, b := socketPair(e.t)
	done := make(chan error, 1)
	go func() { done <- e.srv.ServeConn(context.Background(), b) }()
	c, err := agentclient.New(a)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		c.Close()
		<-done
	})
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// collected is an exec's events gathered from a stream.
type collected struct {
	stdout, stderr, pty strings.Builder
	events              []agentproto.Event
	result              agentproto.ExecResult
}

func collect(t testing.TB, s *agentclient.Stream) *collected {
	t.Helper()
	defer s.Close()
	c := &collected{}
	gotExit := false
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		c.events = append(c.events, ev)
		switch ev.Type {
		case agentproto.EventOutput:
			switch ev.Stream {
			case agentproto.StreamStdout:
				c.stdout.Write(ev.Data)
			case agentproto.StreamStderr:
				c.stderr.Write(ev.Data)
			case agentproto.StreamPTY:
				c.pty.Write(ev.Data)
			}
		case agentproto.EventExit:
			gotExit = true
			c.result = *ev.Result
		}
	}
	if !gotExit {
		t.Fatal("stream ended without an exit event")
	}
	return c
}

func (e *env) run(req agentproto.ExecRequest) *collected {
	e.t.Helper()
	if req.ID == "" {
		req.ID = newID()
	}
	s, err := e.c.Exec(ctxT(e.t), req)
	if err != nil {
		e.t.Fatalf("Exec: %v", err)
	}
	return collect(e.t, s)
}

var idSeq int

func newID() string {
	idSeq++
	return fmt.Sprintf("ex_%d_%d", time.Now().UnixNano(), idSeq)
}
