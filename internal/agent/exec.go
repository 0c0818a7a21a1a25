package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
)

const (
	// killGrace is how long a tree gets between SIGTERM and SIGKILL on
	// timeout: enough for a well-behaved program to flush and exit, short
	// enough that a timeout is still a timeout.
	killGrace = 500 * time.Millisecond
	// drainGrace is how long output is still read after the main process
	// exited. Its own output is already in the pipe and arrives at once; a
	// background child that inherited the pipe can keep it open forever, and
	// the exec must still end. 100 ms covers output in flight from
	// short-lived helpers without making every such exec noticeably slower.
	drainGrace = 100 * time.Millisecond
	// keepFinished and keepFinishedFor bound how many finished execs stay
	// for re-attach and listing: the newest 256, none older than 10 minutes
	// (pruned whenever an exec starts or ends). Their logs live in the
	// agent's memory, which is charged to the sandbox.
	keepFinished    = 256
	keepFinishedFor = 10 * time.Minute
	// oomScoreAdj makes the kernel's OOM killer prefer user processes to
	// the agent (whose own score the host lowers).
	oomScoreAdj = "500"
	// maxTimeoutMS bounds an exec's timeout (a year) so the duration cannot
	// overflow.
	maxTimeoutMS = 365 * 24 * 3600 * 1000
	// readBufSize is the pipe read size: a pipe holds 64 KiB by default;
	// half of it per read keeps syscalls few without wasting memory.
	readBufSize = 32 << 10
)

// defaultPath is the PATH of every exec unless its request sets one.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// execProc is one exec: its process, output log and result.
type execProc struct {
	id     string
	info   agentproto.ExecInfo // immutable after start except Status/EndedAt (under mu)
	marker []byte              // "AIRLOCK_EXEC_ID=<id>"
	pid    int
	since  uint64 // a bound on the main process's start time (clock ticks after boot)
	// created is when the exec was requested.
	created time.Time
	log     *outLog
	done    chan struct{} // closed when the result is final

	stdinMu sync.Mutex
	stdin   *os.File // pipe to the process, or the PTY master; nil when closed
	pty     *os.File // PTY master (also in stdin), for resize

	mu             sync.Mutex
	result         agentproto.ExecResult
	clientSignaled bool
	timedOut       bool
	ended          bool
}

// snapshotInfo returns the exec's listing entry.
func (e *execProc) snapshotInfo() agentproto.ExecInfo {
	e.mu.Lock()
	defer e.mu.Unlock()
	info := e.info
	if e.ended {
		info.Status = e.result.Status
		info.EndedAt = e.result.EndedAt
	}
	return info
}

// resultNow returns the final result; only valid after done is closed.
func (e *execProc) resultNow() agentproto.ExecResult {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.result
}

// execTable holds running and recently finished execs.
type execTable struct {
	mu       sync.Mutex
	byID     map[string]*execProc
	order    []*execProc     // by start
	starting map[string]bool // ids reserved by execs being started
}

func (t *execTable) get(id string) (*execProc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byID[id]
	if !ok {
		return nil, &agentproto.Error{Code: agentproto.CodeNotFound, Message: fmt.Sprintf("exec %q not found", id)}
	}
	return e, nil
}

func (t *execTable) list() []agentproto.ExecInfo {
	t.mu.Lock()
	order := append([]*execProc(nil), t.order...)
	t.mu.Unlock()
	out := make([]agentproto.ExecInfo, 0, len(order))
	for _, e := range order {
		out = append(out, e.snapshotInfo())
	}
	return out
}

// reserve claims id for an exec being started, failing on a duplicate. The
// exec becomes visible with publish, once every field of it is set, so other
// requests never see a half-started exec.
func (t *execTable) reserve(id string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.byID[id]; ok || t.starting[id] {
		return &agentproto.Error{Code: agentproto.CodeAlreadyExists, Message: fmt.Sprintf("exec %q already exists", id)}
	}
	if t.starting == nil {
		t.starting = make(map[string]bool)
	}
	t.starting[id] = true
	return nil
}

