package idmap

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/testutil"
)

func TestMountShiftsOwners(t *testing.T) {
	testutil.RequiresRoot(t)
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "root-file"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(src, "user-dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(src, "user-dir"), 1000, 1001); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "high"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(src, "high"), 70000, 70000); err != nil {
		t.Fatal(err)
	}

	const base, count = 3 << 20, 65536
	tests := []struct {
		name     string
		uid, gid uint32
	}{
		{"root-file", base, base},
		{"user-dir", base + 1000, base + 1001},
		{"high", 65534, 65534}, // outside the range: the overflow id
	}
	dst := t.TempDir()
	if err := Mount(src, dst, base, count); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dst, 0); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(dst, tc.name), &st); err != nil {
				t.Fatal(err)
			}
			if st.Uid != tc.uid || st.Gid != tc.gid {
				t.Errorf("owner %d:%d, want %d:%d", st.Uid, st.Gid, tc.uid, tc.gid)
			}
		})
	}
	t.Run("read-only", func(t *testing.T) {
		err := os.WriteFile(filepath.Join(dst, "new"), nil, 0o644)
		if !errors.Is(err, syscall.EROFS) {
			t.Errorf("write through idmapped mount: %v, want EROFS", err)
		}
	})
	t.Run("source-unchanged", func(t *testing.T) {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(src, "user-dir"), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != 1000 {
			t.Errorf("source owner changed to %d", st.Uid)
		}
	})
}

func TestUserNSCached(t *testing.T) {
	testutil.RequiresRoot(t)
	a, err := userNS(5<<20, 65536)
	if err != nil {
		t.Fatal(err)
	}
	b, err := userNS(5<<20, 65536)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Error("same range gave two namespaces")
	}
	c, err := userNS(6<<20, 65536)
	if err != nil {
		t.Fatal(err)
	}
	var sa, sc unix.Stat_t
	if err := unix.Fstat(int(a.Fd()), &sa); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fstat(int(c.Fd()), &sc); err != nil {
		t.Fatal(err)
	}
	if sa.Ino == sc.Ino {
		t.Error("different ranges share a namespace")
	}
}

func TestInvalidRange(t *testing.T) {
	tests := []struct {
		name        string
		base, count uint32
	}{
		{"zero-count", 1 << 20, 0},
		{"overflow", 1<<32 - 10, 65536},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Mount("/nonexistent", "/nonexistent", tc.base, tc.count)
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("got %v, want invalid argument", err)
			}
		})
	}
}

func BenchmarkMount(b *testing.B) {
	testutil.RequiresRoot(b)
	src, dst := b.TempDir(), b.TempDir()
	if err := Prepare(7<<20, 65536); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := Mount(src, dst, 7<<20, 65536); err != nil {
			b.Fatal(err)
		}
		if err := unix.Unmount(dst, 0); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkNewUserNS(b *testing.B) {
	testutil.RequiresRoot(b)
	for b.Loop() {
		f, err := newUserNS(8<<20, 65536)
		if err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}
