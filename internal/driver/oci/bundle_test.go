package oci

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/driver"
)

func testParams(res driver.Resources, netns string) bundleParams {
	args, _ := InheritedSocket{}.bundle("/data/sandboxes/sbx_x")
	var sysDir string
	if netns != "" {
		sysDir = "/data/sandboxes/sbx_x/sys"
	}
	return bundleParams{
		SysDir: sysDir,
		Spec:   driver.Spec{ID: "sbx_x", Hostname: "h1", Resources: res, NetNSPath: netns},
		Rootfs: "/data/sandboxes/sbx_x/rootfs", AgentPath: "/data/bin/airlock-agent",
		UIDBase: 1 << 20, IDCount: 65536, Cgroup: "/airlock/sbx_x",
		AgentArgs: args,
	}
}

func mustSpec(t *testing.T, p bundleParams) *specs.Spec {
	t.Helper()
	s, err := buildSpec(p)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSpecResources(t *testing.T) {
	tests := []struct {
		name          string
		res           driver.Resources
		quota, memory int64
		pids          int64
	}{
		{"defaults", driver.Resources{}, 100_000, 512 << 20, 256},
		{"given", driver.Resources{CPU: 0.5, MemoryMB: 128, PIDs: 64}, 50_000, 128 << 20, 64},
		{"two_cpus", driver.Resources{CPU: 2}, 200_000, 512 << 20, 256},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := mustSpec(t, testParams(tc.res, "")).Linux.Resources
			if *r.CPU.Quota != tc.quota || *r.CPU.Period != cpuPeriod {
				t.Errorf("cpu %d/%d, want %d/%d", *r.CPU.Quota, *r.CPU.Period, tc.quota, cpuPeriod)
			}
			// No swap: the memory+swap limit equals the memory limit.
			if *r.Memory.Limit != tc.memory || *r.Memory.Swap != tc.memory {
				t.Errorf("memory %d swap %d, want both %d", *r.Memory.Limit, *r.Memory.Swap, tc.memory)
			}
			if *r.Pids.Limit != tc.pids {
				t.Errorf("pids %d, want %d", *r.Pids.Limit, tc.pids)
			}
			if d := r.Devices[0]; d.Allow || d.Access != "rwm" || d.Type != "" {
				t.Errorf("first device rule %+v, want deny all", d)
			}
			for _, d := range r.Devices[1:] {
				if !d.Allow || d.Type != "c" || d.Major == nil {
					t.Errorf("device rule %+v", d)
				}
				if *d.Major != 1 && *d.Major != 5 && *d.Major != 136 {
					t.Errorf("unexpected device major %d allowed", *d.Major)
				}
			}
		})
	}
}

func TestSpecIsolation(t *testing.T) {
	s := mustSpec(t, testParams(driver.Resources{}, ""))
	var ns []specs.LinuxNamespaceType
	for _, n := range s.Linux.Namespaces {
		ns = append(ns, n.Type)
		if n.Path != "" {
			t.Errorf("namespace %s joins %s", n.Type, n.Path)
		}
	}
	for _, want := range []specs.LinuxNamespaceType{specs.PIDNamespace, specs.MountNamespace, specs.IPCNamespace,
		specs.UTSNamespace, specs.CgroupNamespace, specs.NetworkNamespace, specs.UserNamespace} {
		if !slices.Contains(ns, want) {
			t.Errorf("no %s namespace", want)
		}
	}
	want := []specs.LinuxIDMapping{{ContainerID: 0, HostID: 1 << 20, Size: 65536}}
	if !slices.Equal(s.Linux.UIDMappings, want) || !slices.Equal(s.Linux.GIDMappings, want) {
		t.Errorf("mappings %v %v", s.Linux.UIDMappings, s.Linux.GIDMappings)
	}
	if s.Linux.CgroupsPath != "/airlock/sbx_x" {
		t.Errorf("cgroupsPath %q", s.Linux.CgroupsPath)
	}
	p := s.Process
	if !p.NoNewPrivileges || p.User.UID != 0 || p.Cwd != "/" || p.Terminal {
		t.Errorf("process %+v", p)
	}
	if !slices.Equal(p.Env, []string{sandboxPath}) {
		t.Errorf("env %v, want only PATH", p.Env)
	}
	// The agent serves the socket runc passes as fd 3: it listens on
	// nothing the sandbox can reach.
	if !slices.Equal(p.Args, []string{"/.airlock/airlock-agent", "--fd", "3"}) {
		t.Errorf("args %v", p.Args)
	}
	if len(p.Rlimits) != 1 || p.Rlimits[0].Type != "RLIMIT_NOFILE" || p.Rlimits[0].Soft != softNofile ||
		p.Rlimits[0].Hard < softNofile || p.Rlimits[0].Hard > maxNofile {
		t.Errorf("rlimits %+v, want RLIMIT_NOFILE %d soft, at most %d hard", p.Rlimits, softNofile, maxNofile)
	}
	c := p.Capabilities
	if len(c.Ambient) != 0 || len(c.Inheritable) != 0 {
		t.Errorf("ambient %v inheritable %v", c.Ambient, c.Inheritable)
	}
	for _, set := range [][]string{c.Bounding, c.Effective, c.Permitted} {
		if !slices.Equal(set, capabilities) {
			t.Errorf("capability set %v", set)
		}
		for _, bad := range []string{"CAP_SYS_ADMIN", "CAP_NET_RAW", "CAP_MKNOD", "CAP_SYS_PTRACE", "CAP_SYS_MODULE"} {
			if slices.Contains(set, bad) {
				t.Errorf("%s granted", bad)
			}
		}
	}
	if s.Hostname != "h1" || s.Root.Path != "/data/sandboxes/sbx_x/rootfs" || s.Root.Readonly {
		t.Errorf("hostname %q root %+v", s.Hostname, s.Root)
	}
	for _, m := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/sys/firmware", "/proc/acpi", "/proc/scsi",
		"/proc/config.gz", "/proc/interrupts"} {
		if !slices.Contains(s.Linux.MaskedPaths, m) {
			t.Errorf("%s not masked", m)
		}
	}
	for _, m := range []string{"/proc/sys", "/proc/sysrq-trigger", "/proc/bus", "/proc/fs", "/proc/irq"} {
		if !slices.Contains(s.Linux.ReadonlyPaths, m) {
			t.Errorf("%s not read-only", m)
		}
	}
}

