package escape

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// TestEscape runs every hostile program against every runtime. Attacks that
// load the whole host (fork and memory bombs, disk fill, CPU hog, output
// flood) run one at a time first; the others then run in parallel.
func TestEscape(t *testing.T) {
	e := startEnv(t)
	for _, rt := range e.runtimes(t) {
		t.Run(rt, func(t *testing.T) {
			s := newSuite(t, e, rt)
			for _, a := range []struct {
				name string
				f    func(*testing.T)
			}{
				{"ForkBomb", s.forkBomb},
				{"MemoryBomb", s.memoryBomb},
				{"DiskFill", s.diskFill},
				{"DiskFillAgentRunDir", s.diskFillRunDir},
				{"OutputFlood", s.outputFlood},
				{"OpenFiles", s.openFiles},
				{"CPUHog", s.cpuHog},
				// Takes half the host's disk promise for a while: no
				// other create may run meanwhile.
				{"HostDiskSpace", s.hostDiskSpace},
			} {
				s.attack(t, a.name, false, a.f)
			}
			for _, a := range []struct {
				name string
				f    func(*testing.T)
			}{
				{"ProcRootHostFile", s.procRootHostFile},
				{"MountinfoHostPaths", s.mountinfoHostPaths},
				{"NeighbourHostPath", s.neighbourHostPath},
				{"NeighbourByAPI", s.neighbourByAPI},
				{"Mount", s.mount},
				{"Unshare", s.unshare},
				{"Setns", s.setns},
				{"PtraceNeighbour", s.ptraceNeighbour},
				{"PtraceAgent", s.ptraceAgent},
				{"AgentMemory", s.agentMemory},
				{"KillHostPID", s.killHostPID},
				{"SignalAgent", s.signalAgent},
				{"WriteSys", s.writeSys},
				{"WriteProcSys", s.writeProcSys},
				{"KernelModules", s.kernelModules},
				{"RawSockets", s.rawSockets},
				{"SetuidBinary", s.setuidBinary},
				{"FileCapabilities", s.fileCapabilities},
				{"Syscalls", s.syscalls},
				{"Mknod", s.mknod},
				{"DeviceNodes", s.deviceNodes},
				{"ChrootEscape", s.chrootEscape},
				{"CgroupEscape", s.cgroupEscape},
				{"Hostname", s.hostname},
				{"TimeChange", s.timeChange},
				{"Reboot", s.reboot},
				{"KernelInfo", s.kernelInfo},
				{"UeventNetlink", s.ueventNetlink},
				{"AgentBinary", s.agentBinary},
				{"UserNamespace", s.userNamespace},
				{"DaemonAPIFromInside", s.daemonAPIFromInside},
				{"DaemonSecrets", s.daemonSecrets},
				{"FilesSymlinkParent", s.filesSymlinkParent},
				{"FilesAbsoluteSymlink", s.filesAbsoluteSymlink},
				{"FilesDotDot", s.filesDotDot},
				{"FilesSymlinkRace", s.filesSymlinkRace},
				{"TarSlip", s.tarSlip},
				{"HostFileTable", s.hostFileTable},
				{"HostPIDSpace", s.hostPIDSpace},
			} {
				s.attack(t, a.name, true, a.f)
			}
		})
	}
}

// users are the identities every read-only probe runs as: the default
// user and root inside the sandbox.
var users = []string{"", "root"}

func userName(u string) string {
	if u == "" {
		return "user"
	}
	return u
}

// noSecret fails t if any value of got holds a host or neighbour secret.
func (s *suite) noSecret(t testing.TB, what string, got ...string) {
	t.Helper()
	for _, v := range got {
		for _, secret := range []string{s.host.secret, s.nb.secret, s.nb.envSecret} {
			if strings.Contains(v, secret) {
				t.Errorf("%s: read a secret it must not reach: %.300q", what, v)
			}
		}
	}
}

func values(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// --- Host files through /proc and mount tricks --------------------------------

// procRootHostFile: /proc/1/root, /proc/self/root, /proc/*/root and
// /proc/*/cwd all lead to the sandbox's own root, never the host's.
func (s *suite) procRootHostFile(t *testing.T) {
	for _, u := range users {
		got := s.probe.py(t, u, progProcRoot, s.host.marker)
		s.noSecret(t, userName(u), values(got)...)
		expect(t, userName(u), got, notThere)
	}
}

// mountinfoHostPaths: /proc/self/mountinfo names the host paths of the
// sandbox's storage; none of them, nor the neighbour's derived from them,
// can be opened.
func (s *suite) mountinfoHostPaths(t *testing.T) {
	got := s.probe.py(t, "root", progMountinfo, s.probe.id, s.nb.id)
	t.Logf("host paths named in mountinfo: %s", got["#found"])
	delete(got, "#found")
	s.noSecret(t, "mountinfo paths", values(got)...)
	expect(t, "mountinfo paths", got, notThere)
	if s.nb.host.ok {
		// The guess is right: the file is there on the host.
		p := filepath.Join(s.e.cfg.DataDir, "sandboxes", s.nb.id, "storage", "rw", "upper", "home", "user", "secret")
		if _, err := os.Stat(p); err != nil {
			t.Logf("the neighbour's secret is not at the guessed host path %s (%v): the guess tests less", p, err)
		}
	}
}

// neighbourHostPath: the files API of the attacker's sandbox cannot reach
// the neighbour's files by their host path.
func (s *suite) neighbourHostPath(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	nbDir := filepath.Join(s.e.cfg.DataDir, "sandboxes", s.nb.id)
	for _, p := range []string{
		filepath.Join(nbDir, "storage", "rw", "upper", "home", "user", "secret"),
		filepath.Join(nbDir, "rootfs", "home", "user", "secret"),
		"/proc/1/root" + filepath.Join(nbDir, "rootfs", "home", "user", "secret"),
	} {
		b, err := s.probe.readFile(ctx, p)
		if err == nil {
			s.noSecret(t, "download of "+p, string(b))
			t.Errorf("download of the neighbour's host path %s succeeded (%d bytes)", p, len(b))
		} else if !errors.Is(err, client.ErrNotFound) && !errors.Is(err, client.ErrPermissionDenied) && !errors.Is(err, client.ErrInvalidArgument) {
			// Invalid argument: a /proc magic link refused (ELOOP).
			t.Errorf("download of %s: %v, want not found", p, err)
		}
		for _, u := range users {
			if code, body := s.probe.files(t, http.MethodGet, u, p, nil, ""); code == http.StatusOK {
				s.noSecret(t, "download as "+userName(u), string(body))
				t.Errorf("download of %s as %s: %d", p, userName(u), code)
			}
		}
	}
	if _, err := s.probe.c().List(ctx, s.probe.id, filepath.Join(s.e.cfg.DataDir, "sandboxes"), 1); err == nil {
		t.Error("listing the host's sandboxes dir through the files API succeeded")
	}
}

// neighbourByAPI: with the neighbour's id, the attacker tenant gets 404 on
// every call, exactly as for an id that never existed.
func (s *suite) neighbourByAPI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	c := s.e.client(s.e.key(t, attackerTenant))
	id := s.nb.id
	echo := "echo owned > /home/user/secret"
	calls := map[string]func() error{
		"get":  func() error { _, err := c.GetSandbox(ctx, id); return err },
		"exec": func() error { _, err := c.Exec(ctx, id, api.ExecRequest{Shell: &echo}); return err },
		"read": func() error {
			rc, err := c.ReadFile(ctx, id, "/home/user/secret")
			if err == nil {
				rc.Close()
			}
			return err
		},
		"write": func() error {
			_, err := c.WriteFile(ctx, id, "/home/user/secret", strings.NewReader("owned"))
			return err
		},
		"pause":   func() error { _, err := c.Pause(ctx, id); return err },
		"timeout": func() error { _, err := c.SetTimeout(ctx, id, 1); return err },
		"metrics": func() error { _, err := c.Metrics(ctx, id); return err },
		"execs":   func() error { _, err := c.Execs(ctx, id, client.ExecListOptions{}); return err },
		"delete":  func() error { return c.DeleteSandbox(ctx, id) },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, client.ErrNotFound) {
			t.Errorf("%s of the neighbour's sandbox by another tenant: %v, want not found", name, err)
		}
	}
	for sb, err := range c.Sandboxes(ctx, client.ListOptions{}) {
		if err != nil {
			t.Fatal(err)
		}
		if sb.ID == id {
			t.Error("the attacker tenant lists the neighbour's sandbox")
		}
	}
}

// --- Namespaces, mounts, ptrace, signals ----------------------------------------

// mount: mount(2), umount of masks, pivot_root and the new mount API.
func (s *suite) mount(t *testing.T) {
	for _, u := range users {
		expect(t, userName(u), s.probe.py(t, u, progMount), denied)
	}
}

