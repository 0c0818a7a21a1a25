// Package cgroups reads the resource use of a sandbox's cgroup and removes its directories, on cgroup v1, hybrid and v2 hosts.
//
// runc creates and limits each sandbox's cgroup (its cgroupfs driver); this
// package finds where they live, reads counters the driver reports (memory,
// OOM kills, CPU time, tasks), sets the task limit of the sandboxes' common
// parent and removes the empty directories runc leaves behind.
package cgroups

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/mountinfo"
)

// Mode is how the host mounts cgroups.
type Mode int

const (
	// ModeNone means no cgroup filesystem was found.
	ModeNone Mode = iota
	// ModeLegacy is cgroup v1 only.
	ModeLegacy
	// ModeHybrid is cgroup v1 controllers plus a cgroup2 tree without them
	// (this project's reference host).
	ModeHybrid
	// ModeUnified is cgroup v2 only.
	ModeUnified
)

// String names the mode as people say it.
func (m Mode) String() string {
	switch m {
	case ModeLegacy:
		return "v1"
	case ModeHybrid:
		return "hybrid"
	case ModeUnified:
		return "v2"
	}
	return "none"
}

// Hierarchy says where the host's cgroup filesystems are mounted.
type Hierarchy struct {
	// V1 maps each v1 controller (and named hierarchy like "name=systemd")
	// to its mount point. Co-mounted controllers share one.
	V1 map[string]string
	// Unified is the mount point of the cgroup2 tree, "" if none.
	Unified string
	// UnifiedControllers are the controllers enabled on the cgroup2 tree.
	UnifiedControllers []string
}

// Load reads the cgroup mounts of this process's mount namespace.
func Load() (*Hierarchy, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading mounts: %w", err)
	}
	defer f.Close()
	h, err := ParseMountinfo(f)
	if err != nil {
		return nil, err
	}
	if h.Unified != "" {
		b, err := os.ReadFile(filepath.Join(h.Unified, "cgroup.controllers"))
		if err == nil {
			h.UnifiedControllers = strings.Fields(string(b))
		}
	}
	return h, nil
}

// ParseMountinfo finds the cgroup mounts in a /proc/PID/mountinfo listing.
// Only mounts of a hierarchy's root are used (a bind of a sub-cgroup, as in a
// container, is not where its controllers' roots live).
func ParseMountinfo(r io.Reader) (*Hierarchy, error) {
	mounts, err := mountinfo.Parse(r)
	if err != nil {
		return nil, fmt.Errorf("parsing mountinfo: %w", err)
	}
	h := &Hierarchy{V1: map[string]string{}}
	for _, m := range mounts {
		switch m.FSType {
		case "cgroup2":
			if h.Unified == "" && m.Root == "/" {
				h.Unified = m.Target
			}
		case "cgroup":
			if m.Root != "/" {
				continue
			}
			for _, opt := range strings.Split(m.SuperOptions, ",") {
				if isV1Option(opt) {
					if _, dup := h.V1[opt]; !dup {
						h.V1[opt] = m.Target
					}
				}
			}
		}
	}
	return h, nil
}

// isV1Option reports whether a cgroup v1 super option names a hierarchy
// (a controller or name=…) rather than a mount flag.
func isV1Option(opt string) bool {
	if strings.HasPrefix(opt, "name=") {
		return true
	}
	switch opt {
	case "rw", "ro", "relatime", "noatime", "nosuid", "nodev", "noexec", "noprefix", "xattr",
		"clone_children", "cpuset_v2_mode", "favordynmods", "nofavordynmods":
		return false
	}
	return !strings.Contains(opt, "=")
}

// Mode classifies the hierarchy.
func (h *Hierarchy) Mode() Mode {
	switch {
	case len(h.V1) > 0 && h.Unified != "":
		return ModeHybrid
	case len(h.V1) > 0:
		return ModeLegacy
	case h.Unified != "":
		return ModeUnified
	}
	return ModeNone
}

// Has reports whether controller is usable, on v1 or on the cgroup2 tree.
func (h *Hierarchy) Has(controller string) bool {
	if _, ok := h.V1[controller]; ok {
		return true
	}
	return slices.Contains(h.UnifiedControllers, controller)
}

