package storage

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/airlockhq/airlock/internal/testutil"
)

func TestImageFromCacheIsValid(t *testing.T) {
	testutil.RequiresRoot(t)
	fsck := testutil.RequiresBinary(t, "e2fsck")
	dir := t.TempDir()
	const size = 48 // a size no other test uses, so the first image runs mkfs
	first, second := filepath.Join(dir, "a.img"), filepath.Join(dir, "b.img")
	if err := makeImage(context.Background(), first, size); err != nil {
		t.Fatal(err)
	}
	imageCache.Lock()
	_, cached := imageCache.bySize[size]
	imageCache.Unlock()
	if !cached {
		t.Fatal("first image of a size was not cached")
	}
	if err := makeImage(context.Background(), second, size); err != nil {
		t.Fatal(err)
	}
	a, err := os.ReadFile(first)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(second)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Error("image from the cache differs from the mkfs image")
	}
	out, err := exec.Command(fsck, "-fn", second).CombinedOutput()
	if err != nil {
		t.Errorf("e2fsck of the cached image: %v\n%s", err, out)
	}
	st, sa := statBlocks(t, second), statBlocks(t, first)
	if st > sa || st*512 > 4<<20 {
		t.Errorf("cached image uses %d blocks on disk (mkfs image %d): not sparse", st, sa)
	}
}

func statBlocks(t *testing.T, p string) int64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Blocks
}

func TestUnallocated(t *testing.T) {
	const size = 64 << 20
	tests := []struct {
		name    string
		image   bool  // a disk.img exists
		written int64 // bytes written at its start
	}{
		{"tmpfs_or_none", false, 0},
		{"empty", true, 0},
		{"partly_written", true, 8 << 20},
		{"full", true, size},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.image {
				if err := os.Mkdir(filepath.Join(dir, storageName), 0o700); err != nil {
					t.Fatal(err)
				}
				f, err := os.Create(filepath.Join(dir, storageName, imageName))
				if err != nil {
					t.Fatal(err)
				}
				err = f.Truncate(size)
				if err == nil && tc.written > 0 {
					_, err = f.WriteAt(bytes.Repeat([]byte{1}, int(tc.written)), 0)
				}
				if cerr := f.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			got, err := Unallocated(dir)
			if err != nil {
				t.Fatal(err)
			}
			want := int64(0)
			if tc.image {
				want = size - tc.written
			}
			// The host file system may allocate a few blocks more (extent
			// tree) or fewer (compression): allow 1 MiB of slack.
			if d := got - want; d < -(1<<20) || d > 1<<20 {
				t.Errorf("Unallocated = %d, want about %d", got, want)
			}
		})
	}
}