// unshare: no new namespace of any kind, by unshare(2), clone(2) or the
// unshare tool.
func (s *suite) unshare(t *testing.T) {
	for _, u := range users {
		got := s.probe.py(t, u, progUnshare)
		if s.sentry() {
			// gVisor implements namespaces inside the Sentry: a new one
			// is the Sentry's object and gives no host kernel surface
			// (clone of a network namespace gets ENOMEM, as the Sentry
			// has no stack to copy under --network=none).
			accept(got, errnos{"OK", "ENOMEM"}, keysWith(got, "")...)
			continue
		}
		expect(t, userName(u), got, denied)
		if r := s.probe.sh(t, u, "unshare -U -r true"); r.exited(0) {
			t.Errorf("unshare -U -r as %s worked: %v", userName(u), r)
		}
	}
}

// setns: PID 1's namespaces (and the sandbox's own) cannot be joined.
func (s *suite) setns(t *testing.T) {
	for _, u := range users {
		got := s.probe.py(t, u, progSetns)
		var keys []string
		for k := range got {
			if strings.HasPrefix(k, "setns_") {
				keys = append(keys, k)
			}
		}
		want := denied
		if s.sentry() {
			// The Sentry does not implement setns(2).
			want = append(errnos{"ENOTSUP"}, denied...)
		}
		expect(t, userName(u), got, want, keys...)
	}
}

// ptraceNeighbour: the neighbour's processes are invisible, and their host
// pid numbers lead nowhere.
func (s *suite) ptraceNeighbour(t *testing.T) {
	pids := s.nb.host.nsPIDs()
	if len(pids) == 0 {
		// Not host processes (another runtime): aim at plausible numbers.
		pids = []int{2, 3, 4, 5}
	}
	var args []string
	for _, p := range pids {
		args = append(args, strconv.Itoa(p))
	}
	for _, u := range users {
		got := s.probe.py(t, u, progPtrace, args...)
		if strings.Contains(got["#visible"], s.nb.mark) {
			t.Errorf("as %s the neighbour's canary is visible: %.500s", userName(u), got["#visible"])
		}
		delete(got, "#visible")
		s.noSecret(t, userName(u), values(got)...)
		var kill0 []string
		for _, p := range pids {
			kill0 = append(kill0, "kill0_"+strconv.Itoa(p))
		}
		if s.sentry() {
			// The numbers are guesses (gVisor's processes are not host
			// ones) and hit the probe's own processes: what they answer
			// says nothing of the neighbour, whose invisibility and
			// secrets are checked above.
			continue
		}
		// ESRCH, not EPERM: the process is not there at all.
		expect(t, userName(u), got, errnos{"ESRCH"}, kill0...)
		expect(t, userName(u), got, append(denied, notThere...))
	}
}

// ptraceAgent: PID 1, the agent, cannot be traced, read or written, even by
// root inside (same uid, but no CAP_SYS_PTRACE and a seccomp deny).
func (s *suite) ptraceAgent(t *testing.T) {
	for _, u := range users {
		got := s.probe.py(t, u, progPtrace, "1")
		delete(got, "#visible")
		delete(got, "kill0_1") // PID 1 is the sandbox's own init
		if s.sentry() {
			// The Sentry lets any user of the sandbox read the agent's
			// environment (Linux would ask for ptrace rights). It is
			// PATH and HOME only: the daemon's environment never enters,
			// and secrets go to execs, not to the agent.
			s.noSecret(t, userName(u), values(got)...)
			for _, k := range keysWith(got, "environ_") {
				if v := got[k]; strings.HasPrefix(v, "OK:") && !strings.Contains(v, "AIRLOCK") {
					delete(got, k)
				}
			}
		}
		expect(t, userName(u), got, append(denied, notThere...))
	}
}

// agentMemory: in a fresh sandbox whose only exec so far is the attack
// itself, as root (before anything made the agent change its credentials,
// which would have made it non-dumpable by chance), and then as the
// default user, nothing of PID 1 can be read or written through /proc:
// not its memory (the way to patch the agent's code and make it write
// without end to its log on the host, or answer the daemon anything), its
// environment, maps or descriptors, nor its binary read. The agent is
// non-dumpable from its start (internal/agent/nodump) and, under runc, its
// binary is host root's, mode 0711 (the runc driver's agentMode), so the
// kernel makes it non-dumpable from its execve on.
func (s *suite) agentMemory(t *testing.T) {
	b := s.sandbox(t, api.CreateSandboxRequest{})
	for _, u := range []string{"root", ""} {
		got := b.py(t, u, progAgentProc)
		s.noSecret(t, userName(u), values(got)...)
		if s.sentry() {
			// The Sentry's /proc (runsc 20221219) does not ask for
			// ptrace rights: any user of the sandbox reads the agent's
			// environment (PATH and HOME only, checked above), maps,
			// auxiliary vector and descriptor links, and root opens its
			// stdout and stderr, the agent's log, which lives on the
			// sandbox's own quota'd layer (DiskFillAgentRunDir). The
			// Sentry loads the binary as the sandbox's root, so it stays
			// readable (runc.Runtime.ReadableAgent). What matters holds:
			// there is no /proc/1/mem, and ptrace and process_vm_* are
			// refused for the non-dumpable agent.
			accept(got, errnos{"OK"}, append(keysWith(got, "fd_"),
				"environ", "maps", "auxv", "agent_binary_read")...)
		}
		expect(t, userName(u), got, append(denied, notThere...))
	}
	b.alive(t)
}

// killHostPID: a host process's pid number, signalled from inside, reaches
// nothing (the host `sleep` lives); kill(-1) ends only the sandbox's own
// processes and the sandbox still answers.
func (s *suite) killHostPID(t *testing.T) {
	b := s.sandbox(t, api.CreateSandboxRequest{})
	got := b.py(t, "root", progKill, strconv.Itoa(s.host.sleepPID()))
	delete(got, "kill_all") // inside the sandbox: allowed
	if s.sentry() {
		// The Sentry has no pidfd_open; its pids are its own anyway.
		accept(got, errnos{"ENOSYS"}, keysWith(got, "pidfd_")...)
	}
	// ESRCH, not EPERM: the host process is not there at all.
	expect(t, "signalling a host pid", got, errnos{"ESRCH"})
	b.alive(t)
}

// signalAgent: the default user cannot signal PID 1; root cannot kill or
// stop it (the kernel protects a namespace's init); root's SIGTERM ends its
// own sandbox only, which the API then reports as crashed.
func (s *suite) signalAgent(t *testing.T) {
	b := s.sandbox(t, api.CreateSandboxRequest{})
	if r := b.sh(t, "", "kill -TERM 1"); r.exited(0) {
		t.Errorf("the default user signalled PID 1: %v", r)
	}
	if s.sentry() {
		// The Sentry does not shield PID 1 from SIGKILL by root of its
		// own namespace as Linux does: root inside can end its own
		// sandbox this way too (its loss only, reported below).
		b.sh(t, "root", "kill -STOP 1; sleep 0.3; kill -CONT 1")
	} else {
		b.sh(t, "root", "kill -KILL 1; kill -STOP 1; sleep 0.3; kill -CONT 1")
	}
	b.alive(t)
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	// The agent handles SIGTERM (it shuts down cleanly), and a handled
	// signal reaches a namespace's init from inside it, on Linux as in the
	// Sentry: root inside ends its own sandbox, which must then be reported
	// as crashed, never go on as running without its agent. (Measured on
	// both runtimes: init exits 0.)
	term := "kill -TERM 1; sleep 2"
	res, err := b.c().Exec(ctx, b.id, api.ExecRequest{Shell: &term, User: "root"})
	if err == nil && res.Status != api.ExecError {
		// Its sleep died with the sandbox: it cannot have ended normally.
		t.Errorf("the exec that ended its own sandbox: %+v, want status error", res)
	}
	var sb *api.Sandbox
	if !eventually(20*time.Second, func() bool {
		sb, err = b.c().GetSandbox(ctx, b.id)
		return err == nil && sb.State != api.StateRunning
	}) {
		t.Fatalf("sandbox after its root sent SIGTERM to its agent: %+v, %v; want error sandbox_crashed", sb, err)
	}
	if sb.State != api.StateError || sb.Error == nil || sb.Error.Code != "sandbox_crashed" {
		t.Fatalf("sandbox after its root ended the agent: %+v (error %+v), want error sandbox_crashed", sb, sb.Error)
	}
}

// --- Kernel interfaces --------------------------------------------------------

// writeSys: /sys is read-only.
func (s *suite) writeSys(t *testing.T) {
	expect(t, "root", s.probe.py(t, "root", progWriteSys), readOnly)
}

