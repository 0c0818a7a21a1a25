package oci

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/mountinfo"
	"github.com/airlockhq/airlock/internal/storage"
)

// oomScoreAdj is the agent's: the kernel kills user code (the agent raises
// its children to 500) long before the sandbox's only way in.
const oomScoreAdj = -998

// Create allocates a uid range, prepares the sandbox's storage and writes its
// bundle. Nothing runs yet; on error nothing is left behind.
func (c *Core) Create(ctx context.Context, spec driver.Spec) (_ *driver.Handle, retErr error) {
	if err := checkID(spec.ID); err != nil {
		return nil, err
	}
	if c.agentErr != nil {
		return nil, errdefs.Wrap(errdefs.ErrRuntimeUnavailable, "%s driver has no agent binary", c.cfg.Name)
	}
	if len(spec.Template.Layers) == 0 {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "template %q has no layers", spec.Template.Name)
	}
	res := withDefaults(spec.Resources)
	log := c.logger(spec.ID)
	dir := c.Dir(spec.ID)
	t0 := time.Now()
	release, err := c.admitDisk(spec.ID, res)
	if err != nil {
		return nil, err
	}
	defer release()

	// Everything made below is undone if a later step fails; the rollback
	// runs on a context the caller cannot cancel.
	var undo []func(context.Context)
	defer func() {
		if retErr == nil {
			return
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i](cctx)
		}
	}()

	if err := os.Mkdir(dir, 0o711); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, errdefs.Wrap(errdefs.ErrAlreadyExists, "sandbox %s", spec.ID)
		}
		return nil, fmt.Errorf("creating sandbox dir: %w", err)
	}
	undo = append(undo, func(context.Context) {
		if err := removeSandboxDir(dir); err != nil {
			log.Error("rolling back sandbox dir", "err", err)
		}
	})
	// The mode is set again: the umask may have cut the search bit.
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, err
	}
	slot, err := c.slots.alloc(spec.ID)
	if err != nil {
		return nil, err
	}
	undo = append(undo, func(context.Context) { c.slots.free(slot, spec.ID) })
	st := &State{
		ID: spec.ID, Slot: slot, UIDBase: c.cfg.UIDRangeStart + uint32(slot)*c.cfg.IDCount,
		IDCount: c.cfg.IDCount, Dir: dir, Cgroup: c.cgroupPath(spec.ID), NetNS: spec.NetNSPath,
	}
	if err := st.save(); err != nil {
		return nil, err
	}
	t1 := time.Now()
	rootfs, err := storage.Setup(ctx, storage.Options{
		Dir: dir, Layers: spec.Template.Layers, UIDBase: st.UIDBase, IDCount: st.IDCount,
		SizeMB: res.DiskMB, Tmpfs: res.DiskTmpfs,
	})
	if err != nil {
		return nil, fmt.Errorf("preparing sandbox storage: %w", err)
	}
	// Rolls back every mount under the sandbox dir: the socket dir's and
	// the sysfs below too.
	undo = append(undo, func(ctx context.Context) {
		if err := storage.TeardownDir(ctx, dir); err != nil {
			log.Error("rolling back sandbox storage", "err", err)
		}
	})
	if err := c.cfg.Socket.prepare(dir, st.UIDBase); err != nil {
		return nil, err
	}
	var sysDir string
	if spec.NetNSPath != "" {
		sysDir = filepath.Join(dir, sysDirName)
	}
	spec.Resources = res
	t2 := time.Now()
	args, mounts := c.cfg.Socket.bundle(dir)
	s, err := buildSpec(bundleParams{
		Spec: spec, Rootfs: rootfs.Path(), AgentPath: c.agentPath,
		UIDBase: st.UIDBase, IDCount: st.IDCount, Cgroup: st.Cgroup, SysDir: sysDir,
		AgentArgs: args, SocketMounts: mounts,
	})
	if err != nil {
		return nil, err
	}
	if err := c.rt.EditBundle(s, spec, dir); err != nil {
		return nil, fmt.Errorf("adapting bundle: %w", err)
	}
	if r := s.Linux.Resources; c.cfg.DeferCPULimit && r != nil && r.CPU != nil && r.CPU.Quota != nil && *r.CPU.Quota > 0 && r.CPU.Period != nil {
		st.CPU = &CPULimit{Quota: *r.CPU.Quota, Period: *r.CPU.Period}
		r.CPU = nil
		if err := st.save(); err != nil {
			return nil, err
		}
	}
	// The joined namespace's sysfs, if the bundle still binds it (runsc
	// mounts a /sys of its own).
	if sysDir != "" && slices.ContainsFunc(s.Mounts, func(m specs.Mount) bool { return m.Source == sysDir }) {
		if err := mountNetnsSysfs(spec.NetNSPath, sysDir); err != nil {
			return nil, err
		}
	}
	if err := writeSpec(dir, s); err != nil {
		return nil, fmt.Errorf("writing bundle: %w", err)
	}
	h, err := st.handle(c.cfg.Name)
	if err != nil {
		return nil, err
	}
	// Phase times say where a slow start went (see docs/benchmarks.md).
	log.Debug("sandbox created", "slot", slot, "uid_base", st.UIDBase,
		"prepare_us", t1.Sub(t0).Microseconds(), "storage_us", t2.Sub(t1).Microseconds(),
		"bundle_us", time.Since(t2).Microseconds())
	return h, nil
}