func TestSpecMounts(t *testing.T) {
	const resolv = "/data/network/sbx_x/resolv.conf"
	tests := []struct {
		name    string
		netns   string
		resolv  string
		sysType string
		// wantResolv: /etc/resolv.conf is the namespace's, bound read-only.
		wantResolv bool
	}{
		{"own_netns", "", "", "sysfs", false},
		{"joined_netns", "/run/netns/x", "", "bind", false},
		{"joined_netns_resolv", "/run/netns/x", resolv, "bind", true},
		// Without a namespace of its own the file names no resolver of it.
		{"own_netns_resolv", "", resolv, "sysfs", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := testParams(driver.Resources{}, tc.netns)
			p.Spec.ResolvConfPath = tc.resolv
			s := mustSpec(t, p)
			mounts := map[string]specs.Mount{}
			for _, m := range s.Mounts {
				mounts[m.Destination] = m
			}
			has := func(dest, opt string) {
				t.Helper()
				m, ok := mounts[dest]
				if !ok {
					t.Errorf("no mount at %s", dest)
					return
				}
				if opt != "" && !slices.Contains(m.Options, opt) {
					t.Errorf("%s options %v lack %s", dest, m.Options, opt)
				}
			}
			has("/proc", "nosuid")
			has("/dev", "nosuid")
			has("/dev/pts", "newinstance")
			has("/dev/pts", "ptmxmode=0666")
			has("/dev/pts", "gid=5")
			has("/dev/shm", "size="+shmSize)
			has("/dev/mqueue", "")
			has("/sys", "ro")
			has("/sys", "noexec")
			has("/sys/fs/cgroup", "ro")
			has("/.airlock/airlock-agent", "ro")
			if m := mounts["/sys"]; m.Type != tc.sysType || (tc.netns != "" && m.Source != "/data/sandboxes/sbx_x/sys") {
				t.Errorf("/sys %+v, want type %q", m, tc.sysType)
			}
			if m := mounts["/.airlock/airlock-agent"]; m.Source != "/data/bin/airlock-agent" {
				t.Errorf("agent source %q", m.Source)
			}
			m, ok := mounts["/etc/resolv.conf"]
			if ok != tc.wantResolv {
				t.Errorf("/etc/resolv.conf mounted: %v, want %v", ok, tc.wantResolv)
			}
			if ok {
				want := specs.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: resolv, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}}
				if m.Type != want.Type || m.Source != want.Source || !slices.Equal(m.Options, want.Options) {
					t.Errorf("/etc/resolv.conf mount %+v, want %+v", m, want)
				}
			}
			// Nothing of the host is writable from inside: a writable
			// bind would be disk outside the quota, and a path the daemon
			// might trust (the agent's socket dir once was one).
			for _, m := range s.Mounts {
				if m.Type == "bind" && !slices.Contains(m.Options, "ro") {
					t.Errorf("writable bind mount of %s at %s", m.Source, m.Destination)
				}
				if strings.HasPrefix(m.Destination, "/.airlock/") && m.Destination != agentMountPath {
					t.Errorf("unexpected mount %s", m.Destination)
				}
			}
			var net *specs.LinuxNamespace
			for i, n := range s.Linux.Namespaces {
				if n.Type == specs.NetworkNamespace {
					net = &s.Linux.Namespaces[i]
				}
			}
			if net == nil || net.Path != tc.netns {
				t.Errorf("network namespace %+v, want path %q", net, tc.netns)
			}
		})
	}
}

