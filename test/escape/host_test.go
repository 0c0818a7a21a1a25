package escape

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// hostFixture is host state no attack may read or change: a world-readable
// marker file (only the sandbox boundary keeps it out), a world-writable
// directory that must stay empty, a host process, the hostname, kernel
// settings a container escape classically rewrites, the host's mounts,
// loop devices and modules, the agent binary, and an abstract unix socket
// in the host's network namespace.
type hostFixture struct {
	dir       string
	marker    string
	secret    string
	markerMod time.Time
	drop      string
	sleep     *exec.Cmd
	hostname  string
	settings  map[string]string
	mounts    map[string]bool
	loops     map[string]bool
	modules   string
	agent     string
	agentSum  [32]byte
	abstract  string
	accepted  atomic.Int64
}

// hostSettings are kernel settings that escapes rewrite (core_pattern and
// uevent_helper run a program as host root; modprobe likewise) and that the
// attacks in this suite write to from inside.
var hostSettings = []string{
	"/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe", "/proc/sys/kernel/hostname",
	"/proc/sys/kernel/domainname", "/proc/sys/kernel/panic", "/proc/sys/kernel/sysrq",
	"/proc/sys/net/ipv4/ip_forward", "/sys/kernel/uevent_helper", "/sys/kernel/mm/ksm/run",
	"/sys/kernel/mm/transparent_hugepage/enabled", "/sys/class/net/lo/mtu",
	"/sys/fs/cgroup/memory/release_agent", "/sys/fs/cgroup/pids/release_agent",
}

// foreignMountPrefixes are where other test binaries on this shared machine
// mount and unmount while the suite runs (their temp dirs, named network
// namespaces, other airlock data dirs): a mount there is not a sandbox's
// doing. A mount anywhere else that appears during an attack fails it.
func foreignMountPrefixes() []string {
	return []string{
		os.TempDir() + "/", "/run/netns/", "/var/run/netns/", "/var/lib/airlock",
		"/run/runsc", "/var/run/runsc", "/run/user/",
	}
}

