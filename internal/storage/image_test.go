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
