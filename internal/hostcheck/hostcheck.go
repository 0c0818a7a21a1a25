// Package hostcheck snapshots host state (mounts, loop devices, cgroups, files) so tests can assert they leak nothing.
//
// Several test binaries share one machine, so the roots given to Take scope
// the check: mounts, loop devices and files count only under the filesystem
// roots, cgroup directories only under the cgroup roots (see CgroupRoots).
// Without any root the check is host-wide: every mount and bound loop
// device, the airlock* cgroup trees of every hierarchy, named network
// namespaces and network interfaces. Processes are always only the
// descendants of the test process.
package hostcheck

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/mountinfo"
)

// settle is how long AssertNoLeaks waits for asynchronous cleanup (loop
// autoclear, process reaping, cgroup removal by a runtime) before it reports.
const settle = 5 * time.Second

// cgroupRoot is where every cgroup hierarchy is mounted.
const cgroupRoot = "/sys/fs/cgroup"

// Snapshot is the host state recorded by Take.
type Snapshot struct {
	roots   []string // filesystem roots, resolved
	cgroups []string // cgroup roots named in Take
	global  bool     // no roots: check the whole host
	items   map[string]map[string]bool
}

// Take records the host state: mountinfo entries, loop devices with a
// backing file, cgroup directories, the test's descendant processes and the
// files under roots; with no roots also named network namespaces and network
// interfaces. A root under /sys/fs/cgroup is a cgroup root: the cgroup
// directories in its tree are recorded instead of files.
//
// A driver test passes its data dir and CgroupRoots(its cgroup parent):
//
//	snap := hostcheck.Take(t, append(hostcheck.CgroupRoots("airlock"), dataDir)...)
//	defer snap.AssertNoLeaks(t)
func Take(t testing.TB, roots ...string) Snapshot {
	t.Helper()
	s := Snapshot{global: len(roots) == 0}
	for _, r := range roots {
		r = filepath.Clean(r)
		if under(r, cgroupRoot) {
			s.cgroups = append(s.cgroups, r)
			continue
		}
		if real, err := filepath.EvalSymlinks(r); err == nil {
			r = real
		}
		s.roots = append(s.roots, r)
	}
	items, err := s.collect()
	if err != nil {
		t.Fatalf("hostcheck: %v", err)
	}
	s.items = items
	return s
}

// AssertNoLeaks compares the host state now with s and fails t listing what
// is new. It waits a few seconds for cleanup the kernel finishes
// asynchronously before it reports.
func (s Snapshot) AssertNoLeaks(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(settle)
	for {
		now, err := s.collect()
		if err != nil {
			t.Errorf("hostcheck: %v", err)
			return
		}
		leaks := s.diff(now)
		if len(leaks) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("hostcheck: leaked host state:\n  %s", strings.Join(leaks, "\n  "))
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Leaks returns what is new since s, one line per item, without waiting.
func (s Snapshot) Leaks() ([]string, error) {
	now, err := s.collect()
	if err != nil {
		return nil, err
	}
	return s.diff(now), nil
}

func (s Snapshot) diff(now map[string]map[string]bool) []string {
	var out []string
	for kind, set := range now {
		for item := range set {
			if !s.items[kind][item] {
				out = append(out, kind+": "+item)
			}
		}
	}
	sort.Strings(out)
	return out
}

func (s Snapshot) collect() (map[string]map[string]bool, error) {
	items := map[string]map[string]bool{}
	kinds := map[string]func() ([]string, error){
		"mount":   s.mounts,
		"loop":    s.loops,
		"cgroup":  s.cgroupDirs,
		"file":    s.files,
		"process": descendants,
	}
	if s.global {
		kinds["netns"] = netns
		kinds["netlink"] = links
	}
	for kind, f := range kinds {
		list, err := f()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", kind, err)
		}
		set := make(map[string]bool, len(list))
		for _, x := range list {
			set[x] = true
		}
		items[kind] = set
	}
	return items, nil
}

func (s Snapshot) inRoots(p string) bool {
	if s.global {
		return true
	}
	for _, r := range s.roots {
		if under(p, r) {
			return true
		}
	}
	return false
}

func (s Snapshot) mounts() ([]string, error) {
	all, err := mountinfo.Read()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range all {
		if s.inRoots(m.Target) || (!s.global && s.inRoots(m.Source)) {
			// The mount id tells a remount at the same place from a leak.
			out = append(out, fmt.Sprintf("%s on %s type %s (id %d)", m.Source, m.Target, m.FSType, m.ID))
		}
	}
	return out, nil
}

func (s Snapshot) loops() ([]string, error) {
	paths, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // detached meanwhile
		}
		backing := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		if s.inRoots(backing) {
			out = append(out, filepath.Base(filepath.Dir(filepath.Dir(p)))+" backed by "+backing)
		}
	}
	return out, nil
}

