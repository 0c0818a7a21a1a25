package cgroups

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/testutil"
)

func loadFixture(t *testing.T, name string) *Hierarchy {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h, err := ParseMountinfo(f)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestParseMountinfo(t *testing.T) {
	tests := []struct {
		file    string
		mode    Mode
		v1      map[string]string
		unified string
	}{
		{"mountinfo-hybrid", ModeHybrid, map[string]string{
			"cpu": "/sys/fs/cgroup/cpu", "cpuacct": "/sys/fs/cgroup/cpuacct", "cpuset": "/sys/fs/cgroup/cpuset",
			"memory": "/sys/fs/cgroup/memory", "devices": "/sys/fs/cgroup/devices", "freezer": "/sys/fs/cgroup/freezer",
			"blkio": "/sys/fs/cgroup/blkio", "pids": "/sys/fs/cgroup/pids", "name=systemd": "/sys/fs/cgroup/systemd",
		}, "/sys/fs/cgroup/unified"},
		{"mountinfo-unified", ModeUnified, map[string]string{}, "/sys/fs/cgroup"},
		{"mountinfo-legacy", ModeLegacy, map[string]string{
			"cpu": "/sys/fs/cgroup/cpu,cpuacct", "cpuacct": "/sys/fs/cgroup/cpu,cpuacct",
			"memory": "/sys/fs/cgroup/memory", "pids": "/sys/fs/cgroup/pids", "freezer": "/sys/fs/cgroup/freezer",
			"name=systemd": "/sys/fs/cgroup/systemd", "net_cls": "/sys/fs/cgroup/net_cls,net_prio",
			"net_prio": "/sys/fs/cgroup/net_cls,net_prio",
		}, ""},
		// Inside a container the v1 mounts are binds of a sub-cgroup: not roots.
		{"mountinfo-container", ModeUnified, map[string]string{}, "/sys/fs/cgroup/with space"},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			h := loadFixture(t, tc.file)
			if got := h.Mode(); got != tc.mode {
				t.Errorf("Mode = %v, want %v", got, tc.mode)
			}
			if !reflect.DeepEqual(h.V1, tc.v1) {
				t.Errorf("V1 = %v\nwant %v", h.V1, tc.v1)
			}
			if h.Unified != tc.unified {
				t.Errorf("Unified = %q, want %q", h.Unified, tc.unified)
			}
		})
	}
}

func TestGroupDirs(t *testing.T) {
	tests := []struct {
		file string
		want []string
	}{
		{"mountinfo-legacy", []string{
			"/sys/fs/cgroup/cpu,cpuacct/airlock/sbx_1", "/sys/fs/cgroup/freezer/airlock/sbx_1",
			"/sys/fs/cgroup/memory/airlock/sbx_1", "/sys/fs/cgroup/net_cls,net_prio/airlock/sbx_1",
			"/sys/fs/cgroup/pids/airlock/sbx_1", "/sys/fs/cgroup/systemd/airlock/sbx_1",
		}},
		{"mountinfo-unified", []string{"/sys/fs/cgroup/airlock/sbx_1"}},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			g := loadFixture(t, tc.file).Group("airlock/sbx_1")
			if g.Path() != "/airlock/sbx_1" {
				t.Errorf("Path = %q", g.Path())
			}
			if got := g.Dirs(); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Dirs = %v\nwant %v", got, tc.want)
			}
		})
	}
}

