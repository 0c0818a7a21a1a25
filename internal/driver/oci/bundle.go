package oci

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/driver"
)

// Paths inside the sandbox.
const (
	agentMountPath = "/.airlock/airlock-agent"
	// agentFD is the agent's listening socket in the sandbox's init: runc
	// passes the descriptors it preserves from 3 on.
	agentFD = 3
	// socketMountPath is where SharedDirSocket mounts the sandbox's
	// socket dir: the agent's socket is the only thing in it.
	socketMountPath = "/.airlock/run"
	// resolvConfPath is where a joined network namespace's resolver
	// configuration is mounted.
	resolvConfPath = "/etc/resolv.conf"
	// secretsDir is where Spec.SecretsTmpfs mounts its memory file system.
	secretsDir = "/run/secrets"
	// sandboxPath is the only environment the agent starts with: the
	// daemon's own environment (tokens, proxies, paths) never enters.
	sandboxPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// cpuPeriod is the CFS period for CPU quotas (the kernel's default):
	// long enough for low overhead, short enough that a throttled sandbox
	// stutters by at most 100 ms.
	cpuPeriod = 100_000
	// shmSize bounds /dev/shm, a tmpfs charged to the sandbox's memory but
	// cheaper to cap here than to discover through an OOM kill.
	shmSize = "65536k"
	// maxNofile is the hard open file limit of the agent and everything it
	// starts, unless the daemon's own hard limit is lower: in a user
	// namespace runc cannot raise it. Servers that want many descriptors
	// (databases, proxies, language servers) raise their soft limit to it;
	// what they open is charged to the sandbox's memory cgroup, which is
	// the real bound (see docs/security.md), so the hard limit only stops
	// one runaway process early.
	maxNofile = 65536
	// softNofile is the soft open file limit processes start with:
	// select(2) cannot watch a descriptor above 1023 (FD_SETSIZE), so a
	// higher default breaks programs that still use it, as systemd found.
	// The agent itself (Go) raises its own soft limit to the hard one and
	// starts execs with this one.
	softNofile = 1024
)

// Defaults for zero resources. The service passes its own defaults; these
// keep a direct user of the driver from creating an unlimited sandbox.
const (
	DefaultCPU      = 1.0
	DefaultMemoryMB = 512
	DefaultDiskMB   = 1024
	DefaultPIDs     = 256
)

// withDefaults fills zero resources with the defaults.
func withDefaults(r driver.Resources) driver.Resources {
	if r.CPU <= 0 {
		r.CPU = DefaultCPU
	}
	if r.MemoryMB <= 0 {
		r.MemoryMB = DefaultMemoryMB
	}
	if r.DiskMB <= 0 {
		r.DiskMB = DefaultDiskMB
	}
	if r.PIDs <= 0 {
		r.PIDs = DefaultPIDs
	}
	return r
}

// capabilities the agent (root in the sandbox's user namespace) keeps: what
// a package install or a server on a low port needs, without NET_RAW (raw
// sockets, spoofing), MKNOD, SYS_ADMIN or SYS_PTRACE.
var capabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID",
	"CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_AUDIT_WRITE",
}

// staticMaskedPaths and readonlyPaths are Docker's, containerd's and
// CRI-O's defaults (2025: with the thermal side channel's /proc/interrupts
// and, in maskedPaths, each CPU's thermal_throttle), plus /proc/config.gz,
// the host kernel's build configuration: which options, drivers and
// hardening a kernel exploit would meet. Masked paths are kernel state in
// /proc and /sys that leaks host information; read-only ones would let it
// be changed. runc skips a masked path the host does not have.
var (
	staticMaskedPaths = []string{
		"/proc/acpi", "/proc/asound", "/proc/config.gz", "/proc/interrupts", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
		"/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap", "/sys/fs/selinux",
	}
	readonlyPaths = []string{
		"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
	}
)

// maskedPaths is staticMaskedPaths and the thermal_throttle directory of
// every CPU of the host, found once: CPUs come and go rarely, and a path
// missing later is skipped by runc.
var maskedPaths = sync.OnceValue(func() []string {
	m := slices.Clone(staticMaskedPaths)
	cpus, _ := filepath.Glob("/sys/devices/system/cpu/cpu[0-9]*/thermal_throttle")
	return append(m, cpus...)
})

// allowedDevices are the only device nodes the sandbox may open (the
// device cgroup denies every other): the standard safe set.
var allowedDevices = []struct {
	major, minor int64 // minor -1 = any
}{
	{1, 3}, {1, 5}, {1, 7}, {1, 8}, {1, 9}, // null, zero, full, random, urandom
	{5, 0}, {5, 2}, // tty, ptmx
	{136, -1}, // pts
}

// bundleParams is what buildSpec needs besides the driver spec.
type bundleParams struct {
	Spec      driver.Spec
	Rootfs    string // merged overlay
	AgentPath string // host path of the agent binary
	UIDBase   uint32
	IDCount   uint32
	Cgroup    string // cgroupsPath, "/airlock/<id>"
	SysDir    string // host sysfs of a joined network namespace, "" for a fresh one
	// AgentArgs is the agent's command line and SocketMounts what the
	// agent's socket needs mounted (AgentSocket.bundle).
	AgentArgs    []string
	SocketMounts []specs.Mount
}