// CgroupRoots returns the directory of the cgroup parent in every cgroup
// hierarchy mounted on this host (v1 controllers and v2), whether or not it
// exists yet, for use as Take roots.
func CgroupRoots(parent string) []string {
	var out []string
	if isHierarchy(cgroupRoot) { // pure v2
		out = append(out, filepath.Join(cgroupRoot, parent))
	}
	ents, _ := os.ReadDir(cgroupRoot)
	for _, e := range ents {
		h := filepath.Join(cgroupRoot, e.Name())
		if e.IsDir() && isHierarchy(h) {
			out = append(out, filepath.Join(h, parent))
		}
	}
	return out
}

func isHierarchy(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "cgroup.procs"))
	return err == nil
}

func (s Snapshot) cgroupDirs() ([]string, error) {
	roots := s.cgroups
	if s.global {
		for _, pat := range []string{cgroupRoot + "/*/airlock*", cgroupRoot + "/airlock*"} {
			m, err := filepath.Glob(pat)
			if err != nil {
				return nil, err
			}
			roots = append(roots, m...)
		}
	}
	var out []string
	for _, r := range roots {
		err := filepath.WalkDir(r, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil // removed while walking
				}
				return err
			}
			if d.IsDir() {
				out = append(out, p)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// files lists everything under the roots, staying on each root's filesystem:
// a leaked mount is reported as a mount, and walking into it could be huge.
func (s Snapshot) files() ([]string, error) {
	var out []string
	for _, r := range s.roots {
		var rootDev uint64
		var st syscall.Stat_t
		if err := syscall.Lstat(r, &st); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return nil, err
		}
		rootDev = st.Dev
		err := filepath.WalkDir(r, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			out = append(out, p)
			if d.IsDir() && p != r {
				var st syscall.Stat_t
				if syscall.Lstat(p, &st) == nil && st.Dev != rootDev {
					return fs.SkipDir
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func netns() ([]string, error) {
	ents, err := os.ReadDir("/run/netns")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out, nil
}

func links() ([]string, error) {
	ents, err := os.ReadDir("/sys/class/net")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out, nil
}

// descendants lists the processes below the test process, as "pid comm".
func descendants() ([]string, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	children := map[int][]int{}
	comm := map[int]string{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited
		}
		ppid, name, ok := parseStat(string(b))
		if !ok {
			continue
		}
		children[ppid] = append(children[ppid], pid)
		comm[pid] = name
	}
	var out []string
	queue := []int{os.Getpid()}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, fmt.Sprintf("%d %s", c, comm[c]))
			queue = append(queue, c)
		}
	}
	return out, nil
}

// parseStat returns the parent pid and command name from /proc/PID/stat.
// The name is in parentheses and may itself contain spaces and ')'.
func parseStat(s string) (ppid int, comm string, ok bool) {
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return 0, "", false
	}
	fields := strings.Fields(s[end+1:])
	if len(fields) < 2 {
		return 0, "", false
	}
	ppid, err := strconv.Atoi(fields[1])
	if err != nil {
		return 0, "", false
	}
	return ppid, s[open+1 : end], true
}

func under(path, root string) bool { return mountinfo.Under(path, root) }