// publish makes a reserved exec visible.
func (t *execTable) publish(e *execProc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.starting, e.id)
	t.byID[e.id] = e
	t.order = append(t.order, e)
	t.maybePruneLocked()
}

// running returns the execs that have not ended.
func (t *execTable) running() []*execProc {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*execProc
	for _, e := range t.order {
		select {
		case <-e.done:
		default:
			out = append(out, e)
		}
	}
	return out
}

func (t *execTable) prune() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.maybePruneLocked()
}

// maybePruneLocked prunes when the table is over its size or its oldest
// entry may have expired: a full walk per exec would cost every exec.
func (t *execTable) maybePruneLocked() {
	now := time.Now()
	if len(t.order) <= keepFinished && (len(t.order) == 0 || now.Sub(t.order[0].created) <= keepFinishedFor) {
		return
	}
	t.pruneLocked(now)
}

// pruneLocked drops finished execs beyond keepFinished or older than
// keepFinishedFor. Running execs are never dropped.
func (t *execTable) pruneLocked(now time.Time) {
	finished := 0
	for i := len(t.order) - 1; i >= 0; i-- {
		e := t.order[i]
		e.mu.Lock()
		ended, endedAt := e.ended, e.result.EndedAt
		e.mu.Unlock()
		if !ended {
			continue
		}
		finished++
		if finished > keepFinished || now.Sub(endedAt) > keepFinishedFor {
			delete(t.byID, e.id)
			t.order = append(t.order[:i], t.order[i+1:]...)
		}
	}
}

// errStart is a reason an exec could not start; it ends with status error
// and exit code code (127 not found, 126 found but not runnable, -1 when no
// command was tried), as a shell reports them.
type errStart struct {
	msg  string
	code int
}

func (e *errStart) Error() string { return e.msg }

// Exit codes of a command that could not start, as POSIX shells give them.
const (
	exitNotFound   = 127
	exitCannotExec = 126
)

func startErr(code int, format string, args ...any) error {
	return &errStart{msg: fmt.Sprintf(format, args...), code: code}
}

// validateExec checks the shape of a request; failures are request errors,
// not exec results.
func validateExec(req *agentproto.ExecRequest) error {
	bad := func(msg string) error {
		return &agentproto.Error{Code: agentproto.CodeInvalidArgument, Message: msg}
	}
	switch {
	case req.ID == "":
		return bad("exec id is required")
	case len(req.ID) > 128 || strings.ContainsAny(req.ID, "\x00/="):
		return bad("exec id is malformed")
	case len(req.Argv) > 0 && req.Shell != "":
		return bad("argv and shell are exclusive")
	case len(req.Argv) == 0 && req.Shell == "":
		return bad("argv or shell is required")
	case len(req.Argv) > 0 && req.Argv[0] == "":
		return bad("argv[0] is empty")
	case req.TimeoutMS < 0 || req.TimeoutMS > maxTimeoutMS:
		return bad(fmt.Sprintf("timeout_ms must be between 0 and %d", int64(maxTimeoutMS)))
	case req.MaxOutputBytes < 0 || req.MaxOutputBytes > agentproto.HardMaxOutputBytes:
		return bad(fmt.Sprintf("max_output_bytes must be at most %d", agentproto.HardMaxOutputBytes))
	}
	for k := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return bad(fmt.Sprintf("env name %q is malformed", k))
		}
	}
	return nil
}