// Start runs the sandbox's init (the agent) detached and returns once it
// runs; the agent may not listen yet (DialAgent waits).
func (c *Core) Start(ctx context.Context, id string) error { return c.start(ctx, id, "") }

// StartFromImage is Start with the runtime's restore of the checkpoint
// image in directory image (`restore --image-path`) in place of its run:
// the sandbox's processes resume where the checkpoint left them instead
// of its init starting afresh. Everything around the run is Start's: the
// runtime's record of an earlier run is cleared, the agent's socket made
// ready, the network flags chosen (Runtime.RunArgs), the command launched
// where the runtime must start (Runtime.Launch) and the init watched.
func (c *Core) StartFromImage(ctx context.Context, id, image string) error {
	if image == "" || !filepath.IsAbs(image) {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "checkpoint image %q must be an absolute path", image)
	}
	return c.start(ctx, id, image)
}

func (c *Core) start(ctx context.Context, id, image string) error {
	if err := checkID(id); err != nil {
		return err
	}
	st, err := loadState(c.Dir(id))
	if err != nil {
		return fmt.Errorf("starting sandbox %s: %w", id, err)
	}
	log := c.logger(id)
	// runc state costs a process; a sandbox's first start has no record.
	if !c.cli.Exists(id) {
		// nothing to clean
	} else if cs, err := c.cli.State(ctx, id); err == nil {
		switch cs.Status {
		case "running", "paused", "created", "creating":
			return errdefs.Wrap(errdefs.ErrInvalidState, "sandbox %s is %s", id, cs.Status)
		}
		// A stopped container keeps its id in the runtime until deleted;
		// what the runtime left must be gone first (runsc waits for it).
		if err := c.rt.ClearStopped(ctx, id); err != nil {
			return err
		}
		if err := c.cli.Delete(ctx, id); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	} else if !errdefs.IsNotFound(err) {
		return err
	}
	dir := st.Dir
	logf, err := openAgentLog(dir)
	if err != nil {
		return fmt.Errorf("starting sandbox %s: %w", id, err)
	}
	defer logf.Close()
	extra, err := c.cfg.Socket.start(dir, st.UIDBase)
	if err != nil {
		return fmt.Errorf("starting sandbox %s: %w", id, err)
	}
	for _, f := range extra {
		defer f.Close() // the init keeps its own copy
	}
	args, err := c.rt.RunArgs(st)
	if err != nil {
		return fmt.Errorf("starting sandbox %s: %w", id, err)
	}
	if !slices.Equal(args, st.RunArgs) {
		// Saved before the run: Control finds the sandbox by them.
		st.RunArgs = args
		if err := st.save(); err != nil {
			return err
		}
	}
	pidFile := filepath.Join(dir, "init.pid")
	os.Remove(pidFile)
	t0 := time.Now()
	launch := func(cmd *exec.Cmd) error { return c.rt.Launch(cmd, st) }
	if err := c.cli.run(ctx, id, dir, pidFile, filepath.Join(dir, "runc.log"), image, logf, st.RunArgs, launch, extra...); err != nil {
		// The runtime may leave a container record behind on failure.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		c.cli.Delete(cctx, id)
		return fmt.Errorf("starting sandbox %s: %w", id, err)
	}
	t1 := time.Now()
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return fmt.Errorf("reading init pid: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return fmt.Errorf("bad init pid %q", b)
	}
	c.watch(id, pid)
	if st.CPU != nil {
		c.setCPUPending(id, true)
	}
	c.rt.InitRunning(st, pid, false)
	st.Started, st.Pid = true, pid
	if err := st.save(); err != nil {
		return err
	}
	log.Debug("sandbox started", "pid", pid, "runc_us", t1.Sub(t0).Microseconds(), "after_us", time.Since(t1).Microseconds())
	return nil
}

