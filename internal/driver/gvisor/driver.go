// Package gvisor is the airlock driver that runs each sandbox on gVisor's user-space kernel: the shared OCI core's bundle, storage, uid ranges and cgroups (internal/driver/oci), run by Debian's runsc.
//
// The sandbox's system calls are served by runsc's Sentry (one host process
// per sandbox, itself confined by seccomp), its files by the Gofer, so the
// host kernel's attack surface shrinks to what those two use. Storage,
// limits, lifecycle and recovery after a daemon restart are the core's;
// what runsc does differently is this package's oci.Runtime methods: the
// bundle's edits and the agent's own socket (driver.go), runsc's network
// stack and where its commands run (state.go, netstack.go), and the
// processes of its own it leaves to the daemon (handle.go). See
// docs/drivers.md.
//
// Layout under Config.DataDir is the core's, with runsc's state in runsc/
// and, per sandbox, uds/: the directory where the agent's socket lives
// (oci.SharedDirSocket).
package gvisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/oci"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
)

// Name is the runtime name of this driver.
const Name = "gvisor"

var (
	_ driver.Driver        = (*Driver)(nil)
	_ driver.Pauser        = (*Driver)(nil)
	_ driver.Stater        = (*Driver)(nil)
	_ driver.OOMCounter    = (*Driver)(nil)
	_ driver.LayerCapturer = (*Driver)(nil)
	_ driver.Lister        = (*Driver)(nil)
	_ oci.Runtime          = (*Driver)(nil)
)

// Platforms of Debian's runsc. ptrace works everywhere; kvm needs /dev/kvm
// and, on this project's hosts (nested, paravirtual KVM), hangs.
const (
	PlatformPtrace = "ptrace"
	PlatformKVM    = "kvm"
)

// Config configures the gVisor driver. Zero fields take the documented
// defaults.
type Config struct {
	// DataDir holds sandboxes and runsc state; required. It must not be
	// another driver's: uid slots and sandbox dirs live in it.
	DataDir string
	// AgentPath is the host path of the static airlock-agent binary.
	AgentPath string
	// Logger receives the driver's logs; default slog.Default().
	Logger *slog.Logger
	// MaxSandboxes is the number of uid ranges, so of concurrent sandboxes;
	// default 1024.
	MaxSandboxes int
	// Platform is runsc's --platform; default "ptrace".
	Platform string
	// RunscPath is the runsc binary; default "runsc" on PATH, else
	// /usr/bin/runsc (Debian's package).
	RunscPath string
	// UIDRangeStart is the first host uid handed to sandboxes; default
	// DefaultUIDRangeStart, above every range the runc driver hands out,
	// so that no gVisor sandbox ever shares host uids with a runc one.
	UIDRangeStart uint32
	// CgroupParent is the cgroup under which sandboxes live; default
	// "airlock", shared with runc so that the host task budget is one.
	CgroupParent string
}

// validPlatform is the shape of a platform name: it becomes a flag.
var validPlatform = lazyregexp.New(`^[a-z][a-z0-9]{0,31}$`)

// DefaultUIDRangeStart is 2^31: the runc driver's ranges start at 2^20 and,
// at 65536 ids each, reach 2^31 only past 32752 sandboxes.
const DefaultUIDRangeStart = 1 << 31

// runtimeTasks is what the host pids limit of a sandbox adds for runsc's
// own tasks: the Sentry's and the Gofer's threads, a few dozen idle, live
// in the sandbox's cgroup.
const runtimeTasks = 128

// hostTasksPerProcess is the host tasks one sandbox process may cost under
// the ptrace platform, with margin: 100 idle processes took 250.
const hostTasksPerProcess = 4

// probeTimeout bounds the start check of Probe: a sandbox of `true` starts
// in about 200 ms; a platform that cannot work (kvm here) hangs for ever.
const probeTimeout = 20 * time.Second

// probeTTL is how long a probe's result is kept: the check starts a
// sandbox, and GET /v1/info asks for health on every call.
const probeTTL = time.Minute