// startExec registers and starts an exec. A request error (bad shape,
// duplicate id) returns an error; a process that cannot start still returns
// the exec, ended with status error.
func (s *Server) startExec(req *agentproto.ExecRequest) (*execProc, error) {
	if err := validateExec(req); err != nil {
		return nil, err
	}
	// Close waits for starts in flight (startMu) before it kills what runs,
	// so no exec can start behind its back.
	s.startMu.RLock()
	defer s.startMu.RUnlock()
	if s.closing() {
		return nil, &agentproto.Error{Code: agentproto.CodeUnsupported, Message: "agent is shutting down"}
	}
	// An unknown user or a cwd that is not a directory is the request's
	// mistake: it fails, and no exec exists. Anything after is an exec
	// that could not start.
	acct, cwd, prepErr := s.execUserCwd(req)
	var reqErr *agentproto.Error
	if errors.As(prepErr, &reqErr) {
		return nil, prepErr
	}
	max := req.MaxOutputBytes
	if max == 0 {
		max = agentproto.DefaultMaxOutputBytes
	}
	user := req.User
	if user == "" {
		user = s.defaultUser
	}
	now := time.Now()
	e := &execProc{
		id:      req.ID,
		created: now,
		marker:  []byte(agentproto.ExecIDEnv + "=" + req.ID),
		log:     newOutLog(max),
		done:    make(chan struct{}),
		info: agentproto.ExecInfo{
			ID: req.ID, Argv: req.Argv, Shell: req.Shell, User: user, Cwd: req.Cwd,
			Status: agentproto.StatusRunning, StartedAt: now.UTC(), MaxOutputBytes: max,
		},
	}
	if err := s.execs.reserve(e.id); err != nil {
		return nil, err
	}
	defer s.execs.publish(e)
	err := prepErr
	if err == nil {
		err = s.spawn(e, req, acct, cwd)
	}
	if err != nil {
		var se *errStart
		msg, code := "", -1
		if errors.As(err, &se) {
			msg, code = se.msg, se.code
		} else {
			// Pipes, a terminal, /dev/null: what the sandbox is short of
			// (descriptors, memory), said without paths.
			msg = "cannot start the command: " + errText(err)
			s.log.Warn("exec start failed", "exec_id", e.id, "err", err)
		}
		e.mu.Lock()
		e.result = agentproto.ExecResult{
			ID: e.id, Status: agentproto.StatusError, ExitCode: code, Error: msg,
			StartedAt: e.info.StartedAt, EndedAt: e.info.StartedAt, Cwd: e.info.Cwd,
		}
		e.ended = true
		e.mu.Unlock()
		e.log.close()
		close(e.done)
	}
	return e, nil
}

// execUserCwd resolves the exec's user and working directory. An unknown
// user and a cwd that does not exist or is not a directory are request
// errors (*agentproto.Error); a user database that cannot be read is a
// start failure (*errStart).
func (s *Server) execUserCwd(req *agentproto.ExecRequest) (*account, string, error) {
	acct, err := s.lookupUser(req.User)
	if err != nil {
		var pe *agentproto.Error
		if errors.As(err, &pe) {
			return nil, "", err
		}
		return nil, "", startErr(-1, "cannot look the user up: %s", errText(err))
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = acct.Home
		if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
			// A user without a home still runs, in "/".
			cwd = "/"
		}
		return acct, cwd, nil
	}
	if !filepath.IsAbs(cwd) {
		cwd = filepath.Join(acct.Home, cwd)
	}
	fi, err := os.Stat(cwd)
	if err != nil {
		return nil, "", invalid(fmt.Sprintf("cwd %s: %s", cwd, errText(err)))
	}
	if !fi.IsDir() {
		return nil, "", invalid(fmt.Sprintf("cwd %s: not a directory", cwd))
	}
	return acct, cwd, nil
}