// LowerOOMScore makes the OOM killer spare init (pid) of sandbox id before
// anything else in it, for a Runtime whose init is the agent. Lowering a
// score needs CAP_SYS_RESOURCE in the host's namespace, which only the
// daemon has.
func (c *Core) LowerOOMScore(id string, pid int) {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte(strconv.Itoa(oomScoreAdj)), 0); err != nil {
		// Without CAP_SYS_RESOURCE (some CI containers) this fails for
		// every sandbox: say so once.
		c.oomWarn.Do(func() {
			c.logger(id).Warn("cannot lower agent oom score; the OOM killer may pick the agent", "err", err)
		})
	}
}

// Stop sends SIGTERM to init, waits up to timeout and then kills every
// process of the sandbox (Runtime.KillAll). Storage is kept.
func (c *Core) Stop(ctx context.Context, id string, timeout time.Duration) error {
	if err := checkID(id); err != nil {
		return err
	}
	if _, err := loadState(c.Dir(id)); err != nil {
		return fmt.Errorf("stopping sandbox %s: %w", id, err)
	}
	cs, err := c.cli.State(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil // never started
	}
	if err != nil {
		return err
	}
	if cs.Status == "stopped" {
		return nil
	}
	if cs.Status == "paused" {
		// Frozen tasks cannot act on SIGTERM, and on cgroup v1 not even die.
		if err := c.cli.Resume(ctx, id); err != nil {
			return err
		}
	}
	if timeout > 0 {
		if err := c.cli.Kill(ctx, id, "TERM", false); err == nil {
			wctx, cancel := context.WithTimeout(ctx, timeout)
			c.waitInit(wctx, id, cs.Pid)
			cancel()
		}
	}
	return c.rt.KillAll(ctx, id, cs.Pid)
}

// Destroy kills every process and removes the sandbox's cgroups, mounts, loop
// devices and files, and frees its uid range. It is idempotent and works from
// the data dir alone: after a daemon restart or on a half-created sandbox.
func (c *Core) Destroy(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	log := c.logger(id)
	dir := c.Dir(id)
	st, err := loadState(dir)
	if err != nil && !errdefs.IsNotFound(err) {
		log.Warn("destroy: unreadable state, cleaning by id", "err", err)
	}
	var errs []error
	if c.cli.Exists(id) {
		if err := c.rt.KillAll(ctx, id, 0); err != nil {
			// Deleting the container or its storage under live processes
			// would fail or leak: stop here, Destroy can be retried.
			return fmt.Errorf("destroying sandbox %s: %w", id, err)
		}
	} else if c.Init(id) != nil {
		// The runtime forgot it but we may still hold its zombie.
		wctx, wcancel := context.WithTimeout(ctx, KillWait)
		c.waitInit(wctx, id, 0)
		wcancel()
	}
	c.forget(id)
	// Nothing runs in the sandbox any more: the runtime's record and
	// cgroups, and the storage, are independent and go in parallel.
	var runcErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if c.cli.Exists(id) {
			if err := c.cli.Delete(ctx, id); err != nil && !errdefs.IsNotFound(err) {
				runcErr = err
				return
			}
		}
		// runc can leave empty cgroup directories behind (a failed start,
		// a crash between its steps).
		runcErr = c.Group(id).Remove(ctx)
	}()
	if err := storage.TeardownDir(ctx, dir); err != nil {
		errs = append(errs, fmt.Errorf("tearing down storage: %w", err))
	}
	wg.Wait()
	if runcErr != nil {
		errs = append(errs, runcErr)
	}
	if err := errors.Join(errs...); err != nil {
		// Files stay until the mounts are gone: removing them through a
		// live mount could delete what is below it.
		return fmt.Errorf("destroying sandbox %s: %w", id, err)
	}
	if err := removeSandboxDir(dir); err != nil {
		return fmt.Errorf("destroying sandbox %s: %w", id, err)
	}
	slot := -1
	if st != nil {
		slot = st.Slot
	} else {
		slot = c.slots.find(id)
	}
	if err := c.slots.free(slot, id); err != nil {
		return err
	}
	log.Debug("sandbox destroyed")
	return nil
}