// v1 returns the v1 mount point of controller, "" if it is not on v1.
func (h *Hierarchy) v1(controller string) string { return h.V1[controller] }

// Group is one cgroup, named by its path relative to each hierarchy's root
// (runc's cgroupsPath, e.g. "/airlock/sbx_…").
type Group struct {
	h    *Hierarchy
	path string
}

// Group returns the cgroup at path in every hierarchy. It does not create it.
func (h *Hierarchy) Group(path string) *Group {
	return &Group{h: h, path: filepath.Join("/", path)}
}

// Path is the group's path relative to the hierarchy roots.
func (g *Group) Path() string { return g.path }

// Dirs are the group's directory in every hierarchy (v1 controllers sharing
// a mount are listed once), sorted.
func (g *Group) Dirs() []string {
	seen := map[string]bool{}
	var dirs []string
	add := func(root string) {
		d := filepath.Join(root, g.path)
		if !seen[d] {
			seen[d] = true
			dirs = append(dirs, d)
		}
	}
	for _, mnt := range g.h.V1 {
		add(mnt)
	}
	if g.h.Unified != "" {
		add(g.h.Unified)
	}
	sort.Strings(dirs)
	return dirs
}

// dir is the group's directory for controller: its v1 mount if it has one,
// else the cgroup2 tree.
func (g *Group) dir(controller string) (string, bool) {
	if m := g.h.v1(controller); m != "" {
		return filepath.Join(m, g.path), true
	}
	if g.h.Unified != "" {
		return filepath.Join(g.h.Unified, g.path), false
	}
	return "", false
}

// Exists reports whether the group has a directory in any hierarchy.
func (g *Group) Exists() bool {
	for _, d := range g.Dirs() {
		if _, err := os.Stat(d); err == nil {
			return true
		}
	}
	return false
}

// Memory returns the memory in use now and the most ever used (v1
// memory.max_usage_in_bytes, v2 memory.peak; 0 where the kernel lacks it).
func (g *Group) Memory() (usage, peak uint64, err error) {
	dir, v1 := g.dir("memory")
	if dir == "" {
		return 0, 0, errdefs.Wrap(errdefs.ErrNotImplemented, "no memory cgroup")
	}
	usageFile, peakFile := "memory.current", "memory.peak"
	if v1 {
		usageFile, peakFile = "memory.usage_in_bytes", "memory.max_usage_in_bytes"
	}
	if usage, err = readUint(filepath.Join(dir, usageFile)); err != nil {
		return 0, 0, err
	}
	peak, err = readUint(filepath.Join(dir, peakFile))
	if errors.Is(err, fs.ErrNotExist) {
		return usage, 0, nil // memory.peak is Linux 5.19+
	}
	return usage, peak, err
}

// OOMKills counts the group's processes the kernel OOM killer killed (v1
// memory.oom_control `oom_kill`, which unlike failcnt counts kills, not limit
// hits; v2 memory.events `oom_kill`).
func (g *Group) OOMKills() (uint64, error) {
	dir, v1 := g.dir("memory")
	if dir == "" {
		return 0, errdefs.Wrap(errdefs.ErrNotImplemented, "no memory cgroup")
	}
	file := "memory.events"
	if v1 {
		file = "memory.oom_control"
	}
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0, classify(err)
	}
	n, ok := ParseKeyed(b, "oom_kill")
	if !ok {
		return 0, fmt.Errorf("%s: no oom_kill line", file)
	}
	return n, nil
}

// CPUUsage is the CPU time the group's processes used (v1 cpuacct.usage, v2
// cpu.stat usage_usec).
func (g *Group) CPUUsage() (time.Duration, error) {
	if m := g.h.v1("cpuacct"); m != "" {
		ns, err := readUint(filepath.Join(m, g.path, "cpuacct.usage"))
		return time.Duration(ns), err
	}
	if g.h.Unified == "" {
		return 0, errdefs.Wrap(errdefs.ErrNotImplemented, "no cpu accounting cgroup")
	}
	b, err := os.ReadFile(filepath.Join(g.h.Unified, g.path, "cpu.stat"))
	if err != nil {
		return 0, classify(err)
	}
	us, ok := ParseKeyed(b, "usage_usec")
	if !ok {
		return 0, errors.New("cpu.stat: no usage_usec line")
	}
	return time.Duration(us) * time.Microsecond, nil
}