// writeProcSys: /proc/sys and /proc/sysrq-trigger are read-only (or
// absent); the host's core_pattern, modprobe and hostname stay.
func (s *suite) writeProcSys(t *testing.T) {
	for _, u := range users {
		got := s.probe.py(t, u, progWriteProcSys)
		if s.sentry() {
			// /proc/sys is the Sentry's: its network settings belong to
			// its own network stack (no host device under
			// --network=none), and it refuses the hostname with EIO.
			// The host's values are checked after every attack.
			accept(got, errnos{"OK"}, keysWith(got, "/proc/sys/net/")...)
			accept(got, errnos{"EIO"}, keysWith(got, "/proc/sys/kernel/")...)
		}
		expect(t, userName(u), got, readOnly)
	}
}

// kernelModules: init_module, finit_module and delete_module are refused.
func (s *suite) kernelModules(t *testing.T) {
	expect(t, "root", s.probe.py(t, "root", progModules), denied)
}

// rawSockets: no AF_PACKET or SOCK_RAW socket, for anyone.
func (s *suite) rawSockets(t *testing.T) {
	for _, u := range users {
		expect(t, userName(u), s.probe.py(t, u, progRawSockets), anyFailure)
	}
}

// setuidBinary: a setuid-root copy of python made by root inside gives the
// default user nothing: no_new_privs.
func (s *suite) setuidBinary(t *testing.T) {
	n := token()[:8]
	bin := "/tmp/suid-python-" + n
	// The mode through Python's stat(2): coreutils' stat uses
	// statx(AT_NO_AUTOMOUNT), which Debian's gVisor refuses with EINVAL.
	mode := s.probe.mustSh(t, "root", "cp /usr/bin/python3 "+bin+" && chown 0:0 "+bin+" && chmod 4755 "+bin+
		" && python3 -c 'import os,sys; print(oct(os.stat(sys.argv[1]).st_mode & 0o7777)[2:])' "+bin)
	if strings.TrimSpace(mode) != "4755" {
		t.Fatalf("setuid copy has mode %q", mode)
	}
	out := s.probe.mustSh(t, "", bin+` -c 'import os; print(os.getresuid(), os.getresgid())'; grep -E '^(NoNewPrivs|CapEff|CapPrm):' /proc/self/status`)
	wants := []string{"(1000, 1000, 1000) (1000, 1000, 1000)", "NoNewPrivs:\t1", "CapEff:\t0000000000000000", "CapPrm:\t0000000000000000"}
	if s.sentry() {
		// The Sentry's /proc/self/status has no NoNewPrivs line; the ids
		// and capabilities above are what the setuid bit did not give.
		wants = slices.DeleteFunc(wants, func(w string) bool { return strings.HasPrefix(w, "NoNewPrivs") })
	}
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("running a setuid-root binary as the default user: %q lacks %q", out, want)
		}
	}
}

// fileCapabilities: root inside cannot give a binary file capabilities.
func (s *suite) fileCapabilities(t *testing.T) {
	want := denied
	if s.sentry() {
		// The Sentry keeps no security.* extended attributes.
		want = append(errnos{"ENOTSUP"}, denied...)
	}
	expect(t, "root", s.probe.py(t, "root", progFileCaps), want)
	out := s.probe.mustSh(t, "", "/tmp/cap-python -c \"print(open('/proc/self/status').read())\" | grep -E '^Cap(Eff|Prm):'")
	if strings.Count(out, "0000000000000000") != 2 {
		t.Errorf("the copy runs with capabilities: %q", out)
	}
}

// syscalls: keyrings, bpf, userfaultfd, perf, open_by_handle_at, kexec,
// iopl, swap, accounting, clock and hostname setting, reboot… all refused.
func (s *suite) syscalls(t *testing.T) {
	prog := progSyscalls()
	got := map[string]map[string]string{}
	for _, u := range users {
		got[u] = s.probe.py(t, u, prog)
	}
	// What the Sentry answers itself, with no host kernel code behind:
	// no PMU (ENODEV), no file handles (ENOTSUP), its own io_uring (the
	// probe's bogus arguments give EFAULT) and its own kernel log (a few
	// fixed lines, nothing of the host's).
	sentryOwn := map[string]errnos{
		"perf_event_open": {"ENODEV"}, "open_by_handle_at": {"ENOTSUP"},
		"io_uring_setup": {"EFAULT"}, "syslog": {"OK"},
	}
	for _, p := range syscallProbes {
		t.Run(p.name, func(t *testing.T) {
			for _, u := range users {
				if own, ok := sentryOwn[p.name]; ok && s.sentry() {
					accept(got[u], own, p.name)
					if _, left := got[u][p.name]; !left {
						continue
					}
				}
				expect(t, userName(u), got[u], denied, p.name)
			}
		})
	}
}

// mknod: no block or character device can be made.
func (s *suite) mknod(t *testing.T) {
	for _, u := range users {
		got := s.probe.py(t, u, progMknod)
		if s.sentry() {
			// A node made in gVisor is a file of the Sentry's: opening
			// it reaches no host device (ENXIO), except the Sentry's
			// own tun, part of its network stack.
			// The Sentry's own kernel log device (kmsg) opens too.
			orig := maps.Clone(got)
			for k, v := range orig {
				if strings.HasSuffix(k, "_open") {
					continue
				}
				open := orig[k+"_open"]
				own := k == "chr_tun" || k == "chr_kmsg"
				if v == "OK" && (open == "ENXIO" || open == "ENODEV" || own) {
					delete(got, k)
					if own || open != "OK" {
						delete(got, k+"_open")
					}
				}
			}
		}
		expect(t, userName(u), got, denied)
	}
}

// deviceNodes: no host device is there to open; /dev/null works.
func (s *suite) deviceNodes(t *testing.T) {
	got := s.probe.py(t, "root", progDevices)
	if got["#/dev/null"] != "OK" {
		t.Errorf("/dev/null: %s", got["#/dev/null"])
	}
	delete(got, "#/dev/null")
	if s.sentry() {
		// The Sentry's own tun (its network stack) and FUSE (served by
		// the Sentry, no host fuse device).
		accept(got, errnos{"OK"}, "/dev/net/tun", "/dev/fuse")
	}
	expect(t, "root", got, notDevice)
}

// chrootEscape: the double-chroot escape lands at the sandbox's root. (A
// fresh sandbox: the files attacks make the marker's directory inside the
// probe.)
func (s *suite) chrootEscape(t *testing.T) {
	got := s.sandbox(t, api.CreateSandboxRequest{}).py(t, "root", progChroot, s.host.marker)
	if got["#sandbox_root"] != "yes" {
		t.Errorf("after the chroot escape the root is not the sandbox's: %v", got)
	}
	delete(got, "#sandbox_root")
	s.noSecret(t, "after the chroot escape", values(got)...)
	expect(t, "after the chroot escape", got, notThere)
}

// cgroupEscape: every cgroup file is read-only; the sandbox's host cgroup
// limits stay.
func (s *suite) cgroupEscape(t *testing.T) {
	limits := func() map[string]string {
		out := map[string]string{}
		if !s.probe.host.ok {
			return out
		}
		for _, f := range []string{"memory/memory.limit_in_bytes", "pids/pids.max", "cpu/cpu.cfs_quota_us", "memory.max", "pids.max", "cpu.max"} {
			ctrl, file := path.Split(f)
			p := filepath.Join("/sys/fs/cgroup", ctrl, s.probe.host.cgroup, file)
			if b, err := os.ReadFile(p); err == nil {
				out[p] = string(b)
			}
		}
		return out
	}
	before := limits()
	got := s.probe.py(t, "root", progCgroup)
	if len(got) == 0 && s.sentry() {
		// The Sentry shows no cgroup file system at all: nothing of the
		// host's cgroups is there to write. The host limits stay (below).
		if after := limits(); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Errorf("the sandbox's host cgroup limits changed:\nwas %v\nnow %v", before, after)
		}
		return
	}
	if len(got) == 0 {
		t.Fatal("the program found no cgroup file to write")
	}
	expect(t, "root", got, readOnly)
	if after := limits(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the sandbox's host cgroup limits changed:\nwas %v\nnow %v", before, after)
	}
}

// hostname: the hostname cannot be changed (the host's stays; see the host
// check), and the sandbox keeps its own.
func (s *suite) hostname(t *testing.T) {
	want := strings.ReplaceAll(s.probe.id, "_", "-")
	r := s.probe.sh(t, "root", "hostname escape-evil; echo escape-evil > /proc/sys/kernel/hostname; uname -n")
	if lines := strings.Fields(r.stdout); len(lines) == 0 || lines[len(lines)-1] != want {
		t.Errorf("hostname after the attack: %v, want %s", r, want)
	}
}

// timeChange: the clock cannot be set, even to its own value.
func (s *suite) timeChange(t *testing.T) {
	start := time.Now()
	expect(t, "root", s.probe.py(t, "root", progTime), denied)
	if r := s.probe.sh(t, "root", "date -s @$(date +%s)"); r.exited(0) {
		t.Errorf("date -s worked: %v", r)
	}
	// The host's wall clock kept pace with its monotonic clock.
	if skew := time.Now().Round(0).Sub(start.Round(0)) - time.Since(start); skew > time.Second || skew < -time.Second {
		t.Errorf("the host's wall clock moved by %v", skew)
	}
}

