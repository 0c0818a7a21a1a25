package agentclient_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agent"
	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func socketPair(tb testing.TB) (net.Conn, net.Conn) {
	tb.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "sp")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			tb.Fatal(err)
		}
		conns[i] = c
	}
	return conns[0], conns[1]
}

// startAgent runs a real agent in-process (as root inside a temp file root)
// and returns a client and the agent's end of the connection.
func startAgent(tb testing.TB) (*agentclient.Client, net.Conn) {
	tb.Helper()
	root := tb.TempDir()
	// A user with the test's own uid: the tests run as root or not.
	passwd := filepath.Join(tb.TempDir(), "passwd")
	line := fmt.Sprintf("tester:x:%d:%d::/:/bin/sh\n", os.Geteuid(), os.Getegid())
	if err := os.WriteFile(passwd, []byte(line), 0o644); err != nil {
		tb.Fatal(err)
	}
	srv := agent.NewServer(agent.Config{Root: root, PasswdFile: passwd, DefaultUser: "tester", Subreaper: true})
	a, b := socketPair(tb)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.ServeConn(context.Background(), b)
	}()
	c, err := agentclient.New(a)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		c.Close()
		<-done
		srv.Close()
	})
	return c, b
}

// fakeAgent serves a session with handler answering each request frame.
func fakeAgent(tb testing.TB, handler func(req agentproto.Request) agentproto.Response) net.Conn {
	tb.Helper()
	a, b := socketPair(tb)
	sess, err := yamux.Server(b, agentproto.YamuxConfig())
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			st, err := sess.AcceptStream()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer st.Close()
				fr, fw := agentproto.NewFrameReader(st), agentproto.NewFrameWriter(st)
				var req agentproto.Request
				if err := fr.ReadJSON(&req); err != nil {
					return
				}
				resp := handler(req)
				_ = fw.WriteJSON(&resp)
			}()
		}
	}()
	tb.Cleanup(func() {
		sess.Close()
		wg.Wait()
	})
	return a
}

func ctxT(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

func TestHandshake(t *testing.T) {
	t.Run("real_agent", func(t *testing.T) {
		c, _ := startAgent(t)
		if h := c.Agent(); h.Version != agentproto.ProtocolVersion || h.Pid != os.Getpid() {
			t.Fatalf("hello %+v", h)
		}
	})
	t.Run("version_mismatch", func(t *testing.T) {
		conn := fakeAgent(t, func(req agentproto.Request) agentproto.Response {
			return agentproto.Response{Hello: &agentproto.Hello{Version: 99}}
		})
		_, err := agentclient.New(conn)
		if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "99") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("peer_closes", func(t *testing.T) {
		a, b := socketPair(t)
		b.Close()
		start := time.Now()
		_, err := agentclient.New(a)
		if !errors.Is(err, errdefs.ErrUnavailable) {
			t.Fatalf("err = %v", err)
		}
		if time.Since(start) > 5*time.Second {
			t.Fatal("handshake with a closed peer was slow")
		}
	})
}

func TestErrorClasses(t *testing.T) {
	tests := []struct {
		code string
		want error
	}{
		{agentproto.CodeNotFound, errdefs.ErrNotFound},
		{agentproto.CodeAlreadyExists, errdefs.ErrAlreadyExists},
		{agentproto.CodeNotADirectory, errdefs.ErrInvalidArgument},
		{agentproto.CodeIsADirectory, errdefs.ErrInvalidArgument},
		{agentproto.CodeInvalidArgument, errdefs.ErrInvalidArgument},
		{agentproto.CodePermissionDenied, errdefs.ErrPermissionDenied},
		{agentproto.CodeNoSpace, errdefs.ErrQuotaExceeded},
		{agentproto.CodeTooLarge, errdefs.ErrTooLarge},
		{agentproto.CodeInternal, errdefs.ErrInternal},
		{"something_new", errdefs.ErrInternal},
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			conn := fakeAgent(t, func(req agentproto.Request) agentproto.Response {
				if req.Op == agentproto.OpHello {
					return agentproto.Response{Hello: &agentproto.Hello{Version: agentproto.ProtocolVersion}}
				}
				return agentproto.Response{Error: &agentproto.Error{Code: tt.code, Message: "short message"}}
			})
			c, err := agentclient.New(conn)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, err = c.Stat(ctxT(t), "/x", "")
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			var pe *agentproto.Error
			if !errors.As(err, &pe) || pe.Code != tt.code || !strings.Contains(err.Error(), "short message") {
				t.Fatalf("err = %v, want the agent's code and message", err)
			}
		})
	}
}