// Driver runs sandboxes with runsc on the OCI core; Probe adds a real start
// of a sandbox on the configured platform.
type Driver struct {
	*oci.Core
	cfg Config

	probeMu   sync.Mutex
	probeAt   time.Time
	probeLast driver.Health

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// New returns a gVisor driver rooted at cfg.DataDir. It does not check that
// runsc works: Probe does, and the daemon offers the runtime only if it is
// healthy.
func New(cfg Config) (*Driver, error) {
	if cfg.Platform == "" {
		cfg.Platform = PlatformPtrace
	}
	// Which platforms exist depends on the runsc release (systrap came
	// after Debian's); Probe finds out whether this one works.
	if !validPlatform.MatchString(cfg.Platform) {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "invalid gvisor platform %q", cfg.Platform)
	}
	if cfg.RunscPath == "" {
		cfg.RunscPath = "runsc"
	}
	if !strings.Contains(cfg.RunscPath, "/") {
		if p, err := exec.LookPath(cfg.RunscPath); err == nil {
			cfg.RunscPath = p
		} else {
			cfg.RunscPath = "/usr/bin/runsc"
		}
	}
	if cfg.UIDRangeStart == 0 {
		cfg.UIDRangeStart = DefaultUIDRangeStart
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	d := &Driver{cfg: cfg, stop: make(chan struct{})}
	core, err := oci.New(oci.Config{
		Name: Name, DataDir: cfg.DataDir, AgentPath: cfg.AgentPath, Logger: cfg.Logger, MaxSandboxes: cfg.MaxSandboxes,
		UIDRangeStart: cfg.UIDRangeStart, CgroupParent: cfg.CgroupParent,
		Binary: cfg.RunscPath, StateDir: "runsc", GlobalArgs: globalArgs(cfg.Platform),
		// runsc has no --preserve-fds: the agent listens itself.
		Socket: oci.SharedDirSocket{},
		// The Sentry loads the agent as the sandbox's root, through the
		// Gofer: the binary must be readable by it. The agent still makes
		// itself non-dumpable (internal/agent/nodump).
		AgentMode: 0o755,
		// The Sentry, the Gofer and the ptrace stubs boot the agent in
		// the sandbox's cgroup: a quota of one CPU made a cold start
		// half as slow again (measured on a 2-vCPU host).
		DeferCPULimit: true,
	}, d)
	if err != nil {
		return nil, err
	}
	d.Core = core
	d.wg.Add(1)
	go d.reapLoop()
	return d, nil
}

// Close stops the driver's reaping and drops its watches. Sandboxes keep
// running: a new driver on the same data dir recovers them.
func (d *Driver) Close() error {
	d.stopOnce.Do(func() { close(d.stop) })
	d.wg.Wait()
	return d.Core.Close()
}

// Name is "gvisor".
func (d *Driver) Name() string { return Name }

// Capabilities of gVisor: a user-space kernel, pause in the Sentry, memory
// snapshots (runsc checkpoint and restore), the core's disk quota and
// layer capture, every network mode; the Sentry's netstack takes the
// namespace's interfaces at start (see state.go).
func (d *Driver) Capabilities() driver.Capabilities {
	return driver.Capabilities{
		Isolation:         driver.IsolationUserspaceKernel,
		Pause:             true,
		DiskQuota:         true,
		NetworkModes:      []driver.NetworkMode{driver.NetworkNone, driver.NetworkAllowlist, driver.NetworkOpen},
		InterfacesAtStart: true,
		LayerCapture:      true,
		// runsc checkpoint/restore (checkpoint.go).
		MemorySnapshot: true,
	}
}

// globalArgs are runsc's flags for every command.
//
// --host-uds=all lets the agent's socket in the sandbox's uds/ dir be a
// real host socket the daemon can connect to: "create" makes it, and the
// Gofer refuses to walk to a socket file (so the agent cannot even set its
// mode) unless "open" is allowed too. "open" lets the sandbox connect to a
// host socket only through its own mounts, where the only one is its own
// agent's.
//
// --overlay2=none keeps writes on the sandbox's own writable layer (its
// disk quota) instead of the Sentry's memory.
func globalArgs(platform string) []string {
	return []string{"--platform=" + platform, "--host-uds=all", "--overlay2=none"}
}

// resolvConfName is the sandbox dir's copy of the namespace's resolver
// configuration.
const resolvConfName = "resolv.conf"

// EditBundle adapts the core's bundle to runsc.
func (d *Driver) EditBundle(s *specs.Spec, spec driver.Spec, dir string) error {
	for i, m := range s.Mounts {
		// runsc's Gofer opens bind sources as the sandbox's root, an
		// unprivileged host uid, where runc opens them as host root: the
		// resolver file (from a daemon directory only root can search)
		// is copied into the sandbox dir, which the sandbox's uid can
		// cross. It is public (nameserver lines), and read-only inside.
		if m.Destination == "/etc/resolv.conf" && m.Type == "bind" {
			b, err := os.ReadFile(m.Source)
			if err != nil {
				return fmt.Errorf("reading resolver configuration: %w", err)
			}
			p := filepath.Join(dir, resolvConfName)
			if err := os.WriteFile(p, b, 0o644); err != nil {
				return fmt.Errorf("copying resolver configuration: %w", err)
			}
			s.Mounts[i].Source = p
		}
		// gVisor's /sys is its own; a bind of the host sysfs the runc
		// driver mounts for a joined namespace would only leak host
		// details through the Gofer.
		if m.Destination == "/sys" && m.Type == "bind" {
			s.Mounts[i] = specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}}
		}
	}
	if r := s.Linux.Resources; r != nil && r.Pids != nil && r.Pids.Limit != nil && *r.Pids.Limit > 0 {
		// The sandbox's processes are the Sentry's tasks; on the host
		// each costs the ptrace platform a stub process and threads
		// (about 2.5 host tasks per process, measured), besides the
		// Sentry's and Gofer's own threads. The host limit is set so
		// that the sandbox's processes can reach its PIDs limit; past
		// that, a runaway sandbox takes down its own Sentry (a new stub
		// cannot be made), never the host or a neighbour. RLIMIT_NPROC
		// in the bundle is no fix: runsc 20221219 applies it to the
		// Sentry's host uid (nobody), which every gVisor sandbox shares.
		n := hostTasksPerProcess*(*r.Pids.Limit) + runtimeTasks
		r.Pids.Limit = &n
	}
	// The agent's Go runtime sizes itself to the CPUs it sees, and under
	// gVisor it sees neither the sandbox's quota (the Sentry's cgroupfs
	// is its own) nor fewer than the host's cores: it is told the quota,
	// as runc's agent learns it from its cgroup. Each thread it starts
	// costs the ptrace platform a stub thread and the futex wake-ups
	// between them; with the quota's count its start takes about a sixth
	// less (measured). The agent's own children get their environment
	// from the agent, never this one.
	s.Process.Env = append(s.Process.Env, "GOMAXPROCS="+strconv.Itoa(agentProcs(spec.Resources.CPU)))
	// The idle threads the agent keeps against a fork bomb (see
	// cmd/airlock-agent) save nothing here: a sandbox that runs out of
	// tasks loses its Sentry, the agent with it (the conformance suite's
	// fork bomb). Each costs the start a Sentry task and a host stub
	// thread, about a tenth of a cold start in all (measured).
	s.Process.Args = append(s.Process.Args, "--spare-threads=0")
	return nil
}