// reboot: reboot(2) is refused before it looks at its command.
func (s *suite) reboot(t *testing.T) {
	got := s.probe.py(t, "root", `R["reboot"] = sc(169, 0xfee1dead, 672274793, 0x1234, 0)
done()`)
	expect(t, "root", got, errnos{"EPERM"})
	s.probe.alive(t)
}

// kernelInfo: masked /proc files are empty or absent, kernel addresses are
// hidden, the kernel log is refused.
func (s *suite) kernelInfo(t *testing.T) {
	for _, u := range users {
		got := s.probe.py(t, u, progKernelInfo)
		if got["#kallsyms_addresses"] != "0" {
			t.Errorf("as %s /proc/kallsyms shows %s kernel addresses", userName(u), got["#kallsyms_addresses"])
		}
		delete(got, "#kallsyms_addresses")
		keys := []string{"/proc/kcore", "/proc/keys", "/proc/timer_list",
			"/proc/sched_debug", "/proc/latency_stats", "/proc/timer_stats", "/proc/scsi/scsi", "/proc/acpi/wakeup",
			"/proc/config.gz", "/proc/interrupts", "syslog_read"}
		if s.sentry() {
			// The kernel log is the Sentry's own few lines.
			if strings.HasPrefix(got["syslog_read"], "OK") {
				keys = keys[:len(keys)-1]
			}
		}
		expect(t, userName(u), got, append(errnos{"EMPTY", "ENOENT"}, denied...), keys...)
	}
}

// ueventNetlink: the sandbox's network namespace is made by the daemon, so
// it belongs to the host's user namespace, and the kernel broadcasts the
// host's uevents to it. While root inside listens, another sandbox is made
// and deleted (its loop device attached, mounted and detached): nothing
// reaches the listener, because under runc the uevent socket cannot be
// opened (seccomp, EPERM) and under gVisor the Sentry's own netlink never
// sees the host's events. Routing netlink still works.
func (s *suite) ueventNetlink(t *testing.T) {
	b := s.sandbox(t, api.CreateSandboxRequest{})
	const ready, stop = "/tmp/uevent-ready", "/tmp/uevent-stop"
	type outcome struct {
		r   *api.ExecResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		to := 90.0
		r, err := b.c().Exec(ctx, b.id, api.ExecRequest{Cmd: []string{"python3", "-c", pyPrelude + progUevent, ready, stop},
			User: "root", TimeoutS: &to})
		done <- outcome{r, err}
	}()
	if !eventually(time.Minute, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		_, err := b.readFile(ctx, ready)
		return err == nil
	}) {
		t.Fatal("the listener did not start")
	}
	other := s.sandboxOf(t, neighbourTenant, api.CreateSandboxRequest{})
	other.alive(t)
	other.delete(t)
	b.mustSh(t, "root", "touch "+stop)
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	out, _, err := client.Output(o.r)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var got map[string]string
	if json.Unmarshal([]byte(lines[len(lines)-1]), &got) != nil {
		t.Fatalf("the listener did not finish: %+v", o.r)
	}
	if got["received"] != "NONE" {
		t.Errorf("finding: root in sandbox %s received host uevents while another sandbox came and went: %s", b.id, got["received"])
	}
	if got["#route"] != "OK" {
		t.Errorf("a routing netlink socket cannot be opened: %s", got["#route"])
	}
	if !s.sentry() {
		expect(t, "root", got, errnos{"EPERM"}, "open_raw", "open_dgram")
	}
}

// agentBinary: the agent binary (a host file bind-mounted in) cannot be
// written, replaced or changed, nor PID 1's executable opened for writing.
func (s *suite) agentBinary(t *testing.T) {
	expect(t, "root", s.probe.py(t, "root", progAgentBinary), anyFailure)
}

// userNamespace: root inside is an unprivileged uid range on the host,
// distinct from the neighbour's.
func (s *suite) userNamespace(t *testing.T) {
	if s.sentry() {
		// Inside gVisor the uid map is the Sentry's own (0 0 4294967295):
		// root inside is the Sentry's notion. On the host the Sentry runs
		// as nobody and the Gofer as the sandbox's own uid base.
		for _, b := range []*sbx{s.probe, s.nb.sbx} {
			pid := readPidFile(t, filepath.Join(s.sandboxDir(b.id), "init.pid"))
			if uid := procUID(pid); uid == 0 || uid < 0 {
				t.Errorf("sandbox %s's Sentry (pid %d) runs as host uid %d", b.id, pid, uid)
			}
		}
		return
	}
	out := s.probe.mustSh(t, "root", "id -u; cat /proc/self/uid_map")
	f := strings.Fields(out)
	if len(f) < 4 || f[0] != "0" {
		t.Fatalf("root inside: %q", out)
	}
	if f[1] != "0" || f[2] == "0" {
		t.Errorf("uid 0 inside maps to host uid %s: want an unprivileged range (%q)", f[2], out)
	}
	if a, b := s.probe.host, s.nb.host; a.ok && b.ok {
		if a.uidBase == 0 || b.uidBase == 0 {
			t.Errorf("a sandbox runs as host root: %d, %d", a.uidBase, b.uidBase)
		}
		if a.uidBase < b.uidBase+b.uidSize && b.uidBase < a.uidBase+a.uidSize {
			t.Errorf("uid ranges overlap: %d+%d and %d+%d", a.uidBase, a.uidSize, b.uidBase, b.uidSize)
		}
	}
}

// --- The daemon ---------------------------------------------------------------

// daemonAPIFromInside: the daemon's port on loopback and the host's
// abstract unix sockets are in another network namespace.
func (s *suite) daemonAPIFromInside(t *testing.T) {
	for _, u := range users {
		got := s.probe.py(t, u, progConnect, strconv.Itoa(s.e.port()), s.host.abstract)
		t.Logf("network interfaces inside: %s", got["#interfaces"])
		delete(got, "#interfaces")
		expect(t, userName(u), got, unreachable, "tcp4_127.0.0.1", "tcp6_::1", "tcp4_localhost")
		expect(t, userName(u), got, anyFailure, "abstract_unix")
	}
}

// daemonSecrets: no process the sandbox can see holds the daemon's
// environment, command line or any API key or secret; /proc/<daemon pid>
// is not there.
func (s *suite) daemonSecrets(t *testing.T) {
	got := s.probe.py(t, "root", progProcScan, strconv.Itoa(os.Getpid()))
	for _, k := range []string{"daemon_environ", "daemon_cmdline"} {
		// The daemon's pid number may exist inside as another process (pid
		// numbers repeat across namespaces); the content tells them apart.
		if v := got[k]; strings.HasPrefix(v, "OK") {
			t.Logf("%s: a process inside has the daemon's pid number %d", k, os.Getpid())
		} else if !notThere.has(v) {
			t.Errorf("%s = %q, want not there", k, v)
		}
	}
	if cmd, err := os.ReadFile("/proc/self/cmdline"); err == nil && strings.Contains(got["daemon_cmdline"], string(cmd)) {
		t.Error("the daemon's command line is readable inside the sandbox")
	}
	all := strings.Join(values(got), "\n")
	s.noSecret(t, "process environments", all)
	for _, k := range s.e.allKeys() {
		if strings.Contains(all, k) {
			t.Errorf("an API key is readable inside the sandbox")
		}
	}
	if env, err := os.ReadFile("/proc/self/environ"); err == nil && len(env) > 64 &&
		strings.Contains(strings.ReplaceAll(all, "\x00", ""), strings.ReplaceAll(string(env), "\x00", "")) {
		t.Error("the daemon's environment is readable inside the sandbox")
	}
	if exe, err := os.Executable(); err == nil && strings.Contains(all, exe) {
		t.Errorf("the daemon's command line (%s) is readable inside the sandbox", exe)
	}
}

// --- Files API ----------------------------------------------------------------

// fsReq sends a JSON request to a files endpoint as user.
func (s *sbx) fsReq(t testing.TB, method, endpoint string, body any, query url.Values) (int, []byte) {
	t.Helper()
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	return s.e.raw(t, s.key, method, "/v1/sandboxes/"+s.id+"/"+endpoint, query, rd, "application/json")
}