// spawn resolves env and binary, starts the process as acct in cwd and the
// goroutines that follow it.
func (s *Server) spawn(e *execProc, req *agentproto.ExecRequest, acct *account, cwd string) error {
	env := buildEnv(acct, req, e.marker)
	e.info.Cwd = cwd
	argv := req.Argv
	if req.Shell != "" {
		argv = []string{"/bin/sh", "-c", req.Shell}
	}
	path, err := lookPath(argv[0], envValue(env, "PATH"), cwd)
	if err != nil {
		return err
	}

	var cred *syscall.Credential
	if s.euid == 0 {
		cred = &syscall.Credential{Uid: acct.Uid, Gid: acct.Gid, Groups: acct.Groups}
	} else if acct.Uid != s.euid {
		return startErr(-1, "cannot run as %q: agent is not root", acct.Name)
	}

	// Child ends are raw blocking fds (a non-blocking stdio breaks ordinary
	// programs); parent ends are non-blocking files in Go's poller.
	var childFds []int
	defer func() {
		for _, fd := range childFds {
			unix.Close(fd)
		}
	}()
	var parentFiles []*os.File
	ok := false
	defer func() {
		if !ok {
			for _, f := range parentFiles {
				f.Close()
			}
		}
	}()

	var files [3]int
	var outR, errR, ptyM *os.File
	if req.PTY != nil {
		m, slave, err := openPTY(req.PTY.Cols, req.PTY.Rows)
		if err != nil {
			return err
		}
		childFds = append(childFds, slave)
		parentFiles = append(parentFiles, m)
		ptyM = m
		files = [3]int{slave, slave, slave}
		if !hasEnv(req.Env, "TERM") {
			env = append(env, "TERM=xterm-256color")
		}
	} else {
		r, w, err := newPipe(false)
		if err != nil {
			return err
		}
		childFds, parentFiles, outR = append(childFds, w), append(parentFiles, r), r
		files[1] = w
		r, w, err = newPipe(false)
		if err != nil {
			return err
		}
		childFds, parentFiles, errR = append(childFds, w), append(parentFiles, r), r
		files[2] = w
		if len(req.Stdin) > 0 || req.StdinOpen {
			w, r, err := newPipe(true)
			if err != nil {
				return err
			}
			childFds, parentFiles = append(childFds, r), append(parentFiles, w)
			files[0] = r
			e.stdin = w
		} else {
			fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("opening /dev/null: %w", err)
			}
			childFds = append(childFds, fd)
			files[0] = fd
		}
	}
	if ptyM != nil {
		e.stdin, e.pty = ptyM, ptyM
	}

	since := bootTicks()
	attr := &syscall.ProcAttr{
		Dir:   cwd,
		Env:   env,
		Files: []uintptr{uintptr(files[0]), uintptr(files[1]), uintptr(files[2])},
		Sys: &syscall.SysProcAttr{
			Setsid:     true,
			Setctty:    ptyM != nil,
			Ctty:       0,
			Credential: cred,
		},
	}
	started := time.Now()
	pid, exitCh, err := s.reaper.start(func() (int, error) {
		return syscall.ForkExec(path, argv, attr)
	})
	if err != nil {
		return forkErr(argv[0], err)
	}
	ok = true
	e.pid = pid
	e.since = since
	e.info.Pid = pid
	e.info.StartedAt = started.UTC()

	var outputs []*os.File
	if ptyM != nil {
		outputs = []*os.File{ptyM}
	} else {
		outputs = []*os.File{outR, errR}
	}
	readers := &readerGroup{n: int32(len(outputs)), done: make(chan struct{})}
	if ptyM != nil {
		go e.readLoop(readers, ptyM, agentproto.StreamPTY)
	} else {
		go e.readLoop(readers, outR, agentproto.StreamStdout)
		go e.readLoop(readers, errR, agentproto.StreamStderr)
	}
	if len(req.Stdin) > 0 {
		stdin, keepOpen := req.Stdin, req.StdinOpen
		// The process may read its stdin late or never: write it from a
		// goroutine so the exec starts at once. follow closes stdin when
		// the process ends, which ends this write too.
		s.bg.Add(1)
		go func() {
			defer s.bg.Done()
			_ = e.writeStdin(context.Background(), stdin)
			if !keepOpen {
				e.closeStdin()
			}
		}()
	}
	s.bg.Add(1)
	go s.follow(e, exitCh, readers, outputs, time.Duration(req.TimeoutMS)*time.Millisecond)
	return nil
}

