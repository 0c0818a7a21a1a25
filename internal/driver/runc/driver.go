// Package runc is the default airlock driver: each sandbox is an OCI bundle run by Debian's runc, in its own user, pid, mount, ipc, uts, cgroup and network namespaces, with seccomp, dropped capabilities, cgroup limits and a quota'd overlay root.
//
// Layout under Config.DataDir:
//
//	bin/airlock-agent       copy of the agent (host root's, 0711: see agentMode),
//	                        bind-mounted read-only into sandboxes
//	runc/                   runc's state (--root)
//	slots/<n>               uid range n is taken by the sandbox id written in it
//	sandboxes/<id>/         one sandbox: config.json (the bundle), state.json,
//	                        rootfs/ and storage/ (internal/storage), run/ (the
//	                        agent's socket, root's, never mounted into the
//	                        sandbox), agent.log (a symlink to the agent's log
//	                        on the sandbox's own quota'd layer, see
//	                        openAgentLog), runc.log, init.pid; with
//	                        Runtime.ListenSocket uds/ (see agentsock.go)
//
// Another OCI runtime that speaks runc's command line (gVisor's runsc) runs
// the same bundles through Config.Runtime: see internal/driver/gvisor.
//
// Every directory a sandbox's user namespace must cross (data dir, sandboxes/,
// the sandbox dir, bin/) is searchable by others: root inside the sandbox is
// an unprivileged uid on the host and could not reach its rootfs otherwise.
package runc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/cgroups"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
	"github.com/airlockhq/airlock/internal/mountinfo"
	"github.com/airlockhq/airlock/internal/reaper"
	"github.com/airlockhq/airlock/internal/storage"
)

// Name is the runtime name of this driver.
const Name = "runc"

var (
	_ driver.Driver = (*Driver)(nil)
	_ driver.Pauser = (*Driver)(nil)
	_ driver.Stater = (*Driver)(nil)
)

// Config configures the runc driver. Zero fields take the documented defaults.
type Config struct {
	// DataDir holds sandboxes and runc state. Required.
	DataDir string
	// AgentPath is the host path of the static airlock-agent binary.
	AgentPath string
	// RuncPath is the runc binary; default "runc" on PATH, else /usr/sbin/runc.
	RuncPath string
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
	// Logger receives the driver's logs; default slog.Default().
	Logger *slog.Logger
	// Runtime is the OCI runtime; the zero value is runc.
	Runtime Runtime
}

// Timeouts of the driver's own waits.
const (
	// killWait bounds the wait for a killed init to be gone: SIGKILL of a
	// whole cgroup takes milliseconds, but a huge sandbox unmapping gigabytes
	// of memory can take a few seconds.
	killWait = 10 * time.Second
	// cleanupTimeout bounds teardown and rollback that run detached from the
	// caller's context.
	cleanupTimeout = 60 * time.Second
	// legacyLogMax bounds the agent.log of a sandbox started by an earlier
	// daemon, which lives on the data dir's file system (capLegacyLog).
	legacyLogMax = 1 << 20
	// reapEvery is how often the runtime's orphaned processes are reaped
	// (Runtime.Helpers): a sandbox whose runtime died on its own (an OOM
	// kill) leaves its zombies to the daemon, and they cost only a pid each.
	reapEvery = 30 * time.Second
	// oomScoreAdj is the agent's: the kernel kills user code (the agent raises
	// its children to 500) long before the sandbox's only way in.
	oomScoreAdj = -998
)