// fileOps runs every file operation of the API on paths that lead outside
// by `..` or symlinks: writes into the host drop dir, reads of the host
// marker, removal of the host marker. The host check then sees what landed.
func (s *suite) fileOps(t testing.TB, b *sbx, user, dropPath, markerPath string) []string {
	t.Helper()
	var read []string
	b.files(t, http.MethodPut, user, dropPath+"/w-"+token()[:6], strings.NewReader("escape"), "application/octet-stream")
	b.fsReq(t, http.MethodPost, "fs/mkdir", api.MkdirRequest{Path: dropPath + "/d-" + token()[:6], User: user}, nil)
	src := "/tmp/mv-" + token()[:8]
	b.files(t, http.MethodPut, user, src, strings.NewReader("escape"), "application/octet-stream")
	b.fsReq(t, http.MethodPost, "fs/move", api.MoveRequest{From: src, To: dropPath + "/m-" + token()[:6], User: user}, nil)
	_, body := b.files(t, http.MethodGet, user, markerPath, nil, "")
	read = append(read, string(body))
	_, body = b.fsReq(t, http.MethodGet, "fs/list", nil, url.Values{"path": {path.Dir(markerPath)}, "user": {user}})
	read = append(read, string(body))
	_, body = b.fsReq(t, http.MethodGet, "fs/stat", nil, url.Values{"path": {markerPath}, "user": {user}})
	read = append(read, string(body))
	b.fsReq(t, http.MethodDelete, "fs", nil, url.Values{"path": {markerPath}, "user": {user}})
	return read
}

// filesSymlinkParent: uploads, mkdir, move and remove through a parent
// that is a symlink to / or to a host directory stay inside the sandbox.
func (s *suite) filesSymlinkParent(t *testing.T) {
	n := token()[:8]
	s.probe.mustSh(t, "", fmt.Sprintf("ln -sfn / /home/user/rootlink-%[1]s; ln -sfn %[2]s /home/user/droplink-%[1]s; ln -sfn %[3]s /home/user/hostlink-%[1]s",
		n, s.host.drop, s.host.dir))
	var read []string
	for _, u := range users {
		read = append(read, s.fileOps(t, s.probe, u, "/home/user/droplink-"+n, "/home/user/hostlink-"+n+"/marker")...)
		read = append(read, s.fileOps(t, s.probe, u, "/home/user/rootlink-"+n+s.host.drop, "/home/user/rootlink-"+n+s.host.marker)...)
	}
	s.noSecret(t, "files API through symlinked parents", read...)
}

// filesAbsoluteSymlink: a download through an absolute symlink to
// /etc/shadow or to the host marker, or through /proc/1/root, returns the
// sandbox's file, never the host's.
func (s *suite) filesAbsoluteSymlink(t *testing.T) {
	n := token()[:8]
	s.probe.mustSh(t, "root", fmt.Sprintf("ln -sf /etc/shadow /home/user/shadow-%[1]s; ln -sf %[2]s /home/user/marker-%[1]s; ln -sfn /proc/1/root /home/user/p1root-%[1]s", n, s.host.marker))
	hostShadow, _ := os.ReadFile("/etc/shadow")
	var sawShadow bool
	for _, u := range users {
		for _, p := range []string{
			"/home/user/shadow-" + n, "/home/user/marker-" + n, "/proc/1/root/etc/shadow", "/proc/self/root/etc/shadow",
			"/home/user/p1root-" + n + "/etc/shadow", "/proc/1/root" + s.host.marker, "/home/user/p1root-" + n + s.host.marker,
			"/etc/shadow",
		} {
			code, body := s.probe.files(t, http.MethodGet, u, p, nil, "")
			s.noSecret(t, "download of "+p, string(body))
			if len(hostShadow) > 0 && code == http.StatusOK && sha256.Sum256(body) == sha256.Sum256(hostShadow) {
				t.Errorf("download of %s as %s returned the host's /etc/shadow", p, userName(u))
			}
			if code == http.StatusOK && strings.Contains(string(body), "root:") {
				sawShadow = true
			}
		}
	}
	if !sawShadow {
		t.Error("root could not download the sandbox's own /etc/shadow: the probe tests nothing")
	}
}

// filesDotDot: `..` in absolute and relative paths stops at the sandbox's
// root for every file operation.
func (s *suite) filesDotDot(t *testing.T) {
	up := strings.Repeat("../", 12)
	var read []string
	for _, u := range users {
		read = append(read, s.fileOps(t, s.probe, u, "/"+up+s.host.drop, "/"+up+s.host.marker)...)
		read = append(read, s.fileOps(t, s.probe, u, up+s.host.drop[1:], up+s.host.marker[1:])...)
		read = append(read, s.fileOps(t, s.probe, u, "/home/user/"+up+s.host.drop, "/home/user/"+up+s.host.marker)...)
	}
	s.noSecret(t, "files API with ..", read...)
}

// filesSymlinkRace: while a program swaps a directory and a symlink to a
// host directory in a tight loop, uploads, tar uploads, mkdir and downloads
// through that path never reach the host.
func (s *suite) filesSymlinkRace(t *testing.T) {
	b := s.sandbox(t, api.CreateSandboxRequest{})
	const dur = 4.0
	prog := pyPrelude + progRace
	timeout := 60.0
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	eid, err := b.c().ExecAsync(ctx, b.id, api.ExecRequest{Cmd: []string{"python3", "-c", prog, s.host.drop, fmt.Sprint(dur)}, TimeoutS: &timeout})
	if err != nil {
		t.Fatal(err)
	}
	var tarball bytes.Buffer
	tw := tar.NewWriter(&tarball)
	tw.WriteHeader(&tar.Header{Name: "t", Mode: 0o644, Size: 6, Typeflag: tar.TypeReg})
	tw.Write([]byte("escape"))
	tw.Close()
	var ops, ok int
	var read []string
	end := time.Now().Add(time.Duration(dur * float64(time.Second)))
	for i := 0; time.Now().Before(end); i++ {
		for _, op := range []func() (int, []byte){
			func() (int, []byte) {
				return b.files(t, http.MethodPut, "", fmt.Sprintf("/home/user/race/real/f-%d", i), strings.NewReader("escape"), "application/octet-stream")
			},
			func() (int, []byte) {
				return b.files(t, http.MethodPut, "", "/home/user/race/real", bytes.NewReader(tarball.Bytes()), client.ContentTypeTar)
			},
			func() (int, []byte) {
				return b.fsReq(t, http.MethodPost, "fs/mkdir", api.MkdirRequest{Path: fmt.Sprintf("/home/user/race/real/d-%d", i)}, nil)
			},
			func() (int, []byte) { return b.files(t, http.MethodGet, "", "/home/user/race/hreal/marker", nil, "") },
		} {
			code, body := op()
			ops++
			if code < 300 {
				ok++
			}
			read = append(read, string(body))
		}
	}
	s.noSecret(t, "files API during the symlink race", read...)
	var res *api.ExecResult
	if !eventually(30*time.Second, func() bool {
		res, err = b.c().GetExec(ctx, b.id, eid)
		return err == nil && res.Status != api.ExecRunning
	}) {
		t.Fatalf("the race program did not end: %+v %v", res, err)
	}
	stdout, _, _ := client.Output(res)
	t.Logf("%d file operations during the race, %d succeeded; program: %s", ops, ok, strings.TrimSpace(string(stdout)))
	if ok == 0 || !strings.Contains(string(stdout), "#swaps") {
		t.Errorf("the race did not run: %d of %d operations succeeded, program %+v", ok, ops, res)
	}
}

// tarSlip: tar archives with `../` names, absolute names, a symlink they
// then write through, a symlink to /, a directory replaced by a symlink and
// hard links to the host marker unpack inside the sandbox only. Each trick
// is its own archive, so that refusing one does not hide the next.
func (s *suite) tarSlip(t *testing.T) {
	up := strings.Repeat("../", 12)
	reg := func(name string) *tar.Header {
		return &tar.Header{Name: name, Mode: 0o644, Size: 6, Typeflag: tar.TypeReg}
	}
	link := func(name, target string, typ byte) *tar.Header {
		return &tar.Header{Name: name, Linkname: target, Typeflag: typ, Mode: 0o777}
	}
	archives := map[string][]*tar.Header{
		"dotdot":               {reg(up + s.host.drop[1:] + "/slip1")},
		"absolute":             {reg(s.host.drop + "/slip2")},
		"symlink-then-file":    {link("lnk", s.host.drop, tar.TypeSymlink), reg("lnk/slip3")},
		"relative-symlink":     {link("rel", up+s.host.drop[1:], tar.TypeSymlink), reg("rel/slip4")},
		"root-symlink":         {link("rootlnk", "/", tar.TypeSymlink), reg("rootlnk" + s.host.drop + "/slip5")},
		"nested-dotdot":        {reg("sub/" + up + s.host.drop[1:] + "/slip6")},
		"dir-then-symlink":     {{Name: "dir", Typeflag: tar.TypeDir, Mode: 0o755}, link("dir", s.host.drop, tar.TypeSymlink), reg("dir/slip7")},
		"hardlink":             {link("hard", s.host.marker, tar.TypeLink)},
		"hardlink-dotdot":      {link("hardrel", up+s.host.marker[1:], tar.TypeLink)},
		"hardlink-via-symlink": {link("hl", s.host.dir, tar.TypeSymlink), link("hard2", "hl/marker", tar.TypeLink)},
	}
	var read []string
	for name, hdrs := range archives {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hdrs {
			tw.WriteHeader(h)
			if h.Typeflag == tar.TypeReg {
				tw.Write([]byte("escape"))
			}
		}
		tw.Close()
		for _, u := range users {
			dir := "/home/user/untar-" + name + "-" + userName(u)
			code, body := s.probe.files(t, http.MethodPut, u, dir, bytes.NewReader(buf.Bytes()), client.ContentTypeTar)
			t.Logf("%s as %s: %d %s", name, userName(u), code, body)
			for _, p := range []string{"/hard", "/hardrel", "/hard2"} {
				_, body := s.probe.files(t, http.MethodGet, u, dir+p, nil, "")
				read = append(read, string(body))
			}
		}
	}
	r := s.probe.sh(t, "root", "cat /home/user/untar-*/hard* /home/user/untar-*/lnk/* /home/user/untar-*/dir/* 2>&1")
	read = append(read, r.stdout)
	s.noSecret(t, "tar-slip", read...)
}

