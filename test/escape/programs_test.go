package escape

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/api"
)

// The hostile programs are python3 (in the base template; it has no C
// compiler): raw system calls go through ctypes with x86-64 numbers. Each
// program fills the dict R with one outcome per probe, "OK" or the errno
// name, and prints it as the last line of its output (done()).

// pyPrelude is prepended to every program.
const pyPrelude = `
import ctypes, errno, json, os, socket, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
R = {}
def en(e):
    return errno.errorcode.get(e, str(e))
def arg(x):
    if isinstance(x, bytes):
        return ctypes.c_char_p(x)
    if isinstance(x, int):
        return ctypes.c_long(x)
    return x
def sc(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[arg(a) for a in args])
    if r >= 0:
        return "OK"
    return en(ctypes.get_errno())
def ot(f, *a):
    try:
        f(*a)
        return "OK"
    except OSError as e:
        return en(e.errno)
def readf(p, n=4096):
    try:
        with open(p, "rb") as f:
            return "OK:" + f.read(n).decode("latin-1")
    except OSError as e:
        return en(e.errno)
def writef(p, v):
    try:
        with open(p, "w") as f:
            f.write(v)
        return "OK"
    except OSError as e:
        return en(e.errno)
def done():
    sys.stdout.write("\n" + json.dumps(R) + "\n")
`

// py runs prog (with the prelude) as user and returns its R. It fails t if
// the program did not get to done().
func (s *sbx) py(t testing.TB, user, prog string, args ...string) map[string]string {
	t.Helper()
	if runtime.GOARCH != "amd64" {
		t.Skip("the hostile programs use x86-64 system call numbers")
	}
	argv := append([]string{"python3", "-c", pyPrelude + prog}, args...)
	r := s.exec(t, api.ExecRequest{Cmd: argv, User: user})
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	var out map[string]string
	if len(lines) == 0 || json.Unmarshal([]byte(lines[len(lines)-1]), &out) != nil {
		t.Fatalf("hostile program as %q did not finish: %v", user, r)
	}
	return out
}

// errnos is a set of acceptable outcomes of a probe.
type errnos []string

func (e errnos) has(v string) bool {
	for _, x := range e {
		if x == v {
			return true
		}
	}
	return false
}

// Outcomes that mean "refused".
var (
	denied      = errnos{"EPERM", "EACCES", "ENOSYS"}
	notThere    = errnos{"ENOENT", "EACCES", "ENOTDIR", "ESRCH", "ENXIO", "EPERM"}
	readOnly    = errnos{"EROFS", "EACCES", "EPERM", "ENOENT"}
	notDevice   = errnos{"ENOENT", "EACCES", "EPERM", "ENXIO", "ENODEV"}
	anyFailure  = errnos{} // everything but "OK" (see expect)
	unreachable = errnos{"ECONNREFUSED", "ENETUNREACH", "EADDRNOTAVAIL", "EHOSTUNREACH", "EAFNOSUPPORT", "timeout", "unresolved"}
)