func TestDroppedConnection(t *testing.T) {
	c, agentEnd := startAgent(t)
	ctx := ctxT(t)
	s, err := c.Exec(ctx, agentproto.ExecRequest{ID: "ex_drop", Argv: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	agentEnd.Close()
	start := time.Now()
	if _, err := s.Next(); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Next: %v", err)
	}
	calls := map[string]func() error{
		"ping": func() error { return c.Ping(ctx) },
		"exec": func() error {
			_, err := c.Exec(ctx, agentproto.ExecRequest{ID: "ex_2", Argv: []string{"true"}})
			return err
		},
		"wait":  func() error { _, err := c.Wait(ctx, "ex_drop"); return err },
		"write": func() error { _, err := c.WriteFile(ctx, "/f", "", 0, strings.NewReader("x"), 0); return err },
		"read":  func() error { _, _, err := c.ReadFile(ctx, "/f", ""); return err },
		"list":  func() error { _, err := c.ListExecs(ctx); return err },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			if err := call(); !errors.Is(err, errdefs.ErrUnavailable) {
				t.Fatalf("err = %v, want unavailable", err)
			}
		})
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("failing took %v", time.Since(start))
	}
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed")
	}
}

func TestContextCancel(t *testing.T) {
	c, _ := startAgent(t)
	ctx := ctxT(t)
	s, err := c.Exec(ctx, agentproto.ExecRequest{ID: "ex_long", Shell: "echo up; exec sleep 1000"})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := s.Next(); err != nil || string(ev.Data) != "up\n" {
		t.Fatalf("first event %+v %v", ev, err)
	}
	s.Close()

	t.Run("wait", func(t *testing.T) {
		wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := c.Wait(wctx, "ex_long")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v", err)
		}
		if time.Since(start) > 2*time.Second {
			t.Fatal("cancel was slow")
		}
	})
	t.Run("attach_stream", func(t *testing.T) {
		actx, cancel := context.WithCancel(ctx)
		a, err := c.Attach(actx, "ex_long", 0)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		if _, err := a.Next(); err != nil {
			t.Fatal(err)
		}
		time.AfterFunc(20*time.Millisecond, cancel)
		if _, err := a.Next(); !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("read_file", func(t *testing.T) {
		if _, err := c.WriteFile(ctx, "/big", "", 0, bytes.NewReader(make([]byte, 32<<20)), 0); err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		rc, _, err := c.ReadFile(rctx, "/big", "")
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		buf := make([]byte, 1024)
		if _, err := io.ReadFull(rc, buf); err != nil {
			t.Fatal(err)
		}
		cancel()
		if _, err := io.Copy(io.Discard, rc); !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("already_cancelled", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if err := c.Ping(cctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v", err)
		}
	})
	// The session is still healthy and the exec still runs.
	list, err := c.ListExecs(ctx)
	if err != nil || len(list) != 1 || list[0].Status != agentproto.StatusRunning {
		t.Fatalf("list %+v %v", list, err)
	}
	if err := c.Signal(ctx, "ex_long", "KILL"); err != nil {
		t.Fatal(err)
	}
	if res, err := c.Wait(ctx, "ex_long"); err != nil || res.Status != agentproto.StatusKilled {
		t.Fatalf("wait %+v %v", res, err)
	}
}

func TestConcurrentUse(t *testing.T) {
	c, _ := startAgent(t)
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 8 {
				id := fmt.Sprintf("ex_c%d_%d", g, i)
				s, err := c.Exec(ctx, agentproto.ExecRequest{ID: id, Argv: []string{"echo", id}})
				if err != nil {
					errs <- err
					return
				}
				var out bytes.Buffer
				for {
					ev, err := s.Next()
					if err == io.EOF {
						break
					}
					if err != nil {
						errs <- err
						return
					}
					out.Write(ev.Data)
				}
				if out.String() != id+"\n" {
					errs <- fmt.Errorf("exec %s printed %q", id, out.String())
				}
				p := fmt.Sprintf("/g%d/f%d", g, i)
				data := bytes.Repeat([]byte(id), 1000+i*777)
				if _, err := c.WriteFile(ctx, p, "", 0, bytes.NewReader(data), 0); err != nil {
					errs <- err
					return
				}
				rc, _, err := c.ReadFile(ctx, p, "")
				if err != nil {
					errs <- err
					return
				}
				back, err := io.ReadAll(rc)
				rc.Close()
				if err != nil || !bytes.Equal(back, data) {
					errs <- fmt.Errorf("file %s: %v", p, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func BenchmarkExecEcho(b *testing.B) {
	c, _ := startAgent(b)
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		s, err := c.Exec(ctx, agentproto.ExecRequest{ID: fmt.Sprintf("ex_b%d", i), Argv: []string{"/bin/echo", "hi"}})
		if err != nil {
			b.Fatal(err)
		}
		for {
			ev, err := s.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			if ev.Type == agentproto.EventExit && ev.Result.ExitCode != 0 {
				b.Fatalf("result %+v", ev.Result)
			}
		}
	}
}

// BenchmarkForkExecEcho is the baseline for BenchmarkExecEcho: a plain local
// fork/exec/wait of the same command with its output on a pipe.
func BenchmarkForkExecEcho(b *testing.B) {
	for b.Loop() {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			b.Fatal(err)
		}
		pid, err := syscallForkExec("/bin/echo", []string{"/bin/echo", "hi"}, p[1])
		unix.Close(p[1])
		if err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, 64)
		for {
			n, err := unix.Read(p[0], buf)
			if n <= 0 || err != nil {
				break
			}
		}
		unix.Close(p[0])
		var ws unix.WaitStatus
		if _, err := unix.Wait4(pid, &ws, 0, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkWriteFile100MiB(b *testing.B) {
	c, _ := startAgent(b)
	ctx := context.Background()
	data := make([]byte, 100<<20)
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.WriteFile(ctx, "/bench", "", 0, bytes.NewReader(data), 0); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadFile100MiB(b *testing.B) {
	c, _ := startAgent(b)
	ctx := context.Background()
	data := make([]byte, 100<<20)
	if _, err := c.WriteFile(ctx, "/bench", "", 0, bytes.NewReader(data), 0); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for b.Loop() {
		rc, _, err := c.ReadFile(ctx, "/bench", "")
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil || n != int64(len(data)) {
			b.Fatalf("read %d %v", n, err)
		}
	}
}

// TestDownloadCalls checks what Download asks of the agent: one read_file
// with tar of an agent that serves it, whatever the path turns out to be;
// an older agent's Stat first, then TarOut or ReadFile.
func TestDownloadCalls(t *testing.T) {
	dir := agentproto.FileInfo{Name: "d", Path: "/d", Type: agentproto.FileTypeDir, Mode: 0o755}
	for _, tt := range []struct {
		name     string
		features []string
		want     string
	}{
		{"read_tar", []string{agentproto.FeatureReadTar}, "read_file(tar)"},
		{"older_agent", nil, "stat tar_out"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var mu sync.Mutex
			var ops []string
			conn := fakeAgent(t, func(req agentproto.Request) agentproto.Response {
				if req.Op == agentproto.OpHello {
					return agentproto.Response{Hello: &agentproto.Hello{Version: agentproto.ProtocolVersion, Features: tt.features}}
				}
				op := string(req.Op)
				if req.Tar {
					op += "(tar)"
				}
				mu.Lock()
				ops = append(ops, op)
				mu.Unlock()
				return agentproto.Response{File: &dir}
			})
			c, err := agentclient.New(conn)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			rc, fi, err := c.Download(ctxT(t), "/d", "")
			if err != nil {
				t.Fatal(err)
			}
			rc.Close()
			mu.Lock()
			defer mu.Unlock()
			if got := strings.Join(ops, " "); got != tt.want || fi.Type != agentproto.FileTypeDir {
				t.Errorf("calls %q, want %q; info %+v", got, tt.want, fi)
			}
		})
	}
	t.Run("no_info", func(t *testing.T) {
		conn := fakeAgent(t, func(req agentproto.Request) agentproto.Response {
			if req.Op == agentproto.OpHello {
				return agentproto.Response{Hello: &agentproto.Hello{Version: agentproto.ProtocolVersion, Features: []string{agentproto.FeatureReadTar}}}
			}
			return agentproto.Response{}
		})
		c, err := agentclient.New(conn)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// Whether the data is a tar stream is the info's to say.
		if _, _, err := c.Download(ctxT(t), "/d", ""); !errors.Is(err, agentclient.ErrProtocol) {
			t.Fatalf("err = %v", err)
		}
	})
}
