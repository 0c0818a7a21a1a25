package template

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/hostcheck"
	"github.com/airlockhq/airlock/internal/storage"
	"github.com/airlockhq/airlock/internal/testutil"
)

const fakeBase = 2 << 20 // host uid of a fake sandbox's root

// mk runs f and fails the test on error.
func mk(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// fakeUpper builds what a sandbox's writable layer looks like on the host
// after a build step.
func fakeUpper(t *testing.T) string {
	t.Helper()
	up := filepath.Join(t.TempDir(), "upper")
	p := func(rel string) string { return filepath.Join(up, rel) }
	for _, d := range []string{"", "etc", "opaque", "home/user", "proc", ".airlock/run", "usr/bin"} {
		mk(t, "mkdir", os.MkdirAll(p(d), 0o755))
	}
	mk(t, "chown", os.Chown(up, fakeBase, fakeBase))
	mk(t, "file", os.WriteFile(p("etc/config"), []byte("conf\n"), 0o640))
	mk(t, "chown", os.Chown(p("etc/config"), fakeBase, fakeBase+1000))
	mk(t, "file", os.WriteFile(p("home/user/notes"), []byte("mine\n"), 0o600))
	mk(t, "chown", os.Chown(p("home/user/notes"), fakeBase+1000, fakeBase+1000))
	mk(t, "chown", os.Chown(p("home/user"), fakeBase+1000, fakeBase+1000))
	// A whiteout, made by the overlay as the mounter (host root).
	mk(t, "whiteout", unix.Mknod(p("etc/gone"), unix.S_IFCHR, 0))
	// An opaque directory with overlay bookkeeping beside it.
	mk(t, "opaque", unix.Setxattr(p("opaque"), "trusted.overlay.opaque", []byte("y"), 0))
	mk(t, "origin", unix.Setxattr(p("opaque"), "trusted.overlay.origin", []byte{0, 1, 2}, 0))
	mk(t, "file", os.WriteFile(p("opaque/new"), []byte("new\n"), 0o644))
	// Hard links, a symlink, setuid, a fifo.
	mk(t, "file", os.WriteFile(p("usr/bin/tool"), []byte("#!/bin/sh\n"), 0o755))
	mk(t, "link", os.Link(p("usr/bin/tool"), p("usr/bin/tool2")))
	mk(t, "symlink", os.Symlink("tool", p("usr/bin/alias")))
	mk(t, "lchown", os.Lchown(p("usr/bin/alias"), fakeBase+5, fakeBase+5))
	mk(t, "file", os.WriteFile(p("usr/bin/su"), []byte("su"), 0o755))
	mk(t, "chmod", unix.Chmod(p("usr/bin/su"), 0o4755))
	mk(t, "fifo", unix.Mkfifo(p("home/user/pipe"), 0o600))
	// File capabilities, version 3, rooted at the sandbox's root.
	caps := make([]byte, 24)
	binary.LittleEndian.PutUint32(caps[0:], 0x03000001) // revision 3, effective
	binary.LittleEndian.PutUint32(caps[4:], 1<<13)      // CAP_NET_RAW permitted
	binary.LittleEndian.PutUint32(caps[20:], fakeBase)
	mk(t, "caps", unix.Setxattr(p("usr/bin/tool"), "security.capability", caps, 0))
	mk(t, "user xattr", unix.Setxattr(p("etc/config"), "user.origin", []byte("test"), 0))
	// A sparse file: 1 GiB long, one page of data in the middle.
	f, err := os.Create(p("sparse"))
	mk(t, "sparse", err)
	mk(t, "truncate", f.Truncate(1<<30))
	_, err = f.WriteAt([]byte("data"), 512<<20)
	mk(t, "write", err)
	f.Close()
	// The runtime's mount points.
	mk(t, "file", os.WriteFile(p(".airlock/airlock-agent"), nil, 0o755))
	mk(t, "times", os.Chtimes(p("etc"), timeAt(1700000000), timeAt(1700000000)))
	return up
}

func TestCaptureUpper(t *testing.T) {
	testutil.RequiresRoot(t)
	up := fakeUpper(t)
	dst := filepath.Join(t.TempDir(), "layer")
	mk(t, "mkdir", os.Mkdir(dst, 0o700))
	stats, err := CaptureUpper(context.Background(), up, dst, IDShift{Base: fakeBase, Count: 65536}, []string{"proc", ".airlock"})
	if err != nil {
		t.Fatal(err)
	}
	if stats.Whiteouts != 1 || stats.Hardlinks != 1 || stats.Symlinks != 1 {
		t.Errorf("stats %+v", stats)
	}
	lst := func(rel string) *unix.Stat_t {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dst, rel), &st); err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		return &st
	}
	t.Run("owners-shifted-back", func(t *testing.T) {
		for _, c := range []struct {
			rel      string
			uid, gid uint32
		}{{"", 0, 0}, {"etc/config", 0, 1000}, {"home/user", 1000, 1000}, {"home/user/notes", 1000, 1000}, {"usr/bin/alias", 5, 5}, {"etc/gone", 0, 0}} {
			if st := lst(c.rel); st.Uid != c.uid || st.Gid != c.gid {
				t.Errorf("/%s owned by %d:%d, want %d:%d", c.rel, st.Uid, st.Gid, c.uid, c.gid)
			}
		}
	})
	t.Run("modes", func(t *testing.T) {
		for _, c := range []struct {
			rel  string
			mode uint32
		}{{"etc/config", unix.S_IFREG | 0o640}, {"usr/bin/su", unix.S_IFREG | 0o4755}, {"home/user/pipe", unix.S_IFIFO | 0o600}, {"etc/gone", unix.S_IFCHR}} {
			if st := lst(c.rel); st.Mode != c.mode {
				t.Errorf("/%s mode %o, want %o", c.rel, st.Mode, c.mode)
			}
		}
		if st := lst("etc/gone"); st.Rdev != 0 {
			t.Errorf("whiteout rdev %d", st.Rdev)
		}
		if st := lst("etc"); st.Mtim.Sec != 1700000000 {
			t.Errorf("directory mtime %d not kept", st.Mtim.Sec)
		}
	})
	t.Run("hardlink-symlink", func(t *testing.T) {
		a, b := lst("usr/bin/tool"), lst("usr/bin/tool2")
		if a.Ino != b.Ino || a.Nlink != 2 {
			t.Errorf("hard link not kept: inodes %d %d, nlink %d", a.Ino, b.Ino, a.Nlink)
		}
		if target, err := os.Readlink(filepath.Join(dst, "usr/bin/alias")); err != nil || target != "tool" {
			t.Errorf("symlink %q %v", target, err)
		}
	})
	t.Run("xattrs", func(t *testing.T) {
		if v, err := getXattr(filepath.Join(dst, "opaque"), "trusted.overlay.opaque"); err != nil || string(v) != "y" {
			t.Errorf("opaque xattr %q %v", v, err)
		}
		if _, err := getXattr(filepath.Join(dst, "opaque"), "trusted.overlay.origin"); !errors.Is(err, unix.ENODATA) {
			t.Errorf("overlay origin copied: %v", err)
		}
		if v, err := getXattr(filepath.Join(dst, "etc/config"), "user.origin"); err != nil || string(v) != "test" {
			t.Errorf("user xattr %q %v", v, err)
		}
		v, err := getXattr(filepath.Join(dst, "usr/bin/tool"), "security.capability")
		if err != nil || len(v) != 20 || binary.LittleEndian.Uint32(v)&0xFF000000 != 0x02000000 || binary.LittleEndian.Uint32(v[4:]) != 1<<13 {
			t.Errorf("capabilities %x %v, want version 2 with CAP_NET_RAW", v, err)
		}
	})
	t.Run("sparse", func(t *testing.T) {
		st := lst("sparse")
		if st.Size != 1<<30 || st.Blocks*512 > 1<<20 {
			t.Errorf("sparse file: size %d, %d bytes on disk", st.Size, st.Blocks*512)
		}
		f, _ := os.Open(filepath.Join(dst, "sparse"))
		defer f.Close()
		b := make([]byte, 4)
		f.ReadAt(b, 512<<20)
		if string(b) != "data" {
			t.Errorf("sparse data %q", b)
		}
	})
	t.Run("excluded", func(t *testing.T) {
		for _, rel := range []string{"proc", ".airlock"} {
			if _, err := os.Lstat(filepath.Join(dst, rel)); !os.IsNotExist(err) {
				t.Errorf("/%s captured: %v", rel, err)
			}
		}
	})
}