// removeSandboxDir removes dir after checking that nothing is mounted at or
// below it.
func removeSandboxDir(dir string) error {
	mounts, err := mountinfo.Read()
	if err != nil {
		return err
	}
	if m, ok := mountinfo.MountedUnder(mounts, dir); ok {
		return fmt.Errorf("%s is still mounted", m.Target)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing sandbox dir: %w", err)
	}
	return nil
}

// Recover re-adopts a sandbox an earlier daemon started: its init is watched
// again. It returns an error wrapping errdefs.ErrNotFound if the sandbox is
// gone (not running or paused); the caller then destroys it.
func (c *Core) Recover(ctx context.Context, h *driver.Handle) error {
	if err := checkHandle(h, c.cfg.Name); err != nil {
		return err
	}
	st, err := loadState(c.Dir(h.ID))
	if err != nil {
		return fmt.Errorf("recovering sandbox %s: %w", h.ID, err)
	}
	cs, err := c.cli.State(ctx, h.ID)
	if err != nil {
		return fmt.Errorf("recovering sandbox %s: %w", h.ID, err)
	}
	switch cs.Status {
	case "running", "paused":
	default:
		return errdefs.Wrap(errdefs.ErrNotFound, "sandbox %s is %s", h.ID, cs.Status)
	}
	c.watch(h.ID, cs.Pid)
	if p := c.Init(h.ID); p == nil {
		return errdefs.Wrap(errdefs.ErrNotFound, "sandbox %s init is gone", h.ID)
	}
	if st.CPU != nil {
		// A daemon that stopped between a start and the agent's first
		// answer left the limit unset; setting it again is harmless.
		if err := c.cg.Group(st.Cgroup).SetCPU(st.CPU.Quota, st.CPU.Period); err != nil {
			return fmt.Errorf("recovering sandbox %s: limiting its CPU: %w", h.ID, err)
		}
	}
	c.rt.InitRunning(st, cs.Pid, true)
	if st.Pid != cs.Pid {
		st.Pid = cs.Pid
		if err := st.save(); err != nil {
			return err
		}
	}
	return nil
}

// Inspect reports the runtime's view of the sandbox, its OOM kills and,
// once init ended, how.
func (c *Core) Inspect(ctx context.Context, id string) (driver.Status, error) {
	if err := checkID(id); err != nil {
		return driver.Status{}, err
	}
	st, err := loadState(c.Dir(id))
	if err != nil {
		return driver.Status{}, fmt.Errorf("inspecting sandbox %s: %w", id, err)
	}
	c.capLegacyLog(st.Dir)
	var status driver.Status
	cs, err := c.cli.State(ctx, id)
	switch {
	case err == nil:
		status.Pid = cs.Pid
		switch cs.Status {
		case "running":
			status.State = driver.StateRunning
		case "paused":
			status.State = driver.StatePaused
		case "created", "creating":
			status.State = driver.StateCreated
		case "stopped":
			status.State = driver.StateStopped
			status.Pid = 0
		default:
			status.State = driver.StateUnknown
		}
	case errdefs.IsNotFound(err):
		if st.Started {
			status.State = driver.StateUnknown
		} else {
			status.State = driver.StateCreated
		}
	default:
		return driver.Status{}, err
	}
	if n, err := c.cg.Group(st.Cgroup).OOMKills(); err == nil {
		status.OOMKills = n
	}
	if p := c.Init(id); p != nil {
		if e, ok := p.Exit(); ok {
			if status.State == driver.StateRunning || status.State == driver.StatePaused {
				// The runtime may not have noticed yet; the reaper has.
				status.State, status.Pid = driver.StateStopped, 0
			}
			if e.Known {
				status.ExitCode = e.Code
				if e.Signal != 0 {
					status.ExitSignal = unix.SignalName(e.Signal)
				}
			}
		}
	}
	return status, nil
}

