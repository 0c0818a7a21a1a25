// Command airlock-agent runs inside a sandbox (usually as PID 1) and serves the agent protocol to the airlock daemon.
package main

import (
	// First: the agent is non-dumpable before anything else of it runs
	// (see the package).
	_ "github.com/airlockhq/airlock/internal/agent/nodump"

	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agent"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "airlock-agent:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("airlock-agent", flag.ContinueOnError)
	listen := fs.String("listen", "", "listen on `unix:/path/agent.sock` and serve every connection")
	stdio := fs.Bool("stdio", false, "serve one session on stdin/stdout")
	fdNum := fs.Int("fd", -1, "serve the inherited socket `fd`: every connection if it is a listening (or bound) socket, else one session")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	logMax := fs.Int64("log-max", defaultLogMax, "when stderr is a file, empty it once it would pass `bytes` (0: never)")
	spare := fs.Int("spare-threads", spareThreads, "make `n` OS threads at start and keep them idle (see spareThreads; 0 where a failed thread creation ends the whole sandbox anyway: gVisor)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *showVersion {
		fmt.Println(version)
		return nil
	}
	if *listen == "" && !*stdio && *fdNum < 0 {
		return errors.New("one of --listen, --stdio, --fd is required")
	}
	if *stdio && *fdNum >= 0 {
		return errors.New("--stdio and --fd are exclusive")
	}
	if *spare < 0 {
		return errors.New("--spare-threads must not be negative")
	}
	prewarmThreads(*spare)
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	// Logs go to stderr: stdout may be the protocol stream.
	var logw io.Writer = os.Stderr
	if w := capLog(os.Stderr, *logMax); w != nil {
		logw = w
	}
	log := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: level}))

	// The inherited socket is taken before anything else runs: it must be
	// close-on-exec before the server can start a process.
	var listeners []net.Listener
	var conn net.Conn
	if *fdNum >= 0 {
		ln, err := fdListener(*fdNum)
		if err != nil {
			return err
		}
		if ln != nil {
			listeners = append(listeners, ln)
		}
	}
	if *stdio || (*fdNum >= 0 && len(listeners) == 0) {
		c, err := sessionConn(*stdio, *fdNum)
		if err != nil {
			return err
		}
		conn = c
	}
	var own net.Listener // the --listen one
	if *listen != "" {
		ln, err := listenUnix(*listen)
		if err != nil {
			for _, l := range listeners {
				l.Close()
			}
			return err
		}
		own = ln
	}

	srv := agent.NewServer(agent.Config{Subreaper: true, Logger: log, Version: version})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	var wg sync.WaitGroup
	sessionDone := make(chan struct{})
	if conn != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(sessionDone)
			if err := srv.ServeConn(ctx, conn); err != nil && !errors.Is(err, context.Canceled) {
				log.Warn("session ended", "err", err)
			}
		}()
	}
	for _, ln := range listeners {
		log.Info("agent listening", "addr", ln.Addr().String(), "pid", os.Getpid(), "version", version)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-ctx.Done()
			ln.Close()
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			acceptLoop(ctx, ln, srv, log)
		}()
	}
	if own != nil {
		log.Info("agent listening", "addr", own.Addr().String(), "pid", os.Getpid(), "version", version)
		wg.Add(1)
		go func() {
			defer wg.Done()
			serveDroppable(ctx, own, *listen, srv, log)
		}()
	}
	// With only a single session, its end is the agent's end: nobody can
	// reconnect to a socketpair or stdio.
	if len(listeners) == 0 && own == nil {
		select {
		case <-ctx.Done():
		case <-sessionDone:
		}
	} else {
		<-ctx.Done()
	}
	stop()
	log.Info("agent stopping")
	// Close kills every exec's tree; bound it so a stuck teardown cannot
	// keep a PID 1 (and so the sandbox) alive forever.
	closed := make(chan struct{})
	go func() { srv.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(15 * time.Second):
		log.Warn("shutdown timed out")
		return nil
	}
	wg.Wait()
	return nil
}

