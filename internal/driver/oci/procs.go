package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/cgroups"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/reaper"
)

// The sandboxes' processes. The daemon is a child subreaper: a detached
// init comes back to it, and it watches each init through a pidfd (it
// reaps only those pids, never wait4(-1)).

// watch records pid as the init of id and reaps it when it ends.
func (c *Core) watch(id string, pid int) {
	p, err := reaper.Watch(pid)
	if err != nil {
		c.log.Warn("watching sandbox init", "sandbox_id", id, "pid", pid, "err", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.record(id)
	if s.proc != nil && s.proc != p {
		s.proc.Close()
	}
	s.proc = p
}

// record returns the in-memory record of id, making it; c.mu is held.
func (c *Core) record(id string) *sandbox {
	s := c.sandboxes[id]
	if s == nil {
		s = &sandbox{id: id}
		c.sandboxes[id] = s
	}
	return s
}

// setCPUPending records whether sandbox id's deferred CPU limit is still
// to be set (Config.DeferCPULimit).
func (c *Core) setCPUPending(id string, pending bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.record(id).cpuPending = pending
}

// applyDeferredCPU sets sandbox id's deferred CPU limit on its cgroup g if
// its current init does not have it yet. A limit that cannot be set fails
// the dial: no sandbox is handed out without its quota.
func (c *Core) applyDeferredCPU(id string, st *State, g *cgroups.Group) error {
	if st.CPU == nil {
		return nil
	}
	c.mu.Lock()
	s := c.sandboxes[id]
	pending := s != nil && s.cpuPending
	c.mu.Unlock()
	if !pending {
		return nil
	}
	if err := g.SetCPU(st.CPU.Quota, st.CPU.Period); err != nil {
		return fmt.Errorf("limiting sandbox %s CPU: %w", id, err)
	}
	c.setCPUPending(id, false)
	return nil
}

// Init returns the watch of sandbox id's init, nil if none.
func (c *Core) Init(id string) *reaper.Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.sandboxes[id]; s != nil {
		return s.proc
	}
	return nil
}

// SetHelpers records the watches of the runtime's own processes of sandbox
// id that outlive its init and were left to the daemon to reap (runsc's
// Gofer): they are closed when the sandbox is destroyed.
func (c *Core) SetHelpers(id string, ws []*reaper.Process) {
	c.mu.Lock()
	s := c.record(id)
	old := s.helpers
	s.helpers = ws
	c.mu.Unlock()
	for _, h := range old {
		h.Close()
	}
}

// Helpers returns what SetHelpers recorded for sandbox id.
func (c *Core) Helpers(id string) []*reaper.Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.sandboxes[id]; s != nil {
		return s.helpers
	}
	return nil
}

// forget drops the in-memory record of id.
func (c *Core) forget(id string) {
	c.mu.Lock()
	s := c.sandboxes[id]
	delete(c.sandboxes, id)
	c.mu.Unlock()
	if s == nil {
		return
	}
	if s.proc != nil {
		s.proc.Close()
	}
	for _, h := range s.helpers {
		h.Close()
	}
}

// initWatch returns the watch of sandbox id's init if it is of pid (of any
// pid when pid is 0), else watches pid and returns that: nil when pid is 0
// or already gone.
func (c *Core) initWatch(id string, pid int) *reaper.Process {
	if p := c.Init(id); p != nil && (pid == 0 || p.Pid() == pid) {
		return p
	}
	if pid <= 0 {
		return nil
	}
	c.watch(id, pid)
	return c.Init(id)
}

// waitInit waits until id's init (pid, 0 for the one watched) is gone or
// ctx is done, reaping it if it is our child.
func (c *Core) waitInit(ctx context.Context, id string, pid int) error {
	p := c.initWatch(id, pid)
	if p == nil {
		return nil // already gone
	}
	select {
	case <-p.Done():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for sandbox %s init to end: %w", id, ctx.Err())
	}
}

// KillInit ends every process of a sandbox whose processes all live in its
// pid namespace and waits for init to go: it thaws a frozen sandbox (frozen
// tasks do not die), then SIGKILLs init through its pidfd. The kernel kills
// every other process of the namespace when init dies, and init's end is
// only reported once they are gone. pid is init's pid if known, 0 to ask
// the runtime.
func (c *Core) KillInit(ctx context.Context, id string, pid int) error {
	p := c.initWatch(id, pid)
	if p == nil && pid == 0 {
		cs, err := c.cli.State(ctx, id)
		if errdefs.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if cs.Status == "stopped" || cs.Pid <= 0 {
			return nil
		}
		p = c.initWatch(id, cs.Pid)
	}
	if p == nil {
		return nil // already gone
	}
	select {
	case <-p.Done():
		return nil
	default:
	}
	if frozen, _ := c.Group(id).Frozen(); frozen {
		if err := c.cli.Resume(ctx, id); err != nil {
			return fmt.Errorf("thawing sandbox %s: %w", id, err)
		}
	}
	if err := p.Signal(unix.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("killing sandbox %s: %w", id, err)
	}
	wctx, cancel := context.WithTimeout(ctx, KillWait)
	defer cancel()
	return c.waitInit(wctx, id, 0)
}

// CgroupPIDs lists the processes of g, read from its first hierarchy that
// has a cgroup.procs file (every hierarchy holds the same processes).
func CgroupPIDs(g *cgroups.Group) []int {
	for _, dir := range g.Dirs() {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			continue
		}
		var pids []int
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil && n > 0 {
				pids = append(pids, n)
			}
		}
		return pids
	}
	return nil
}

// inCgroup reports whether pid is a process of g.
func inCgroup(g *cgroups.Group, pid int) bool {
	for _, p := range CgroupPIDs(g) {
		if p == pid {
			return true
		}
	}
	return false
}