// agentProcs is the agent's GOMAXPROCS for a CPU quota of cpu: the whole
// CPUs it may use, at least one.
func agentProcs(cpu float64) int { return max(1, int(math.Ceil(cpu))) }

// Probe checks what the core needs of the host (root, the binary, cgroups,
// idmapped mounts, the agent) and that runsc really starts a sandbox on the
// configured platform. The result is kept for probeTTL.
func (d *Driver) Probe(ctx context.Context) driver.Health {
	d.probeMu.Lock()
	defer d.probeMu.Unlock()
	if !d.probeAt.IsZero() && time.Since(d.probeAt) < probeTTL {
		return d.probeLast
	}
	h := d.ProbeHost(ctx)
	if h.State == driver.HealthHealthy {
		if err := d.startCheck(ctx); err != nil {
			h = driver.Health{State: driver.HealthUnhealthy, Description: "runsc cannot start a sandbox (platform " + d.cfg.Platform + "): " + err.Error()}
		} else {
			h.Description += ", platform " + d.cfg.Platform
		}
	}
	d.probeAt, d.probeLast = time.Now(), h
	return h
}

// startCheck runs `true` in a throw-away sandbox of the host's root
// (runsc do) on the configured platform, with its own state dir.
func (d *Driver) startCheck(ctx context.Context) error {
	root, err := os.MkdirTemp(d.cfg.DataDir, ".probe-runsc-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.cfg.RunscPath, "--root", root, "--platform="+d.cfg.Platform, "--network=none", "do", "true")
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	// runsc do leaves its Sentry, Gofer and stubs to the daemon (the
	// subreaper) as they exit: reap them, or they stay zombies.
	reapProbe(root)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("no sandbox started within %v", probeTimeout)
	}
	if err != nil {
		return fmt.Errorf("%v: %s", err, lastLine(out))
	}
	return nil
}

// reapProbe reaps the processes of the probe sandbox whose state dir is
// root, once they died as the daemon's children: it waits (up to
// probeReapWait) while a process of the daemon's still names root on its
// command line, and reaps every zombie child named "exe" (runsc re-executes
// itself). The only other "exe" children of the daemon are runtime
// processes of sandboxes, which are reaped when dead anyway, and the idmap
// helper, whose status nobody reads.
func reapProbe(root string) {
	self := os.Getpid()
	deadline := time.Now().Add(probeReapWait)
	for {
		alive := false
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
			if err != nil {
				continue
			}
			i, j := strings.IndexByte(string(b), '('), strings.LastIndexByte(string(b), ')')
			if i < 0 || j < i || string(b[i+1:j]) != "exe" {
				continue
			}
			f := strings.Fields(string(b[j+1:]))
			if len(f) < 2 || f[1] != strconv.Itoa(self) {
				continue
			}
			if f[0] == "Z" {
				var info unix.Siginfo
				unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG, nil)
				continue
			}
			if cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && strings.Contains(string(cmd), root) {
				alive = true
			}
		}
		if !alive || time.Now().After(deadline) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// probeReapWait bounds reapProbe's wait for the probe's processes to end:
// runsc do kills them before it exits, so this is milliseconds.
const probeReapWait = 5 * time.Second

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}