// Driver runs sandboxes with runc. Create one per data dir with New.
type Driver struct {
	cfg       Config
	log       *slog.Logger
	runc      *runcCLI
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

	oomWarn  sync.Once
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// sandbox is the in-memory record of one sandbox this driver instance started
// or recovered.
type sandbox struct {
	id   string
	proc *reaper.Process // watch of the current init, nil if none
	// helpers are watches of the runtime's processes that outlive init
	// and were reparented to the daemon (Runtime.Helpers): they must be
	// reaped, or runsc waits on their zombies for ever.
	helpers []*reaper.Process
	// group and dir are read from the state file once (see paths): they
	// never change during a sandbox's life.
	group *cgroups.Group
	dir   string
}

// validID matches the ids Spec promises: safe as a file and cgroup name.
var validID = lazyregexp.New(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// New returns a driver rooted at cfg.DataDir, creating its directories.
func New(cfg Config) (*Driver, error) {
	if cfg.DataDir == "" || !filepath.IsAbs(cfg.DataDir) {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "runc data dir %q must be an absolute path", cfg.DataDir)
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
	if cfg.RuncPath == "" {
		cfg.RuncPath = "runc"
	}
	if !strings.Contains(cfg.RuncPath, "/") {
		if p, err := exec.LookPath(cfg.RuncPath); err == nil {
			cfg.RuncPath = p
		} else {
			cfg.RuncPath = "/usr/sbin/runc"
		}
	}
	rt := &cfg.Runtime
	if rt.Name == "" {
		rt.Name = Name
	}
	if rt.Isolation == "" {
		rt.Isolation = driver.IsolationContainer
	}
	if rt.Binary == "" {
		rt.Binary = cfg.RuncPath
	}
	if rt.StateDir == "" {
		rt.StateDir = "runc"
	}
	d := &Driver{
		cfg:         cfg,
		log:         cfg.Logger.With("driver", rt.Name),
		runc:        &runcCLI{path: rt.Binary, root: filepath.Join(cfg.DataDir, rt.StateDir), global: rt.GlobalArgs},
		sbxRoot:     filepath.Join(cfg.DataDir, "sandboxes"),
		sandboxes:   map[string]*sandbox{},
		statfs:      unix.Statfs,
		diskPending: map[string]int64{},
		stop:        make(chan struct{}),
	}
	if rt.CommandsInNetNS {
		d.runc.netnsOf = func(id string) string {
			if checkID(id) != nil {
				return ""
			}
			st, err := loadState(d.dir(id))
			if err != nil {
				return ""
			}
			return st.NetNS
		}
	}
	for _, dir := range []struct {
		path string
		mode os.FileMode
	}{{cfg.DataDir, 0o711}, {d.sbxRoot, 0o711}, {d.runc.root, 0o700}, {filepath.Join(cfg.DataDir, "bin"), 0o711}} {
		if err := os.MkdirAll(dir.path, dir.mode); err != nil {
			return nil, fmt.Errorf("creating %s: %w", dir.path, err)
		}
	}
	for _, dir := range []string{d.sbxRoot, filepath.Join(cfg.DataDir, "bin")} {
		if err := os.Chmod(dir, 0o711); err != nil {
			return nil, err
		}
	}
	if err := searchable(d.sbxRoot); err != nil {
		return nil, err
	}
	s, err := newSlots(filepath.Join(cfg.DataDir, "slots"), cfg.MaxSandboxes)
	if err != nil {
		return nil, err
	}
	d.slots = s
	if err := d.ensureCgroupParent(); err != nil {
		return nil, err
	}
	d.raiseFileMax()
	mode := os.FileMode(agentMode)
	if rt.ReadableAgent {
		mode = 0o755
	}
	d.agentPath, d.agentErr = installAgent(cfg.AgentPath, filepath.Join(cfg.DataDir, "bin", "airlock-agent"), mode)
	if d.agentErr != nil {
		d.log.Warn("no usable agent binary", "path", cfg.AgentPath, "err", d.agentErr)
	}
	if rt.Helpers {
		d.wg.Add(1)
		go d.reapLoop()
	}
	return d, nil
}

// Close stops the driver's background work. Sandboxes keep running: a new
// driver on the same data dir recovers them.
func (d *Driver) Close() error {
	d.stopOnce.Do(func() { close(d.stop) })
	d.wg.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, s := range d.sandboxes {
		if s.proc != nil {
			s.proc.Close()
		}
		delete(d.sandboxes, id)
	}
	return nil
}

// ensureCgroupParent creates the parent cgroup of all sandboxes in every
// hierarchy. It stays for the daemon's lifetime (like Docker's /docker):
// removing it when the last sandbox goes would race with runc creating the
// next one below it.
func (d *Driver) ensureCgroupParent() error {
	h, err := cgroups.Load()
	if err != nil {
		return err
	}
	d.cg = h
	parent := h.Group(d.cfg.CgroupParent)
	for _, dir := range parent.Dirs() {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("creating cgroup parent: %w", err)
		}
	}
	budget := d.cfg.HostPIDs
	if budget == 0 {
		if budget, err = hostPIDBudget(); err != nil {
			return err
		}
	}
	if !h.Has("pids") {
		d.log.Warn("no pids cgroup controller: the sandboxes' total tasks are not bounded")
		return nil
	}
	if err := parent.SetPIDsMax(budget); err != nil {
		return fmt.Errorf("limiting the sandboxes' tasks: %w", err)
	}
	d.log.Debug("sandboxes' task budget set", "cgroup", parent.Path(), "pids_max", budget)
	return nil
}

// hostPIDBudget is the default HostPIDs: half of the host's pid space
// (the lower of kernel.pid_max and kernel.threads-max), the other half
// left to the host, the daemon and everything else.
func hostPIDBudget() (int64, error) {
	var space int64
	for _, p := range []string{"/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"} {
		v, err := readSysctl(p)
		if err != nil {
			return 0, err
		}
		if space == 0 || v < space {
			space = v
		}
	}
	return max(space/2, 1), nil
}

// fileMaxDefault is the default Config.FileMax: LONG_MAX, the kernel's
// upper bound for fs.file-max.
const fileMaxDefault = 1<<63 - 1

const fileMaxPath = "/proc/sys/fs/file-max"

// raiseFileMax raises fs.file-max to cfg.FileMax if it is lower. Failure
// (a host that mounts /proc/sys read-only for the daemon) is only logged:
// sandboxes still run, with the host's file table as their shared limit.
func (d *Driver) raiseFileMax() {
	want := d.cfg.FileMax
	if want < 0 {
		return
	}
	if want == 0 {
		want = fileMaxDefault
	}
	cur, err := readSysctl(fileMaxPath)
	if err != nil {
		d.log.Warn("reading fs.file-max", "err", err)
		return
	}
	if cur >= want {
		return
	}
	if err := os.WriteFile(fileMaxPath, []byte(strconv.FormatInt(want, 10)), 0); err != nil {
		d.log.Warn("cannot raise fs.file-max: one sandbox can fill the host's file table", "file_max", cur, "err", err)
		return
	}
	d.log.Info("raised fs.file-max: open files are bounded by each sandbox's memory cgroup", "was", cur, "now", want)
}

// readSysctl reads a single-number file of /proc/sys.
func readSysctl(p string) (int64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parsing %s: %w", p, err)
	}
	return v, nil
}

// diskReserveMin is the least default reserve of DiskReserveMB: what the
// host needs to keep working (the store, logs, template builds).
const diskReserveMin = 1 << 30