// dialRetry is the pause between connection attempts while the agent
// starts: it listens a few milliseconds after init runs (runc), or a
// hundred or two under gVisor's ptrace platform, and an attempt costs
// microseconds, so polling finely for dialFastFor keeps the start fast.
// After that the pause grows to dialRetryMax for an agent that is slow.
const (
	dialRetry    = 500 * time.Microsecond
	dialFastFor  = 500 * time.Millisecond
	dialRetryMax = 20 * time.Millisecond
)

// DialAgent connects to the agent's socket, retrying until ctx is done
// while the agent does not listen yet. It fails early if the sandbox's init
// has ended, and at once, with errdefs.ErrUnavailable, if anything but the
// sandbox's agent answers (see agentsock.go).
func (c *Core) DialAgent(ctx context.Context, id string) (net.Conn, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	st, err := loadState(c.Dir(id))
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, errdefs.Wrap(errdefs.ErrNotFound, "sandbox %s", id)
		}
		return nil, err
	}
	g := c.cg.Group(st.Cgroup)
	wait, fastUntil := dialRetry, time.Now().Add(dialFastFor)
	for {
		initPid := st.Pid
		p := c.Init(id)
		if p != nil {
			initPid = p.Pid()
		}
		conn, err := c.cfg.Socket.dial(ctx, st, initPid, g)
		if err == nil {
			if err := c.applyDeferredCPU(id, st, g); err != nil {
				conn.Close()
				return nil, err
			}
			return conn, nil
		}
		if !errors.Is(err, errNotListening) {
			if errors.Is(err, errdefs.ErrUnavailable) {
				c.logger(id).Warn("refusing the agent socket's peer", "err", err)
			}
			return nil, fmt.Errorf("connecting to sandbox %s agent: %w", id, err)
		}
		if p != nil {
			select {
			case <-p.Done():
				return nil, errdefs.Wrap(errdefs.ErrUnavailable, "sandbox %s agent: init has ended", id)
			default:
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: connecting to sandbox %s agent: %v", errdefs.ErrUnavailable, id, ctx.Err())
		case <-time.After(wait):
		}
		if wait < dialRetryMax && time.Now().After(fastUntil) {
			wait *= 2
		}
	}
}

// Pause freezes every process of the sandbox (runc: the cgroup freezer;
// runsc: its Sentry stops the sandbox's tasks).
func (c *Core) Pause(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if c.cfg.FreezeCgroup {
		if err := c.freezable(id); err != nil {
			return err
		}
		if err := c.Group(id).SetFrozen(ctx, true); err != nil {
			return fmt.Errorf("pausing sandbox %s: %w", id, err)
		}
		return nil
	}
	if err := c.cli.Pause(ctx, id); err != nil {
		return fmt.Errorf("pausing sandbox %s: %w", id, err)
	}
	return nil
}

// freezable checks that sandbox id was started (its cgroup is the
// runtime's, with its init in it) before its freezer is written.
func (c *Core) freezable(id string) error {
	st, err := loadState(c.Dir(id))
	if err != nil {
		return err
	}
	if !st.Started || c.Init(id) == nil {
		return errdefs.Wrap(errdefs.ErrInvalidState, "sandbox %s is not running", id)
	}
	return nil
}

// Resume thaws a paused sandbox.
func (c *Core) Resume(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if c.cfg.FreezeCgroup {
		if err := c.freezable(id); err != nil {
			return err
		}
		if err := c.Group(id).SetFrozen(ctx, false); err != nil {
			return fmt.Errorf("resuming sandbox %s: %w", id, err)
		}
		return nil
	}
	if err := c.cli.Resume(ctx, id); err != nil {
		return fmt.Errorf("resuming sandbox %s: %w", id, err)
	}
	return nil
}
