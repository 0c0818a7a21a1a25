package hostcheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/testutil"
)

func TestParseStat(t *testing.T) {
	tests := []struct {
		name, in string
		ppid     int
		comm     string
		ok       bool
	}{
		{"plain", "123 (sleep) S 45 123 45 0", 45, "sleep", true},
		{"paren-and-space-in-name", "9 (a) b (c) R 7 9 9 0", 7, "a) b (c", true},
		{"truncated", "9 (x", 0, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ppid, comm, ok := parseStat(tc.in)
			if ppid != tc.ppid || comm != tc.comm || ok != tc.ok {
				t.Errorf("parseStat(%q) = %d, %q, %v; want %d, %q, %v", tc.in, ppid, comm, ok, tc.ppid, tc.comm, tc.ok)
			}
		})
	}
}

// leakOf asserts that the snapshot reports exactly one new item of kind
// containing want, then that undo makes it clean again.
func leakOf(t *testing.T, s Snapshot, kind, want string, undo func()) {
	t.Helper()
	leaks, err := s.Leaks()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, l := range leaks {
		if strings.HasPrefix(l, kind+": ") && strings.Contains(l, want) {
			found = true
		}
	}
	if !found {
		t.Errorf("leak of %s %q not reported; got %q", kind, want, leaks)
	}
	undo()
	s.AssertNoLeaks(t)
}

func TestDetects(t *testing.T) {
	t.Run("file", func(t *testing.T) {
		root := t.TempDir()
		s := Take(t, root)
		p := filepath.Join(root, "left-behind")
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		leakOf(t, s, "file", p, func() { os.Remove(p) })
	})
	t.Run("process", func(t *testing.T) {
		s := Take(t, t.TempDir())
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Skip("no sleep binary:", err)
		}
		leakOf(t, s, "process", "sleep", func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	})
	t.Run("mount", func(t *testing.T) {
		testutil.RequiresRoot(t)
		root := t.TempDir()
		s := Take(t, root)
		if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(root, unix.MNT_DETACH) })
		leakOf(t, s, "mount", root, func() {
			if err := unix.Unmount(root, 0); err != nil {
				t.Fatal(err)
			}
		})
	})
	t.Run("cgroup", func(t *testing.T) {
		testutil.RequiresRoot(t)
		parent := filepath.Join(cgroupRoot, "pids")
		if _, err := os.Stat(filepath.Join(parent, "cgroup.procs")); err != nil {
			t.Skip("no cgroup v1 pids hierarchy")
		}
		s := Take(t, append(CgroupRoots("airlock-hostcheck-test"), t.TempDir())...)
		cg := filepath.Join(parent, "airlock-hostcheck-test")
		if err := os.Mkdir(cg, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Remove(cg) })
		leakOf(t, s, "cgroup", cg, func() {
			if err := os.Remove(cg); err != nil {
				t.Fatal(err)
			}
		})
	})
}

func TestCgroupRoots(t *testing.T) {
	roots := CgroupRoots("airlock-x")
	if len(roots) == 0 {
		t.Skip("no cgroup hierarchy mounted")
	}
	for _, r := range roots {
		if filepath.Base(r) != "airlock-x" || !isHierarchy(filepath.Dir(r)) {
			t.Errorf("%s is not airlock-x in a hierarchy", r)
		}
	}
}

func TestScopedToRoots(t *testing.T) {
	root, other := t.TempDir(), t.TempDir()
	s := Take(t, root)
	if err := os.WriteFile(filepath.Join(other, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		// A cgroup outside the (cgroup) roots is another test's business.
		cg := filepath.Join(cgroupRoot, "pids", "airlock-hostcheck-other")
		if err := os.Mkdir(cg, 0o755); err == nil {
			t.Cleanup(func() { _ = os.Remove(cg) })
		}
	}
	leaks, err := s.Leaks()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leaks {
		if strings.Contains(l, other) || strings.Contains(l, "airlock-hostcheck-other") {
			t.Errorf("change outside the roots reported: %s", l)
		}
	}
}