func TestSpecSecretsTmpfs(t *testing.T) {
	for _, want := range []bool{false, true} {
		t.Run(fmt.Sprint("secrets_tmpfs_", want), func(t *testing.T) {
			p := testParams(driver.Resources{}, "")
			p.Spec.SecretsTmpfs = want
			s := mustSpec(t, p)
			var got *specs.Mount
			for i, m := range s.Mounts {
				if m.Destination == "/run/secrets" {
					got = &s.Mounts[i]
				}
			}
			if (got != nil) != want {
				t.Fatalf("/run/secrets mounted: %v, want %v", got != nil, want)
			}
			if got == nil {
				return
			}
			// Memory only (no disk), small, and nothing there runs.
			wantOpts := []string{"nosuid", "nodev", "noexec", "mode=1777", "size=1m", "nr_inodes=1k"}
			if got.Type != "tmpfs" || got.Source != "tmpfs" || !slices.Equal(got.Options, wantOpts) {
				t.Errorf("/run/secrets mount %+v, want tmpfs with %v", *got, wantOpts)
			}
		})
	}
}

func TestSeccompProfile(t *testing.T) {
	s := mustSpec(t, testParams(driver.Resources{}, ""))
	sc := s.Linux.Seccomp
	if sc == nil {
		t.Fatal("no seccomp profile")
	}
	if sc.DefaultAction != specs.ActErrno {
		t.Errorf("default action %s, want errno (allowlist)", sc.DefaultAction)
	}
	allowed := map[string]bool{}
	var denied []string
	for _, r := range sc.Syscalls {
		for _, n := range r.Names {
			if r.Action == specs.ActAllow && len(r.Args) == 0 {
				allowed[n] = true
			}
			if r.Action == specs.ActErrno && r.ErrnoRet != nil && *r.ErrnoRet == 1 {
				denied = append(denied, n)
			}
			if slices.Contains(deniedSyscalls, n) && r.Action != specs.ActErrno {
				t.Errorf("%s has a %s rule", n, r.Action)
			}
		}
	}
	for _, n := range deniedSyscalls {
		if !slices.Contains(denied, n) {
			t.Errorf("%s not denied with EPERM", n)
		}
	}
	// The profile still allows what ordinary programs need.
	for _, n := range []string{"read", "write", "openat", "execve", "setuid", "chown", "bind", "chroot", "setfsuid", "setgroups"} {
		if !allowed[n] {
			t.Errorf("%s not allowed", n)
		}
	}
	if len(sc.Architectures) != 1 {
		t.Errorf("architectures %v, want the native one only", sc.Architectures)
	}
	// socket(AF_NETLINK) is allowed for every protocol but the kernel's
	// object events, which are refused with EPERM.
	var netlinkAllow, ueventDeny int
	for _, r := range sc.Syscalls {
		if !slices.Contains(r.Names, "socket") {
			continue
		}
		domain, proto := -1, -1
		var protoOp specs.LinuxSeccompOperator
		for _, a := range r.Args {
			switch a.Index {
			case 0:
				if a.Op == specs.OpEqualTo {
					domain = int(a.Value)
				}
				if (a.Op == specs.OpLessThan && a.Value > unix.AF_NETLINK) || (a.Op == specs.OpLessEqual && a.Value >= unix.AF_NETLINK) {
					domain = unix.AF_NETLINK // a range holding it
				}
			case 2:
				proto, protoOp = int(a.Value), a.Op
			}
		}
		if domain != unix.AF_NETLINK {
			continue
		}
		switch {
		case r.Action == specs.ActAllow && proto == unix.NETLINK_KOBJECT_UEVENT && protoOp == specs.OpNotEqual:
			netlinkAllow++
		case r.Action == specs.ActAllow:
			t.Errorf("a rule allows socket(AF_NETLINK) without excluding NETLINK_KOBJECT_UEVENT: %+v", r)
		case r.Action == specs.ActErrno && proto == unix.NETLINK_KOBJECT_UEVENT && protoOp == specs.OpEqualTo && r.ErrnoRet != nil && *r.ErrnoRet == uint(unix.EPERM):
			ueventDeny++
		}
	}
	if netlinkAllow != 1 || ueventDeny != 1 {
		t.Errorf("netlink rules: %d allowing all but uevents, %d refusing uevents with EPERM; want 1 and 1", netlinkAllow, ueventDeny)
	}
}
