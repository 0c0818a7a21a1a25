package agent

import (
	"errors"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// maxUnclaimed bounds the exit statuses kept for pids nobody registered:
// orphans reparented to the agent are reaped and forgotten, so only a few
// statuses ever wait here, but a fork bomb of orphans must not grow it.
const maxUnclaimed = 1024

// exitStatus is what the reaper learned about a dead child.
type exitStatus struct {
	ws   syscall.WaitStatus
	when time.Time
}

// reaper is the process's only waiter for children. Go's os/exec Wait and a
// wait4(-1) loop would steal each other's statuses, so processes are started
// through reaper.start and never waited for elsewhere.
//
// In "all" mode (PID 1, or a subreaper) it reaps every child with
// wait4(-1, WNOHANG) on each SIGCHLD, so orphans never stay zombies. In "own"
// mode (the server embedded in a process that also runs other children) it
// only waits for the pids it started.
type reaper struct {
	all  bool // guarded by mu
	refs int  // guarded by globalReaperMu

	mu        sync.Mutex
	waiters   map[int]chan exitStatus
	unclaimed map[int]exitStatus
	order     []int // unclaimed pids, oldest first

	sigs chan os.Signal
	stop chan struct{}
	done chan struct{}
}

var (
	globalReaperMu sync.Mutex
	globalReaper   *reaper
)

// acquireReaper returns the process's reaper, starting it on first use. There
// must be only one: two wait4(-1) loops would steal each other's children.
// Asking for "all" mode upgrades a running reaper.
func acquireReaper(all bool) (*reaper, error) {
	globalReaperMu.Lock()
	defer globalReaperMu.Unlock()
	if os.Getpid() == 1 {
		all = true
	}
	if r := globalReaper; r != nil {
		r.refs++
		if all {
			if err := r.setAll(); err != nil {
				r.refs--
				return nil, err
			}
		}
		return r, nil
	}
	r, err := newReaper(all)
	if err != nil {
		return nil, err
	}
	r.refs = 1
	globalReaper = r
	return r, nil
}

// releaseReaper drops a reference; the last one stops the reaper.
func releaseReaper(r *reaper) {
	globalReaperMu.Lock()
	defer globalReaperMu.Unlock()
	r.refs--
	if r.refs > 0 {
		return
	}
	globalReaper = nil
	r.close()
}

func (r *reaper) setAll() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.all {
		return nil
	}
	if err := setSubreaper(); err != nil {
		return err
	}
	r.all = true
	return nil
}

func setSubreaper() error {
	if os.Getpid() == 1 {
		return nil
	}
	return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}

func newReaper(all bool) (*reaper, error) {
	r := &reaper{
		all:       all,
		waiters:   make(map[int]chan exitStatus),
		unclaimed: make(map[int]exitStatus),
		sigs:      make(chan os.Signal, 1),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	if all {
		if err := setSubreaper(); err != nil {
			return nil, err
		}
	}
	signal.Notify(r.sigs, syscall.SIGCHLD)
	go r.loop()
	return r, nil
}

// start runs fork (which must start exactly one child and return its pid)
// and registers the pid before the reaper can dispatch its exit: the lock is
// held across both, so a status reaped meanwhile waits for the registration.
func (r *reaper) start(fork func() (int, error)) (int, <-chan exitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	forked := time.Now()
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan exitStatus, 1)
	if st, ok := r.unclaimed[pid]; ok {
		delete(r.unclaimed, pid)
		// A status older than the fork belongs to an earlier process that
		// had the same pid (an orphan); it must not end this one.
		if !st.when.Before(forked) {
			ch <- st
			return pid, ch, nil
		}
	}
	r.waiters[pid] = ch
	return pid, ch, nil
}

// close stops the reaper. Children still running are not waited for.
func (r *reaper) close() {
	signal.Stop(r.sigs)
	close(r.stop)
	<-r.done
}

func (r *reaper) loop() {
	defer close(r.done)
	for {
		select {
		case <-r.stop:
			return
		case <-r.sigs:
			r.reap()
		}
	}
}

func (r *reaper) reap() {
	r.mu.Lock()
	all := r.all
	r.mu.Unlock()
	if !all {
		r.mu.Lock()
		defer r.mu.Unlock()
		for pid, ch := range r.waiters {
			var ws syscall.WaitStatus
			got, err := wait4(pid, &ws)
			if got == pid && err == nil {
				delete(r.waiters, pid)
				ch <- exitStatus{ws: ws, when: time.Now()}
			} else if errors.Is(err, syscall.ECHILD) {
				// Someone else reaped it; report a kill so the exec ends.
				delete(r.waiters, pid)
				ch <- exitStatus{ws: syscall.WaitStatus(syscall.SIGKILL), when: time.Now()}
			}
		}
		return
	}
	for {
		var ws syscall.WaitStatus
		pid, err := wait4(-1, &ws)
		if err != nil || pid <= 0 {
			return
		}
		r.dispatch(pid, exitStatus{ws: ws, when: time.Now()})
	}
}

func (r *reaper) dispatch(pid int, st exitStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ch, ok := r.waiters[pid]; ok {
		delete(r.waiters, pid)
		ch <- st
		return
	}
	// An orphan (or, in theory, a child not yet registered): keep its
	// status for a while in case start claims it.
	if len(r.order) >= maxUnclaimed {
		delete(r.unclaimed, r.order[0])
		r.order = r.order[1:]
	}
	r.unclaimed[pid] = st
	r.order = append(r.order, pid)
}

func wait4(pid int, ws *syscall.WaitStatus) (int, error) {
	for {
		got, err := syscall.Wait4(pid, ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		return got, err
	}
}
