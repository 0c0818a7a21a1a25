// Package agent is airlock-agent's server: it runs inside a sandbox and serves exec and file operations over the agent protocol.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// Config configures a Server. The zero value is usable.
type Config struct {
	// PasswdFile and GroupFile are the user databases (default /etc/passwd,
	// /etc/group); tests point them at fixtures.
	PasswdFile string
	GroupFile  string
	// DefaultUser runs requests that name no user (default "user").
	DefaultUser string
	// Root is the directory file operations are confined to (default "/").
	// In production the agent's "/" is the sandbox root; tests use a temp
	// dir. Confinement is the kernel's (openat2 RESOLVE_IN_ROOT), so "/" is
	// not a weaker mode. Exec is not affected.
	Root string
	// Subreaper makes the agent reap every child with wait4(-1) and, when it
	// is not PID 1, marks it a child subreaper so that orphans of execs come
	// to it. The agent binary sets it; a host process embedding the server
	// may leave it off when other code in the process waits for its own
	// children (then only the agent's own children are waited for). It is
	// forced on when the process is PID 1.
	Subreaper bool
	// Logger receives the agent's logs (default: discard). Sandbox output is
	// never logged.
	Logger *slog.Logger
	// Version is reported in the handshake.
	Version string
	// OOMCounterFile is the cgroup file with the "oom_kill N" counter of the
	// sandbox's memory cgroup. Default: the v1 memory.oom_control or the v2
	// memory.events under /sys/fs/cgroup, whichever is readable; none means
	// no OOM detection in the agent.
	OOMCounterFile string
}

// Server serves agent sessions. One Server holds the exec table shared by all
// its sessions, so a client that reconnects finds its execs again.
type Server struct {
	cfg         Config
	log         *slog.Logger
	defaultUser string
	passwdFile  string
	groupFile   string
	euid        uint32
	oomFile     string
	fs          *fsRoot
	fsErr       error
	users       userDB

	reaper    *reaper
	reaperErr error
	execs     execTable
	bg        sync.WaitGroup // follow and stdin goroutines
	watches   watchSlots

	startMu sync.RWMutex // held for reading while an exec starts

	mu       sync.Mutex
	closed   bool
	sessions map[*yamux.Session]struct{}
	conns    map[net.Conn]struct{} // connections not yet a session, and direct ones
	closeErr error
	once     sync.Once
}

// NewServer returns a Server for cfg.
func NewServer(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg:         cfg,
		log:         cfg.Logger,
		defaultUser: cfg.DefaultUser,
		passwdFile:  cfg.PasswdFile,
		groupFile:   cfg.GroupFile,
		euid:        uint32(os.Geteuid()),
		sessions:    make(map[*yamux.Session]struct{}),
		conns:       make(map[net.Conn]struct{}),
		execs:       execTable{byID: make(map[string]*execProc)},
	}
	if s.defaultUser == "" {
		s.defaultUser = agentproto.DefaultUser
	}
	if s.passwdFile == "" {
		s.passwdFile = "/etc/passwd"
	}
	if s.groupFile == "" {
		s.groupFile = "/etc/group"
	}
	root := cfg.Root
	if root == "" {
		root = "/"
	}
	s.fs, s.fsErr = openFSRoot(root)
	if s.fsErr != nil {
		s.log.Error("opening file root", "root", root, "err", s.fsErr)
	}
	s.oomFile = cfg.OOMCounterFile
	if s.oomFile == "" {
		s.oomFile = findOOMFile()
	}
	s.reaper, s.reaperErr = acquireReaper(cfg.Subreaper)
	if s.reaperErr != nil && cfg.Subreaper {
		// Without the subreaper bit orphans go to the real init; execs
		// still work.
		s.log.Warn("becoming subreaper failed; reaping own children only", "err", s.reaperErr)
		s.reaper, s.reaperErr = acquireReaper(false)
	}
	if s.reaperErr != nil {
		s.log.Error("starting reaper", "err", s.reaperErr)
	}
	return s
}

func (s *Server) closing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// ServeConn serves one session on conn and returns when conn closes (nil) or
// ctx ends (its error). Execs outlive the session. A connection that opens
// with agentproto.DirectPreamble is a direct connection instead: it serves
// that one request and ends.
func (s *Server) ServeConn(ctx context.Context, conn net.Conn) error {
	first, err := s.firstByte(ctx, conn)
	if err != nil {
		conn.Close()
		if errors.Is(err, errServerClosed) {
			return err
		}
		return ctx.Err() // the peer left before a word
	}
	if first == agentproto.DirectPreamble[0] {
		return s.serveDirect(ctx, conn)
	}
	return s.serveSession(ctx, &replayConn{Conn: conn, first: []byte{first}})
}