// PIDs is the number of tasks in the group (pids.current).
func (g *Group) PIDs() (uint64, error) {
	dir, _ := g.dir("pids")
	if dir == "" {
		return 0, errdefs.Wrap(errdefs.ErrNotImplemented, "no pids cgroup")
	}
	return readUint(filepath.Join(dir, "pids.current"))
}

// PIDsMax is the group's task limit (pids.max), -1 for none ("max").
func (g *Group) PIDsMax() (int64, error) {
	dir, _ := g.dir("pids")
	if dir == "" {
		return 0, errdefs.Wrap(errdefs.ErrNotImplemented, "no pids cgroup")
	}
	n, err := readUint(filepath.Join(dir, "pids.max"))
	if err != nil {
		return 0, err
	}
	if n > math.MaxInt64 {
		return -1, nil
	}
	return int64(n), nil
}

// SetPIDsMax sets the group's task limit (pids.max); max < 0 removes it.
// The group's directory must exist. The limit is hierarchical: tasks of
// every group below count against it, so a parent's limit bounds all its
// children together. On the cgroup2 tree the pids controller is first
// enabled in every ancestor's cgroup.subtree_control, without which the
// group has no pids.max.
func (g *Group) SetPIDsMax(max int64) error {
	dir, v1 := g.dir("pids")
	if dir == "" {
		return errdefs.Wrap(errdefs.ErrNotImplemented, "no pids cgroup")
	}
	if g.path == "/" {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "the root cgroup has no pids.max")
	}
	if !v1 {
		if err := g.enableUnified("pids"); err != nil {
			return err
		}
	}
	v := "max"
	if max >= 0 {
		v = strconv.FormatInt(max, 10)
	}
	if err := os.WriteFile(filepath.Join(dir, "pids.max"), []byte(v), 0); err != nil {
		return fmt.Errorf("setting pids.max of %s: %w", g.path, classify(err))
	}
	return nil
}

// SetCPU limits the group to quota µs of CPU time per period µs (v1
// cpu.cfs_period_us and cpu.cfs_quota_us, v2 cpu.max); quota < 0 removes
// the limit. The group's directory must exist.
func (g *Group) SetCPU(quota int64, period uint64) error {
	dir, v1 := g.dir("cpu")
	if dir == "" {
		return errdefs.Wrap(errdefs.ErrNotImplemented, "no cpu cgroup")
	}
	if period == 0 {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "cpu period 0")
	}
	q := "max"
	if quota >= 0 {
		q = strconv.FormatInt(quota, 10)
	}
	if !v1 {
		if err := g.enableUnified("cpu"); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "cpu.max"), []byte(q+" "+strconv.FormatUint(period, 10)), 0); err != nil {
			return fmt.Errorf("setting cpu.max of %s: %w", g.path, classify(err))
		}
		return nil
	}
	if quota < 0 {
		q = "-1"
	}
	// The period first: a quota is checked against the period in force.
	if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), []byte(strconv.FormatUint(period, 10)), 0); err != nil {
		return fmt.Errorf("setting cpu.cfs_period_us of %s: %w", g.path, classify(err))
	}
	if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(q), 0); err != nil {
		return fmt.Errorf("setting cpu.cfs_quota_us of %s: %w", g.path, classify(err))
	}
	return nil
}

// CPU returns the group's CPU limit: quota µs per period µs, quota -1 for
// none.
func (g *Group) CPU() (quota int64, period uint64, err error) {
	dir, v1 := g.dir("cpu")
	if dir == "" {
		return 0, 0, errdefs.Wrap(errdefs.ErrNotImplemented, "no cpu cgroup")
	}
	if !v1 {
		b, err := os.ReadFile(filepath.Join(dir, "cpu.max"))
		if err != nil {
			return 0, 0, classify(err)
		}
		f := strings.Fields(string(b))
		if len(f) != 2 {
			return 0, 0, fmt.Errorf("cpu.max: %q", b)
		}
		quota = -1
		if f[0] != "max" {
			if quota, err = strconv.ParseInt(f[0], 10, 64); err != nil {
				return 0, 0, fmt.Errorf("cpu.max: %w", err)
			}
		}
		period, err = strconv.ParseUint(f[1], 10, 64)
		return quota, period, err
	}
	b, err := os.ReadFile(filepath.Join(dir, "cpu.cfs_quota_us"))
	if err != nil {
		return 0, 0, classify(err)
	}
	if quota, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err != nil {
		return 0, 0, fmt.Errorf("cpu.cfs_quota_us: %w", err)
	}
	period, err = readUint(filepath.Join(dir, "cpu.cfs_period_us"))
	return quota, period, err
}