// admitDisk reserves diskMB for sandbox id against the data dir's free
// space, or fails with an error wrapping errdefs.ErrCapacityExhausted if
// the host cannot promise it: free space, minus what live sandboxes may
// still write into their sparse images, minus creates in flight, minus the
// reserve. The returned release ends the reservation once the sandbox's
// image exists (it is then counted from the image itself) or the create
// failed.
func (d *Driver) admitDisk(id string, res driver.Resources) (release func(), err error) {
	if res.DiskTmpfs || d.cfg.DiskReserveMB < 0 {
		return func() {}, nil // tmpfs layers use memory, not disk
	}
	want := res.DiskMB << 20
	d.diskMu.Lock()
	defer d.diskMu.Unlock()
	var sfs unix.Statfs_t
	if err := d.statfs(d.sbxRoot, &sfs); err != nil {
		return nil, fmt.Errorf("statfs of the data dir: %w", err)
	}
	free := int64(sfs.Bavail) * sfs.Bsize
	reserve := d.cfg.DiskReserveMB << 20
	if reserve == 0 {
		reserve = max(diskReserveMin, int64(sfs.Blocks)*sfs.Bsize/20)
	}
	var promised int64
	ents, err := os.ReadDir(d.sbxRoot)
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	for _, e := range ents {
		if _, ok := d.diskPending[e.Name()]; ok || !e.IsDir() {
			continue
		}
		n, err := storage.Unallocated(filepath.Join(d.sbxRoot, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("disk promised to sandbox %s: %w", e.Name(), err)
		}
		promised += n
	}
	for _, n := range d.diskPending {
		promised += n
	}
	if avail := free - promised - reserve; want > avail {
		return nil, errdefs.Wrap(errdefs.ErrCapacityExhausted,
			"disk: %d MiB asked, the host can promise %d MiB (free %d MiB, promised to sandboxes %d MiB, reserve %d MiB)",
			want>>20, max(avail, 0)>>20, free>>20, promised>>20, reserve>>20)
	}
	d.diskPending[id] = want
	return func() {
		d.diskMu.Lock()
		delete(d.diskPending, id)
		d.diskMu.Unlock()
	}, nil
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

// agentMode is the agent binary's mode in the data dir: executable by the
// sandboxes' uids, readable by nobody but host root. An exec of a binary
// its process cannot read is non-dumpable from its first instruction, and
// its memory belongs to the host's user namespace (would_dump in
// fs/exec.c): no process of the sandbox, root included, can then read or
// write the agent's memory, environment or descriptors through /proc, and
// no user of the sandbox can read the binary. Root inside holds
// CAP_DAC_OVERRIDE only over files of uids its user namespace maps, and
// host root is not one of them. The agent also makes itself non-dumpable
// as it starts (internal/agent/nodump), which holds where the binary must
// stay readable (Runtime.ReadableAgent).
const agentMode = 0o711

// installAgent copies the agent binary into the data dir, host root's with
// mode (agentMode), by an atomic rename: running sandboxes keep the inode
// they bind-mounted, so an upgrade never changes a binary under a running
// agent, and the copy is reachable by sandbox uids wherever the original
// lives.
func installAgent(src, dst string, mode os.FileMode) (string, error) {
	if src == "" {
		return "", errors.New("no agent path configured")
	}
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".agent-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	_, err = io.Copy(tmp, in)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), mode)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		return "", fmt.Errorf("installing agent: %w", err)
	}
	return dst, nil
}

// Name is "runc", or the name of Config.Runtime.
func (d *Driver) Name() string { return d.rtName() }

// Capabilities of runc: container isolation, freezer pause, a disk quota
// through the loop-mounted writable layer; no memory snapshots (no CRIU).
func (d *Driver) Capabilities() driver.Capabilities {
	return driver.Capabilities{
		Isolation:    d.cfg.Runtime.Isolation,
		Pause:        true,
		DiskQuota:    true,
		NetworkModes: []driver.NetworkMode{driver.NetworkNone, driver.NetworkAllowlist, driver.NetworkOpen},

		InterfacesAtStart: d.cfg.Runtime.InterfacesAtStart,
	}
}

func (d *Driver) dir(id string) string { return filepath.Join(d.sbxRoot, id) }

func (d *Driver) cgroupPath(id string) string { return "/" + d.cfg.CgroupParent + "/" + id }

func (d *Driver) logger(id string) *slog.Logger { return d.log.With("sandbox_id", id) }

func checkID(id string) error {
	if !validID.MatchString(id) {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "invalid sandbox id %q", id)
	}
	return nil
}