// readerGroup tells follow when every output reader is done; the last
// reader closes done (no extra goroutine as with a WaitGroup).
type readerGroup struct {
	n    int32
	done chan struct{}
}

func (g *readerGroup) finish() {
	if atomic.AddInt32(&g.n, -1) == 0 {
		close(g.done)
	}
}

// readBufs recycles the output read buffers: one exec needs two, and a
// fresh 32 KiB allocation per stream and exec shows up in exec latency.
var readBufs = sync.Pool{New: func() any { b := make([]byte, readBufSize); return &b }}

// bootTicks is now in the clock ticks of /proc/PID/stat's start time
// (USER_HZ, 100 on Linux), minus one tick of margin: a process forked after
// this call never has an earlier start time.
func bootTicks() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	ticks := uint64(ts.Sec)*100 + uint64(ts.Nsec)/10_000_000
	if ticks > 0 {
		ticks--
	}
	return ticks
}

// newPipe makes a pipe whose parent end is a pollable file and whose child
// end is a raw fd. With parentWrites the parent keeps the write end (stdin).
func newPipe(parentWrites bool) (parent *os.File, child int, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, -1, fmt.Errorf("pipe: %w", err)
	}
	pfd, cfd := p[0], p[1]
	if parentWrites {
		pfd, cfd = p[1], p[0]
	}
	if err := unix.SetNonblock(pfd, true); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, -1, fmt.Errorf("pipe: %w", err)
	}
	return os.NewFile(uintptr(pfd), "pipe"), cfd, nil
}

// readLoop copies one output file into the log until EOF, or until follow
// sets a read deadline after the main process exited.
func (e *execProc) readLoop(g *readerGroup, f *os.File, stream string) {
	defer g.finish()
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	buf := *bp
	for {
		n, err := f.Read(buf)
		if n > 0 {
			e.log.write(stream, buf[:n])
		}
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// What is already in the pipe is still output of the exec:
			// take it without waiting for more.
			drainNow(f, func(p []byte) { e.log.write(stream, p) }, buf)
		}
		// EOF, or EIO on a PTY master whose slave is closed: done.
		return
	}
}

// drainNow reads what a non-blocking file holds right now, in a bounded
// number of reads (a writer that never stops must not keep us here).
func drainNow(f *os.File, write func([]byte), buf []byte) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		for range 64 {
			n, err := unix.Read(int(fd), buf)
			if n <= 0 || err != nil {
				return
			}
			write(buf[:n])
		}
	})
}

// follow waits for the exec's main process, enforces the timeout, drains
// output and records the result.
func (s *Server) follow(e *execProc, exitCh <-chan exitStatus, readers *readerGroup, outputs []*os.File, timeout time.Duration) {
	defer s.bg.Done()
	// Done here rather than before answering the client, to keep them off
	// the exec's start latency; the process is at most microseconds old.
	// Best effort: the process may have exited already, and a kernel without
	// the file (gVisor) has no OOM killer preference to set.
	if err := os.WriteFile("/proc/"+strconv.Itoa(e.pid)+"/oom_score_adj", []byte(oomScoreAdj), 0); err != nil {
		s.log.Debug("setting oom_score_adj", "exec_id", e.id, "err", err)
	}
	// An OOM kill in the first microseconds would be missed: the exec is
	// then reported as killed by SIGKILL, and the host's own check remains.
	oomBefore, oomOK := s.oomKills()
	var timeoutC, graceC <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timeoutC = t.C
	}
	var graceT *time.Timer
	var st exitStatus