// enableUnified enables controller for g in every ancestor's
// cgroup.subtree_control on the cgroup2 tree, root first.
func (g *Group) enableUnified(controller string) error {
	var ancestors []string
	for p := filepath.Dir(g.path); ; p = filepath.Dir(p) {
		ancestors = append(ancestors, p)
		if p == "/" {
			break
		}
	}
	for i := len(ancestors) - 1; i >= 0; i-- {
		f := filepath.Join(g.h.Unified, ancestors[i], "cgroup.subtree_control")
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("enabling %s controller: %w", controller, classify(err))
		}
		if slices.Contains(strings.Fields(string(b)), controller) {
			continue
		}
		if err := os.WriteFile(f, []byte("+"+controller), 0); err != nil {
			return fmt.Errorf("enabling %s controller in %s: %w", controller, ancestors[i], err)
		}
	}
	return nil
}

// Frozen reports whether the group is frozen or freezing (v1
// freezer.state, v2 cgroup.freeze). A group without a freezer is not frozen.
func (g *Group) Frozen() (bool, error) {
	if m := g.h.v1("freezer"); m != "" {
		b, err := os.ReadFile(filepath.Join(m, g.path, "freezer.state"))
		if err != nil {
			return false, classify(err)
		}
		return strings.TrimSpace(string(b)) != "THAWED", nil
	}
	if g.h.Unified == "" {
		return false, nil
	}
	b, err := os.ReadFile(filepath.Join(g.h.Unified, g.path, "cgroup.freeze"))
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(filepath.Join(g.h.Unified, g.path)); serr == nil {
			return false, nil // the root group has no cgroup.freeze
		}
	}
	if err != nil {
		return false, classify(err)
	}
	return strings.TrimSpace(string(b)) == "1", nil
}

// removeRetry is how long Remove retries a directory that is busy: tasks of a
// killed group leave it a few milliseconds after SIGKILL, not at once.
const removeRetry = 2 * time.Second