// buildSpec returns the OCI runtime spec of one sandbox.
func buildSpec(p bundleParams) (*specs.Spec, error) {
	res := withDefaults(p.Spec.Resources)
	hostname := p.Spec.Hostname
	if hostname == "" {
		hostname = "sandbox"
	}
	mem := res.MemoryMB << 20
	quota := int64(res.CPU * cpuPeriod)
	period := uint64(cpuPeriod)
	pids := res.PIDs
	devs := []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}
	for _, d := range allowedDevices {
		major := d.major
		var minor *int64
		if d.minor >= 0 {
			m := d.minor
			minor = &m
		}
		devs = append(devs, specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &major, Minor: minor, Access: "rwm"})
	}
	netns := specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: p.Spec.NetNSPath}

	s := &specs.Spec{
		Version:  specs.Version,
		Hostname: hostname,
		Root:     &specs.Root{Path: p.Rootfs},
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			// The agent serves the socket the daemon made and runc
			// passes (see bindAgentSocket), or its own in a socket dir
			// (SharedDirSocket): nothing else of the host is writable
			// from inside for it.
			Args: p.AgentArgs,
			Env:  []string{sandboxPath},
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: capabilities, Effective: capabilities, Permitted: capabilities,
			},
			Rlimits:         []specs.POSIXRlimit{nofileLimit()},
			NoNewPrivileges: true,
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=" + shmSize}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			sysMount(p.SysDir),
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
			{Destination: agentMountPath, Type: "bind", Source: p.AgentPath, Options: []string{"bind", "ro", "nosuid", "nodev"}},
		},
		Linux: &specs.Linux{
			UIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: p.UIDBase, Size: p.IDCount}},
			GIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: p.UIDBase, Size: p.IDCount}},
			CgroupsPath: p.Cgroup,
			Resources: &specs.LinuxResources{
				Devices: devs,
				Memory:  &specs.LinuxMemory{Limit: &mem, Swap: &mem},
				CPU:     &specs.LinuxCPU{Quota: &quota, Period: &period},
				Pids:    &specs.LinuxPids{Limit: &pids},
			},
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.MountNamespace}, {Type: specs.CgroupNamespace}, {Type: specs.UserNamespace},
				netns,
			},
			MaskedPaths:   maskedPaths(),
			ReadonlyPaths: readonlyPaths,
		},
		Annotations: map[string]string{"io.airlock.sandbox.id": p.Spec.ID},
	}
	if p.Spec.NetNSPath != "" && p.Spec.ResolvConfPath != "" {
		// The namespace's resolver (airlock's DNS) replaces the
		// template's; read-only, so root inside cannot point it elsewhere.
		s.Mounts = append(s.Mounts, specs.Mount{Destination: resolvConfPath, Type: "bind", Source: p.Spec.ResolvConfPath,
			Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
	}
	s.Mounts = append(s.Mounts, p.SocketMounts...)
	if p.Spec.SecretsTmpfs {
		// Memory, not the disk image: secret values never reach a disk.
		// Sticky and world-writable so the manager can write the files as
		// the sandbox user (who then owns them, mode 0400) through the
		// agent; nobody else may remove or replace them.
		s.Mounts = append(s.Mounts, specs.Mount{Destination: secretsDir, Type: "tmpfs", Source: "tmpfs",
			Options: []string{"nosuid", "nodev", "noexec", "mode=1777", "size=1m", "nr_inodes=1k"}})
	}
	sc, err := seccompProfile(s)
	if err != nil {
		return nil, err
	}
	s.Linux.Seccomp = sc
	return s, nil
}

// nofileLimit is RLIMIT_NOFILE of the sandbox: softNofile/maxNofile, each
// lowered to the daemon's own hard limit, which runc cannot exceed.
func nofileLimit() specs.POSIXRlimit {
	hard := uint64(maxNofile)
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil && rl.Max < hard {
		hard = rl.Max
	}
	return specs.POSIXRlimit{Type: "RLIMIT_NOFILE", Hard: hard, Soft: min(softNofile, hard)}
}

// sysMount is /sys, read-only. With a joined network namespace it is a bind
// of the sysfs the daemon mounted for that namespace at sysDir (see
// mountNetnsSysfs); otherwise runc mounts a fresh one.
func sysMount(sysDir string) specs.Mount {
	if sysDir != "" {
		return specs.Mount{Destination: "/sys", Type: "bind", Source: sysDir, Options: []string{"bind", "ro", "nosuid", "noexec", "nodev"}}
	}
	return specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}}
}

// writeSpec writes s as dir/config.json, atomically.
func writeSpec(dir string, s *specs.Spec) error {
	b, err := json.MarshalIndent(s, "", "\t")
	if err != nil {
		return fmt.Errorf("encoding runtime spec: %w", err)
	}
	return writeFileAtomic(filepath.Join(dir, "config.json"), b, 0o600)
}

// writeFileAtomic replaces path with data so readers never see half a file.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