wait:
	for {
		select {
		case st = <-exitCh:
			break wait
		case <-timeoutC:
			timeoutC = nil
			e.mu.Lock()
			e.timedOut = true
			e.mu.Unlock()
			signalTree(e.pid, e.since, e.marker, syscall.SIGTERM)
			graceT = time.NewTimer(killGrace)
			graceC = graceT.C
		case <-graceC:
			graceC = nil
			killTree(e.pid, e.since, e.marker)
		}
	}
	e.mu.Lock()
	timedOut := e.timedOut
	e.mu.Unlock()
	if timedOut {
		// The main process is gone; the rest of the tree gets what is left
		// of its grace, then SIGKILL, so a timeout always ends the tree.
		if graceC != nil && len(execTree(e.pid, e.since, e.marker)) > 0 {
			<-graceC
		}
		killTree(e.pid, e.since, e.marker)
	}
	if graceT != nil {
		graceT.Stop()
	}

	readersDone := readers.done
	drain := time.NewTimer(drainGrace)
	select {
	case <-readersDone:
	case <-drain.C:
		for _, f := range outputs {
			_ = f.SetReadDeadline(time.Unix(1, 0))
		}
		<-readersDone
	}
	drain.Stop()
	for _, f := range outputs {
		if f != e.pty {
			f.Close()
		}
	}
	// The PTY first: closeStdin would otherwise send it an EOF character.
	e.closePTY()
	e.closeStdin()

	res := agentproto.ExecResult{
		ID:        e.id,
		StartedAt: e.info.StartedAt,
		EndedAt:   st.when.UTC(),
		Cwd:       e.info.Cwd,
	}
	res.DurationMS = res.EndedAt.Sub(res.StartedAt).Milliseconds()
	ost := e.log.stats()
	res.StdoutBytes, res.StderrBytes, res.Truncated = ost.stdout, ost.stderr, ost.truncated
	res.StdoutDropped, res.StderrDropped = ost.stdoutDropped, ost.stderrDropped
	ws := st.ws
	e.mu.Lock()
	switch {
	case ws.Exited():
		res.ExitCode = ws.ExitStatus()
		res.Status = agentproto.StatusExited
	case ws.Signaled():
		sig := ws.Signal()
		res.ExitCode = 128 + int(sig)
		res.Signal = signalName(sig)
		res.Status = agentproto.StatusExited
		if e.clientSignaled && !e.timedOut {
			res.Status = agentproto.StatusKilled
		}
	default:
		res.ExitCode = -1
		res.Status = agentproto.StatusExited
	}
	// OOM: the sandbox's OOM kill count grew while the exec ran, and the
	// exec ended as a process the OOM killer chose does (its own SIGKILL,
	// or a shell's 137 for such a child). The exit alone is not enough: a
	// kill -9 is no OOM; the count alone is not either: another exec may
	// have been the one killed (see agentproto.EndedBySIGKILL).
	if res.Status == agentproto.StatusExited && !e.clientSignaled && oomOK && agentproto.EndedBySIGKILL(res) {
		if after, ok := s.oomKills(); ok && after > oomBefore {
			res.Status = agentproto.StatusOOM
		}
	}
	if e.timedOut {
		res.Status = agentproto.StatusTimeout
	}
	e.result = res
	e.ended = true
	e.mu.Unlock()
	// The result is set before the log closes: a reader that sees the end
	// of output finds the result.
	e.log.close()
	close(e.done)
	s.execs.prune()
}

// closeStdin closes the process's stdin pipe, which also ends a write
// blocked on it. On a PTY it sends the EOF character instead: the terminal
// stays, the program sees end of input.
func (e *execProc) closeStdin() {
	e.mu.Lock()
	f, isPTY := e.stdin, e.pty != nil
	if !isPTY {
		e.stdin = nil
	}
	e.mu.Unlock()
	if f == nil {
		return
	}
	if isPTY {
		e.stdinMu.Lock()
		defer e.stdinMu.Unlock()
		_, _ = f.Write([]byte{4})
		return
	}
	f.Close()
}

// closePTY closes the PTY master once its output is drained.
func (e *execProc) closePTY() {
	e.mu.Lock()
	f := e.pty
	e.stdin = nil
	e.mu.Unlock()
	if f != nil {
		f.Close()
	}
}