// expect fails t for every probe in got whose outcome is not in want. An
// empty want accepts any failure, never "OK" (or "OK:" and data).
func expect(t testing.TB, what string, got map[string]string, want errnos, keys ...string) {
	t.Helper()
	if len(keys) == 0 {
		for k := range got {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		v, ok := got[k]
		if !ok {
			t.Errorf("%s: probe %s did not run", what, k)
			continue
		}
		if strings.HasPrefix(v, "OK") || (len(want) > 0 && !want.has(v)) {
			t.Errorf("%s: %s = %.200q, want one of %v", what, k, v, want)
		}
	}
}

// Programs. Arguments come through sys.argv; nothing secret is passed, so
// nothing the program prints can be mistaken for a leak.

// progProcRoot reads the host marker (argv[1]) through every path into
// another root that /proc offers.
const progProcRoot = `
m = sys.argv[1]
paths = [m, "/proc/1/root" + m, "/proc/self/root" + m, "/proc/thread-self/root" + m,
         "/proc/self/cwd/../../../../../../.." + m, "/.airlock/run/../../../../../.." + m,
         "/proc/1/cwd/../../../../../.." + m]
for d in os.listdir("/proc"):
    if d.isdigit():
        paths += ["/proc/%s/root%s" % (d, m), "/proc/%s/cwd/../../../../../..%s" % (d, m)]
for p in paths:
    R[p] = readf(p)
done()
`

// progMountinfo finds the host paths of the sandbox's own storage in
// /proc/self/mountinfo (argv[1] is its id), derives the neighbour's
// (argv[2]) and tries to open them all, directly and through /proc/self/root.
const progMountinfo = `
own, nb = sys.argv[1], sys.argv[2]
found = set()
for line in open("/proc/self/mountinfo"):
    for tok in line.replace(",", " ").replace("=", " ").replace(":", " ").split():
        if tok.startswith("/") and own in tok:
            found.add(tok)
paths = set(found)
for p in found:
    head = p.split(own)[0]
    paths.add(head)
    paths.add(head + nb)
    paths.add(p.replace(own, nb))
    paths.add(head + nb + "/storage/rw/upper/home/user/secret")
    paths.add(head + nb + "/run/agent.sock")
    paths.add(head.rstrip("/").rsplit("/", 1)[0] + "/airlock.db")
for p in sorted(paths):
    for q in (p, "/proc/self/root" + p, "/proc/1/root" + p):
        if os.path.isdir(q):
            R[q] = ot(os.listdir, q)
        else:
            R[q] = readf(q, 64)
R["#found"] = str(len(found))
done()
`

// progMount tries every way to make or remove a mount.
const progMount = `
MS_BIND, MS_REC, MS_REMOUNT, MNT_DETACH = 4096, 16384, 32, 2
R["mount_tmpfs"] = sc(165, b"none", b"/mnt", b"tmpfs", 0, 0)
R["mount_bind_root"] = sc(165, b"/", b"/mnt", 0, MS_BIND | MS_REC, 0)
R["mount_proc"] = sc(165, b"proc", b"/mnt", b"proc", 0, 0)
R["mount_sysfs"] = sc(165, b"sysfs", b"/mnt", b"sysfs", 0, 0)
R["mount_cgroup"] = sc(165, b"cgroup", b"/mnt", b"cgroup", 0, b"memory")
R["remount_proc_sys_rw"] = sc(165, b"none", b"/proc/sys", 0, MS_REMOUNT | MS_BIND, 0)
R["remount_cgroup_rw"] = sc(165, b"none", b"/sys/fs/cgroup/memory", 0, MS_REMOUNT | MS_BIND, 0)
R["umount_proc_keys"] = sc(166, b"/proc/keys", MNT_DETACH)
R["umount_proc_sys"] = sc(166, b"/proc/sys", MNT_DETACH)
R["umount_agent"] = sc(166, b"/.airlock/airlock-agent", MNT_DETACH)
R["pivot_root"] = sc(155, b"/tmp", b"/tmp")
R["fsopen"] = sc(430, b"tmpfs", 0)
R["fspick"] = sc(433, -100, b"/", 0)
R["open_tree"] = sc(428, -100, b"/", 1)
R["move_mount"] = sc(429, -100, b"/proc", -100, b"/mnt", 0)
R["mount_setattr"] = sc(442, -100, b"/", 0, 0, 0)
done()
`

// progUnshare asks for new namespaces with unshare and clone.
const progUnshare = `
for n, f in {"user": 0x10000000, "mnt": 0x20000, "net": 0x40000000, "pid": 0x20000000,
             "uts": 0x04000000, "ipc": 0x08000000, "cgroup": 0x02000000, "time": 0x80}.items():
    R["unshare_" + n] = sc(272, f)
for n, f in {"user": 0x10000000, "mnt": 0x20000, "net": 0x40000000}.items():
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(56), ctypes.c_long(f | 17), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))
    if r == 0:
        os._exit(0)
    R["clone_" + n] = "OK" if r > 0 else en(ctypes.get_errno())
    if r > 0:
        os.waitpid(r, 0)
done()
`

// progSetns opens every namespace of PID 1 and of itself and joins it.
const progSetns = `
for n in os.listdir("/proc/self/ns"):
    for pid in ("1", "self"):
        p = "/proc/%s/ns/%s" % (pid, n)
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError as e:
            R["open_%s_%s" % (pid, n)] = en(e.errno)
            continue
        R["setns_%s_%s" % (pid, n)] = sc(308, fd, 0)
        os.close(fd)
done()
`

// progPtrace attaches to, reads and writes the processes argv[1:] by every
// route, and lists the command lines it can see.
const progPtrace = `
for a in sys.argv[1:]:
    pid = int(a)
    R["kill0_%d" % pid] = ot(os.kill, pid, 0)
    R["attach_%d" % pid] = sc(101, 16, pid, 0, 0)
    R["seize_%d" % pid] = sc(101, 0x4206, pid, 0, 0)
    R["vm_readv_%d" % pid] = sc(310, pid, 0, 0, 0, 0, 0)
    R["vm_writev_%d" % pid] = sc(311, pid, 0, 0, 0, 0, 0)
    R["mem_%d" % pid] = ot(lambda: os.close(os.open("/proc/%d/mem" % pid, os.O_RDWR)))
    R["environ_%d" % pid] = readf("/proc/%d/environ" % pid)
    R["root_%d" % pid] = ot(os.listdir, "/proc/%d/root/" % pid)
    fd = libc.syscall(ctypes.c_long(434), ctypes.c_long(pid), ctypes.c_long(0))
    R["pidfd_getfd_%d" % pid] = sc(438, fd, 0, 0) if fd >= 0 else "ESRCH"
vis = []
for d in os.listdir("/proc"):
    if d.isdigit() and d != str(os.getpid()):
        try:
            vis.append(open("/proc/%s/cmdline" % d, "rb").read().replace(b"\0", b" ").decode("latin-1"))
        except OSError:
            pass
print(json.dumps(vis))
done()
`

// progKill signals the host process argv[1] by its host pid number, then
// every process it can see.
const progKill = `
import signal
hp = int(sys.argv[1])
R["kill0_host_pid"] = ot(os.kill, hp, 0)
R["stop_host_pid"] = ot(os.kill, hp, signal.SIGSTOP)
R["kill_host_pid"] = ot(os.kill, hp, signal.SIGKILL)
fd = libc.syscall(ctypes.c_long(434), ctypes.c_long(hp), ctypes.c_long(0))
R["pidfd_open_host_pid"] = "OK" if fd >= 0 else en(ctypes.get_errno())
R["kill_all"] = ot(os.kill, -1, signal.SIGKILL)
done()
`

// progWriteSys writes each sysfs file back with its current value: a no-op
// if the write went through, so a failed containment changes nothing on the
// host, yet shows as "OK".
const progWriteSys = `
import re
for p in ["/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/mm/ksm/run", "/sys/kernel/uevent_helper",
          "/sys/class/net/lo/mtu", "/sys/kernel/profiling", "/sys/module/printk/parameters/time",
          "/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/kernel/debug/x", "/sys/power/pm_async"]:
    try:
        cur = open(p).read().strip()
    except OSError as e:
        R[p] = en(e.errno)
        continue
    m = re.search(r"\[(\w+)\]", cur)
    R[p] = writef(p, (m.group(1) if m else cur) + "\n")
done()
`

// progWriteProcSys writes kernel settings through /proc/sys and the sysrq
// trigger, with values harmless on a host should a write go through (the
// current value; 1 to drop_caches; "h", help, to sysrq).
const progWriteProcSys = `
for p in ["/proc/sys/kernel/hostname", "/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe",
          "/proc/sys/kernel/panic", "/proc/sys/net/ipv4/ip_forward", "/proc/sys/kernel/sysrq"]:
    try:
        cur = open(p).read()
    except OSError as e:
        R[p] = en(e.errno)
        continue
    R[p] = writef(p, cur)
R["/proc/sys/vm/drop_caches"] = writef("/proc/sys/vm/drop_caches", "1")
R["/proc/sysrq-trigger"] = writef("/proc/sysrq-trigger", "h")
done()
`

// progModules loads and unloads kernel modules. A missing module name makes
// delete_module harmless: ENOENT would mean the permission check passed.
const progModules = `
R["init_module"] = sc(175, 0, 0, b"")
fd = os.open("/dev/null", os.O_RDONLY)
R["finit_module"] = sc(313, fd, b"", 0)
R["delete_module"] = sc(176, b"airlock_escape_none", 0)
done()
`

// progRawSockets opens raw and packet sockets (none sends anything).
const progRawSockets = `
for name, fam, typ, proto in [("packet_raw", 17, 3, 0x0300), ("packet_dgram", 17, 2, 0x0300),
                              ("inet_raw_icmp", 2, 3, 1), ("inet_raw_tcp", 2, 3, 6), ("inet_raw_raw", 2, 3, 255),
                              ("inet6_raw_icmp", 10, 3, 58), ("inet_sock_packet", 2, 10, 0x0300)]:
    try:
        s = socket.socket(fam, typ, proto)
        s.close()
        R[name] = "OK"
    except OSError as e:
        R[name] = en(e.errno)
done()
`

// progFileCaps gives a copy of python file capabilities (CAP_SYS_ADMIN,
// CAP_SYS_PTRACE) through the security.capability xattr.
const progFileCaps = `
import shutil
shutil.copy("/usr/bin/python3", "/tmp/cap-python")
caps = (1 << 21) | (1 << 19)
v2 = struct.pack("<IIIII", 0x02000001, caps, 0, 0, 0)
R["setxattr_v2"] = ot(os.setxattr, "/tmp/cap-python", "security.capability", v2)
v3 = struct.pack("<IIIIII", 0x03000001, caps, 0, 0, 0, 0)
R["setxattr_v3"] = ot(os.setxattr, "/tmp/cap-python", "security.capability", v3)
done()
`

// syscallProbes are denied system calls and their x86-64 numbers and
// arguments: harmless arguments, so that an allowed call fails with an
// argument error (EINVAL, EFAULT, ENOENT) instead of doing something.
var syscallProbes = []struct {
	name string
	nr   int
	args string // python argument list
}{
	{"keyctl", 250, "0, -3, 0"},
	{"add_key", 248, `b"user", b"escape", b"x", 1, -3`},
	{"request_key", 249, `b"user", b"escape", 0, 0`},
	{"bpf", 321, "0, 0, 0"},
	{"userfaultfd", 323, "0"},
	{"perf_event_open", 298, "0, 0, -1, -1, 0"},
	{"open_by_handle_at", 304, "-100, 0, 0"},
	{"kexec_load", 246, "0, 0, 0, 0"},
	{"kexec_file_load", 320, `-1, -1, 0, b"", 0`},
	{"iopl", 172, "3"},
	{"ioperm", 173, "0x80, 1, 1"},
	{"swapon", 167, `b"/nonexistent", 0`},
	{"swapoff", 168, `b"/nonexistent"`},
	{"acct", 163, `b"/nonexistent"`},
	{"syslog", 103, "10, 0, 0"},
	{"quotactl", 179, "0, 0, 0, 0"},
	{"lookup_dcookie", 212, "0, 0, 0"},
	{"io_uring_setup", 425, "1, 0"},
	{"fanotify_init", 300, "0, 0"},
	{"nfsservctl", 180, "0, 0, 0"},
	{"uselib", 134, `b"/nonexistent"`},
	{"vhangup", 153, ""},
	{"process_vm_writev", 311, "1, 0, 0, 0, 0, 0"},
	{"pidfd_getfd", 438, "-1, 0, 0"},
	{"settimeofday", 164, "0, 0"},
	{"clock_settime", 227, "0, 0"},
	{"sethostname", 170, `b"escape", 6`},
	{"setdomainname", 171, `b"escape", 6`},
	{"reboot", 169, "0xfee1dead, 672274793, 0x1234, 0"},
}

// progSyscalls calls every syscallProbe.
func progSyscalls() string {
	var b strings.Builder
	for _, p := range syscallProbes {
		b.WriteString("R[\"" + p.name + "\"] = sc(" + itoa(p.nr))
		if p.args != "" {
			b.WriteString(", " + p.args)
		}
		b.WriteString(")\n")
	}
	b.WriteString("done()\n")
	return b.String()
}

// progMknod makes device nodes (and opens them if that worked).
const progMknod = `
for name, mode, dev in [("blk_sda", 0o060600, os.makedev(8, 0)), ("blk_vda", 0o060600, os.makedev(253, 0)),
                        ("blk_loop0", 0o060600, os.makedev(7, 0)), ("chr_mem", 0o020600, os.makedev(1, 1)),
                        ("chr_kmsg", 0o020600, os.makedev(1, 11)), ("chr_tun", 0o020600, os.makedev(10, 200)),
                        ("chr_tty1", 0o020600, os.makedev(4, 1))]:
    p = "/tmp/mknod-%s-%d" % (name, os.getuid())
    R[name] = ot(os.mknod, p, mode, dev)
    if R[name] == "OK":
        R[name + "_open"] = ot(lambda: os.close(os.open(p, os.O_RDONLY)))
done()
`

// progDevices opens host devices by their usual names.
const progDevices = `
for p in ["/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg", "/dev/sda", "/dev/vda", "/dev/vdb", "/dev/nvme0n1",
          "/dev/loop0", "/dev/loop-control", "/dev/net/tun", "/dev/kvm", "/dev/fuse", "/dev/console", "/dev/tty0",
          "/dev/tty1", "/dev/mapper/control", "/dev/cpu/0/msr", "/dev/snapshot", "/dev/hpet", "/dev/dri/card0"]:
    R[p] = ot(lambda: os.close(os.open(p, os.O_RDONLY)))
R["#/dev/null"] = ot(lambda: os.close(os.open("/dev/null", os.O_RDWR)))
done()
`

// progChroot is the classic double-chroot escape: keep a directory fd
// outside a new chroot, walk up from it and chroot there. In a container it
// must end at the sandbox's own root, not the host's.
const progChroot = `
m = sys.argv[1]
os.makedirs("/tmp/jail/inner", exist_ok=True)
fd = os.open("/", os.O_RDONLY)
os.chroot("/tmp/jail")
os.fchdir(fd)
for i in range(64):
    os.chdir("..")
os.chroot(".")
R["#sandbox_root"] = "yes" if os.path.isdir("/.airlock") else "no"
R["marker"] = readf(m)
R["marker_dir"] = ot(os.listdir, os.path.dirname(m))
done()
`

// progCgroup writes to every cgroup control file that would lift a limit or
// move a process, and makes a child cgroup in every hierarchy.
const progCgroup = `
writes = {"cgroup.procs": str(os.getpid()), "tasks": str(os.getpid()), "release_agent": "/tmp/escape",
          "notify_on_release": "1", "memory.limit_in_bytes": "-1", "memory.memsw.limit_in_bytes": "-1",
          "memory.max": "max", "pids.max": "max", "cpu.cfs_quota_us": "-1", "cpu.max": "max",
          "devices.allow": "a", "cgroup.subtree_control": "+memory", "freezer.state": "THAWED"}
for root, dirs, files in os.walk("/sys/fs/cgroup"):
    for f in files:
        if f in writes:
            R[os.path.join(root, f)] = writef(os.path.join(root, f), writes[f])
for h in os.listdir("/sys/fs/cgroup"):
    d = os.path.join("/sys/fs/cgroup", h)
    if os.path.isdir(d):
        R["mkdir " + d] = ot(os.mkdir, os.path.join(d, "escape"))
done()
`

// progTime sets the clock to what it already is (harmless should it work).
const progTime = `
class timeval(ctypes.Structure):
    _fields_ = [("s", ctypes.c_long), ("us", ctypes.c_long)]
class timespec(ctypes.Structure):
    _fields_ = [("s", ctypes.c_long), ("ns", ctypes.c_long)]
class timex(ctypes.Structure):
    _fields_ = [("modes", ctypes.c_uint), ("rest", ctypes.c_byte * 204)]
now = time.time()
R["settimeofday"] = sc(164, ctypes.byref(timeval(int(now), 0)), 0)
R["clock_settime"] = sc(227, 0, ctypes.byref(timespec(int(now), 0)))
tx = timex()
tx.modes = 0x0100
R["adjtimex_setoffset_0"] = sc(159, ctypes.byref(tx))
R["clock_adjtime_setoffset_0"] = sc(305, 0, ctypes.byref(tx))
done()
`

// progKernelInfo reads what masked /proc paths and kptr_restrict hide.
const progKernelInfo = `
for p in ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/latency_stats",
          "/proc/timer_stats", "/proc/scsi/scsi", "/proc/acpi/wakeup", "/proc/config.gz", "/proc/interrupts"]:
    R[p] = readf(p, 256)
    if R[p] == "OK:":
        R[p] = "EMPTY"
nonzero = 0
try:
    for line in open("/proc/kallsyms"):
        if int(line.split()[0], 16) != 0:
            nonzero += 1
except OSError:
    pass
R["#kallsyms_addresses"] = str(nonzero)
R["syslog_read"] = sc(103, 3, 0, 0)
done()
`

// progAgentBinary replaces or writes the agent binary (bind-mounted from
// the host) and PID 1's executable.
const progAgentBinary = `
R["open_agent_rw"] = ot(lambda: os.close(os.open("/.airlock/airlock-agent", os.O_RDWR)))
R["open_proc1_exe_rw"] = ot(lambda: os.close(os.open("/proc/1/exe", os.O_RDWR)))
R["unlink_agent"] = ot(os.unlink, "/.airlock/airlock-agent")
open("/tmp/fake-agent", "w").write("#!/bin/sh\n")
R["rename_over_agent"] = ot(os.rename, "/tmp/fake-agent", "/.airlock/airlock-agent")
R["chmod_agent"] = ot(os.chmod, "/.airlock/airlock-agent", 0o777)
R["truncate_agent"] = ot(os.truncate, "/.airlock/airlock-agent", 0)
done()
`

// progAgentProc reaches for PID 1 (the agent) through /proc and its
// binary: its memory read-write and read-only (the way a patch of its code
// begins), its environment, maps and auxiliary vector, its descriptors
// (listing and each link), its executable and the bind-mounted binary for
// reading, and its stdout/stderr (the agent's log on the host) for writing.
// Every one must be refused to every user of the sandbox.
const progAgentProc = `
def rd(p):
    fd = os.open(p, os.O_RDONLY)
    try:
        os.read(fd, 1)
    finally:
        os.close(fd)
R["mem_rdwr"] = ot(lambda: os.close(os.open("/proc/1/mem", os.O_RDWR)))
R["mem_rdonly"] = ot(lambda: os.close(os.open("/proc/1/mem", os.O_RDONLY)))
R["environ"] = readf("/proc/1/environ")
R["maps"] = readf("/proc/1/maps")
R["auxv"] = readf("/proc/1/auxv")
R["map_files"] = ot(os.listdir, "/proc/1/map_files")
try:
    R["fd_list"] = "OK:" + ",".join(os.listdir("/proc/1/fd"))
except OSError as e:
    R["fd_list"] = en(e.errno)
for n in range(0, 16):
    r = ot(os.readlink, "/proc/1/fd/%d" % n)
    if r != "ENOENT":
        R["fd_link_%d" % n] = r
for n in (1, 2):
    R["fd_write_%d" % n] = ot(lambda: os.close(os.open("/proc/1/fd/%d" % n, os.O_WRONLY | os.O_APPEND)))
R["exe_read"] = ot(rd, "/proc/1/exe")
R["agent_binary_read"] = ot(rd, "/.airlock/airlock-agent")
# The agent is a static binary loaded at 0x400000. With a real buffer, not
# a zero-length one (which Linux answers before any check): EFAULT would
# mean the access check passed.
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(8)
local, remote = iovec(ctypes.cast(buf, ctypes.c_void_p), 8), iovec(0x400000, 8)
for nr, name in ((310, "vm_readv"), (311, "vm_writev")):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), ctypes.c_long(1), ctypes.byref(local), ctypes.c_long(1),
                     ctypes.byref(remote), ctypes.c_long(1), ctypes.c_long(0))
    R[name] = "OK" if r >= 0 else en(ctypes.get_errno())
for req, name in ((16, "ptrace_attach"), (0x4206, "ptrace_seize")):
    R[name] = sc(101, req, 1, 0, 0)
    if R[name] == "OK":
        sc(101, 17, 1, 0, 0)  # PTRACE_DETACH: leave the agent as it was
done()
`

// progUevent opens netlink sockets of the kernel's object events
// (NETLINK_KOBJECT_UEVENT, raw and datagram), binds the raw one to the
// kernel's multicast group, writes argv[1] once it listens, and counts what
// arrives until the file argv[2] exists (everything queued is read first),
// at most 60 s. A routing netlink socket must still open (ip, getaddrinfo).
const progUevent = `
import select
ready, stop = sys.argv[1], sys.argv[2]
AF_NETLINK, NETLINK_KOBJECT_UEVENT = 16, 15
def sock(t, proto):
    try:
        return socket.socket(AF_NETLINK, t, proto), "OK"
    except OSError as e:
        return None, en(e.errno)
s, R["open_raw"] = sock(socket.SOCK_RAW, NETLINK_KOBJECT_UEVENT)
d, R["open_dgram"] = sock(socket.SOCK_DGRAM, NETLINK_KOBJECT_UEVENT)
if d is not None:
    d.close()
r, R["#route"] = sock(socket.SOCK_RAW, 0)
if r is not None:
    r.close()
if s is not None:
    R["bind"] = ot(s.bind, (0, 1))
open(ready, "w").write("1")
n, seen, end = 0, [], time.time() + 60
while time.time() < end:
    if s is not None and select.select([s], [], [], 0.2)[0]:
        seen.append(s.recv(65536)[:80].decode("latin-1"))
        n += 1
        continue
    if s is None:
        time.sleep(0.2)
    if os.path.exists(stop):
        break
R["received"] = ("OK:%d %r" % (n, seen[:3])) if n else "NONE"
done()
`

// progConnect connects to the daemon's port (argv[1]) on loopback and to
// the host's abstract unix socket (argv[2]).
const progConnect = `
port, abstract = int(sys.argv[1]), sys.argv[2]
for name, fam, addr in [("tcp4_127.0.0.1", socket.AF_INET, ("127.0.0.1", port)), ("tcp6_::1", socket.AF_INET6, ("::1", port)),
                        ("tcp4_localhost", socket.AF_INET, ("localhost", port))]:
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect(addr)
        R[name] = "OK"
    except socket.timeout:
        R[name] = "timeout"
    except socket.gaierror:
        R[name] = "unresolved"
    except OSError as e:
        R[name] = en(e.errno) if e.errno else type(e).__name__
    s.close()
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
R["abstract_unix"] = ot(s.connect, "\0" + abstract)
R["#interfaces"] = " ".join(sorted(os.listdir("/sys/class/net")))
done()
`

// progProcScan dumps every environment and command line it can read, and
// the daemon's by its host pid (argv[1]): the Go side looks for secrets.
const progProcScan = `
me = str(os.getpid())
for d in os.listdir("/proc"):
    if not d.isdigit() or d == me:
        continue
    for f in ("environ", "cmdline"):
        R["%s/%s" % (d, f)] = readf("/proc/%s/%s" % (d, f), 1 << 16)
R["daemon_environ"] = readf("/proc/%s/environ" % sys.argv[1], 1 << 16)
R["daemon_cmdline"] = readf("/proc/%s/cmdline" % sys.argv[1], 1 << 16)
R["own_environ"] = json.dumps(dict(os.environ))
done()
`

// progOpenFiles opens /dev/null until the limit in enough processes for
// 100k files in all, after trying to raise the limit.
const progOpenFiles = `
import resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
R["#hard"] = str(hard)
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard * 16, hard * 16))
    R["raise_limit"] = "OK"
except (ValueError, OSError):
    R["raise_limit"] = "EPERM"
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
n = 100000 // hard + 1
kids = []
for i in range(n):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        count, err = 0, "none"
        try:
            while count < 100000:
                os.open("/dev/null", os.O_RDONLY)
                count += 1
        except OSError as e:
            err = en(e.errno)
        os.write(w, ("%d %s\n" % (count, err)).encode())
        time.sleep(1)
        os._exit(0)
    os.close(w)
    kids.append((pid, r))
res = []
for pid, r in kids:
    res.append(os.read(r, 100).decode().strip())
    os.waitpid(pid, 0)
R["#children"] = json.dumps(res)
done()
`

// progRace swaps a directory and a symlink to a host directory (argv[1]) in
// a loop (renameat2 RENAME_EXCHANGE, atomic) for argv[2] seconds, so that
// each path the files API resolves meanwhile may cross the symlink.
const progRace = `
target, dur = sys.argv[1], float(sys.argv[2])
base = "/home/user/race"
os.makedirs(base + "/real", exist_ok=True)
os.symlink(target, base + "/link")
os.makedirs(base + "/hreal", exist_ok=True)
open(base + "/hreal/marker", "w").write("decoy\n")
os.symlink(os.path.dirname(target), base + "/hlink")
end = time.time() + dur
n = 0
while time.time() < end:
    sc(316, -100, (base + "/real").encode(), -100, (base + "/link").encode(), 2)
    sc(316, -100, (base + "/hreal").encode(), -100, (base + "/hlink").encode(), 2)
    n += 1
R["#swaps"] = str(n)
done()
`

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}