func TestParseKeyed(t *testing.T) {
	tests := []struct {
		file, key string
		want      uint64
		ok        bool
	}{
		{"memory.oom_control", "oom_kill", 3, true},
		{"memory.oom_control", "under_oom", 0, true},
		{"memory.events", "oom_kill", 2, true},
		{"memory.events", "oom", 4, true},
		{"cpu.stat", "usage_usec", 1500000, true},
		{"cpu.stat", "missing", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.file+"/"+tc.key, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			got, ok := ParseKeyed(b, tc.key)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("ParseKeyed(%s, %s) = %d, %v; want %d, %v", tc.file, tc.key, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestParseUint(t *testing.T) {
	tests := []struct {
		in      string
		want    uint64
		wantErr bool
	}{
		{"123\n", 123, false},
		{"max\n", ^uint64(0), false},
		{"", 0, true},
		{"-1", 0, true},
	}
	for _, tc := range tests {
		got, err := ParseUint([]byte(tc.in))
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("ParseUint(%q) = %d, %v", tc.in, got, err)
		}
	}
}

// fakeTree writes counter files where a hierarchy expects them, so the
// readers' choice of file and directory is tested without a kernel.
func fakeTree(t *testing.T, unified bool) *Hierarchy {
	t.Helper()
	root := t.TempDir()
	write := func(rel, content string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fixture := func(name string) string {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if unified {
		write("v2/g/cgroup.freeze", "1\n")
		write("v2/g/memory.current", "1000\n")
		write("v2/g/memory.peak", "5000\n")
		write("v2/g/memory.events", fixture("memory.events"))
		write("v2/g/cpu.stat", fixture("cpu.stat"))
		write("v2/g/pids.current", "7\n")
		return &Hierarchy{V1: map[string]string{}, Unified: filepath.Join(root, "v2"),
			UnifiedControllers: []string{"cpu", "memory", "pids"}}
	}
	write("freezer/g/freezer.state", "FREEZING\n")
	write("memory/g/memory.usage_in_bytes", "2000\n")
	write("memory/g/memory.max_usage_in_bytes", "9000\n")
	write("memory/g/memory.oom_control", fixture("memory.oom_control"))
	write("cpuacct/g/cpuacct.usage", "2500000000\n")
	write("pids/g/pids.current", "4\n")
	// A cgroup2 tree with the same names must not be read when v1 has the controller.
	write("v2/g/memory.current", "1\n")
	return &Hierarchy{V1: map[string]string{
		"memory": filepath.Join(root, "memory"), "cpuacct": filepath.Join(root, "cpuacct"),
		"pids": filepath.Join(root, "pids"), "freezer": filepath.Join(root, "freezer"),
	}, Unified: filepath.Join(root, "v2")}
}

func TestGroupCounters(t *testing.T) {
	tests := []struct {
		name              string
		unified           bool
		usage, peak, ooms uint64
		cpu               time.Duration
		pids              uint64
	}{
		{"v1", false, 2000, 9000, 3, 2500 * time.Millisecond, 4},
		{"v2", true, 1000, 5000, 2, 1500 * time.Millisecond, 7},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := fakeTree(t, tc.unified).Group("/g")
			usage, peak, err := g.Memory()
			if err != nil || usage != tc.usage || peak != tc.peak {
				t.Errorf("Memory = %d, %d, %v; want %d, %d", usage, peak, err, tc.usage, tc.peak)
			}
			if n, err := g.OOMKills(); err != nil || n != tc.ooms {
				t.Errorf("OOMKills = %d, %v; want %d", n, err, tc.ooms)
			}
			if d, err := g.CPUUsage(); err != nil || d != tc.cpu {
				t.Errorf("CPUUsage = %v, %v; want %v", d, err, tc.cpu)
			}
			if n, err := g.PIDs(); err != nil || n != tc.pids {
				t.Errorf("PIDs = %d, %v; want %d", n, err, tc.pids)
			}
			if !g.Exists() {
				t.Error("Exists = false")
			}
			if f, err := g.Frozen(); err != nil || !f {
				t.Errorf("Frozen = %v, %v; want true", f, err)
			}
			gone := fakeTree(t, tc.unified).Group("/gone")
			if _, err := gone.OOMKills(); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("OOMKills of a missing group: %v, want ErrNotFound", err)
			}
			if gone.Exists() {
				t.Error("Exists of a missing group = true")
			}
		})
	}
}

// TestRemoveReal makes a nested cgroup with a task in it on the real
// hierarchy and checks Remove removes every directory once the task is gone.
func TestRemoveReal(t *testing.T) {
	testutil.RequiresRoot(t)
	h, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if h.Mode() == ModeNone {
		t.Skip("no cgroup filesystem")
	}
	g := h.Group("airlock-cgroups-test-" + strconv.Itoa(os.Getpid()))
	t.Cleanup(func() { g.Remove(context.Background()) })
	for _, d := range g.Dirs() {
		if err := os.MkdirAll(filepath.Join(d, "child", "grandchild"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if !g.Exists() {
		t.Fatal("Exists = false after mkdir")
	}
	if f, err := g.Frozen(); err != nil || f {
		t.Fatalf("Frozen of a new group = %v, %v", f, err)
	}
	// A task in the group makes rmdir fail with EBUSY: Remove must report it.
	dir, _ := g.dir("pids")
	cmdPid := startSleeper(t, filepath.Join(dir, "child"))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := g.Remove(ctx); err == nil {
		t.Fatal("Remove succeeded with a task inside")
	}
	killSleeper(t, cmdPid)
	if err := g.Remove(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, d := range g.Dirs() {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists: %v", d, err)
		}
	}
	if err := g.Remove(context.Background()); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	if err := h.Group("/").Remove(context.Background()); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Remove of the root: %v", err)
	}
}

func TestLoadHost(t *testing.T) {
	h, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if h.Mode() == ModeNone {
		t.Skip("no cgroup filesystem")
	}
	// Whatever the mode, this process's own pids/memory accounting is readable
	// through the root group on a host that has the controllers.
	if h.Has("memory") {
		if _, _, err := h.Group("/").Memory(); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("root Memory: %v", err)
		}
	}
}

func TestSetPIDsMaxFake(t *testing.T) {
	tests := []struct {
		name    string
		unified bool
		max     int64
		want    string
	}{
		{"v1", false, 300, "300"},
		{"v1_unlimited", false, -1, "max"},
		{"v2", true, 42, "42"},
		{"v2_unlimited", true, -1, "max"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := fakeTree(t, tc.unified)
			parent := filepath.Join(h.Unified, "cgroup.subtree_control")
			if tc.unified {
				if err := os.WriteFile(parent, []byte("cpu memory\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			g := h.Group("/g")
			if err := g.SetPIDsMax(tc.max); err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(h.V1["pids"], "g")
			if tc.unified {
				dir = filepath.Join(h.Unified, "g")
				// The controller must be enabled in the parent, or the
				// kernel has no pids.max for the group.
				if b, _ := os.ReadFile(parent); string(b) != "+pids" {
					t.Errorf("root subtree_control got %q, want +pids", b)
				}
			}
			b, err := os.ReadFile(filepath.Join(dir, "pids.max"))
			if err != nil || string(b) != tc.want {
				t.Fatalf("pids.max = %q, %v; want %q", b, err, tc.want)
			}
			if n, err := g.PIDsMax(); err != nil || n != tc.max {
				t.Errorf("PIDsMax = %d, %v; want %d", n, err, tc.max)
			}
		})
	}
	if err := fakeTree(t, false).Group("/").SetPIDsMax(1); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("SetPIDsMax of the root: %v", err)
	}
}

// TestSetPIDsMaxReal: a parent's pids.max bounds the tasks of the groups
// below it together (the driver limits all sandboxes through their parent).
func TestSetPIDsMaxReal(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "sh")
	h, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if !h.Has("pids") {
		t.Skip("no pids controller")
	}
	g := h.Group("airlock-cgroups-pids-" + strconv.Itoa(os.Getpid()))
	t.Cleanup(func() { g.Remove(context.Background()) })
	for _, d := range g.Dirs() {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.SetPIDsMax(3); err != nil {
		t.Fatal(err)
	}
	dir, _ := g.dir("pids")
	child := filepath.Join(dir, "child")
	if err := os.Mkdir(child, 0o755); err != nil {
		t.Fatal(err)
	}
	// The shell moves itself into the child group, which has no limit of
	// its own, and forks six sleeps: the parent's limit of three must stop
	// it at two.
	script := `echo $$ > ` + filepath.Join(child, "cgroup.procs") + `; for i in 1 2 3 4 5 6; do sleep 1 & done; wait`
	out, _ := exec.Command("sh", "-c", script).CombinedOutput()
	// v1 counts a refused fork in the forking group, v2 in the group whose
	// limit refused it.
	var refused uint64
	for _, d := range []string{dir, child} {
		b, err := os.ReadFile(filepath.Join(d, "pids.events"))
		if err != nil {
			t.Fatal(err)
		}
		n, _ := ParseKeyed(b, "max")
		refused += n
	}
	if refused == 0 {
		t.Errorf("no fork refused under a parent limit of 3 (shell said %q)", out)
	}
	if n, err := g.PIDsMax(); err != nil || n != 3 {
		t.Errorf("PIDsMax = %d, %v", n, err)
	}
	if err := g.SetPIDsMax(-1); err != nil {
		t.Fatal(err)
	}
	if n, err := g.PIDsMax(); err != nil || n != -1 {
		t.Errorf("PIDsMax after removing the limit = %d, %v", n, err)
	}
}
