package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/cgroups"
	"github.com/airlockhq/airlock/internal/driver/oci"
	"github.com/airlockhq/airlock/internal/reaper"
)

// What runsc leaves to the daemon (oci.Runtime). A sandbox's init is its
// Sentry; its Gofer and the ptrace platform's stubs are processes of
// runsc's own in the sandbox's cgroup, reparented to the daemon (the
// subreaper) by a detached run. Killing the Sentry ends every sandbox
// process, but not them: they are killed and reaped here, or `runsc
// delete` waits on their zombies for ever.

// reapEvery is how often the runtime's orphaned processes are reaped: a
// sandbox whose Sentry died on its own (an OOM kill) leaves its zombies to
// the daemon, and they cost only a pid each.
const reapEvery = 30 * time.Second

// InitRunning watches the Gofer of a sandbox whose Sentry (pid) runs,
// started or recovered. runsc's Sentry keeps its OOM score: /proc refuses
// to lower it, and its death is the sandbox's anyway.
func (d *Driver) InitRunning(st *oci.State, pid int, _ bool) { d.watchHelpers(st.ID, pid) }

// KillAll ends every process of the sandbox: the Sentry (and with it every
// sandbox process), then what runsc left in the cgroup, and waits until
// they are all reaped. pid is the Sentry's pid if known, 0 to ask runsc.
func (d *Driver) KillAll(ctx context.Context, id string, pid int) error {
	// The runtime's processes, taken before init dies: its children are
	// then reparented to the daemon, and a zombie no longer shows its
	// cgroup.
	snap := snapshotCgroup(d.Group(id))
	if err := d.resumeIfPaused(ctx, id); err != nil {
		return err
	}
	if err := d.KillInit(ctx, id, pid); err != nil {
		return err
	}
	hctx, cancel := context.WithTimeout(ctx, oci.KillWait)
	defer cancel()
	if err := d.killHelpers(hctx, id); err != nil {
		return err
	}
	if err := d.reapSnapshot(hctx, snap); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	return nil
}

// resumeIfPaused resumes a sandbox runsc paused before it is killed: runsc
// pauses in its Sentry, not with the cgroup freezer, and a sandbox killed
// paused leaves a record `runsc delete` cannot remove.
func (d *Driver) resumeIfPaused(ctx context.Context, id string) error {
	if p := d.Init(id); p != nil {
		select {
		case <-p.Done():
			return nil // nothing left to resume
		default:
		}
	}
	cs, err := d.CLI().State(ctx, id)
	if err != nil || cs.Status != "paused" {
		return nil // KillInit asks again and says what is wrong
	}
	if err := d.CLI().Resume(ctx, id); err != nil {
		return fmt.Errorf("thawing sandbox %s: %w", id, err)
	}
	return nil
}

// ClearStopped kills and reaps the Gofer a stopped sandbox left: runsc
// waits for it before it deletes the sandbox's record.
func (d *Driver) ClearStopped(ctx context.Context, id string) error {
	hctx, cancel := context.WithTimeout(ctx, oci.KillWait)
	defer cancel()
	return d.killHelpers(hctx, id)
}

// watchHelpers watches the processes of id's cgroup, other than init,
// whose parent is the daemon: the runtime's helpers, which a detached run
// leaves to the daemon (its subreaper) to reap.
func (d *Driver) watchHelpers(id string, initPid int) {
	self := os.Getpid()
	var ws []*reaper.Process
	for _, pid := range oci.CgroupPIDs(d.Group(id)) {
		if pid == initPid || parentPid(pid) != self {
			continue
		}
		if p, err := reaper.Watch(pid); err == nil {
			ws = append(ws, p)
		}
	}
	d.SetHelpers(id, ws)
}

// killHelpers kills what the runtime left in the sandbox's cgroup after its
// init ended and waits until the cgroup is empty. Only the sandbox's own
// processes are there: the runtime put them there.
func (d *Driver) killHelpers(ctx context.Context, id string) error {
	g := d.Group(id)
	for {
		pids := oci.CgroupPIDs(g)
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
	for _, h := range d.Helpers(id) {
		select {
		case <-h.Done():
		case <-ctx.Done():
			return fmt.Errorf("sandbox %s runtime helper %d not reaped: %w", id, h.Pid(), ctx.Err())
		}
	}
	return nil
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
	start, end := d.UIDRange()
	return uid == nobodyUID || (uint64(uid) >= start && uint64(uid) < end)
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
	for _, pid := range oci.CgroupPIDs(g) {
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
