package agent

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fuzzRoot is a sandbox root with links that try to leave it, beside a
// file outside it that nothing may reach.
func fuzzRoot(f *testing.F) (base, root string) {
	base = f.TempDir()
	root = filepath.Join(base, "root")
	for _, d := range []string{"home/user/a", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			f.Fatal(err)
		}
	}
	must := func(err error) {
		if err != nil {
			f.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(base, "outside"), []byte("host"), 0o600))
	must(os.WriteFile(filepath.Join(root, "etc/hostname"), []byte("sbx"), 0o644))
	for link, target := range map[string]string{
		"home/user/up": "../../..", "home/user/abs": "/", "home/user/out": "../../../outside",
		"home/user/loop": "loop", "home/user/a/back": "..", "proc-self": "/proc/self/root",
	} {
		must(os.Symlink(target, filepath.Join(root, link)))
	}
	return base, root
}

// inside reports whether the file behind fd is root or below it.
func inside(fd int, root string) (string, bool) {
	got, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return err.Error(), false
	}
	return got, got == root || strings.HasPrefix(got, root+"/")
}

// FuzzOpenInRoot: whatever path a client sends, cleaned as the agent
// cleans it, opens only what is inside the sandbox's root, whatever links
// are on the way (openat2 RESOLVE_IN_ROOT).
func FuzzOpenInRoot(f *testing.F) {
	if !hasOpenat2() {
		f.Skip("the kernel has no openat2")
	}
	_, root := fuzzRoot(f)
	r, err := openFSRoot(root)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(r.close)
	for _, s := range []string{"a", "up", "up/outside", "abs/etc/hostname", "out", "../../../outside", "/..", "loop",
		"a/back/up/..", "/proc-self/etc", "~/x", "/home/user/a/back/back/back/outside", ".", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		cp, err := cleanPath(p, "/home/user")
		if err != nil {
			return
		}
		if !strings.HasPrefix(cp, "/") || strings.Contains(cp, "/../") || strings.HasSuffix(cp, "/..") {
			t.Fatalf("cleanPath(%q) = %q: not clean and absolute", p, cp)
		}
		for _, nofollow := range []int{0, unix.O_NOFOLLOW} {
			fd, err := r.open(cp, unix.O_PATH|nofollow, 0)
			if err != nil {
				continue
			}
			got, ok := inside(fd, root)
			unix.Close(fd)
			if !ok {
				t.Fatalf("open(%q) reached %s, outside the root", cp, got)
			}
		}
		if cp != "/" {
			if fd, _, err := r.openParent(cp); err == nil {
				got, ok := inside(fd, root)
				unix.Close(fd)
				if !ok {
					t.Fatalf("openParent(%q) reached %s, outside the root", cp, got)
				}
			}
		}
	})
}

type fuzzEntry struct {
	name, link string
	typ        byte
	body       string
	mode       int64
}

func tarOf(entries ...fuzzEntry) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		tw.WriteHeader(&tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Size: int64(len(e.body)), Mode: mode})
		tw.Write([]byte(e.body))
	}
	tw.Close()
	return b.Bytes()
}

// FuzzUnpack: an uploaded archive, whatever it holds (links out, `..`,
// links then files through them, hard links to host files, setuid bits),
// writes only below the directory it is unpacked into.
func FuzzUnpack(f *testing.F) {
	f.Add(tarOf(fuzzEntry{name: "a/b.txt", typ: tar.TypeReg, body: "x"}))
	f.Add(tarOf(fuzzEntry{name: "l", typ: tar.TypeSymlink, link: "/"}, fuzzEntry{name: "l/escaped", typ: tar.TypeReg, body: "x"}))
	f.Add(tarOf(fuzzEntry{name: "u", typ: tar.TypeSymlink, link: "../.."}, fuzzEntry{name: "u/outside", typ: tar.TypeReg, body: "x"}))
	f.Add(tarOf(fuzzEntry{name: "../outside", typ: tar.TypeReg, body: "x"}))
	f.Add(tarOf(fuzzEntry{name: "h", typ: tar.TypeLink, link: "../outside"}))
	f.Add(tarOf(fuzzEntry{name: "s", typ: tar.TypeReg, body: "x", mode: 0o4755}, fuzzEntry{name: "d/", typ: tar.TypeDir, mode: 0o2777}))
	f.Add(tarOf(fuzzEntry{name: "d", typ: tar.TypeDir}, fuzzEntry{name: "d", typ: tar.TypeSymlink, link: "/"}, fuzzEntry{name: "d/x", typ: tar.TypeReg}))
	f.Add(tarOf(fuzzEntry{name: "p", typ: tar.TypeFifo}, fuzzEntry{name: "p", typ: tar.TypeReg, body: "x"}))
	f.Add([]byte("not a tar"))
	f.Fuzz(func(t *testing.T, archive []byte) {
		base := t.TempDir()
		root := filepath.Join(base, "root")
		if err := os.Mkdir(root, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(base, "outside"), []byte("host"), 0o600); err != nil {
			t.Fatal(err)
		}
		dfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(dfd)
		done := make(chan struct{})
		go func() { _ = unpack(dfd, tar.NewReader(bytes.NewReader(archive))); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			// An unpack that blocks (a FIFO opened for writing) hangs the
			// upload: fail with where it waits.
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("unpack hangs on %q\n%s", archive, buf[:n])
		}
		ents, _ := os.ReadDir(base)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if !slices.Equal(names, []string{"outside", "root"}) {
			t.Fatalf("beside the unpack root: %v", names)
		}
		if b, err := os.ReadFile(filepath.Join(base, "outside")); err != nil || string(b) != "host" {
			t.Fatalf("the file outside changed: %q %v", b, err)
		}
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(base, "outside"), &st); err != nil || st.Nlink != 1 {
			t.Fatalf("the file outside got a hard link: %d %v", st.Nlink, err)
		}
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.Type()&os.ModeSymlink != 0 {
				return nil
			}
			if fi, err := d.Info(); err == nil && fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
				t.Fatalf("%s has a set-id bit: %v", p, fi.Mode())
			}
			return nil
		})
	})
}
