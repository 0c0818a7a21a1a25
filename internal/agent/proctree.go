package agent

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// procStat is the part of /proc/PID/stat the tree walk needs.
type procStat struct {
	pid, ppid, pgrp, sid int
	state                byte
	start                uint64 // start time, clock ticks after boot
}

// readProcStat parses /proc/PID/stat. The command name (field 2) may hold
// spaces and parentheses, so parsing starts after its last ')'.
func readProcStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return procStat{}, false
	}
	// Fields from 3 (state) on; starttime is field 22.
	f := strings.Fields(string(b[i+2:]))
	if len(f) < 20 {
		return procStat{}, false
	}
	st := procStat{pid: pid, state: f[0][0]}
	st.ppid, _ = strconv.Atoi(f[1])
	st.pgrp, _ = strconv.Atoi(f[2])
	st.sid, _ = strconv.Atoi(f[3])
	st.start, _ = strconv.ParseUint(f[19], 10, 64)
	return st, true
}

// listProcs returns every live process (zombies excluded: they are already
// dead and only wait for their parent).
func listProcs() []procStat {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	procs := make([]procStat, 0, len(names))
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		st, ok := readProcStat(pid)
		if !ok || st.state == 'Z' || st.state == 'X' {
			continue
		}
		procs = append(procs, st)
	}
	return procs
}

// hasEnvMarker reports whether pid's environment holds marker ("K=V").
func hasEnvMarker(pid int, marker []byte) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	for len(b) > 0 {
		i := bytes.IndexByte(b, 0)
		var kv []byte
		if i < 0 {
			kv, b = b, nil
		} else {
			kv, b = b[:i], b[i+1:]
		}
		if bytes.Equal(kv, marker) {
			return true
		}
	}
	return false
}

// execTree returns the live processes of the exec whose main process was
// leader (its session and process group id, since every exec calls setsid)
// and started at tick since: everything in that session or group, their
// descendants, and any process carrying the exec's environment marker
// (double-forked daemons that made a session of their own).
//
// Reading /proc/PID/environ takes the target's mmap lock, and a process
// stuck in the kernel (state D, e.g. in a memory cgroup's OOM handling) can
// hold it indefinitely. So environments are read only of processes that
// could carry the marker (started no earlier than the exec) and are not in
// state D; a D process is picked up by a later round of killTree.
func execTree(leader int, since uint64, marker []byte) []int {
	self := os.Getpid()
	procs := listProcs()
	in := make(map[int]bool)
	children := make(map[int][]int)
	for _, p := range procs {
		if p.pid == self {
			continue
		}
		children[p.ppid] = append(children[p.ppid], p.pid)
		if p.sid == leader || p.pgrp == leader {
			in[p.pid] = true
		}
	}
	for _, p := range procs {
		if !in[p.pid] && p.pid != self && p.start >= since && p.state != 'D' && hasEnvMarker(p.pid, marker) {
			in[p.pid] = true
		}
	}
	// Descendants of any member.
	queue := make([]int, 0, len(in))
	for pid := range in {
		queue = append(queue, pid)
	}
	for len(queue) > 0 {
		pid := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		for _, c := range children[pid] {
			if !in[c] {
				in[c] = true
				queue = append(queue, c)
			}
		}
	}
	pids := make([]int, 0, len(in))
	for pid := range in {
		pids = append(pids, pid)
	}
	return pids
}

// signalTree sends sig to the exec's whole tree once and returns how many
// processes it found.
func signalTree(leader int, since uint64, marker []byte, sig syscall.Signal) int {
	// The group first: one atomic kill for the common case.
	_ = syscall.Kill(-leader, sig)
	pids := execTree(leader, since, marker)
	for _, pid := range pids {
		_ = syscall.Kill(pid, sig)
	}
	return len(pids)
}

// killTreeTimeout bounds killTree. SIGKILL cannot be caught, so a tree is
// gone within milliseconds unless it forks faster than the walk; the bound
// only keeps a pathological case from pinning a goroutine forever.
const killTreeTimeout = 10 * time.Second

// killTree sends SIGKILL to the exec's tree until no process of it is left.
// It reports whether the tree is gone.
func killTree(leader int, since uint64, marker []byte) bool {
	deadline := time.Now().Add(killTreeTimeout)
	pause := time.Millisecond
	for {
		if signalTree(leader, since, marker, syscall.SIGKILL) == 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		// Killed processes need a moment to exit (and be reaped, for the
		// ones whose parent is gone); re-walk after it.
		time.Sleep(pause)
		pause = min(2*pause, 20*time.Millisecond)
	}
}

// parseSignal accepts "SIGTERM", "TERM", "sigterm" or "15".
func parseSignal(s string) (syscall.Signal, error) {
	s = strings.TrimSpace(s)
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 || n > 64 {
			return 0, fmt.Errorf("signal %d out of range", n)
		}
		return syscall.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, fmt.Errorf("unknown signal %q", s)
}

// signalName returns "SIGKILL" for 9.
func signalName(sig syscall.Signal) string {
	if n := unix.SignalName(sig); n != "" {
		return n
	}
	return "SIG" + strconv.Itoa(int(sig))
}