// serveSession serves a yamux session on conn.
func (s *Server) serveSession(ctx context.Context, conn net.Conn) error {
	sess, err := yamux.Server(conn, agentproto.YamuxConfig())
	if err != nil {
		conn.Close()
		return fmt.Errorf("starting session: %w", err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		sess.Close()
		return errServerClosed
	}
	s.sessions[sess] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.sessions, sess)
		s.mu.Unlock()
	}()

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(sctx, func() { sess.Close() })
	defer stop()
	var wg sync.WaitGroup
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.handle(sctx, st)
		}()
	}
	cancel()
	sess.Close()
	wg.Wait()
	return ctx.Err()
}

// Close kills every running exec's process tree, ends every session and waits
// for the exec goroutines and the reaper.
func (s *Server) Close() error {
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		sessions := make([]*yamux.Session, 0, len(s.sessions))
		for sess := range s.sessions {
			sessions = append(sessions, sess)
		}
		conns := make([]net.Conn, 0, len(s.conns))
		for c := range s.conns {
			conns = append(conns, c)
		}
		s.mu.Unlock()
		for _, sess := range sessions {
			sess.Close()
		}
		for _, c := range conns {
			c.Close()
		}
		// Wait for execs being started; later ones see closed and refuse.
		s.startMu.Lock()
		//lint:ignore SA2001 an empty critical section is the barrier
		s.startMu.Unlock()
		var wg sync.WaitGroup
		for _, e := range s.execs.running() {
			if e.pid == 0 {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				killTree(e.pid, e.since, e.marker)
			}()
		}
		wg.Wait()
		s.bg.Wait()
		if s.reaper != nil {
			releaseReaper(s.reaper)
		}
		if s.fs != nil {
			s.fs.close()
		}
	})
	return s.closeErr
}

