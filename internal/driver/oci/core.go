// Package oci is the core the OCI runtime drivers share (internal/driver/runc, internal/driver/gvisor): each sandbox an OCI bundle in its own user, pid, mount, ipc, uts, cgroup and network namespaces, with seccomp, dropped capabilities, cgroup limits and a quota'd overlay root, run by a runtime that speaks runc's command line.
//
// The core does storage, uid slots, cgroups, the bundle, the agent's socket
// and its peer check, the lifecycle and its recovery after a daemon
// restart, reaping, stats, host-wide limits and the capture of a stopped
// sandbox's writable layer. What differs between runtimes, a driver says
// through Runtime (its own methods) and the few data fields of Config;
// the driver adds Name, Capabilities and Probe and embeds the Core for the
// rest of driver.Driver.
//
// Layout under Config.DataDir:
//
//	bin/airlock-agent       copy of the agent (host root's, 0711 unless
//	                        Config.AgentMode: see agentMode), bind-mounted
//	                        read-only into sandboxes
//	<StateDir>/             the runtime's state (--root)
//	slots/<n>               uid range n is taken by the sandbox id written in it
//	sandboxes/<id>/         one sandbox: config.json (the bundle), state.json,
//	                        rootfs/ and storage/ (internal/storage), agent.log
//	                        (a symlink to the agent's log on the sandbox's own
//	                        quota'd layer, see openAgentLog), runc.log,
//	                        init.pid, and the agent socket's directory
//	                        (run/ or uds/, see agentsock.go)
//
// Every directory a sandbox's user namespace must cross (data dir,
// sandboxes/, the sandbox dir, bin/) is searchable by others: root inside
// the sandbox is an unprivileged uid on the host and could not reach its
// rootfs otherwise.
package oci

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/cgroups"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
	"github.com/airlockhq/airlock/internal/reaper"
)

// Config configures the core of one driver. Zero fields take the documented
// defaults.
type Config struct {
	// Name is the driver's name, in handles and logs. Required.
	Name string
	// DataDir holds sandboxes and the runtime's state. Required; it must
	// not be another driver's: uid slots and sandbox dirs live in it.
	DataDir string
	// AgentPath is the host path of the static airlock-agent binary.
	AgentPath string
	// Binary is the runtime's executable (runc, runsc). Required.
	Binary string
	// StateDir is the runtime's state directory (--root) under DataDir;
	// default "runc".
	StateDir string
	// GlobalArgs are flags given before every subcommand (runsc: the
	// platform).
	GlobalArgs []string
	// Socket is how the daemon reaches the agent (see agentsock.go);
	// default InheritedSocket.
	Socket AgentSocket
	// AgentMode is the agent binary's mode in the data dir; default
	// 0711 (see agentMode).
	AgentMode os.FileMode
	// CgroupParent is the cgroup under which sandboxes live; default "airlock".
	CgroupParent string
	// UIDRangeStart is the first host uid handed to sandboxes; default 1<<20,
	// well above real host users.
	UIDRangeStart uint32
	// IDCount is the size of each sandbox's uid/gid range; default 65536.
	IDCount uint32
	// MaxSandboxes is the number of uid ranges, so of concurrent sandboxes;
	// default 1024.
	MaxSandboxes int
	// HostPIDs is the number of tasks all sandboxes together may run: the
	// pids.max of CgroupParent. Each sandbox has its own limit, but their
	// sum can exceed the host's pid space, and once that is full nothing
	// on the host can fork. Default half of min(kernel.pid_max,
	// kernel.threads-max); negative for no limit.
	HostPIDs int64
	// FileMax is the least fs.file-max the driver sets at start, raising a
	// lower host setting: the host's file table is shared by every process,
	// so the kernel's default (about 10% of memory in 1 KiB files) lets
	// one sandbox at the maximum memory fill it, while each open file is
	// already charged to its sandbox's memory cgroup. Default LONG_MAX
	// (what systemd sets since v240); negative leaves the host's value.
	FileMax int64
	// DiskReserveMB is the free space of the data dir's file system that
	// disk quotas may never promise away: Create refuses a sandbox whose
	// disk_mb does not fit in the free space minus the still unwritten part
	// of every live sandbox's quota minus this reserve (writable layers are
	// sparse images, so a quota takes host blocks only as it fills).
	// Default the larger of 1 GiB and 5% of the file system; negative
	// turns the check off (deliberate over-commit).
	DiskReserveMB int64
	// DeferCPULimit leaves the CPU quota out of the bundle and sets it on
	// the sandbox's cgroup once the agent first listens after a start
	// (DialAgent): the runtime's own start-up is not throttled to the
	// sandbox's quota. Under runsc the Sentry, the Gofer and the ptrace
	// stubs that boot the agent all live in the sandbox's cgroup, and a
	// quota of one CPU took a third of a cold start (measured). Nothing
	// but the agent runs before it listens, and nothing the sandbox is
	// asked to run reaches it before the quota is in place.
	DeferCPULimit bool
	// ResetInPlace lets ResetRoot return a running sandbox to fresh layers
	// keeping its init (reroot.go): for a runtime whose init lives in the
	// sandbox's own mount namespace on the bundle's rootfs (runc; not
	// runsc, whose Sentry serves the files from its Gofer).
	ResetInPlace bool
	// FreezeCgroup makes Pause and Resume write the sandbox's cgroup
	// freezer themselves instead of running the runtime's pause and resume
	// (runc's are that write, after a process start of their own that
	// costs more than the write: a resume from memory is then well under
	// a millisecond). The runtime reads the freezer for its own state, so
	// the two agree. Not for runsc, whose Sentry pauses its tasks.
	FreezeCgroup bool
	// Logger receives the driver's logs; default slog.Default().
	Logger *slog.Logger
}