func TestCaptureRefusesSymlinkRoot(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	mk(t, "symlink", os.Symlink("/etc", filepath.Join(dir, "upper")))
	dst := filepath.Join(dir, "layer")
	mk(t, "mkdir", os.Mkdir(dst, 0o700))
	if _, err := CaptureUpper(context.Background(), filepath.Join(dir, "upper"), dst, IDShift{Base: fakeBase, Count: 65536}, nil); err == nil {
		t.Fatal("captured through a symlink")
	}
}

// TestCapturedLayerStacks mounts a captured layer over a lower one the way
// every sandbox does: the kernel must honour its whiteout and opaque dir.
func TestCapturedLayerStacks(t *testing.T) {
	testutil.RequiresRoot(t)
	lower := filepath.Join(t.TempDir(), "lower")
	for _, d := range []string{"etc", "opaque", "home/user", "usr/bin"} {
		mk(t, "mkdir", os.MkdirAll(filepath.Join(lower, d), 0o755))
	}
	for _, f := range []string{"etc/gone", "etc/kept", "opaque/old"} {
		mk(t, "file", os.WriteFile(filepath.Join(lower, f), []byte(f), 0o644))
	}
	up := fakeUpper(t)
	layer := filepath.Join(t.TempDir(), "layer")
	mk(t, "mkdir", os.Mkdir(layer, 0o700))
	if _, err := CaptureUpper(context.Background(), up, layer, IDShift{Base: fakeBase, Count: 65536}, []string{"proc", ".airlock"}); err != nil {
		t.Fatal(err)
	}

	t.Run("lookup", func(t *testing.T) {
		roots := []string{lower, layer}
		for rel, want := range map[string]bool{"etc/gone": false, "etc/kept": true, "etc/config": true, "opaque/old": false, "opaque/new": true, "usr/bin/tool": true} {
			if _, ok := LookupLayers(roots, rel); ok != want {
				t.Errorf("LookupLayers(%s) = %v, want %v", rel, ok, want)
			}
		}
	})
	t.Run("overlay", func(t *testing.T) {
		parent := t.TempDir()
		for _, d := range []string{filepath.Dir(parent), parent} {
			os.Chmod(d, 0o711)
		}
		leaks := hostcheck.Take(t, parent)
		const base = 5 << 20
		r, err := storage.Setup(context.Background(), storage.Options{Dir: parent, Layers: []string{lower, layer}, UIDBase: base, IDCount: 65536, SizeMB: 16})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := r.Teardown(context.Background()); err != nil {
				t.Error(err)
			}
			leaks.AssertNoLeaks(t)
		}()
		ls := func(rel string) []string {
			ents, err := os.ReadDir(filepath.Join(r.Path(), rel))
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			return names
		}
		if got := ls("etc"); !slices.Equal(got, []string{"config", "kept"}) {
			t.Errorf("/etc = %v: whiteout not honoured", got)
		}
		if got := ls("opaque"); !slices.Equal(got, []string{"new"}) {
			t.Errorf("/opaque = %v: opaque dir not honoured", got)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(r.Path(), "home/user/notes"), &st); err != nil || st.Uid != base+1000 {
			t.Errorf("/home/user/notes owned by host uid %d (%v), want %d", st.Uid, err, base+1000)
		}
		b, err := os.ReadFile(filepath.Join(r.Path(), "etc/config"))
		if err != nil || !strings.HasPrefix(string(b), "conf") {
			t.Errorf("config %q %v", b, err)
		}
	})
}

func timeAt(sec int64) time.Time { return time.Unix(sec, 0) }
