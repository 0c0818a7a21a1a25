package oci

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// TestThrowawayThreadIsNeverTheMainOne: what runs on a throwaway thread
// (a reset's setns into a sandbox's mount namespace) never runs on the
// main thread: the main thread does not exit when its goroutine ends, and
// /proc/self follows it, so a main thread left in a sandbox's namespace
// would hand every later mountinfo read of the daemon the sandbox's
// mounts. The goroutine that lands on the main thread holds it and hands
// fn to another thread.
func TestThrowawayThreadIsNeverTheMainOne(t *testing.T) {
	var mu sync.Mutex
	var mainTID int
	onMainThread = func() bool {
		mu.Lock()
		defer mu.Unlock()
		tid := unix.Gettid()
		if mainTID == 0 && tid != unix.Getpid() {
			mainTID = tid // the first other thread asked plays a second main one
		}
		return tid == mainTID || tid == unix.Getpid()
	}
	defer func() { onMainThread = func() bool { return unix.Gettid() == unix.Getpid() } }()
	var ran, real int
	if err := onThrowawayThread(func() error {
		ran, real = unix.Gettid(), unix.Getpid()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if ran == 0 || ran == mainTID || ran == real {
		t.Fatalf("fn ran on thread %d; the main one was %d (the process's %d)", ran, mainTID, real)
	}
}

// TestMountPointNeverFollowsSymlinks: the mount points a reset makes in
// a new root (whose layers may come from a sandbox's files or a user's
// template) are made inside it, through directories only: a symlink on
// the way, absolute or relative, is an error and nothing is made where it
// points.
func TestMountPointNeverFollowsSymlinks(t *testing.T) {
	base := t.TempDir()
	root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(root, "etc"), filepath.Join(root, "dev"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"abs": outside, "rel": "../outside", "etc/up": "../../outside", "proc": "/proc"} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(rfd)
	uid := uint32(os.Getuid())
	for _, rel := range []string{"abs/x", "rel/x/y", "etc/up/resolv.conf", "proc/sys", "abs", "proc"} {
		for _, dir := range []bool{true, false} {
			fd, err := mountPoint(rfd, rel, dir, uid)
			if err == nil {
				unix.Close(fd)
				t.Errorf("mountPoint(%q, dir=%v) went through a symlink", rel, dir)
			}
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("made outside the root: %v", ents)
	}
	for _, tc := range []struct {
		rel string
		dir bool
	}{{"dev", true}, {".airlock/airlock-agent", false}, {"run/secrets", true}, {"etc/resolv.conf", false}} {
		fd, err := mountPoint(rfd, tc.rel, tc.dir, uid)
		if err != nil {
			t.Fatalf("mountPoint(%q): %v", tc.rel, err)
		}
		unix.Close(fd)
		fi, err := os.Lstat(filepath.Join(root, tc.rel))
		if err != nil || fi.IsDir() != tc.dir || fi.Mode()&os.ModeSymlink != 0 {
			t.Fatalf("%s: %v %v", tc.rel, fi, err)
		}
	}
}