// Signals of serveDroppable: the sandbox's runtime (the daemon, through
// `runsc kill`) sends them to the agent around a checkpoint.
const (
	sigDrop   = syscall.SIGUSR1 // close every connection and the listener, remove the socket
	sigListen = syscall.SIGUSR2 // listen again at the same path
)

// serveDroppable serves every connection on ln, the agent's own socket at
// addr, until ctx ends; on sigDrop it closes every connection it accepted
// and the listener, and once it holds no socket any more it removes the
// socket file, which tells the sender it is done; on sigListen it listens
// at addr again.
//
// gVisor checkpoints no socket bound or connected on the host (its
// --host-uds sockets, which is what the daemon dials), so the daemon asks
// the agent to hold none while it checkpoints the sandbox and to listen
// again once the sandbox is restored. Execs outlive their connections, so
// nothing else stops. A process inside may send these too, as it may kill
// the agent: it harms only its own sandbox, until a sigListen or the
// agent's next start.
func serveDroppable(ctx context.Context, ln net.Listener, addr string, srv *agent.Server, log *slog.Logger) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, sigDrop, sigListen)
	defer signal.Stop(sig)
	for {
		lctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			acceptLoop(lctx, ln, srv, log)
		}()
		dropped := false
		for !dropped && ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case s := <-sig:
				if s != sigDrop {
					continue
				}
				// runsc cannot save a TCP connection, and a save that
				// fails ends the sandbox: refuse while one is open.
				if n := connectedTCP(); n > 0 {
					log.Warn("not closing the agent socket for a checkpoint: TCP connections are open", "connections", n)
					if err := refuseDrop(addr); err != nil {
						log.Warn("answering the checkpoint's signal", "err", err)
					}
					continue
				}
				dropped = true
			}
		}
		cancel() // acceptLoop closes the connections, then ln
		<-done
		if !dropped {
			return
		}
		// A closed connection's descriptor goes once the goroutines
		// parked on it return; the socket file's removal is the answer,
		// so it waits for them (and then removes it in a dir the
		// daemon opened for that).
		waitNoSockets(time.Second)
		if err := os.Remove(strings.TrimPrefix(addr, "unix:")); err != nil {
			log.Warn("removing the agent socket", "err", err)
		}
		log.Info("agent closed its socket")
		// Told to listen again by sigListen or by the daemon's file
		// beside the socket (listenAgainName), which the restored agent
		// sees without the daemon's signal: a restore is one runtime
		// call the fewer.
		again := filepath.Join(filepath.Dir(strings.TrimPrefix(addr, "unix:")), listenAgainName)
		poll := time.NewTicker(2 * time.Millisecond)
		ln = nil
		for ln == nil {
			select {
			case <-ctx.Done():
				poll.Stop()
				return
			case <-poll.C:
				if _, err := os.Lstat(again); err != nil {
					continue
				}
			case s := <-sig:
				if s != sigListen {
					continue
				}
			}
			os.Remove(again)
			l, err := listenUnix(addr)
			if err != nil {
				log.Error("listening again", "err", err)
				time.Sleep(100 * time.Millisecond)
				continue
			}
			ln = l
			log.Info("agent listening again", "addr", l.Addr().String())
		}
		poll.Stop()
	}
}

// listenAgainName is the file the daemon makes beside the agent's socket
// to have an agent that closed it listen again.
const listenAgainName = "listen-again"

// dropRefusedName is the file the agent makes beside its socket when it
// refuses a sigDrop; the daemon removes it.
const dropRefusedName = "checkpoint-refused"

// refuseDrop tells the sender of a sigDrop that the agent keeps its socket.
func refuseDrop(addr string) error {
	p := filepath.Join(filepath.Dir(strings.TrimPrefix(addr, "unix:")), dropRefusedName)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	return f.Close()
}

// connectedTCP counts the sandbox's TCP sockets in a connected state
// (established or closing: every state but listen and close) in
// /proc/net/tcp and tcp6.
func connectedTCP() int {
	n := 0
	for _, p := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		lines := strings.Split(string(b), "\n")
		for _, l := range lines[min(1, len(lines)):] {
			f := strings.Fields(l)
			if len(f) < 4 {
				continue
			}
			switch f[3] {
			case "07", "0A": // close, listen
			default:
				n++
			}
		}
	}
	return n
}