// stream carries one request: a yamux stream of a session, or a whole
// direct connection (*directConn).
type stream interface {
	io.ReadWriteCloser
	SetDeadline(time.Time) error
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

// handle serves one stream: one request.
func (s *Server) handle(ctx context.Context, st stream) {
	defer st.Close()
	var fr *agentproto.FrameReader
	if dc, ok := st.(*directConn); ok {
		// Unbuffered, so that file data can be spliced off the socket.
		fr = agentproto.NewFrameReaderUnbuffered(dc.Conn)
	} else {
		fr = agentproto.NewFrameReader(st)
	}
	fw := agentproto.NewFrameWriter(st)
	var req agentproto.Request
	if err := fr.ReadJSON(&req); err != nil {
		return
	}
	resp, err := s.dispatch(ctx, st, fr, fw, &req)
	if errors.Is(err, errHandled) {
		return
	}
	if err != nil {
		resp = agentproto.Response{Error: s.protoError(req.Op, err)}
	}
	_ = fw.WriteJSON(&resp)
}

// errHandled tells handle that the op wrote its own answer.
var errHandled = errors.New("handled")

func (s *Server) dispatch(ctx context.Context, st stream, fr *agentproto.FrameReader, fw *agentproto.FrameWriter, req *agentproto.Request) (agentproto.Response, error) {
	switch req.Op {
	case agentproto.OpHello:
		return agentproto.Response{Hello: &agentproto.Hello{
			Version: agentproto.ProtocolVersion, Agent: s.cfg.Version, Pid: os.Getpid(),
			Features: []string{agentproto.FeatureDirect, agentproto.FeatureReadTar},
		}}, nil
	case agentproto.OpPing:
		return agentproto.Response{}, nil
	case agentproto.OpExec:
		if req.Exec == nil {
			return agentproto.Response{}, invalid("exec request is missing")
		}
		if s.reaper == nil {
			return agentproto.Response{}, fmt.Errorf("no reaper: %w", s.reaperErr)
		}
		e, err := s.startExec(req.Exec)
		if err != nil {
			return agentproto.Response{}, err
		}
		s.log.Debug("exec started", "exec_id", e.id, "pid", e.pid, "user", e.info.User)
		if err := fw.WriteJSON(&agentproto.Response{}); err != nil {
			return agentproto.Response{}, errHandled
		}
		s.streamEvents(ctx, st, fr, fw, e, 0)
		return agentproto.Response{}, errHandled
	case agentproto.OpAttach:
		e, err := s.execs.get(req.ExecID)
		if err != nil {
			return agentproto.Response{}, err
		}
		if req.FromOffset < 0 {
			return agentproto.Response{}, invalid("from_offset is negative")
		}
		if err := fw.WriteJSON(&agentproto.Response{}); err != nil {
			return agentproto.Response{}, errHandled
		}
		s.streamEvents(ctx, st, fr, fw, e, req.FromOffset)
		return agentproto.Response{}, errHandled
	case agentproto.OpWait:
		e, err := s.execs.get(req.ExecID)
		if err != nil {
			return agentproto.Response{}, err
		}
		gone, stop := watchPeer(st, fr)
		defer stop()
		select {
		case <-e.done:
			res := e.resultNow()
			return agentproto.Response{Result: &res}, nil
		case <-gone:
			return agentproto.Response{}, errHandled
		case <-ctx.Done():
			return agentproto.Response{}, errHandled
		}
	case agentproto.OpStdin:
		return s.handleStdin(ctx, fr, fw, req)
	case agentproto.OpSignal:
		sig, err := parseSignal(req.Signal)
		if err != nil {
			return agentproto.Response{}, invalid(err.Error())
		}
		e, err := s.execs.get(req.ExecID)
		if err != nil {
			return agentproto.Response{}, err
		}
		s.log.Debug("exec signal", "exec_id", e.id, "signal", signalName(sig))
		e.signal(sig)
		return agentproto.Response{}, nil
	case agentproto.OpResize:
		e, err := s.execs.get(req.ExecID)
		if err != nil {
			return agentproto.Response{}, err
		}
		if req.Cols == 0 || req.Rows == 0 {
			return agentproto.Response{}, invalid("cols and rows must be positive")
		}
		e.mu.Lock()
		m := e.pty
		ended := e.ended
		e.mu.Unlock()
		if m == nil {
			return agentproto.Response{}, invalid("exec has no pty")
		}
		if ended {
			return agentproto.Response{}, invalid("exec has ended")
		}
		if err := resizePTY(m, req.Cols, req.Rows); err != nil {
			return agentproto.Response{}, invalid("exec has ended")
		}
		return agentproto.Response{}, nil
	case agentproto.OpListExecs:
		return agentproto.Response{Execs: s.execs.list()}, nil
	case agentproto.OpReadFile, agentproto.OpWriteFile, agentproto.OpStat, agentproto.OpList,
		agentproto.OpMkdir, agentproto.OpMove, agentproto.OpRemove, agentproto.OpTarOut, agentproto.OpTarIn:
		return s.handleFile(ctx, st, fr, fw, req)
	case agentproto.OpWatch:
		return s.handleWatch(ctx, st, fr, fw, req)
	default:
		return agentproto.Response{}, &agentproto.Error{Code: agentproto.CodeUnsupported, Message: fmt.Sprintf("unknown op %q", req.Op)}
	}
}

// watchPeer reads the stream in the background for ops where the client sends
// nothing more: EOF or an error means the client went away. Then it fails
// pending writes at once (the client no longer reads them). stop ends the
// watcher and waits for it.
func watchPeer(st stream, fr *agentproto.FrameReader) (gone <-chan struct{}, stop func()) {
	ch := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		for {
			if _, _, err := fr.Next(); err != nil {
				break
			}
		}
		close(ch)
		_ = st.SetWriteDeadline(time.Unix(1, 0))
	}()
	return ch, func() {
		_ = st.SetReadDeadline(time.Unix(1, 0))
		<-exited
	}
}