// writeStdin writes p to the process's stdin; ctx aborts a write that the
// process does not read.
func (e *execProc) writeStdin(ctx context.Context, p []byte) error {
	e.stdinMu.Lock()
	defer e.stdinMu.Unlock()
	e.mu.Lock()
	f := e.stdin
	e.mu.Unlock()
	if f == nil {
		return &agentproto.Error{Code: agentproto.CodeInvalidArgument, Message: "stdin is closed"}
	}
	_ = f.SetWriteDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { _ = f.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := f.Write(p); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &agentproto.Error{Code: agentproto.CodeInvalidArgument, Message: "stdin is closed"}
	}
	return nil
}

// signal sends sig to the exec's tree. SIGKILL repeats until the tree is gone.
func (e *execProc) signal(sig syscall.Signal) {
	if e.pid == 0 {
		return
	}
	e.mu.Lock()
	if !e.ended {
		e.clientSignaled = true
	}
	e.mu.Unlock()
	if sig == syscall.SIGKILL {
		killTree(e.pid, e.since, e.marker)
		return
	}
	signalTree(e.pid, e.since, e.marker, sig)
}

// buildEnv merges the request's env over the defaults and adds the marker.
func buildEnv(acct *account, req *agentproto.ExecRequest, marker []byte) []string {
	m := map[string]string{
		"PATH":    defaultPath,
		"HOME":    acct.Home,
		"USER":    acct.Name,
		"LOGNAME": acct.Name,
		"SHELL":   acct.Shell,
		"LANG":    "C.UTF-8",
	}
	for k, v := range req.Env {
		m[k] = v
	}
	delete(m, agentproto.ExecIDEnv)
	env := make([]string, 0, len(m)+2)
	for k, v := range m {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	return append(env, string(marker))
}

func hasEnv(env map[string]string, k string) bool {
	_, ok := env[k]
	return ok
}

func envValue(env []string, k string) string {
	for _, kv := range env {
		if strings.HasPrefix(kv, k+"=") {
			return kv[len(k)+1:]
		}
	}
	return ""
}

// forkErr describes a failed fork and exec of a command that lookPath
// found: resource shortages (no command was tried, -1), a missing #!
// interpreter or anything else execve refused (126).
func forkErr(name string, err error) error {
	var errno syscall.Errno
	errors.As(err, &errno)
	switch errno {
	case syscall.EAGAIN, syscall.ENOMEM, syscall.EMFILE, syscall.ENFILE:
		return startErr(-1, "cannot start %s: %s", name, errText(err))
	case syscall.ENOENT:
		// The file exists (lookPath saw it): its interpreter does not.
		return startErr(exitCannotExec, "cannot run %s: its interpreter (#! line) or loader was not found", name)
	}
	return startErr(exitCannotExec, "cannot run %s: %s", name, errText(err))
}

// lookPath finds name like execvp does, in the exec's own PATH.
func lookPath(name, path, cwd string) (string, error) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		if err := isExecutable(p); err != nil {
			code := exitCannotExec
			if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) {
				code = exitNotFound
			}
			return "", startErr(code, "%s: %s", name, errText(err))
		}
		return p, nil
	}
	denied := false
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(cwd, dir)
		}
		p := filepath.Join(dir, name)
		err := isExecutable(p)
		if err == nil {
			return p, nil
		}
		denied = denied || errors.Is(err, syscall.EACCES)
	}
	if denied {
		// As execvp: a match that may not be run is what is reported.
		return "", startErr(exitCannotExec, "%s: permission denied (found in PATH, not executable)", name)
	}
	return "", startErr(exitNotFound, "%s: executable file not found in PATH", name)
}

func isExecutable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return syscall.EISDIR
	}
	if fi.Mode()&0o111 == 0 {
		return syscall.EACCES
	}
	return nil
}

// errText is an error's errno text without paths or operation names.
func errText(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return err.Error()
}