// waitNoSockets waits, up to d, until the agent holds no socket
// descriptor.
func waitNoSockets(d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			return
		}
		n := 0
		for _, e := range ents {
			if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
				n++
			}
		}
		if n == 0 {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// acceptLoop serves every connection on ln until ctx ends, when it closes
// the connections it accepted, then ln, and waits for their sessions.
func acceptLoop(ctx context.Context, ln net.Listener, srv *agent.Server, log *slog.Logger) {
	var wg sync.WaitGroup
	defer wg.Wait()
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		ln.Close()
	})
	defer stop()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			log.Error("accept failed", "err", err)
			// Do not spin on a persistent error (EMFILE).
			time.Sleep(100 * time.Millisecond)
			continue
		}
		mu.Lock()
		if ctx.Err() != nil {
			mu.Unlock()
			conn.Close()
			return
		}
		conns[conn] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { mu.Lock(); delete(conns, conn); mu.Unlock() }()
			log.Debug("session started")
			if err := srv.ServeConn(ctx, conn); err != nil && !errors.Is(err, context.Canceled) {
				log.Warn("session ended", "err", err)
			}
			conn.Close()
		}()
	}
}

// listenUnix listens on "unix:/path". A stale socket file from an earlier
// agent is replaced; the new one is mode 0600 (the host daemon connects as
// real root, which needs no permission bits).
func listenUnix(addr string) (net.Listener, error) {
	p, ok := strings.CutPrefix(addr, "unix:")
	if !ok || p == "" {
		return nil, fmt.Errorf("--listen %q: want unix:/path", addr)
	}
	if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(p)
	}
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", p)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listening: %w", err)
	}
	if err := os.Chmod(p, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("listening: %w", err)
	}
	return ln, nil
}

// listenBacklog is the queue of connections not yet accepted: the daemon
// holds one connection per sandbox and reconnects rarely.
const listenBacklog = 64

// fdListener returns a listener on the inherited socket fd if it is a
// stream socket that listens, or one that is bound but neither listening nor
// connected (the daemon may leave listen to the agent); nil for anything
// else (a connected socket, a pipe), which is one session.
//
// The agent calls listen itself in both cases: the kernel takes the peer
// credentials a client reads with SO_PEERCRED from whoever last called
// listen, so the daemon, which made the socket, then sees this agent (its
// pid and its user namespace's root) and can check that it is talking to
// the sandbox's init, not to itself. The inherited descriptor is replaced
// by a close-on-exec duplicate: an exec that inherited it could accept the
// daemon's connections in the agent's place.
func fdListener(fd int) (net.Listener, error) {
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if errors.Is(err, unix.ENOTSOCK) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("--fd %d: %w", fd, err)
	}
	if typ != unix.SOCK_STREAM && typ != unix.SOCK_SEQPACKET {
		return nil, nil
	}
	accepting, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	if err != nil {
		return nil, fmt.Errorf("--fd %d: %w", fd, err)
	}
	if accepting == 0 {
		if _, err := unix.Getpeername(fd); err == nil {
			return nil, nil // connected: one session
		}
		sa, err := unix.Getsockname(fd)
		if err != nil {
			return nil, fmt.Errorf("--fd %d: %w", fd, err)
		}
		if ua, ok := sa.(*unix.SockaddrUnix); !ok || ua.Name == "" {
			return nil, nil // unbound: nothing could ever connect to it
		}
	}
	if err := unix.Listen(fd, listenBacklog); err != nil {
		return nil, fmt.Errorf("--fd %d: listening: %w", fd, err)
	}
	f := os.NewFile(uintptr(fd), "agent-listener")
	ln, err := net.FileListener(f) // a close-on-exec duplicate
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("--fd %d: %w", fd, err)
	}
	return ln, nil
}

// defaultLogMax bounds the agent's log file: the agent logs its own
// troubles, never sandbox output, and the file (the sandbox's stderr, opened
// by the daemon) lives on the host outside the sandbox's disk quota.
const defaultLogMax = 1 << 20