// Create allocates a uid range, prepares the sandbox's storage and writes its
// bundle. Nothing runs yet; on error nothing is left behind.
func (d *Driver) Create(ctx context.Context, spec driver.Spec) (_ *driver.Handle, retErr error) {
	if err := checkID(spec.ID); err != nil {
		return nil, err
	}
	if d.agentErr != nil {
		return nil, errdefs.Wrap(errdefs.ErrRuntimeUnavailable, "runc driver has no agent binary")
	}
	if len(spec.Template.Layers) == 0 {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "template %q has no layers", spec.Template.Name)
	}
	res := withDefaults(spec.Resources)
	log := d.logger(spec.ID)
	dir := d.dir(spec.ID)
	t0 := time.Now()
	release, err := d.admitDisk(spec.ID, res)
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
	slot, err := d.slots.alloc(spec.ID)
	if err != nil {
		return nil, err
	}
	undo = append(undo, func(context.Context) { d.slots.free(slot, spec.ID) })
	st := &sandboxState{
		ID: spec.ID, Slot: slot, UIDBase: d.cfg.UIDRangeStart + uint32(slot)*d.cfg.IDCount,
		IDCount: d.cfg.IDCount, Dir: dir, Cgroup: d.cgroupPath(spec.ID), NetNS: spec.NetNSPath,
	}
	// The agent's socket dir is root's and stays on the host (see
	// agentsock.go): the umask cannot widen 0700.
	if err := os.Mkdir(filepath.Join(dir, "run"), 0o700); err != nil {
		return nil, fmt.Errorf("creating agent run dir: %w", err)
	}
	if d.cfg.Runtime.RunArgs != nil {
		st.RunArgs = d.cfg.Runtime.RunArgs(spec)
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
	undo = append(undo, func(ctx context.Context) {
		if err := storage.TeardownDir(ctx, dir); err != nil {
			log.Error("rolling back sandbox storage", "err", err)
		}
	})
	if d.cfg.Runtime.ListenSocket {
		// Rolled back by the storage teardown, like the sysfs below.
		if err := makeSocketDir(filepath.Join(dir, socketDirName), st.UIDBase); err != nil {
			return nil, err
		}
	}
	var sysDir string
	if spec.NetNSPath != "" {
		// Rolled back by the storage teardown above: it unmounts every
		// mount under the sandbox dir.
		sysDir = filepath.Join(dir, sysDirName)
		if err := mountNetnsSysfs(spec.NetNSPath, sysDir); err != nil {
			return nil, err
		}
	}
	spec.Resources = res
	t2 := time.Now()
	s, err := buildSpec(bundleParams{
		Spec: spec, Rootfs: rootfs.Path(), AgentPath: d.agentPath,
		UIDBase: st.UIDBase, IDCount: st.IDCount, Cgroup: st.Cgroup, SysDir: sysDir,
		SocketDir: d.socketDir(dir),
	})
	if err != nil {
		return nil, err
	}
	if d.cfg.Runtime.EditSpec != nil {
		if err := d.cfg.Runtime.EditSpec(s, spec, dir); err != nil {
			return nil, fmt.Errorf("adapting bundle: %w", err)
		}
	}
	if err := writeSpec(dir, s); err != nil {
		return nil, fmt.Errorf("writing bundle: %w", err)
	}
	h, err := st.handle(d.rtName())
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
func (d *Driver) Start(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	st, err := loadState(d.dir(id))
	if err != nil {
		return fmt.Errorf("starting sandbox %s: %w", id, err)
	}
	log := d.logger(id)
	// runc state costs a process; a sandbox's first start has no record.
	if !d.runc.exists(id) {
		// nothing to clean
	} else if cs, err := d.runc.state(ctx, id); err == nil {
		switch cs.Status {
		case "running", "paused", "created", "creating":
			return errdefs.Wrap(errdefs.ErrInvalidState, "sandbox %s is %s", id, cs.Status)
		}
		// A stopped container keeps its id in runc until deleted; the
		// runtime's helpers must be gone first (runsc waits for them).
		if d.cfg.Runtime.Helpers {
			hctx, cancel := context.WithTimeout(ctx, killWait)
			err := d.killHelpers(hctx, id)
			cancel()
			if err != nil {
				return err
			}
		}
		if err := d.runc.delete(ctx, id); err != nil && !errdefs.IsNotFound(err) {
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
	var extra []*os.File
	if d.cfg.Runtime.ListenSocket {
		// The agent makes its own socket; an earlier one died with the
		// earlier init and would only answer "refused".
		if err := sealSocketDir(filepath.Join(dir, socketDirName), st.UIDBase, false); err != nil {
			return fmt.Errorf("starting sandbox %s: %w", id, err)
		}
		if err := removeStaleSocket(filepath.Join(dir, socketDirName)); err != nil {
			return fmt.Errorf("starting sandbox %s: %w", id, err)
		}
	} else {
		// A fresh socket for every start: the one of an earlier init died
		// with it.
		sock, err := bindAgentSocket(filepath.Join(dir, "run"))
		if err != nil {
			return fmt.Errorf("starting sandbox %s: %w", id, err)
		}
		defer sock.Close() // the init keeps its own copy
		extra = append(extra, sock)
	}
	pidFile := filepath.Join(dir, "init.pid")
	os.Remove(pidFile)
	t0 := time.Now()
	var launch func(*exec.Cmd) error
	if l := d.cfg.Runtime.Launch; l != nil {
		launch = func(cmd *exec.Cmd) error { return l(cmd, st.NetNS, dir) }
	}
	if err := d.runc.run(ctx, id, dir, pidFile, filepath.Join(dir, "runc.log"), logf, st.RunArgs, launch, extra...); err != nil {
		// runc may leave a container record behind on failure.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		d.runc.delete(cctx, id)
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
	d.watch(id, pid)
	d.watchHelpers(id, pid)
	// Lowering a score needs CAP_SYS_RESOURCE in the host's namespace, which
	// only the daemon has.
	if d.cfg.Runtime.KeepOOMScore {
		// nothing to lower
	} else if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte(strconv.Itoa(oomScoreAdj)), 0); err != nil {
		// Without CAP_SYS_RESOURCE (some CI containers) this fails for
		// every sandbox: say so once.
		d.oomWarn.Do(func() { log.Warn("cannot lower agent oom score; the OOM killer may pick the agent", "err", err) })
	}
	st.Started, st.Pid = true, pid
	if err := st.save(); err != nil {
		return err
	}
	log.Debug("sandbox started", "pid", pid, "runc_us", t1.Sub(t0).Microseconds(), "after_us", time.Since(t1).Microseconds())
	return nil
}

// watch records pid as the init of id and reaps it when it ends.
func (d *Driver) watch(id string, pid int) {
	p, err := reaper.Watch(pid)
	if err != nil {
		d.log.Warn("watching sandbox init", "sandbox_id", id, "pid", pid, "err", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.sandboxes[id]
	if s == nil {
		s = &sandbox{id: id}
		d.sandboxes[id] = s
	}
	if s.proc != nil && s.proc != p {
		s.proc.Close()
	}
	s.proc = p
}

// proc returns the watch of id's init, nil if none.
func (d *Driver) proc(id string) *reaper.Process {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s := d.sandboxes[id]; s != nil {
		return s.proc
	}
	return nil
}

// forget drops the in-memory record of id.
func (d *Driver) forget(id string) {
	d.mu.Lock()
	s := d.sandboxes[id]
	delete(d.sandboxes, id)
	d.mu.Unlock()
	if s != nil && s.proc != nil {
		s.proc.Close()
	}
	if s != nil {
		for _, h := range s.helpers {
			h.Close()
		}
	}
}

// watchHelpers watches the processes of id's cgroup, other than init,
// whose parent is the daemon: the runtime's helpers, which a detached run
// leaves to the daemon (its subreaper) to reap.
func (d *Driver) watchHelpers(id string, initPid int) {
	if !d.cfg.Runtime.Helpers {
		return
	}
	self := os.Getpid()
	var ws []*reaper.Process
	for _, pid := range cgroupPIDs(d.cg.Group(d.cgroupPath(id))) {
		if pid == initPid || parentPid(pid) != self {
			continue
		}
		if p, err := reaper.Watch(pid); err == nil {
			ws = append(ws, p)
		}
	}
	d.mu.Lock()
	s := d.sandboxes[id]
	if s == nil {
		s = &sandbox{id: id}
		d.sandboxes[id] = s
	}
	old := s.helpers
	s.helpers = ws
	d.mu.Unlock()
	for _, h := range old {
		h.Close()
	}
}

// nobodyUID is the host uid runsc runs its Sentry and the ptrace stubs as.
const nobodyUID = 65534

// isRuntimeZombie reports whether pid is a dead process of a sandbox
// runtime left to the daemon: a zombie child of the daemon, named "exe"
// (runsc re-executes itself) and running as runsc's uid or one of the
// driver's sandbox uids. That is never a child os/exec waits for: those
// are runtime CLIs (named after their binary) and the idmap helper (which
// runs as host root).
func (d *Driver) isRuntimeZombie(pid, self int) bool {
	st, ok := readStat(pid)
	if !ok || st.state != 'Z' || st.comm != "exe" || st.ppid != self {
		return false
	}
	uid, ok := realUID(pid)
	if !ok {
		return false
	}
	end := uint64(d.cfg.UIDRangeStart) + uint64(d.cfg.MaxSandboxes)*uint64(d.cfg.IDCount)
	return uid == nobodyUID || (uid >= d.cfg.UIDRangeStart && uint64(uid) < end)
}

// reapRuntimeZombies reaps every runtime zombie (isRuntimeZombie) and
// returns how many. runsc's ptrace stubs are children of its Sentry: when
// it dies they are reparented to the daemon, the subreaper, and nobody
// else would reap them.
func (d *Driver) reapRuntimeZombies() int {
	self := os.Getpid()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !d.isRuntimeZombie(pid, self) {
			continue
		}
		var info unix.Siginfo
		if unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG, nil) == nil {
			n++
		}
	}
	return n
}

// reapSnapshot waits until every process of snap (pid and start time,
// taken from the sandbox's cgroup before its init was killed) is gone,
// reaping those that died as the daemon's children.
func (d *Driver) reapSnapshot(ctx context.Context, snap map[int]uint64) error {
	self := os.Getpid()
	for {
		left := 0
		for pid, start := range snap {
			st, ok := readStat(pid)
			if !ok || st.start != start {
				delete(snap, pid) // gone (or its pid reused)
				continue
			}
			if st.state == 'Z' && st.ppid == self {
				var info unix.Siginfo
				if err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG, nil); err == nil {
					delete(snap, pid)
					continue
				}
			}
			left++
		}
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d runtime processes not gone: %w", left, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// snapshotCgroup returns the processes of g with their start times.
func snapshotCgroup(g *cgroups.Group) map[int]uint64 {
	snap := map[int]uint64{}
	for _, pid := range cgroupPIDs(g) {
		if st, ok := readStat(pid); ok {
			snap[pid] = st.start
		}
	}
	return snap
}

// realUID returns the real uid of pid.
func realUID(pid int) (uint32, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				return 0, false
			}
			n, err := strconv.ParseUint(f[0], 10, 32)
			return uint32(n), err == nil
		}
	}
	return 0, false
}

// procStat is what reapZombies reads of /proc/PID/stat.
type procStat struct {
	comm  string
	state byte
	ppid  int
	start uint64 // start time in clock ticks after boot
}

func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	i, j := strings.IndexByte(string(b), '('), strings.LastIndexByte(string(b), ')')
	if i < 0 || j < i {
		return procStat{}, false
	}
	f := strings.Fields(string(b[j+1:]))
	if len(f) < 2 || len(f[0]) != 1 {
		return procStat{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	var start uint64
	if len(f) > 19 {
		start, _ = strconv.ParseUint(f[19], 10, 64)
	}
	return procStat{comm: string(b[i+1 : j]), state: f[0][0], ppid: ppid, start: start}, true
}

// parentPid returns the parent of pid, 0 if unknown.
func parentPid(pid int) int {
	st, _ := readStat(pid)
	return st.ppid
}

// waitInit waits until id's init (pid) is gone or ctx is done, reaping it
// if it is our child.
func (d *Driver) waitInit(ctx context.Context, id string, pid int) error {
	p := d.proc(id)
	if p == nil || (pid > 0 && p.Pid() != pid) {
		if pid <= 0 {
			return nil
		}
		d.watch(id, pid)
		if p = d.proc(id); p == nil {
			return nil // already gone
		}
	}
	select {
	case <-p.Done():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for sandbox %s init to end: %w", id, ctx.Err())
	}
}

// Stop sends SIGTERM to init, waits up to timeout and then kills every
// process of the sandbox. Storage is kept.
func (d *Driver) Stop(ctx context.Context, id string, timeout time.Duration) error {
	if err := checkID(id); err != nil {
		return err
	}
	if _, err := loadState(d.dir(id)); err != nil {
		return fmt.Errorf("stopping sandbox %s: %w", id, err)
	}
	cs, err := d.runc.state(ctx, id)
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
		if err := d.runc.resume(ctx, id); err != nil {
			return err
		}
	}
	if timeout > 0 {
		if err := d.runc.kill(ctx, id, "TERM", false); err == nil {
			wctx, cancel := context.WithTimeout(ctx, timeout)
			d.waitInit(wctx, id, cs.Pid)
			cancel()
		}
	}
	return d.killAll(ctx, id, cs.Pid)
}

// killAll ends every process of the sandbox and waits for init to go:
// it thaws a frozen sandbox (frozen tasks do not die), then SIGKILLs init
// through its pidfd. The sandbox has its own pid namespace, so the kernel
// kills every other process in it when init dies, and init's end is only
// reported once they are gone. pid is init's pid if known, 0 to ask runc.
func (d *Driver) killAll(ctx context.Context, id string, pid int) error {
	if !d.cfg.Runtime.Helpers {
		return d.killInit(ctx, id, pid)
	}
	// The runtime's processes, taken before init dies: its children are
	// then reparented to the daemon, and a zombie no longer shows its
	// cgroup.
	snap := snapshotCgroup(d.cg.Group(d.cgroupPath(id)))
	if err := d.killInit(ctx, id, pid); err != nil {
		return err
	}
	hctx, cancel := context.WithTimeout(ctx, killWait)
	defer cancel()
	if err := d.killHelpers(hctx, id); err != nil {
		return err
	}
	if err := d.reapSnapshot(hctx, snap); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	return nil
}

// killInit is killAll without the runtime's helpers.
func (d *Driver) killInit(ctx context.Context, id string, pid int) error {
	p := d.proc(id)
	if p == nil || (pid != 0 && p.Pid() != pid) {
		if pid == 0 {
			cs, err := d.runc.state(ctx, id)
			if errdefs.IsNotFound(err) {
				return nil
			}
			if err != nil {
				return err
			}
			if cs.Status == "stopped" || cs.Pid <= 0 {
				return nil
			}
			pid = cs.Pid
		}
		d.watch(id, pid)
		if p = d.proc(id); p == nil {
			return nil // already gone
		}
	}
	select {
	case <-p.Done():
		return nil
	default:
	}
	frozen, _ := d.cg.Group(d.cgroupPath(id)).Frozen()
	if !frozen && d.cfg.Runtime.PausesItself {
		cs, err := d.runc.state(ctx, id)
		frozen = err == nil && cs.Status == "paused"
	}
	if frozen {
		if err := d.runc.resume(ctx, id); err != nil {
			return fmt.Errorf("thawing sandbox %s: %w", id, err)
		}
	}
	if err := p.Signal(unix.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("killing sandbox %s: %w", id, err)
	}
	wctx, cancel := context.WithTimeout(ctx, killWait)
	defer cancel()
	return d.waitInit(wctx, id, 0)
}

// killHelpers kills what the runtime left in the sandbox's cgroup after its
// init ended and waits until the cgroup is empty. Only the sandbox's own
// processes are there: the runtime put them there.
func (d *Driver) killHelpers(ctx context.Context, id string) error {
	g := d.cg.Group(d.cgroupPath(id))
	for {
		pids := cgroupPIDs(g)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("killing sandbox %s runtime helper %d: %w", id, pid, err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sandbox %s runtime helpers survive: %w", id, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	// Stubs of a Sentry that died on its own before (an OOM kill) are
	// zombies of the daemon already.
	d.reapRuntimeZombies()
	// A dead process leaves its cgroup at once but stays a zombie until
	// its parent reaps it; the watched ones are the daemon's to reap.
	d.mu.Lock()
	var hs []*reaper.Process
	if s := d.sandboxes[id]; s != nil {
		hs = s.helpers
	}
	d.mu.Unlock()
	for _, h := range hs {
		select {
		case <-h.Done():
		case <-ctx.Done():
			return fmt.Errorf("sandbox %s runtime helper %d not reaped: %w", id, h.Pid(), ctx.Err())
		}
	}
	return nil
}

// Destroy kills every process and removes the sandbox's cgroups, mounts, loop
// devices and files, and frees its uid range. It is idempotent and works from
// the data dir alone: after a daemon restart or on a half-created sandbox.
func (d *Driver) Destroy(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	log := d.logger(id)
	dir := d.dir(id)
	st, err := loadState(dir)
	if err != nil && !errdefs.IsNotFound(err) {
		log.Warn("destroy: unreadable state, cleaning by id", "err", err)
	}
	var errs []error
	if d.runc.exists(id) {
		if err := d.killAll(ctx, id, 0); err != nil {
			// Deleting the container or its storage under live processes
			// would fail or leak: stop here, Destroy can be retried.
			return fmt.Errorf("destroying sandbox %s: %w", id, err)
		}
	} else if d.proc(id) != nil {
		// runc forgot it but we may still hold its zombie.
		wctx, wcancel := context.WithTimeout(ctx, killWait)
		d.waitInit(wctx, id, 0)
		wcancel()
	}
	d.forget(id)
	// Nothing runs in the sandbox any more: runc's record and cgroups, and
	// the storage, are independent and go in parallel.
	var runcErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if d.runc.exists(id) {
			if err := d.runc.delete(ctx, id); err != nil && !errdefs.IsNotFound(err) {
				runcErr = err
				return
			}
		}
		// runc can leave empty cgroup directories behind (a failed start,
		// a crash between its steps).
		runcErr = d.cg.Group(d.cgroupPath(id)).Remove(ctx)
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
		slot = d.slots.find(id)
	}
	if err := d.slots.free(slot, id); err != nil {
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
func (d *Driver) Recover(ctx context.Context, h *driver.Handle) error {
	if h == nil {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "nil handle")
	}
	if h.Driver != "" && h.Driver != d.rtName() {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "handle of driver %q", h.Driver)
	}
	if h.Version > stateVersion {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "handle version %d is newer than this driver's %d", h.Version, stateVersion)
	}
	if err := checkID(h.ID); err != nil {
		return err
	}
	st, err := loadState(d.dir(h.ID))
	if err != nil {
		return fmt.Errorf("recovering sandbox %s: %w", h.ID, err)
	}
	cs, err := d.runc.state(ctx, h.ID)
	if err != nil {
		return fmt.Errorf("recovering sandbox %s: %w", h.ID, err)
	}
	switch cs.Status {
	case "running", "paused":
	default:
		return errdefs.Wrap(errdefs.ErrNotFound, "sandbox %s is %s", h.ID, cs.Status)
	}
	d.watch(h.ID, cs.Pid)
	if p := d.proc(h.ID); p == nil {
		return errdefs.Wrap(errdefs.ErrNotFound, "sandbox %s init is gone", h.ID)
	}
	d.watchHelpers(h.ID, cs.Pid)
	if st.Pid != cs.Pid {
		st.Pid = cs.Pid
		if err := st.save(); err != nil {
			return err
		}
	}
	return nil
}

// Inspect reports runc's view of the sandbox, its OOM kills and, once init
// ended, how.
func (d *Driver) Inspect(ctx context.Context, id string) (driver.Status, error) {
	if err := checkID(id); err != nil {
		return driver.Status{}, err
	}
	st, err := loadState(d.dir(id))
	if err != nil {
		return driver.Status{}, fmt.Errorf("inspecting sandbox %s: %w", id, err)
	}
	d.capLegacyLog(st.Dir)
	var status driver.Status
	cs, err := d.runc.state(ctx, id)
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
	if n, err := d.cg.Group(st.Cgroup).OOMKills(); err == nil {
		status.OOMKills = n
	}
	if p := d.proc(id); p != nil {
		if e, ok := p.Exit(); ok {
			if status.State == driver.StateRunning || status.State == driver.StatePaused {
				// runc may not have noticed yet; the reaper has.
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
// starts: it listens a few milliseconds after init runs, and an attempt
// costs microseconds, so polling finely keeps the start fast. After
// dialFastTries the pause grows to dialRetryMax for an agent that is slow.
const (
	dialRetry     = 500 * time.Microsecond
	dialFastTries = 100
	dialRetryMax  = 20 * time.Millisecond
)

// DialAgent connects to the agent's socket, retrying until ctx is done
// while the agent does not listen yet. It fails early if the sandbox's init
// has ended, and at once, with errdefs.ErrUnavailable, if anything but the
// sandbox's agent answers (see agentsock.go).
func (d *Driver) DialAgent(ctx context.Context, id string) (net.Conn, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	st, err := loadState(d.dir(id))
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, errdefs.Wrap(errdefs.ErrNotFound, "sandbox %s", id)
		}
		return nil, err
	}
	runDir := filepath.Join(st.Dir, "run")
	if d.cfg.Runtime.ListenSocket {
		runDir = filepath.Join(st.Dir, socketDirName)
	}
	wait := dialRetry
	for try := 0; ; try++ {
		want := peer{uid: st.UIDBase, pid: st.Pid}
		p := d.proc(id)
		if p != nil {
			want.pid = p.Pid()
		}
		if d.cfg.Runtime.ListenSocket {
			// The runtime's file proxy, not init, listens on the host
			// side: the peer must be a process of the sandbox's cgroup.
			want.pid, want.cgroup = 0, d.cg.Group(st.Cgroup)
		}
		conn, err := dialAgentSocket(ctx, runDir, want)
		if err == nil && d.cfg.Runtime.ListenSocket {
			if err := sealSocketDir(runDir, st.UIDBase, true); err != nil {
				conn.Close()
				return nil, fmt.Errorf("connecting to sandbox %s agent: %w", id, err)
			}
		}
		if err == nil {
			return conn, nil
		}
		if !errors.Is(err, errNotListening) {
			if errors.Is(err, errdefs.ErrUnavailable) {
				d.logger(id).Warn("refusing the agent socket's peer", "err", err)
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
		if try >= dialFastTries && wait < dialRetryMax {
			wait *= 2
		}
	}
}

// Pause freezes every process of the sandbox (cgroup freezer).
func (d *Driver) Pause(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := d.runc.pause(ctx, id); err != nil {
		return fmt.Errorf("pausing sandbox %s: %w", id, err)
	}
	return nil
}

// Resume thaws a paused sandbox.
func (d *Driver) Resume(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := d.runc.resume(ctx, id); err != nil {
		return fmt.Errorf("resuming sandbox %s: %w", id, err)
	}
	return nil
}

// paths returns the cgroup and directory of sandbox id. They are read from
// its state file once and then kept with the in-memory record: Stats and
// OOMKills run around every exec, and neither path changes while the
// sandbox lives.
func (d *Driver) paths(id string) (*cgroups.Group, string, error) {
	d.mu.Lock()
	if s := d.sandboxes[id]; s != nil && s.group != nil {
		g, dir := s.group, s.dir
		d.mu.Unlock()
		return g, dir, nil
	}
	d.mu.Unlock()
	st, err := loadState(d.dir(id))
	if err != nil {
		return nil, "", err
	}
	g := d.cg.Group(st.Cgroup)
	d.mu.Lock()
	// Only a sandbox this driver started or recovered is cached: its record
	// goes with Destroy, so nothing stale outlives it.
	if s := d.sandboxes[id]; s != nil {
		s.group, s.dir = g, st.Dir
	}
	d.mu.Unlock()
	return g, st.Dir, nil
}

// OOMKills returns how many processes of the sandbox the kernel OOM killer
// has killed: one cgroup file read, cheap enough for the start and end of
// every exec (Stats reads a dozen files and the disk counters).
func (d *Driver) OOMKills(ctx context.Context, id string) (uint64, error) {
	if err := checkID(id); err != nil {
		return 0, err
	}
	g, _, err := d.paths(id)
	if err != nil {
		return 0, fmt.Errorf("sandbox %s oom kills: %w", id, err)
	}
	n, err := g.OOMKills()
	if err != nil {
		return 0, fmt.Errorf("sandbox %s oom kills: %w", id, err)
	}
	return n, nil
}

// Stats samples the sandbox's cgroup counters and disk use.
func (d *Driver) Stats(ctx context.Context, id string) (driver.Stats, error) {
	if err := checkID(id); err != nil {
		return driver.Stats{}, err
	}
	g, dir, err := d.paths(id)
	if err != nil {
		return driver.Stats{}, fmt.Errorf("sandbox %s stats: %w", id, err)
	}
	var s driver.Stats
	if g.Exists() {
		cpu, err := g.CPUUsage()
		if err != nil {
			return s, fmt.Errorf("sandbox %s stats: %w", id, err)
		}
		s.CPUSeconds = cpu.Seconds()
		if s.MemoryBytes, s.MemoryPeakBytes, err = g.Memory(); err != nil {
			return s, fmt.Errorf("sandbox %s stats: %w", id, err)
		}
		if s.PIDs, err = g.PIDs(); err != nil {
			return s, fmt.Errorf("sandbox %s stats: %w", id, err)
		}
		if s.OOMKills, err = g.OOMKills(); err != nil {
			return s, fmt.Errorf("sandbox %s stats: %w", id, err)
		}
	}
	if s.DiskBytes, s.DiskWrittenBytes, err = storage.Usage(dir); err != nil {
		return s, fmt.Errorf("sandbox %s disk usage: %w", id, err)
	}
	return s, nil
}

// reapLoop reaps the runtime's orphaned processes every reapEvery.
func (d *Driver) reapLoop() {
	defer d.wg.Done()
	t := time.NewTicker(reapEvery)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
			// A sandbox whose runtime died on its own (an OOM kill) left
			// its stubs to the daemon.
			d.reapRuntimeZombies()
		}
	}
}

// The agent's log. The agent's stdout and stderr are one file the daemon
// opens for it, agentLogName in the sandbox's storage.PrivateDir: on the
// sandbox's own writable layer (its loop-mounted ext4 image or its tmpfs),
// outside the overlay, so the sandbox cannot see it and everything written
// to it, by the agent or by whatever made the agent (or, under gVisor, root
// inside, through /proc/1/fd/1) write, counts against the sandbox's disk
// quota: at worst the sandbox fills its own quota, never the host's disk.
// The agent still empties the file before it passes 1 MiB (--log-max), so
// that its log takes little of the quota. <sandbox>/agent.log is a symlink
// to it for whoever debugs on the host.
const agentLogName = "agent.log"

// openAgentLog opens the agent's log of the sandbox in dir for appending,
// creating it (host root's, 0600) and the symlink to it. Without a mounted
// writable layer there is no log (and no start): it would be on the host's
// own disk.
func openAgentLog(dir string) (*os.File, error) {
	priv, err := storage.PrivateDir(dir)
	if err != nil {
		return nil, fmt.Errorf("agent log: %w", err)
	}
	p := filepath.Join(priv, agentLogName)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening agent log: %w", err)
	}
	rel, err := filepath.Rel(dir, p)
	if err == nil {
		// Best effort, for people: only where nothing is yet (a sandbox
		// of an earlier daemon keeps its old log file there).
		_ = os.Symlink(rel, filepath.Join(dir, agentLogName))
	}
	return f, nil
}

// capLegacyLog truncates the agent.log of a runc sandbox an earlier daemon
// made, a regular file on the data dir's file system, once it exceeds
// legacyLogMax (the manager's sweep inspects every sandbox every 30 s):
// such a sandbox runs the agent it started with until its next start,
// which moves the log onto its own storage. (A gVisor one's is on a 2 MiB
// tmpfs of its own, log/, which its teardown unmounts.) The agent opened
// it O_APPEND, so its next line lands at the new end.
func (d *Driver) capLegacyLog(dir string) {
	p := filepath.Join(dir, agentLogName)
	if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() && fi.Size() > legacyLogMax {
		if err := os.Truncate(p, 0); err == nil {
			d.log.Info("legacy agent log truncated", "path", p, "size", fi.Size())
		}
	}
}
