package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agent/nodump"
	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/testutil"
)

// TestMain doubles as the agent: the tests start this binary with
// AIRLOCK_AGENT_MAIN=1 instead of building the command.
func TestMain(m *testing.M) {
	if os.Getenv("AIRLOCK_AGENT_MAIN") == "1" {
		if err := run(os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, "airlock-agent:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// TestNonDumpable: the built agent is non-dumpable as it runs, even from a
// binary its user may read (which the kernel alone would leave dumpable):
// its /proc files belong to root, not to the user it runs as, so no other
// process of that user can read or write its memory. (This test binary
// itself imports nodump and would prove nothing.)
func TestNonDumpable(t *testing.T) {
	if d, err := nodump.Dumpable(); err != nil || d {
		t.Fatalf("nodump.Dumpable: %v, %v", d, err)
	}
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(testutil.BuildAgent(t))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "airlock-agent")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	const nobody = 65534
	cmd := exec.Command(bin, "--stdio")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	stdin, err := cmd.StdinPipe() // held open: the agent waits for a session
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	environ := fmt.Sprintf("/proc/%d/environ", cmd.Process.Pid)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var st unix.Stat_t
		if err := unix.Stat(environ, &st); err != nil {
			t.Fatal(err)
		}
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", cmd.Process.Pid))
		if exe == bin && st.Uid == 0 {
			return // non-dumpable: the kernel gives its /proc files to root
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent (running %s as uid %d) still owns %s: it is dumpable", exe, nobody, environ)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startAgent runs the agent binary with args; the test kills it at the end.
func startAgent(t *testing.T, args []string, setup func(*exec.Cmd)) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "AIRLOCK_AGENT_MAIN=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if setup != nil {
		setup(cmd)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		if t.Failed() {
			t.Logf("agent stderr:\n%s", stderr.String())
		}
	})
	return cmd
}

func dialAgent(t *testing.T, sock string) *agentclient.Client {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := net.Dial("unix", sock)
		if err == nil {
			c, err := agentclient.New(conn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent never listened: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// me is the user the tests run as; the agent runs execs as it.
func me(t *testing.T) string {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	return u.Username
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && b[i+2] != 'Z'
}

// zombieChildren lists zombies whose parent is pid.
func zombieChildren(pid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
		if len(f) > 1 && f[0] == "Z" && f[1] == strconv.Itoa(pid) {
			out = append(out, p)
		}
	}
	return out
}

func waitExit(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for alive(cmd.Process.Pid) {
		if time.Now().After(deadline) {
			t.Fatal("agent did not exit")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestListenReconnectAndShutdown(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	cmd := startAgent(t, []string{"--listen", "unix:" + sock}, nil)
	ctx := ctxT(t)

	first := dialAgent(t, sock)
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v %v", fi.Mode(), err)
	}
	s, err := first.Exec(ctx, agentproto.ExecRequest{ID: "ex_a", User: me(t), StdinOpen: true, Shell: "echo $$; read x; echo after"})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := s.Next()
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(ev.Data)))
	first.Close() // the daemon restarts

	second := dialAgent(t, sock)
	if h := second.Agent(); h.Pid != cmd.Process.Pid {
		t.Fatalf("hello %+v", h)
	}
	if err := second.WriteStdin(ctx, "ex_a", []byte("\n")); err != nil {
		t.Fatal(err)
	}
	res, err := second.Wait(ctx, "ex_a")
	if err != nil || res.Status != agentproto.StatusExited {
		t.Fatalf("wait %+v %v", res, err)
	}
	a, err := second.Attach(ctx, "ex_a", 0)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	for {
		ev, err := a.Next()
		if err != nil {
			break
		}
		out.Write(ev.Data)
	}
	if out.String() != fmt.Sprintf("%d\nafter\n", pid) {
		t.Fatalf("replayed %q", out.String())
	}

	// Orphans come to the agent (a subreaper) and are reaped.
	if r, err := second.Wait(ctx, mustExec(t, second, agentproto.ExecRequest{ID: "ex_orphan", User: me(t), Shell: "sleep 0.2 &"})); err != nil || r.Status != agentproto.StatusExited {
		t.Fatalf("orphan exec %+v %v", r, err)
	}
	time.Sleep(500 * time.Millisecond)
	if z := zombieChildren(cmd.Process.Pid); len(z) > 0 {
		t.Fatalf("zombies left: %v", z)
	}

	// SIGTERM: the agent kills running execs and exits.
	s2, err := second.Exec(ctx, agentproto.ExecRequest{ID: "ex_long", User: me(t), Shell: "echo $$; exec sleep 1000"})
	if err != nil {
		t.Fatal(err)
	}
	ev, err = s2.Next()
	if err != nil {
		t.Fatal(err)
	}
	longPid, _ := strconv.Atoi(strings.TrimSpace(string(ev.Data)))
	s2.Close()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitExit(t, cmd)
	if alive(longPid) {
		t.Fatalf("exec pid %d survived the agent", longPid)
	}
	if _, err := os.Stat(sock); err == nil {
		// net.UnixListener removes its socket file on Close.
		t.Fatal("socket file left behind")
	}
}

func mustExec(t *testing.T, c *agentclient.Client, req agentproto.ExecRequest) string {
	t.Helper()
	s, err := c.Exec(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	return req.ID
}

// pipeClientConn is the client's net.Conn over the agent's stdio pipes.
type pipeClientConn struct {
	io.Reader
	io.WriteCloser
}

func (c pipeClientConn) LocalAddr() net.Addr              { return &net.UnixAddr{} }
func (c pipeClientConn) RemoteAddr() net.Addr             { return &net.UnixAddr{} }
func (c pipeClientConn) SetDeadline(time.Time) error      { return nil }
func (c pipeClientConn) SetReadDeadline(time.Time) error  { return nil }
func (c pipeClientConn) SetWriteDeadline(time.Time) error { return nil }

func socketFiles(t *testing.T) (*os.File, *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return os.NewFile(uintptr(fds[0]), "ours"), os.NewFile(uintptr(fds[1]), "agents")
}

func TestSingleSessionModes(t *testing.T) {
	tests := []struct {
		name  string
		start func(t *testing.T) (net.Conn, *exec.Cmd)
	}{
		{"stdio_socket", func(t *testing.T) (net.Conn, *exec.Cmd) {
			ours, theirs := socketFiles(t)
			cmd := startAgent(t, []string{"--stdio"}, func(c *exec.Cmd) { c.Stdin, c.Stdout = theirs, theirs })
			theirs.Close()
			conn, err := net.FileConn(ours)
			ours.Close()
			if err != nil {
				t.Fatal(err)
			}
			return conn, cmd
		}},
		{"stdio_pipes", func(t *testing.T) (net.Conn, *exec.Cmd) {
			var in io.WriteCloser
			var out io.Reader
			cmd := startAgent(t, []string{"--stdio"}, func(c *exec.Cmd) {
				var err error
				if in, err = c.StdinPipe(); err != nil {
					t.Fatal(err)
				}
				if out, err = c.StdoutPipe(); err != nil {
					t.Fatal(err)
				}
			})
			return pipeClientConn{Reader: out, WriteCloser: in}, cmd
		}},
		{"fd", func(t *testing.T) (net.Conn, *exec.Cmd) {
			ours, theirs := socketFiles(t)
			cmd := startAgent(t, []string{"--fd", "3"}, func(c *exec.Cmd) { c.ExtraFiles = []*os.File{theirs} })
			theirs.Close()
			conn, err := net.FileConn(ours)
			ours.Close()
			if err != nil {
				t.Fatal(err)
			}
			return conn, cmd
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, cmd := tt.start(t)
			c, err := agentclient.New(conn)
			if err != nil {
				t.Fatal(err)
			}
			ctx := ctxT(t)
			s, err := c.Exec(ctx, agentproto.ExecRequest{ID: "ex_1", User: me(t), Argv: []string{"echo", "hi"}})
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			for {
				ev, err := s.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				out.Write(ev.Data)
			}
			if out.String() != "hi\n" {
				t.Fatalf("got %q", out.String())
			}
			// With a single session, its end is the agent's end.
			c.Close()
			waitExit(t, cmd)
		})
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{}, {"--stdio", "--fd", "3"}, {"--listen", "tcp:1.2.3.4:5"}, {"--log-level", "loud", "--stdio"}, {"--spare-threads", "-1", "--stdio"}} {
		t.Run(strings.Join(args, "_"), func(t *testing.T) {
			cmd := exec.Command(os.Args[0], args...)
			cmd.Env = append(os.Environ(), "AIRLOCK_AGENT_MAIN=1")
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Fatalf("want a failing exit, got %v: %s", err, out)
			}
		})
	}
}

// TestFdListener: a socket the daemon made and handed over as --fd, bound or
// already listening, is served connection after connection; whoever
// connects sees the agent as the peer (it listens itself), and no exec
// inherits the socket.
func TestFdListener(t *testing.T) {
	for _, tc := range []struct {
		name      string
		listening bool // the daemon called listen before handing it over
	}{
		{"bound", false},
		{"listening", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "agent.sock")
			fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			f := os.NewFile(uintptr(fd), "listener")
			defer f.Close()
			if err := unix.Bind(fd, &unix.SockaddrUnix{Name: sock}); err != nil {
				t.Fatal(err)
			}
			if tc.listening {
				if err := unix.Listen(fd, 8); err != nil {
					t.Fatal(err)
				}
			}
			cmd := startAgent(t, []string{"--fd", "3"}, func(c *exec.Cmd) { c.ExtraFiles = []*os.File{f} })
			f.Close() // the agent's copy is the only one now

			for i := range 2 { // the daemon restarts between sessions
				c := dialAgent(t, sock)
				if h := c.Agent(); h.Pid != cmd.Process.Pid {
					t.Fatalf("session %d: hello %+v", i, h)
				}
				conn, err := net.Dial("unix", sock)
				if err != nil {
					t.Fatal(err)
				}
				raw, _ := conn.(*net.UnixConn).SyscallConn()
				var cred *unix.Ucred
				raw.Control(func(fd uintptr) { cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
				conn.Close()
				if err != nil || int(cred.Pid) != cmd.Process.Pid {
					t.Fatalf("session %d: peer credentials %+v (%v), want the agent's pid %d", i, cred, err, cmd.Process.Pid)
				}
				// The exec's own descriptors: its stdio and the one ls
				// opens to list them, never the agent's listening socket.
				r, err := c.Wait(ctxT(t), mustExec(t, c, agentproto.ExecRequest{ID: "ex_fds" + strconv.Itoa(i), User: me(t),
					Shell: "for f in /proc/self/fd/*; do readlink $f; done | grep -c socket: >&2; exit 0"}))
				if err != nil || r.Status != agentproto.StatusExited {
					t.Fatalf("exec %+v %v", r, err)
				}
				a, err := c.Attach(ctxT(t), "ex_fds"+strconv.Itoa(i), 0)
				if err != nil {
					t.Fatal(err)
				}
				var out bytes.Buffer
				for {
					ev, err := a.Next()
					if err != nil {
						break
					}
					out.Write(ev.Data)
				}
				if strings.TrimSpace(out.String()) != "0" {
					t.Fatalf("an exec holds %q sockets, want none", out.String())
				}
				c.Close()
			}
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			waitExit(t, cmd)
		})
	}
}

// TestLogCap: with stderr on a file, the agent's log never grows past
// --log-max, whatever makes it log.
func TestLogCap(t *testing.T) {
	const logMax = 4096
	logPath := filepath.Join(t.TempDir(), "agent.log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	ours, theirs := socketFiles(t)
	startAgent(t, []string{"--fd", "3", "--log-level", "debug", "--log-max", strconv.Itoa(logMax)}, func(c *exec.Cmd) {
		c.ExtraFiles = []*os.File{theirs}
		c.Stderr = logf
	})
	theirs.Close()
	conn, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		t.Fatal(err)
	}
	c, err := agentclient.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Every exec logs a line at debug level: far more than logMax in all.
	var peak int64
	for i := range 200 {
		id := "ex_" + strconv.Itoa(i) + "_" + strings.Repeat("x", 64)
		if _, err := c.Wait(ctxT(t), mustExec(t, c, agentproto.ExecRequest{ID: id, User: me(t), Argv: []string{"true"}})); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(logPath); err == nil {
			peak = max(peak, fi.Size())
		}
	}
	if peak == 0 {
		t.Fatal("the agent logged nothing: the test proves nothing")
	}
	if peak > logMax {
		t.Errorf("agent.log reached %d bytes, cap %d", peak, logMax)
	}
}