// Timeouts of the core's own waits.
const (
	// KillWait bounds the wait for a killed init to be gone: SIGKILL of a
	// whole cgroup takes milliseconds, but a huge sandbox unmapping
	// gigabytes of memory can take a few seconds.
	KillWait = 10 * time.Second
	// cleanupTimeout bounds teardown and rollback that run detached from the
	// caller's context.
	cleanupTimeout = 60 * time.Second
	// legacyLogMax bounds the agent.log of a sandbox started by an earlier
	// daemon, which lives on the data dir's file system (capLegacyLog).
	legacyLogMax = 1 << 20
)

// Core runs OCI bundles with one runtime. Create one per data dir with New.
type Core struct {
	cfg       Config
	rt        Runtime
	log       *slog.Logger
	cli       *CLI
	slots     *slots
	agentPath string // copy of cfg.AgentPath in the data dir, "" if none
	agentErr  error  // why there is no agent
	sbxRoot   string
	// cg is the host's cgroup mounts, read once: parsing mountinfo costs
	// more than the counter reads it serves (Stats runs on every exec), and
	// cgroup filesystems are not remounted under a running daemon.
	cg *cgroups.Hierarchy
	// statfs reports the data dir's file system; a test hook.
	statfs func(path string, st *unix.Statfs_t) error

	mu        sync.Mutex
	sandboxes map[string]*sandbox

	// diskMu serialises disk admission; diskPending holds the quota of
	// every create between its admission and its end, whose image may not
	// exist yet.
	diskMu      sync.Mutex
	diskPending map[string]int64

	oomWarn sync.Once
}

// sandbox is the in-memory record of one sandbox this core started or
// recovered.
type sandbox struct {
	id   string
	proc *reaper.Process // watch of the current init, nil if none
	// helpers are watches of the runtime's processes that outlive init
	// and were reparented to the daemon (see SetHelpers).
	helpers []*reaper.Process
	// group and dir are read from the state file once (see paths): they
	// never change during a sandbox's life.
	group *cgroups.Group
	dir   string
	// cpuPending says the deferred CPU limit (Config.DeferCPULimit) of
	// the init last started is not on its cgroup yet.
	cpuPending bool
}