func newHostFixture(t *testing.T, agentPath string) *hostFixture {
	t.Helper()
	h := &hostFixture{secret: "host-secret-" + token(), settings: map[string]string{}, agent: agentPath}
	var err error
	if h.dir, err = os.MkdirTemp("", "airlock-escape-host-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(h.dir) })
	// World-readable and world-writable on purpose: only the sandbox
	// boundary may keep the sandbox's uids out.
	if err := os.Chmod(h.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	h.marker = filepath.Join(h.dir, "marker")
	if err := os.WriteFile(h.marker, []byte(h.secret), 0o644); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(h.marker)
	if err != nil {
		t.Fatal(err)
	}
	h.markerMod = fi.ModTime()
	h.drop = filepath.Join(h.dir, "drop")
	if err := os.Mkdir(h.drop, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(h.drop, 0o777); err != nil {
		t.Fatal(err)
	}
	h.sleep = exec.Command("sleep", "3600")
	if err := h.sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.sleep.Process.Kill() // by PID: our own child
		h.sleep.Wait()
	})
	if h.hostname, err = os.Hostname(); err != nil {
		t.Fatal(err)
	}
	for _, p := range hostSettings {
		if b, err := os.ReadFile(p); err == nil {
			h.settings[p] = string(b)
		}
	}
	h.mounts = hostMounts()
	h.loops = hostLoops()
	h.modules = hostModules()
	if h.agentSum, err = fileSum(agentPath); err != nil {
		t.Fatal(err)
	}
	// An abstract unix socket lives in a network namespace: a sandbox with
	// its own namespace must not reach this one.
	h.abstract = "airlock-escape-" + token()
	ln, err := net.Listen("unix", "@"+h.abstract)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.accepted.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return h
}

// sleepPID is the host process attacks try to signal.
func (h *hostFixture) sleepPID() int { return h.sleep.Process.Pid }

// check fails t if an attack changed the host.
func (h *hostFixture) check(t testing.TB) {
	t.Helper()
	if b, err := os.ReadFile(h.marker); err != nil || string(b) != h.secret {
		t.Errorf("host marker changed: %q, %v", b, err)
	} else if fi, err := os.Stat(h.marker); err != nil || !fi.ModTime().Equal(h.markerMod) {
		t.Errorf("host marker touched: %v", err)
	}
	if ents, err := os.ReadDir(h.dir); err != nil || len(ents) != 2 {
		t.Errorf("host dir %s holds %v (%v), want only marker and drop", h.dir, names(ents), err)
	}
	if ents, err := os.ReadDir(h.drop); err != nil || len(ents) != 0 {
		t.Errorf("a sandbox wrote into the host dir %s: %v (%v)", h.drop, names(ents), err)
	}
	if st := procState(h.sleepPID()); st != "S" && st != "R" && st != "D" {
		t.Errorf("host process %d was signalled: state %q", h.sleepPID(), st)
	}
	if hn, err := os.Hostname(); err != nil || hn != h.hostname {
		t.Errorf("host hostname is %q (%v), was %q", hn, err, h.hostname)
	}
	for p, v := range h.settings {
		if b, err := os.ReadFile(p); err != nil || string(b) != v {
			t.Errorf("host setting %s is %q (%v), was %q", p, b, err, v)
		}
	}
	for m := range hostMounts() {
		if !h.mounts[m] {
			t.Errorf("new host mount: %s", m)
		}
	}
	for l := range hostLoops() {
		if !h.loops[l] {
			t.Errorf("new host loop device: %s", l)
		}
	}
	if m := hostModules(); m != h.modules {
		t.Errorf("host kernel modules changed:\nnow %s\nwas %s", m, h.modules)
	}
	if sum, err := fileSum(h.agent); err != nil || sum != h.agentSum {
		t.Errorf("host agent binary %s changed (%v)", h.agent, err)
	}
	if n := h.accepted.Load(); n != 0 {
		t.Errorf("the host's abstract socket @%s accepted %d connections", h.abstract, n)
	}
	if err := exec.Command("true").Run(); err != nil {
		t.Errorf("the host cannot start a process: %v", err)
	}
}

// procState is the state letter of pid in /proc/PID/stat ("" if gone).
// procExiting reports whether pid is gone, a zombie, or exiting
// (PF_EXITING): an exiting task is moved to the root cgroup before it
// becomes a zombie, while its state still reads R or D.
func procExiting(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return true
	}
	// After the name: state ppid pgrp session tty_nr tpgid flags …
	f := strings.Fields(s[i+1:])
	if len(f) < 7 || f[0] == "Z" || f[0] == "X" {
		return true
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	return err != nil || flags&pfExiting != 0
}

// pfExiting is the kernel's PF_EXITING task flag.
const pfExiting = 0x4

func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+3 > len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

// hostMounts lists the host's mounts outside foreignMountPrefixes as
// "target type source".
func hostMounts() map[string]bool {
	out := map[string]bool{}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return out
	}
	defer f.Close()
	prefixes := foreignMountPrefixes()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
lines:
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, x := range fields {
			if x == "-" && i >= 6 {
				sep = i
				break
			}
		}
		if sep < 0 || len(fields) < sep+3 {
			continue
		}
		target := fields[4]
		for _, p := range prefixes {
			if strings.HasPrefix(target, p) {
				continue lines
			}
		}
		out[target+" "+fields[sep+1]+" "+fields[sep+2]] = true
	}
	return out
}

// hostLoops lists bound loop devices whose backing file is outside
// foreignMountPrefixes.
func hostLoops() map[string]bool {
	out := map[string]bool{}
	paths, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	prefixes := foreignMountPrefixes()
loops:
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		backing := strings.TrimSpace(string(b))
		for _, pre := range prefixes {
			if strings.HasPrefix(backing, pre) {
				continue loops
			}
		}
		out[filepath.Base(filepath.Dir(filepath.Dir(p)))+" "+backing] = true
	}
	return out
}

// hostModules is the sorted list of loaded module names.
func hostModules() string {
	b, err := os.ReadFile("/proc/modules")
	if err != nil {
		return ""
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	sort.Strings(names)
	return strings.Join(names, " ")
}

func fileSum(p string) ([32]byte, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return [32]byte{}, err
	}
	return sha256.Sum256(b), nil
}

func names(ents []os.DirEntry) []string {
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// hostFree is the free space of the filesystem holding dir, in bytes.
func hostFree(t testing.TB, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}
