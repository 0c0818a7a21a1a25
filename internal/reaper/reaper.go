// Package reaper makes the daemon a child subreaper and reaps the container inits it is told about, and only those.
//
// A detached `runc run` exits once the container's init runs, so the init is
// reparented to the nearest subreaper. Without one it goes to host PID 1 and the
// daemon can never learn how it ended; with one (Enable) the daemon must reap it
// or it stays a zombie. Reaping uses pidfds (pidfd_open + waitid(P_PIDFD)), never
// wait4(-1): that would steal the exit status of os/exec's children.
package reaper

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Enable marks the calling process as a child subreaper, so orphaned
// descendants (detached container inits) are reparented to it. It affects the
// whole process and is meant to be called once at daemon start.
func Enable() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set child subreaper: %w", err)
	}
	return nil
}

// Enabled reports whether the calling process is a child subreaper.
func Enabled() bool {
	var v int32
	if err := unix.Prctl(unix.PR_GET_CHILD_SUBREAPER, uintptr(unsafe.Pointer(&v)), 0, 0, 0); err != nil {
		return false
	}
	return v != 0
}

// Exit is how a watched process ended.
type Exit struct {
	// Known is false when the process was not this process's child when it
	// ended (no subreaper, or another parent reaped it): only the fact that it
	// ended is known then.
	Known bool
	// Code is the exit code when the process exited normally.
	Code int
	// Signal is the signal that killed it, 0 if it exited normally.
	Signal unix.Signal
}

// String describes e in a few words for logs.
func (e Exit) String() string {
	switch {
	case !e.Known:
		return "exited (status unknown)"
	case e.Signal != 0:
		return "killed by " + unix.SignalName(e.Signal)
	default:
		return fmt.Sprintf("exited with code %d", e.Code)
	}
}

// Process is one watched process. Its goroutine ends when the process ends or
// Close is called.
type Process struct {
	pid  int
	f    *os.File // the pidfd, registered with the runtime poller
	done chan struct{}

	mu   sync.Mutex
	exit Exit
	err  error
}

// Watch starts watching pid: if it is (or becomes) a child of this process it
// is reaped when it ends and its status recorded. It returns an error wrapping
// os.ErrProcessDone if pid does not exist (it already ended and was reaped).
func Watch(pid int) (*Process, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("watch pid %d: invalid pid", pid)
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil, fmt.Errorf("watch pid %d: %w", pid, os.ErrProcessDone)
		}
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	// A non-blocking pidfd goes to the runtime's poller, so a watch costs a
	// parked goroutine, not an OS thread blocked in poll(2).
	p := &Process{pid: pid, f: os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", pid)), done: make(chan struct{})}
	rc, err := p.f.SyscallConn()
	if err != nil {
		p.f.Close()
		return nil, fmt.Errorf("pidfd %d: %w", pid, err)
	}
	go p.wait(rc)
	return p, nil
}

// Pid is the watched process id.
func (p *Process) Pid() int { return p.pid }

// Done is closed once the process has ended (or the watch was closed).
func (p *Process) Done() <-chan struct{} { return p.done }

// Exit returns how the process ended; ok is false while it still runs or if
// the watch was closed before it ended.
func (p *Process) Exit() (e Exit, ok bool) {
	select {
	case <-p.done:
	default:
		return Exit{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit, p.err == nil
}

// Signal sends sig to the process through its pidfd, so a pid recycled
// after the process ended is never hit. It returns an error wrapping
// os.ErrProcessDone once the process has ended.
func (p *Process) Signal(sig unix.Signal) error {
	select {
	case <-p.done:
		return fmt.Errorf("signal pid %d: %w", p.pid, os.ErrProcessDone)
	default:
	}
	rc, err := p.f.SyscallConn()
	if err != nil {
		return fmt.Errorf("signal pid %d: %w", p.pid, os.ErrProcessDone)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.PidfdSendSignal(int(fd), sig, nil, 0) }); err != nil {
		return fmt.Errorf("signal pid %d: %w", p.pid, os.ErrProcessDone)
	}
	if errors.Is(serr, unix.ESRCH) {
		return fmt.Errorf("signal pid %d: %w", p.pid, os.ErrProcessDone)
	}
	if serr != nil {
		return fmt.Errorf("signal pid %d: %w", p.pid, serr)
	}
	return nil
}

// Close stops watching. The process is not touched; if it ends later nobody
// reaps it through this watch.
func (p *Process) Close() error {
	// Closing the file wakes the goroutine parked in the poller.
	p.f.Close()
	<-p.done
	return nil
}

func (p *Process) wait(rc interface {
	Read(func(fd uintptr) bool) error
}) {
	defer close(p.done)
	var (
		exit Exit
		werr error
	)
	err := rc.Read(func(fd uintptr) bool {
		e, ended, err := tryReap(int(fd))
		if err != nil {
			werr = err
			return true
		}
		exit = e
		return ended
	})
	if err == nil {
		err = werr
	}
	p.mu.Lock()
	p.exit, p.err = exit, err
	p.mu.Unlock()
	p.f.Close()
}

// siginfo is the part of the kernel's siginfo_t that waitid fills for
// SIGCHLD (x/sys/unix.Siginfo hides these fields).
type siginfo struct {
	Signo  int32
	Errno  int32
	Code   int32
	_      int32
	Pid    int32
	UID    uint32
	Status int32
	_      [100]byte
}

// Codes of siginfo.Code for SIGCHLD.
const (
	cldExited = 1
	cldKilled = 2
	cldDumped = 3
)

// tryReap reaps the process behind pidfd if it is our child and has ended.
// ended is true once the process has ended, whether or not we could reap it.
func tryReap(pidfd int) (e Exit, ended bool, err error) {
	var info siginfo
	for {
		_, _, errno := unix.Syscall6(unix.SYS_WAITID, unix.P_PIDFD, uintptr(pidfd),
			uintptr(unsafe.Pointer(&info)), unix.WEXITED|unix.WNOHANG, 0, 0)
		if errno == unix.EINTR {
			continue
		}
		if errno == unix.ECHILD {
			// Not our child: someone else reaps it. A pidfd polls readable
			// once its process has ended, which is all we can learn.
			fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
			n, perr := unix.Poll(fds, 0)
			if perr != nil && perr != unix.EINTR {
				return Exit{}, false, fmt.Errorf("poll pidfd: %w", perr)
			}
			return Exit{}, n > 0 && fds[0].Revents&(unix.POLLIN|unix.POLLHUP) != 0, nil
		}
		if errno != 0 {
			return Exit{}, false, fmt.Errorf("waitid: %w", errno)
		}
		break
	}
	if info.Pid == 0 {
		return Exit{}, false, nil // still running
	}
	switch info.Code {
	case cldExited:
		return Exit{Known: true, Code: int(info.Status)}, true, nil
	case cldKilled, cldDumped:
		return Exit{Known: true, Signal: unix.Signal(info.Status)}, true, nil
	}
	return Exit{Known: true}, true, nil
}