// validID matches the ids driver.Spec promises: safe as a file and cgroup
// name.
var validID = lazyregexp.New(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// New returns a core rooted at cfg.DataDir, creating its directories, that
// runs sandboxes with rt.
func New(cfg Config, rt Runtime) (*Core, error) {
	if cfg.DataDir == "" || !filepath.IsAbs(cfg.DataDir) {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "%s data dir %q must be an absolute path", cfg.Name, cfg.DataDir)
	}
	if cfg.Name == "" || cfg.Binary == "" || rt == nil {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "an OCI driver needs a name, a runtime binary and a Runtime")
	}
	if cfg.StateDir == "" {
		cfg.StateDir = "runc"
	}
	if cfg.Socket == nil {
		cfg.Socket = InheritedSocket{}
	}
	if cfg.AgentMode == 0 {
		cfg.AgentMode = agentMode
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "airlock"
	}
	if cfg.UIDRangeStart == 0 {
		cfg.UIDRangeStart = 1 << 20
	}
	if cfg.IDCount == 0 {
		cfg.IDCount = 65536
	}
	if cfg.MaxSandboxes <= 0 {
		cfg.MaxSandboxes = 1024
	}
	if uint64(cfg.UIDRangeStart)+uint64(cfg.MaxSandboxes)*uint64(cfg.IDCount) > 1<<32-1 {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "uid ranges exceed 32 bits")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Core{
		cfg:         cfg,
		rt:          rt,
		log:         cfg.Logger.With("driver", cfg.Name),
		cli:         &CLI{path: cfg.Binary, root: filepath.Join(cfg.DataDir, cfg.StateDir), global: cfg.GlobalArgs, control: rt.Control},
		sbxRoot:     filepath.Join(cfg.DataDir, "sandboxes"),
		sandboxes:   map[string]*sandbox{},
		statfs:      unix.Statfs,
		diskPending: map[string]int64{},
	}
	for _, dir := range []struct {
		path string
		mode os.FileMode
	}{{cfg.DataDir, 0o711}, {c.sbxRoot, 0o711}, {c.cli.root, 0o700}, {filepath.Join(cfg.DataDir, "bin"), 0o711}} {
		if err := os.MkdirAll(dir.path, dir.mode); err != nil {
			return nil, fmt.Errorf("creating %s: %w", dir.path, err)
		}
	}
	for _, dir := range []string{c.sbxRoot, filepath.Join(cfg.DataDir, "bin")} {
		if err := os.Chmod(dir, 0o711); err != nil {
			return nil, err
		}
	}
	if err := searchable(c.sbxRoot); err != nil {
		return nil, err
	}
	s, err := newSlots(filepath.Join(cfg.DataDir, "slots"), cfg.MaxSandboxes)
	if err != nil {
		return nil, err
	}
	c.slots = s
	if err := c.ensureCgroupParent(); err != nil {
		return nil, err
	}
	c.raiseFileMax()
	c.agentPath, c.agentErr = installAgent(cfg.AgentPath, filepath.Join(cfg.DataDir, "bin", "airlock-agent"), cfg.AgentMode)
	if c.agentErr != nil {
		c.log.Warn("no usable agent binary", "path", cfg.AgentPath, "err", c.agentErr)
	}
	return c, nil
}

// Close drops the core's watches. Sandboxes keep running: a new driver on
// the same data dir recovers them.
func (c *Core) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, s := range c.sandboxes {
		if s.proc != nil {
			s.proc.Close()
		}
		for _, h := range s.helpers {
			h.Close()
		}
		delete(c.sandboxes, id)
	}
	return nil
}

// CLI is the runtime's command line, for a driver's Runtime methods.
func (c *Core) CLI() *CLI { return c.cli }

// Logger is the driver's logger.
func (c *Core) Logger() *slog.Logger { return c.log }

// Dir is the host directory of sandbox id (which need not exist).
func (c *Core) Dir(id string) string { return filepath.Join(c.sbxRoot, id) }

// LoadState reads the state of sandbox id; an error wrapping
// errdefs.ErrNotFound if it has none.
func (c *Core) LoadState(id string) (*State, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	return loadState(c.Dir(id))
}

// Group is the cgroup of sandbox id.
func (c *Core) Group(id string) *cgroups.Group { return c.cg.Group(c.cgroupPath(id)) }

// UIDRange is the host uids the core hands to sandboxes: [start, end).
func (c *Core) UIDRange() (start, end uint64) {
	start = uint64(c.cfg.UIDRangeStart)
	return start, start + uint64(c.cfg.MaxSandboxes)*uint64(c.cfg.IDCount)
}

// AgentPath is the agent binary the sandboxes run (the data dir's copy),
// "" if there is none.
func (c *Core) AgentPath() string { return c.agentPath }

func (c *Core) cgroupPath(id string) string { return "/" + c.cfg.CgroupParent + "/" + id }

func (c *Core) logger(id string) *slog.Logger { return c.log.With("sandbox_id", id) }

func checkID(id string) error {
	if !validID.MatchString(id) {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "invalid sandbox id %q", id)
	}
	return nil
}

// searchable checks that every directory from / down to dir lets others
// search it: the sandbox's root is a host uid without any privilege here.
func searchable(dir string) error {
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return errdefs.Wrap(errdefs.ErrInvalidArgument,
				"%s is not searchable by others (mode %v): sandboxes could not reach their root", p, fi.Mode().Perm())
		}
		if p == "/" {
			return nil
		}
	}
}

// List returns the ids of the sandboxes in the data dir (created and not
// destroyed), whichever daemon made them: driver.Lister.
func (c *Core) List(context.Context) ([]string, error) {
	ents, err := os.ReadDir(c.sbxRoot)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() && checkID(e.Name()) == nil {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}