// Remove deletes the group's directories in every hierarchy, children first.
// A group that does not exist is not an error. It fails if a directory still
// holds tasks once ctx is done or after a short retry.
func (g *Group) Remove(ctx context.Context) error {
	if g.path == "/" {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "refusing to remove a cgroup root")
	}
	var errs []error
	for _, d := range g.Dirs() {
		if err := removeTree(ctx, d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeTree rmdirs dir and every cgroup below it, deepest first.
func removeTree(ctx context.Context, dir string) error {
	var subdirs []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			subdirs = append(subdirs, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("listing cgroup %s: %w", dir, err)
	}
	deadline := time.Now().Add(removeRetry)
	for i := len(subdirs) - 1; i >= 0; i-- {
		for {
			err := unix.Rmdir(subdirs[i])
			if err == nil || err == unix.ENOENT {
				break
			}
			if err != unix.EBUSY || time.Now().After(deadline) {
				return fmt.Errorf("removing cgroup %s: %w", subdirs[i], err)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("removing cgroup %s: %w", subdirs[i], ctx.Err())
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return nil
}

// ParseKeyed returns the value of key in a flat keyed file ("key value" per
// line: memory.oom_control, memory.events, cpu.stat, memory.stat).
func ParseKeyed(b []byte, key string) (uint64, bool) {
	for _, line := range bytes.Split(b, []byte("\n")) {
		k, v, ok := bytes.Cut(bytes.TrimSpace(line), []byte(" "))
		if !ok || string(k) != key {
			continue
		}
		n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
		if err != nil {
			return 0, false
		}
		return n, true
	}
	return 0, false
}

// ParseUint parses a single-value cgroup file. "max" (v2: no limit) is
// reported as the largest uint64.
func ParseUint(b []byte) (uint64, error) {
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return ^uint64(0), nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parsing cgroup value %q: %w", s, err)
	}
	return n, nil
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, classify(err)
	}
	n, err := ParseUint(b)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}

// classify maps a missing cgroup file to errdefs.ErrNotFound: the group is
// gone (the sandbox was deleted or never started).
func classify(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
	}
	return err
}

// freezeWait bounds how long SetFrozen waits for the kernel to report the
// group frozen (a task in an uninterruptible sleep holds it back).
const freezeWait = 5 * time.Second

// SetFrozen freezes (true) or thaws the group and, for a freeze, waits
// until every task in it and below is frozen (v1 freezer.state, v2
// cgroup.freeze and cgroup.events). A frozen group's tasks run nothing,
// fork nothing and do not exit, so the set Procs reads meanwhile is
// exact, and a SIGKILL sent to them takes effect at the thaw.
func (g *Group) SetFrozen(ctx context.Context, frozen bool) error {
	if m := g.h.v1("freezer"); m != "" {
		f := filepath.Join(m, g.path, "freezer.state")
		if !frozen {
			if err := os.WriteFile(f, []byte("THAWED"), 0); err != nil {
				return fmt.Errorf("writing %s: %w", f, classify(err))
			}
			return pollFile(ctx, f, func(s string) bool { return s == "THAWED" })
		}
		err := freezeV1(ctx, f)
		if err != nil {
			// Never left half frozen.
			_ = os.WriteFile(f, []byte("THAWED"), 0)
		}
		return err
	}
	if g.h.Unified == "" {
		return errdefs.Wrap(errdefs.ErrNotImplemented, "no freezer cgroup")
	}
	dir := filepath.Join(g.h.Unified, g.path)
	v := "0"
	if frozen {
		v = "1"
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte(v), 0); err != nil {
		return fmt.Errorf("writing cgroup.freeze of %s: %w", g.path, classify(err))
	}
	if !frozen {
		return nil
	}
	return pollFile(ctx, filepath.Join(dir, "cgroup.events"), func(s string) bool {
		n, ok := ParseKeyed([]byte(s), "frozen")
		return ok && n == 1
	})
}

// freezeV1 freezes through v1 freezer.state file f. A v1 freeze can stay
// FREEZING for good when it catches a task at the wrong moment (a fork in
// progress, a task in some sleeps): as runc does, it thaws and freezes
// again every few milliseconds until the group is FROZEN, for at most
// freezeWait.
func freezeV1(ctx context.Context, f string) error {
	deadline := time.Now().Add(freezeWait)
	for i := 0; ; i++ {
		if i > 0 && i%10 == 0 {
			if err := os.WriteFile(f, []byte("THAWED"), 0); err != nil {
				return fmt.Errorf("writing %s: %w", f, classify(err))
			}
		}
		if err := os.WriteFile(f, []byte("FROZEN"), 0); err != nil {
			return fmt.Errorf("writing %s: %w", f, classify(err))
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("reading %s: %w", f, classify(err))
		}
		st := strings.TrimSpace(string(b))
		if st == "FROZEN" {
			return nil
		}
		if time.Now().After(deadline) {
			return errdefs.Wrap(errdefs.ErrUnavailable, "%s stayed %s", f, st)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// pollFile reads f until done says yes, for at most freezeWait.
func pollFile(ctx context.Context, f string, done func(string) bool) error {
	deadline := time.Now().Add(freezeWait)
	for {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("reading %s: %w", f, classify(err))
		}
		if done(strings.TrimSpace(string(b))) {
			return nil
		}
		if time.Now().After(deadline) {
			return errdefs.Wrap(errdefs.ErrUnavailable, "%s did not settle: %q", f, strings.TrimSpace(string(b)))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// Procs lists the processes (thread group ids) in the group and every
// group below it, from the pids controller's tree (v1) or the unified one.
func (g *Group) Procs() ([]int, error) {
	dir, _ := g.dir("pids")
	if dir == "" {
		if dir, _ = g.dir("freezer"); dir == "" {
			return nil, errdefs.Wrap(errdefs.ErrNotImplemented, "no cgroup to list processes from")
		}
	}
	var pids []int
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return err
		}
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil && n > 0 {
				pids = append(pids, n)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing processes of cgroup %s: %w", g.path, classify(err))
	}
	return pids, nil
}