// streamEvents sends e's output from offset from on, following it live, then
// the exit event.
func (s *Server) streamEvents(ctx context.Context, st stream, fr *agentproto.FrameReader, fw *agentproto.FrameWriter, e *execProc, from int64) {
	gone, stop := watchPeer(st, fr)
	defer stop()
	cur := outCursor{pos: from}
	var pieces []piece
	var pace *time.Timer
	defer func() {
		if pace != nil {
			pace.Stop()
		}
	}()
	for {
		var closed, capped bool
		var changed <-chan struct{}
		pieces, closed, capped, changed = e.log.read(&cur, agentproto.DataChunk, pieces[:0])
		sent := 0
		for _, p := range pieces {
			if err := fw.WriteOutput(p.stream, p.off, p.data); err != nil {
				return
			}
			sent += len(p.data)
		}
		if closed {
			res := e.resultNow()
			_ = fw.WriteJSON(&agentproto.Event{Type: agentproto.EventExit, Offset: cur.pos, Result: &res})
			return
		}
		if capped {
			// Past the cap the log keeps only a tail: send what it holds
			// at a bounded pace (or at the end), not each write.
			wait := max(agentproto.FollowInterval, time.Duration(sent)*time.Second/agentproto.FollowRate)
			if pace == nil {
				pace = time.NewTimer(wait)
			} else {
				pace.Reset(wait)
			}
			select {
			case <-pace.C:
			case <-e.log.done:
			case <-gone:
				return
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-changed:
		case <-gone:
			return
		case <-ctx.Done():
			return
		}
	}
}

// handleStdin takes data frames for an exec's stdin.
func (s *Server) handleStdin(ctx context.Context, fr *agentproto.FrameReader, fw *agentproto.FrameWriter, req *agentproto.Request) (agentproto.Response, error) {
	e, err := s.execs.get(req.ExecID)
	if err != nil {
		return agentproto.Response{}, err
	}
	if err := fw.WriteJSON(&agentproto.Response{}); err != nil {
		return agentproto.Response{}, errHandled
	}
	for {
		t, p, err := fr.Next()
		if err != nil {
			return agentproto.Response{}, errHandled
		}
		switch t {
		case agentproto.FrameData:
			if err := e.writeStdin(ctx, p); err != nil {
				return agentproto.Response{}, err
			}
		case agentproto.FrameEnd:
			if req.EOF {
				e.closeStdin()
			}
			return agentproto.Response{}, nil
		default:
			return agentproto.Response{}, invalid("unexpected frame")
		}
	}
}

func invalid(msg string) error {
	return &agentproto.Error{Code: agentproto.CodeInvalidArgument, Message: msg}
}

// protoError classifies err for the wire. Unclassified errors are logged and
// sent as "internal" without detail.
func (s *Server) protoError(op agentproto.Op, err error) *agentproto.Error {
	var pe *agentproto.Error
	if errors.As(err, &pe) {
		return pe
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return &agentproto.Error{Code: agentproto.CodeInternal, Message: "request cancelled"}
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if code := errnoCode(errno); code != "" {
			return &agentproto.Error{Code: code, Message: errno.Error()}
		}
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return &agentproto.Error{Code: agentproto.CodeInvalidArgument, Message: "unexpected end of data"}
	}
	s.log.Warn("request failed", "op", string(op), "err", err)
	return &agentproto.Error{Code: agentproto.CodeInternal, Message: "internal error"}
}

// errnoCode maps a file system errno to a wire code.
func errnoCode(errno syscall.Errno) string {
	switch errno {
	case syscall.ENOENT:
		return agentproto.CodeNotFound
	case syscall.EEXIST:
		return agentproto.CodeAlreadyExists
	case syscall.ENOTDIR:
		return agentproto.CodeNotADirectory
	case syscall.EISDIR:
		return agentproto.CodeIsADirectory
	case syscall.EACCES, syscall.EPERM, syscall.EROFS:
		return agentproto.CodePermissionDenied
	case syscall.ENOSPC, syscall.EDQUOT:
		return agentproto.CodeNoSpace
	case syscall.EFBIG, syscall.ENAMETOOLONG:
		return agentproto.CodeTooLarge
	case syscall.EINVAL, syscall.ELOOP, syscall.EXDEV, syscall.EBUSY, syscall.ENOTEMPTY:
		return agentproto.CodeInvalidArgument
	}
	return ""
}

// findOOMFile returns the file whose oom_kill counter tells that the kernel
// OOM-killed a process of the sandbox's memory cgroup, or "".
func findOOMFile() string {
	for _, p := range []string{"/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"} {
		if _, ok := readOOMKills(p); ok {
			return p
		}
	}
	return ""
}

func (s *Server) oomKills() (int64, bool) {
	if s.oomFile == "" {
		return 0, false
	}
	return readOOMKills(s.oomFile)
}

// readOOMKills reads the "oom_kill N" line of a cgroup file.
func readOOMKills(p string) (int64, bool) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