// capLog returns a writer to f that empties f before a write would take it
// past max bytes, or nil if f is not a regular file or max is 0. The daemon
// trims the file too, but only every so often: the cap here holds between
// its passes, whatever makes the agent log.
func capLog(f *os.File, max int64) io.Writer {
	if max <= 0 {
		return nil
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	return &cappedFile{f: f, max: max}
}

// cappedFile is a log file kept under max bytes.
type cappedFile struct {
	mu  sync.Mutex
	f   *os.File
	max int64
}

func (w *cappedFile) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if fi, err := w.f.Stat(); err == nil && fi.Size()+int64(len(p)) > w.max {
		// The daemon opens the log O_APPEND; the seek covers a file that
		// is not, so the next line does not land past a hole.
		if err := w.f.Truncate(0); err == nil {
			_, _ = w.f.Seek(0, io.SeekStart)
		}
	}
	return w.f.Write(p)
}

// sessionConn returns the connection of --stdio or --fd. A socket becomes a
// real net.Conn; pipes (stdio from a runtime) are wrapped.
func sessionConn(stdio bool, fd int) (net.Conn, error) {
	if fd < 0 {
		fd = 0
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("session fd %d: %w", fd, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFSOCK {
		// A socket (a socketpair end) carries both directions.
		f := os.NewFile(uintptr(fd), "agent-conn")
		conn, err := net.FileConn(f) // dups the fd
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("session fd %d: %w", fd, err)
		}
		return conn, nil
	}
	if !stdio {
		return nil, fmt.Errorf("--fd %d is not a socket", fd)
	}
	// Pipes may arrive blocking or not; own non-blocking duplicates put
	// both directions in Go's poller either way.
	r, err := pollableDup(0)
	if err != nil {
		return nil, err
	}
	w, err := pollableDup(1)
	if err != nil {
		r.Close()
		return nil, err
	}
	return &pipeConn{r: r, w: w}, nil
}

func pollableDup(fd int) (*os.File, error) {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup fd %d: %w", fd, err)
	}
	if err := unix.SetNonblock(nfd, true); err != nil {
		unix.Close(nfd)
		return nil, fmt.Errorf("fd %d: %w", fd, err)
	}
	return os.NewFile(uintptr(nfd), "stdio"), nil
}

// pipeConn is a net.Conn over separate read and write files (stdio pipes).
type pipeConn struct {
	r    io.ReadCloser
	w    io.WriteCloser
	once sync.Once
}

func (c *pipeConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *pipeConn) Write(p []byte) (int, error) { return c.w.Write(p) }
func (c *pipeConn) Close() error {
	c.once.Do(func() { c.r.Close(); c.w.Close() })
	return nil
}
func (c *pipeConn) LocalAddr() net.Addr                { return stdioAddr{} }
func (c *pipeConn) RemoteAddr() net.Addr               { return stdioAddr{} }
func (c *pipeConn) SetDeadline(t time.Time) error      { return nil }
func (c *pipeConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *pipeConn) SetWriteDeadline(t time.Time) error { return nil }

type stdioAddr struct{}

func (stdioAddr) Network() string { return "stdio" }
func (stdioAddr) String() string  { return "stdio" }

// spareThreads is how many OS threads the agent creates at start and keeps
// idle. Threads count against the sandbox's PID limit, so under a fork bomb
// clone(2) fails for everyone, the agent included; the Go runtime treats a
// failed thread creation as fatal, and the agent is PID 1. With idle threads
// already made, the runtime reuses them instead of creating new ones while
// the bomb runs, and the agent stays alive to end it (timeout, signal).
// Under gVisor a sandbox that runs out of tasks loses its whole user-space
// kernel, the agent with it, so its driver asks for none (--spare-threads
// 0): there each thread costs the start a host stub thread.
const spareThreads = 12

// prewarmThreads makes the runtime create n OS threads (each goroutine
// holds its own locked thread until all exist) and then releases them to the
// runtime's idle list, where they stay for reuse.
func prewarmThreads(n int) {
	var held, done sync.WaitGroup
	release := make(chan struct{})
	held.Add(n)
	done.Add(n)
	for range n {
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			held.Done()
			<-release
			runtime.UnlockOSThread()
		}()
	}
	held.Wait()
	close(release)
	done.Wait()
}