// --- Resource abuse -----------------------------------------------------------

// forkBomb: the bomb hits the sandbox's PID limit, never the host's; the
// sandbox answers afterwards and its processes are gone.
func (s *suite) forkBomb(t *testing.T) {
	const limit = 128
	b := s.sandbox(t, api.CreateSandboxRequest{Resources: &api.Resources{PIDs: limit}})
	var peak atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		for {
			if m, err := b.c().Metrics(ctx, b.id); err == nil && m.PIDs > peak.Load() {
				peak.Store(m.PIDs)
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	timeout := 6.0
	r := b.exec(t, api.ExecRequest{Cmd: []string{"bash", "-c", `f() { f | f & }; f; while :; do sleep 1000 & done`}, TimeoutS: &timeout})
	close(stop)
	wg.Wait()
	hostLimit := uint64(limit)
	if s.sentry() {
		// Metrics count host tasks: under gVisor the Sentry's threads and
		// the ptrace stubs behind each process, bounded by the driver at
		// 4 × pids + 128 (internal/driver/gvisor). A bomb that reaches it
		// ends the sandbox's own Sentry: the sandbox is reported crashed,
		// the host and the neighbour keep going (checked after the attack).
		hostLimit = 4*limit + 128
		if r.Status == api.ExecError {
			t.Logf("fork bomb ended the sandbox's user-space kernel: %v", r)
			if peak.Load() > hostLimit {
				t.Errorf("the sandbox ran %d host tasks, limit %d", peak.Load(), hostLimit)
			}
			s.crashed(t, b)
			return
		}
	}
	if r.Status != api.ExecTimeout && r.Status != api.ExecKilled {
		t.Errorf("fork bomb: %v, want timeout", r)
	}
	t.Logf("fork bomb peaked at %d tasks (limit %d)", peak.Load(), hostLimit)
	if peak.Load() > hostLimit {
		t.Errorf("the sandbox ran %d tasks, limit %d", peak.Load(), hostLimit)
	}
	b.alive(t)
	if s.sentry() {
		return // host tasks of the runtime, not processes: see above
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	var left uint64
	if !eventually(20*time.Second, func() bool {
		m, err := b.c().Metrics(ctx, b.id)
		left = m.PIDs
		// What stays is the agent's own threads (about a dozen kept idle,
		// see cmd/airlock-agent), nothing of the bomb's 128.
		return err == nil && m.PIDs < 24
	}) {
		t.Errorf("%d tasks left after the fork bomb ended", left)
	}
}

// memoryBomb: allocating past the limit is an OOM kill reported as such;
// the sandbox answers afterwards.
func (s *suite) memoryBomb(t *testing.T) {
	b := s.sandbox(t, api.CreateSandboxRequest{Resources: &api.Resources{MemoryMB: 128}})
	r := b.exec(t, api.ExecRequest{Cmd: []string{"python3", "-c", "x = []\nwhile True:\n    x.append(b'x' * (8 << 20))"}})
	if s.sentry() && r.Status != api.ExecOOM {
		// The Sentry holds all the sandbox's memory: the host's OOM
		// killer ends the whole sandbox, which is reported crashed; the
		// host and the neighbour are checked after the attack.
		t.Logf("memory bomb ended the sandbox's user-space kernel: %v", r)
		s.crashed(t, b)
		return
	}
	if r.Status != api.ExecOOM {
		t.Errorf("memory bomb: %v, want status oom", r)
	}
	b.alive(t)
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if m, err := b.c().Metrics(ctx, b.id); err != nil {
		t.Error(err)
	} else if m.MemoryPeakBytes > 129<<20 {
		t.Errorf("memory peak %d above the 128 MiB limit", m.MemoryPeakBytes)
	}
}

// diskFill: writing past the disk quota is ENOSPC inside; the host's disk
// loses at most the quota; the sandbox stays usable.
func (s *suite) diskFill(t *testing.T) {
	const quotaMB = 64
	b := s.sandbox(t, api.CreateSandboxRequest{Resources: &api.Resources{DiskMB: quotaMB}})
	before := hostFree(t, s.e.cfg.DataDir)
	r := b.sh(t, "root", "dd if=/dev/zero of=/home/user/fill bs=1M count=2048 2>&1; sync -f /home/user/fill")
	after := hostFree(t, s.e.cfg.DataDir)
	if !strings.Contains(r.stdout, "No space left on device") {
		t.Errorf("disk fill: %v, want ENOSPC", r)
	}
	// Other tests share the disk: the slack absorbs their writes, and is
	// far below the 2 GiB the attack tried.
	if used := before - after; used > (quotaMB+512)<<20 {
		t.Errorf("the host's disk lost %d MiB to a sandbox with a %d MiB quota", used>>20, quotaMB)
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if _, err := b.c().WriteFile(ctx, b.id, "/home/user/more", bytes.NewReader(make([]byte, 16<<20))); !errors.Is(err, client.ErrQuotaExceeded) {
		t.Errorf("upload to a full disk: %v, want quota exceeded", err)
	}
	b.mustSh(t, "root", "rm -f /home/user/fill")
	if _, err := b.c().WriteFile(ctx, b.id, "/home/user/more", bytes.NewReader(make([]byte, 1<<20))); err != nil {
		t.Errorf("upload after freeing space: %v", err)
	}
}

// diskFillRunDir: root inside writes where the agent's socket dir was once
// bind-mounted from the host (/.airlock/run) and into the agent's stdout
// and stderr (its log, a file on the host), and lists its writable mounts:
// nothing it writes may reach the host's disk outside its quota. Under
// runc the agent's descriptors are out of reach (it is non-dumpable);
// under gVisor root opens them, and the log is on the sandbox's own quota'd
// layer: four times the quota written there stops at the quota.
func (s *suite) diskFillRunDir(t *testing.T) {
	const quotaMB, writeMB = 32, 128
	b := s.sandbox(t, api.CreateSandboxRequest{Resources: &api.Resources{DiskMB: quotaMB}})
	sbxDir := s.sandboxDir(b.id)
	before := hostFilesSize(t, sbxDir)
	mounts := b.py(t, "root", progWritableMounts)
	if s.sentry() {
		// The Gofer serves the root, which is the quota'd overlay on the
		// host (DiskFill proves the quota holds through it), and the agent
		// socket dir, a 16 KiB tmpfs on the host handed to host root once
		// the agent listens (the write below must fail or stay tiny).
		if mounts["/"] == "9p" {
			delete(mounts, "/")
		}
		if mounts["/.airlock/run"] == "9p" {
			delete(mounts, "/.airlock/run")
		}
	}
	for mnt, fstype := range mounts {
		t.Errorf("finding: sandbox %s has a writable %s mount at %s: what root inside writes there is not bounded by its disk quota", b.id, fstype, mnt)
	}
	r := b.sh(t, "root", fmt.Sprintf("mkdir -p /.airlock/run; dd if=/dev/zero of=/.airlock/run/fill bs=1M count=%d 2>&1; "+
		"rm -f /.airlock/run/fill; "+
		"for f in 1 2; do head -c %d /dev/zero >> /proc/1/fd/$f && echo wrote-agent-fd-$f; done 2>&1; true", writeMB, writeMB<<20))
	after := hostFilesSize(t, sbxDir)
	if strings.Contains(r.stdout, fmt.Sprintf("%d bytes", writeMB<<20)) || after-before > quotaMB<<20 {
		t.Errorf("finding: root in a sandbox with a %d MiB disk quota wrote %d MiB to the host's disk outside its layer "+
			"(sandbox dir %s without its storage): %v", quotaMB, (after-before)>>20, sbxDir, r)
	}
	if strings.Contains(r.stdout, "wrote-agent-fd") {
		t.Errorf("finding: root in sandbox %s wrote %d MiB to the agent's log on the host through /proc/1/fd: %v", b.id, writeMB, r)
	}
	// The host's view: <sandbox>/agent.log leads to the log.
	if fi, err := os.Stat(filepath.Join(sbxDir, "agent.log")); err != nil || fi.Size() > quotaMB<<20 {
		t.Errorf("the agent's log of a %d MiB sandbox: %v, %v", quotaMB, fi, err)
	}
	b.sh(t, "root", ": > /proc/1/fd/2 2>/dev/null; true")
	b.alive(t)
}

// progWritableMounts lists the mounts the sandbox can write to whose data
// would not be the quota'd root overlay or memory charged to the sandbox
// (tmpfs, devpts, mqueue): a writable bind of a host directory shows up.
//
// runc binds the host's device nodes (null, zero, tty…) into a sandbox
// with a user namespace, and masks /proc files with /dev/null: those are
// character devices, not storage, and are skipped.
const progWritableMounts = `
import stat
memory = ("tmpfs", "devpts", "mqueue", "proc")
for line in open("/proc/self/mountinfo"):
    pre, post = line.split(" - ", 1)
    f, g = pre.split(), post.split()
    mnt, opts, fstype = f[4], f[5].split(","), g[0]
    if "rw" not in opts or fstype in memory:
        continue
    if mnt == "/" and fstype == "overlay":
        continue
    try:
        if stat.S_ISCHR(os.stat(mnt).st_mode):
            continue
    except OSError:
        pass
    R[mnt] = fstype
done()
`

// hostFilesSize is the disk use of the files in a sandbox dir on the host,
// without its storage (the quota'd image and its mounts) and rootfs.
func hostFilesSize(t testing.TB, dir string) int64 {
	t.Helper()
	var total int64
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil // a file that went meanwhile
		}
		if d.IsDir() && p != dir && (filepath.Dir(p) == dir && (d.Name() == "storage" || d.Name() == "rootfs" || d.Name() == "sys")) {
			return filepath.SkipDir
		}
		var st syscall.Stat_t
		if syscall.Lstat(p, &st) == nil {
			total += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return total
}

// outputFlood: output past the cap is dropped and marked truncated, in the
// JSON and the streaming mode, and the daemon's memory stays bounded.
// floodCmd prints n MB of "y\n" in 1 MB writes. One process with big
// writes, not `yes | head`: under gVisor's ptrace platform every small
// write through a pipe between two processes is a round of context
// switches (100 MB took 10 s here), and the test is about what the daemon
// keeps of a flood, not about how fast gVisor moves a pipe.
func floodCmd(mb int) string {
	return fmt.Sprintf(`python3 -c 'import sys; b = b"y\n" * 500000
for _ in range(%d): sys.stdout.buffer.write(b)'`, mb)
}

func (s *suite) outputFlood(t *testing.T) {
	b := s.sandbox(t, api.CreateSandboxRequest{})
	r := b.exec(t, api.ExecRequest{Shell: ptr(floodCmd(200))})
	if !r.exited(0) || !r.Truncated || len(r.stdout) == 0 || len(r.stdout) > 1<<20 {
		t.Errorf("flood in JSON mode: %d bytes of output, %v", len(r.stdout), r)
	}
	const limit = 16 << 20
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	var peak atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > peak.Load() {
				peak.Store(ms.HeapAlloc)
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	max := int64(limit)
	var got int64
	started := time.Now()
	res, err := client.Consume(b.c().ExecStream(ctx, b.id, api.ExecRequest{Shell: ptr(floodCmd(1000)), MaxOutputBytes: &max}),
		client.StreamHandlers{OnStdout: func(p []byte) { got += int64(len(p)) }})
	elapsed := time.Since(started)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("streamed flood: %v", err)
	}
	// Past the cap a stream keeps its head and tail; a follower gets the
	// head, then samples of the tail no faster than the agent's follow
	// rate (8 MiB/s), then the final tail: never the flood itself.
	if bound := 2*limit + int64(8<<20*elapsed.Seconds()); !res.Truncated || got > bound || got < limit || res.StdoutDroppedBytes != 1000000000-limit {
		t.Errorf("streamed flood: %d bytes received in %s (bound %d), cap %d, result %+v", got, elapsed, bound, limit, res)
	}
	grew := int64(peak.Load()) - int64(base)
	t.Logf("this process's heap (daemon and client) grew by %d MiB during a 1 GB flood", grew>>20)
	if grew > 256<<20 {
		t.Errorf("the daemon's heap grew by %d MiB during a flood capped at %d MiB", grew>>20, limit>>20)
	}
}

// openFiles: 100k open files across several processes stop at each
// process's limit (EMFILE), the limit cannot be raised, and the host's file
// table is not exhausted.
func (s *suite) openFiles(t *testing.T) {
	b := s.sandbox(t, api.CreateSandboxRequest{})
	fileMax, _ := readFileNr(t)
	var peak atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if _, n := readFileNr(t); n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	got := b.py(t, "root", progOpenFiles)
	close(stop)
	wg.Wait()
	if got["raise_limit"] != "EPERM" {
		t.Errorf("raising RLIMIT_NOFILE: %s", got["raise_limit"])
	}
	hard, _ := strconv.ParseInt(got["#hard"], 10, 64)
	var kids []string
	json.Unmarshal([]byte(got["#children"]), &kids)
	var total int64
	for _, k := range kids {
		var n int64
		var errName string
		fmt.Sscanf(k, "%d %s", &n, &errName)
		total += n
		if errName != "EMFILE" || n > hard {
			t.Errorf("a process opened %d files (limit %d) and stopped with %s, want EMFILE", n, hard, errName)
		}
	}
	t.Logf("%d files opened by %d processes (limit %d each); host file table peaked at %d of %d", total, len(kids), hard, peak.Load(), fileMax)
	if total < 100_000 {
		t.Errorf("only %d files opened: the attack did not reach 100k", total)
	}
	if peak.Load() >= fileMax*9/10 {
		t.Errorf("the host's file table reached %d of %d", peak.Load(), fileMax)
	}
	b.alive(t)
}

// readFileNr returns fs.file-max and the number of allocated file handles.
func readFileNr(t testing.TB) (max, allocated int64) {
	b, err := os.ReadFile("/proc/sys/fs/file-nr")
	if err != nil {
		t.Error(err)
		return 0, 0
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return 0, 0
	}
	allocated, _ = strconv.ParseInt(f[0], 10, 64)
	max, _ = strconv.ParseInt(f[2], 10, 64)
	return max, allocated
}

// hostFileTable: the sandbox a tenant may ask for (the server's maximum
// resources) must not be able to fill the host's file table (fs.file-max),
// which is shared by every process without CAP_SYS_ADMIN on the host, so by
// every other sandbox. Open files are bounded by pids × RLIMIT_NOFILE and by
// the memory cgroup, which charges each open file's kernel memory; the cost
// per file is measured here, not assumed (after raising the soft limit to
// the hard one, as a server would). The runc driver raises fs.file-max at
// start so that the memory bound comes first. Filling the table for real
// would break every other sandbox and test on this shared host, so the
// bound is computed from measured values instead.
func (s *suite) hostFileTable(t *testing.T) {
	b := s.sandbox(t, api.CreateSandboxRequest{})
	if s.sentry() {
		// Files opened in gVisor are the Sentry's objects, not host
		// files: opening 10000 of them must not move the host's table.
		_, before := readFileNr(t)
		got := b.py(t, "root", `
import resource
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
fds = [os.open("/dev/null", os.O_RDONLY) for i in range(min(10000, hard - 64))]
R["#opened"] = str(len(fds))
import time; time.sleep(1)
done()
`)
		_, after := readFileNr(t)
		t.Logf("%s files opened inside gVisor; host file handles %d → %d", got["#opened"], before, after)
		if n, _ := strconv.Atoi(got["#opened"]); n < 5000 {
			t.Errorf("the program opened %q files", got["#opened"])
		} else if after-before > int64(n)/2 {
			t.Errorf("finding: %d files opened in a gVisor sandbox took %d host file handles", n, after-before)
		}
		return
	}
	got := b.py(t, "root", `
import resource
cg = "/sys/fs/cgroup/memory/memory.usage_in_bytes"
if not os.path.exists(cg):
    cg = "/sys/fs/cgroup/memory.current"
def usage():
    return int(open(cg).read())
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
n = min(10000, hard - 64)
a = usage()
fds = [os.open("/dev/null", os.O_RDONLY) for i in range(n)]
R["#per_file"] = str((usage() - a) // n)
R["#nofile"] = str(hard)
done()
`)
	perFile, _ := strconv.ParseInt(got["#per_file"], 10, 64)
	nofile, _ := strconv.ParseInt(got["#nofile"], 10, 64)
	if perFile <= 0 || nofile <= 0 {
		t.Skipf("cannot measure the memory charge of an open file here: %v", got)
	}
	info := s.e.info(t)
	maxMem, maxPIDs := info.Limits.MaxResources.MemoryMB<<20, info.Limits.MaxResources.PIDs
	fileMax, allocated := readFileNr(t)
	bound := min(maxPIDs*nofile, maxMem/perFile)
	t.Logf("one sandbox at the maximum resources (%d MiB, %d pids, nofile %d) can hold %d open files (%d bytes of memory each); host: %d of %d in use",
		maxMem>>20, maxPIDs, nofile, bound, perFile, allocated, fileMax)
	if bound >= fileMax-allocated {
		t.Errorf("finding: one sandbox at the server's maximum resources can hold %d open files, more than the %d free in the host's "+
			"file table (fs.file-max %d): it can make open(2), pipe(2) and socket(2) fail with ENFILE in every other sandbox and "+
			"for every host process without CAP_SYS_ADMIN (measured: %d bytes of memory cgroup charge per open file, RLIMIT_NOFILE %d, "+
			"max_resources memory %d MiB and pids %d)", bound, fileMax-allocated, fileMax, perFile, nofile, maxMem>>20, maxPIDs)
	}
}

// hostPIDSpace: the tasks one tenant may run (its sandbox quota × the
// maximum PID limit, capped by the parent cgroup's pids.max) must leave
// room in the host's pid space (kernel.pid_max, kernel.threads-max): once
// it is full no process on the host can fork, root included. The fork bomb
// above shows that a sandbox fills its PID limit; filling the host's for
// real would break this shared machine, so the bound is computed.
func (s *suite) hostPIDSpace(t *testing.T) {
	info := s.e.info(t)
	perTenant, maxPIDs := int64(info.Limits.MaxSandboxesPerTenant), info.Limits.MaxResources.PIDs
	pidMax := readInt(t, "/proc/sys/kernel/pid_max")
	threadsMax := readInt(t, "/proc/sys/kernel/threads-max")
	tasks, _ := filepath.Glob("/proc/[0-9]*/task/[0-9]*")
	free := min(pidMax, threadsMax) - int64(len(tasks))
	parentMax := int64(-1) // unlimited
	cg := s.probe.host.cgroup
	if s.sentry() {
		// gVisor's sandbox processes are not host processes: its cgroup
		// is the driver's (internal/driver/runc's state.json).
		var st struct {
			Cgroup string `json:"cgroup"`
		}
		if b, err := os.ReadFile(filepath.Join(s.sandboxDir(s.probe.id), "state.json")); err == nil {
			json.Unmarshal(b, &st)
		}
		cg = st.Cgroup
	}
	if cg != "" {
		parent := path.Dir(cg)
		for _, p := range []string{filepath.Join("/sys/fs/cgroup/pids", parent, "pids.max"), filepath.Join("/sys/fs/cgroup", parent, "pids.max")} {
			if b, err := os.ReadFile(p); err == nil {
				if v := strings.TrimSpace(string(b)); v != "max" {
					parentMax, _ = strconv.ParseInt(v, 10, 64)
				}
				break
			}
		}
	}
	tenant := perTenant * maxPIDs
	if parentMax >= 0 {
		tenant = min(tenant, parentMax)
	}
	t.Logf("one tenant may run %d tasks (%d sandboxes × %d pids, parent cgroup pids.max %d); host: %d free of pid_max %d, threads-max %d",
		tenant, perTenant, maxPIDs, parentMax, free, pidMax, threadsMax)
	if tenant >= free {
		t.Errorf("finding: one tenant may run %d tasks (%d sandboxes × max pids %d; the sandboxes' parent cgroup has pids.max %s) "+
			"but the host has only %d free pids (kernel.pid_max %d, threads-max %d): %d sandboxes at the maximum PID limit "+
			"exhaust the host's pid space and no process on the host can fork, the daemon included",
			tenant, perTenant, maxPIDs, fmtMax(parentMax), free, pidMax, threadsMax, free/maxPIDs+1)
	}
}

// hostDiskSpace: disk quotas are sparse images that take host blocks only
// as the sandbox writes, so quotas that each fit the host's free space can
// together fill it, and then the neighbours' writes, the store and the host
// fail. The driver therefore admits a sandbox only if the data dir's free
// space, less what every live sandbox may still write into its quota and a
// reserve, holds the new quota; otherwise the create is 503
// capacity_exhausted. The suite's daemon allows disk_mb far beyond the
// host's disk, so the driver is what answers. Three asks: more than the
// host has; half of it, which fits; and the other half plus 1 GiB while the
// first half lives — refused although the host's free space barely moved
// (a check of free space alone would admit it), and granted once the first
// is gone. It runs alone: it holds half the host's disk promise.
func (s *suite) hostDiskSpace(t *testing.T) {
	img := filepath.Join(s.sandboxDir(s.probe.id), "storage", "disk.img")
	var st syscall.Stat_t
	if err := syscall.Stat(img, &st); err != nil {
		t.Skipf("no disk image to inspect (%v): the runtime keeps its disk elsewhere", err)
	}
	if sparse := st.Blocks*512 < st.Size; !sparse {
		t.Logf("the probe's disk image is not sparse (%d of %d MiB allocated)", st.Blocks*512>>20, st.Size>>20)
	}
	ask := func(diskMB int64) (*api.Sandbox, error) {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		return s.e.client(s.e.key(t, attackerTenant)).CreateSandbox(ctx, api.CreateSandboxRequest{Runtime: s.runtime, Resources: &api.Resources{DiskMB: diskMB}})
	}
	refused := func(what string, diskMB int64) {
		t.Helper()
		sb, err := ask(diskMB)
		if err == nil {
			b := &sbx{e: s.e, key: s.e.key(t, attackerTenant), id: sb.ID}
			b.delete(t)
			t.Errorf("finding: %s: a sandbox with a %d MiB disk quota was created on a host with %d MiB free: its sparse image "+
				"promises blocks the host does not have (internal/driver/runc admitDisk)", what, diskMB, hostFree(t, s.e.cfg.DataDir)>>20)
			return
		}
		if !errors.Is(err, client.ErrCapacityExhausted) {
			t.Errorf("%s: create with disk_mb %d = %v, want 503 capacity_exhausted", what, diskMB, err)
		}
	}
	freeMB := hostFree(t, s.e.cfg.DataDir) >> 20
	if freeMB+1024 > maxDiskMB {
		t.Skipf("the host has %d MiB free, more than the largest quota", freeMB)
	}
	t.Logf("the data dir's file system has %d MiB free", freeMB)
	refused("more than the host has", freeMB+1024)

	half := freeMB / 2
	a := s.sandbox(t, api.CreateSandboxRequest{Resources: &api.Resources{DiskMB: half}})
	a.alive(t)
	t.Logf("a sandbox with %d MiB of disk: the host still has %d MiB free", half, hostFree(t, s.e.cfg.DataDir)>>20)
	refused("over-commit of the unwritten quota of a live sandbox", freeMB-half+1024)
	a.delete(t)
	b := s.sandbox(t, api.CreateSandboxRequest{Resources: &api.Resources{DiskMB: freeMB - half}})
	b.alive(t)
	b.delete(t)
}

func fmtMax(v int64) string {
	if v < 0 {
		return "max"
	}
	return strconv.FormatInt(v, 10)
}

func readInt(t testing.TB, p string) int64 {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// cpuHog: busy loops in a sandbox limited to half a CPU use at most about
// half a CPU, and the neighbour's canary keeps running meanwhile.
func (s *suite) cpuHog(t *testing.T) {
	b := s.sandbox(t, api.CreateSandboxRequest{Resources: &api.Resources{CPU: 0.5}})
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	before, err := b.c().Metrics(ctx, b.id)
	if err != nil {
		t.Fatal(err)
	}
	nbBefore := s.nb.counter(t)
	start := time.Now()
	b.mustSh(t, "", `for i in 1 2 3 4; do timeout 3 sh -c 'while :; do :; done' & done; wait; true`)
	wall := time.Since(start).Seconds()
	after, err := b.c().Metrics(ctx, b.id)
	if err != nil {
		t.Fatal(err)
	}
	nbAfter := s.nb.counter(t)
	ratio := (after.CPUSeconds - before.CPUSeconds) / wall
	t.Logf("hog used %.2f CPU over %.1fs; the neighbour's canary advanced %d meanwhile", ratio, wall, nbAfter-nbBefore)
	// The quota is what bounds it; the margin covers the accounting of the
	// last period.
	if ratio > 0.7 {
		t.Errorf("a sandbox limited to 0.5 CPU used %.2f", ratio)
	}
	if nbAfter <= nbBefore {
		t.Errorf("the neighbour's canary did not advance during the CPU hog (%d → %d)", nbBefore, nbAfter)
	}
}

func ptr[T any](v T) *T { return &v }
