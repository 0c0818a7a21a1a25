package storage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/hostcheck"
	"github.com/airlockhq/airlock/internal/mountinfo"
	"github.com/airlockhq/airlock/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	testBase  = 2 << 20 // well above real host users
	testCount = 65536
)

// fixture is a small template layer and a parent directory for sandbox dirs.
type fixture struct {
	layer string
	root  string // parent of sandbox dirs, watched by the leak check
}

func newFixture(t testing.TB) fixture {
	t.Helper()
	testutil.RequiresRoot(t)
	top := t.TempDir()
	// The sandbox's root must be able to walk to the test paths from inside
	// its user namespace, where the host's root is nobody.
	for _, d := range []string{filepath.Dir(top), top} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	layer := filepath.Join(top, "layer")
	root := filepath.Join(top, "sandboxes")
	files := []struct {
		path     string
		dir      bool
		uid, gid int
		mode     os.FileMode
		data     string
	}{
		{"", true, 0, 0, 0o755, ""},
		{"etc", true, 0, 0, 0o755, ""},
		{"etc/passwd", false, 0, 0, 0o644, "root:x:0:0::/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n"},
		{"home", true, 0, 0, 0o755, ""},
		{"home/user", true, 1000, 1000, 0o750, ""},
		{"home/user/notes", false, 1000, 1000, 0o640, "hello"},
		{"tmp", true, 0, 0, os.ModeSticky | 0o777, ""},
	}
	for _, f := range files {
		p := filepath.Join(layer, f.path)
		var err error
		if f.dir {
			err = os.MkdirAll(p, 0o755)
		} else {
			err = os.WriteFile(p, []byte(f.data), 0o644)
		}
		if err == nil {
			err = os.Chown(p, f.uid, f.gid)
		}
		if err == nil {
			err = os.Chmod(p, f.mode)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(root, 0o711); err != nil {
		t.Fatal(err)
	}
	return fixture{layer: layer, root: root}
}

func (f fixture) dir(t testing.TB, name string) string {
	t.Helper()
	d := filepath.Join(f.root, name)
	if err := os.Mkdir(d, 0o711); err != nil {
		t.Fatal(err)
	}
	return d
}

func (f fixture) opts(dir string, tmpfs bool) Options {
	return Options{Dir: dir, Layers: []string{f.layer}, UIDBase: testBase, IDCount: testCount, SizeMB: 32, Tmpfs: tmpfs}
}

// teardownOnFail makes sure a failing test does not leave mounts behind.
func teardownOnFail(t testing.TB, dir string) {
	t.Cleanup(func() {
		if err := TeardownDir(context.Background(), dir); err != nil {
			t.Errorf("cleanup teardown: %v", err)
		}
	})
}

var modes = []struct {
	name  string
	tmpfs bool
}{{"ext4", false}, {"tmpfs", true}}

func TestSetupTeardown(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			f := newFixture(t)
			leaks := hostcheck.Take(t, f.root)
			dir := f.dir(t, "sbx")
			teardownOnFail(t, dir)

			r, err := Setup(context.Background(), f.opts(dir, mode.tmpfs))
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(dir, "rootfs"); r.Path() != want {
				t.Errorf("Path() = %s, want %s", r.Path(), want)
			}
			assertMounted(t, r.Path(), "overlay")

			t.Run("owners-on-host", func(t *testing.T) {
				for _, c := range []struct {
					path     string
					uid, gid uint32
				}{
					{"", testBase, testBase},
					{"etc/passwd", testBase, testBase},
					{"home/user", testBase + 1000, testBase + 1000},
					{"home/user/notes", testBase + 1000, testBase + 1000},
				} {
					var st unix.Stat_t
					if err := unix.Stat(filepath.Join(r.Path(), c.path), &st); err != nil {
						t.Fatal(err)
					}
					if st.Uid != c.uid || st.Gid != c.gid {
						t.Errorf("/%s owned by %d:%d, want %d:%d", c.path, st.Uid, st.Gid, c.uid, c.gid)
					}
				}
			})
			t.Run("owners-in-userns", func(t *testing.T) {
				got := statInUserNS(t, r.Path(), "", "etc/passwd", "home/user", "home/user/notes", "tmp")
				want := "0:0 755\n0:0 644\n1000:1000 750\n1000:1000 640\n0:0 1777\n"
				if got != want {
					t.Errorf("inside the user namespace:\n%swant:\n%s", got, want)
				}
			})
			t.Run("writes-stay-in-sandbox", func(t *testing.T) {
				p := filepath.Join(r.Path(), "etc/passwd")
				if err := os.WriteFile(p, []byte("changed\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(r.Path(), "tmp/new"), []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
				b, err := os.ReadFile(filepath.Join(f.layer, "etc/passwd"))
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(string(b), "changed") {
					t.Error("write through the overlay reached the template")
				}
				if _, err := os.Stat(filepath.Join(f.layer, "tmp/new")); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("new file appeared in the template: %v", err)
				}
				var st unix.Stat_t
				if err := unix.Stat(p, &st); err != nil {
					t.Fatal(err)
				}
				if st.Uid != testBase {
					t.Errorf("copied-up file owned by %d, want %d", st.Uid, testBase)
				}
			})
			t.Run("usage", func(t *testing.T) {
				used0, written0, err := Usage(dir)
				if err != nil {
					t.Fatal(err)
				}
				data := make([]byte, 4<<20)
				for i := range data {
					data[i] = byte(i) // incompressible enough, and not a hole
				}
				p := filepath.Join(r.Path(), "tmp/blob")
				if err := os.WriteFile(p, data, 0o644); err != nil {
					t.Fatal(err)
				}
				syncFile(t, p)
				used1, written1, err := Usage(dir)
				if err != nil {
					t.Fatal(err)
				}
				if used1 < used0+uint64(len(data)) {
					t.Errorf("used %d -> %d after writing %d bytes", used0, used1, len(data))
				}
				if written1 < written0+uint64(len(data)) {
					t.Errorf("written %d -> %d after writing %d bytes", written0, written1, len(data))
				}
				if err := os.Remove(p); err != nil {
					t.Fatal(err)
				}
				syncFile(t, filepath.Join(r.Path(), "tmp"))
				used2, written2, err := Usage(dir)
				if err != nil {
					t.Fatal(err)
				}
				if used2 >= used1 {
					t.Errorf("used did not drop after delete: %d -> %d", used1, used2)
				}
				if !mode.tmpfs && written2 < written1 {
					t.Errorf("written went down: %d -> %d", written1, written2)
				}
			})

			if err := r.Teardown(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := r.Teardown(context.Background()); err != nil {
				t.Errorf("second teardown: %v", err)
			}
			for _, name := range []string{"rootfs", "storage"} {
				if _, err := os.Lstat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s left after teardown: %v", name, err)
				}
			}
			if _, _, err := Usage(dir); !errdefs.IsNotFound(err) {
				t.Errorf("Usage after teardown: %v, want not found", err)
			}
			if err := os.Remove(dir); err != nil {
				t.Errorf("sandbox dir not empty after teardown: %v", err)
			}
			leaks.AssertNoLeaks(t)
		})
	}
}

func syncFile(t testing.TB, p string) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// statInUserNS stats paths under root from a process in a user namespace
// with the sandbox's mapping, as the sandbox's processes would see them.
func statInUserNS(t *testing.T, root string, paths ...string) string {
	t.Helper()
	stat := testutil.RequiresBinary(t, "stat")
	args := []string{"-c", "%u:%g %a"}
	for _, p := range paths {
		args = append(args, filepath.Join(root, p))
	}
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: testBase, Size: testCount}}
	cmd := exec.Command(stat, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: m,
		GidMappings: m,
		// Become the namespace's root, as the sandbox's init is.
		Credential: &syscall.Credential{Uid: 0, Gid: 0},
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("stat in user namespace: %v: %s", err, out)
	}
	return string(out)
}

func assertMounted(t testing.TB, target, fstype string) {
	t.Helper()
	all, err := mountinfo.Read()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range all {
		if m.Target == target && m.FSType == fstype {
			return
		}
	}
	t.Errorf("no %s mount at %s", fstype, target)
}

func TestDiskFull(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			f := newFixture(t)
			dir := f.dir(t, "sbx")
			teardownOnFail(t, dir)
			opts := f.opts(dir, mode.tmpfs)
			opts.SizeMB = 16
			r, err := Setup(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(r.Path(), "tmp/fill")
			n, err := fill(p)
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling the layer: %v, want ENOSPC", err)
			}
			if limit := opts.SizeMB << 20; n > limit || n < limit/2 {
				t.Errorf("wrote %d bytes before ENOSPC into a %d byte layer", n, limit)
			}
			if _, err := os.Stat(filepath.Join(f.layer, "tmp/fill")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("fill reached the template: %v", err)
			}
			// Still usable: freeing space lets the sandbox write again.
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(r.Path(), "tmp/after"), make([]byte, 1<<20), 0o644); err != nil {
				t.Errorf("write after freeing space: %v", err)
			}
			if err := r.Teardown(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPrivateDir: the private dir is host root's, 0700, on the writable
// layer's own file system (so a file there fills the quota and stops at
// it), and absent from the sandbox's root; without a mounted layer there is
// none, and a layer set up without one gets one.
func TestPrivateDir(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			f := newFixture(t)
			dir := f.dir(t, "sbx")
			teardownOnFail(t, dir)
			if _, err := PrivateDir(dir); !errdefs.IsNotFound(err) {
				t.Errorf("PrivateDir before Setup: %v, want not found", err)
			}
			opts := f.opts(dir, mode.tmpfs)
			opts.SizeMB = 16
			r, err := Setup(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			p, err := PrivateDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			var st, rw unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil || unix.Stat(filepath.Join(dir, storageName, rwName), &rw) != nil {
				t.Fatal(err)
			}
			if st.Uid != 0 || st.Mode&0o7777 != 0o700 || st.Dev != rw.Dev {
				t.Errorf("private dir: uid %d mode %o dev %d, want host root's, 0700, on the layer (dev %d)", st.Uid, st.Mode&0o7777, st.Dev, rw.Dev)
			}
			if out := listDir(t, r.Path()); strings.Contains(out, privateName) {
				t.Errorf("the private dir shows in the sandbox's root: %s", out)
			}
			n, err := fill(filepath.Join(p, "log"))
			if !errors.Is(err, syscall.ENOSPC) || n > opts.SizeMB<<20 {
				t.Errorf("wrote %d bytes into the private dir of a %d MiB layer (%v), want ENOSPC within it", n, opts.SizeMB, err)
			}
			if err := os.Remove(filepath.Join(p, "log")); err != nil {
				t.Fatal(err)
			}
			// A layer of an earlier version had none.
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if q, err := PrivateDir(dir); err != nil || q != p {
				t.Errorf("PrivateDir of a layer without one: %q, %v", q, err)
			}
			if err := r.Teardown(context.Background()); err != nil {
				t.Fatal(err)
			}
			if _, err := PrivateDir(dir); !errdefs.IsNotFound(err) {
				t.Errorf("PrivateDir after Teardown: %v, want not found", err)
			}
		})
	}
}

// TestUpperDir: the upper directory holds what was written through the
// merged root, owned by the sandbox's uid base, and not what the host keeps
// beside it (the private dir); without a mounted layer there is none.
func TestUpperDir(t *testing.T) {
	f := newFixture(t)
	dir := f.dir(t, "sbx")
	teardownOnFail(t, dir)
	if _, err := UpperDir(dir); !errdefs.IsNotFound(err) {
		t.Errorf("UpperDir before Setup: %v, want not found", err)
	}
	opts := f.opts(dir, false)
	r, err := Setup(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.Path(), "written"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(r.Path(), "written"), int(opts.UIDBase)+5, int(opts.UIDBase)+5); err != nil {
		t.Fatal(err)
	}
	if _, err := PrivateDir(dir); err != nil {
		t.Fatal(err)
	}
	up, err := UpperDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(up, "written"), &st); err != nil || st.Uid != opts.UIDBase+5 {
		t.Errorf("file written through the root: uid %d (%v) in the upper dir, want %d", st.Uid, err, opts.UIDBase+5)
	}
	if _, err := os.Lstat(filepath.Join(up, privateName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the private dir is in the upper dir: %v", err)
	}
	if err := r.Teardown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := UpperDir(dir); !errdefs.IsNotFound(err) {
		t.Errorf("UpperDir after Teardown: %v, want not found", err)
	}
}

// fill writes 1 MiB chunks to p until a write fails; it returns the bytes
// written and the error.
func fill(p string) (int64, error) {
	fh, err := os.Create(p)
	if err != nil {
		return 0, err
	}
	defer fh.Close()
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = 0xa5
	}
	var n int64
	for n < 1<<30 {
		w, err := fh.Write(chunk)
		n += int64(w)
		if err != nil {
			return n, err
		}
	}
	if err := fh.Sync(); err != nil {
		return n, err
	}
	return n, errors.New("layer never filled")
}

func TestNoLeaks(t *testing.T) {
	f := newFixture(t)
	leaks := hostcheck.Take(t, f.root)
	for i := range 20 {
		dir := f.dir(t, fmt.Sprintf("sbx%d", i))
		teardownOnFail(t, dir)
		opts := f.opts(dir, i%4 == 3)
		opts.UIDBase = testBase + uint32(i%3)*testCount // a few ranges, reused
		r, err := Setup(context.Background(), opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(r.Path(), "tmp/x"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := r.Teardown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(dir); err != nil {
			t.Fatal(err)
		}
	}
	leaks.AssertNoLeaks(t)
}

func TestConcurrentSetup(t *testing.T) {
	f := newFixture(t)
	leaks := hostcheck.Take(t, f.root)
	const n = 8
	errs := make(chan error, n)
	for i := range n {
		dir := f.dir(t, fmt.Sprintf("sbx%d", i))
		teardownOnFail(t, dir)
		go func() {
			opts := f.opts(dir, false)
			opts.UIDBase = testBase + uint32(10+i)*testCount // new ranges: namespaces made concurrently
			r, err := Setup(context.Background(), opts)
			if err == nil {
				if _, err = os.Stat(filepath.Join(r.Path(), "etc/passwd")); err == nil {
					err = r.Teardown(context.Background())
				}
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	for i := range n {
		if err := os.Remove(filepath.Join(f.root, fmt.Sprintf("sbx%d", i))); err != nil {
			t.Error(err)
		}
	}
	leaks.AssertNoLeaks(t)
}

func TestSetupFailsCleanly(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(t *testing.T, o *Options)
		class  error
	}{
		{
			// The second layer cannot be idmapped (procfs), so Setup fails
			// after the image, the loop device and the first layer are mounted.
			name:   "unidmappable-layer",
			mutate: func(t *testing.T, o *Options) { o.Layers = append(o.Layers, "/proc/sys") },
			class:  errdefs.ErrRuntimeUnavailable,
		},
		{
			name:   "unidmappable-layer-tmpfs",
			mutate: func(t *testing.T, o *Options) { o.Tmpfs = true; o.Layers = append(o.Layers, "/proc/sys") },
			class:  errdefs.ErrRuntimeUnavailable,
		},
		{
			name:   "missing-layer",
			mutate: func(t *testing.T, o *Options) { o.Layers = []string{filepath.Join(o.Dir, "nope")} },
			class:  errdefs.ErrNotFound,
		},
		{
			name:   "too-small",
			mutate: func(t *testing.T, o *Options) { o.SizeMB = 1 },
			class:  errdefs.ErrInvalidArgument,
		},
		{
			name:   "relative-dir",
			mutate: func(t *testing.T, o *Options) { o.Dir = "sandboxes/x" },
			class:  errdefs.ErrInvalidArgument,
		},
		{
			name:   "no-layers",
			mutate: func(t *testing.T, o *Options) { o.Layers = nil },
			class:  errdefs.ErrInvalidArgument,
		},
		{
			name:   "id-range-overflow",
			mutate: func(t *testing.T, o *Options) { o.UIDBase = 1<<32 - 100 },
			class:  errdefs.ErrInvalidArgument,
		},
		{
			name: "already-set-up",
			mutate: func(t *testing.T, o *Options) {
				// The caller's own file must survive the refusal.
				if err := os.Mkdir(filepath.Join(o.Dir, "rootfs"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(o.Dir, "rootfs", "keep"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			},
			class: errdefs.ErrAlreadyExists,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			dir := f.dir(t, "sbx")
			teardownOnFail(t, dir)
			opts := f.opts(dir, false)
			tc.mutate(t, &opts)
			before := listDir(t, dir)
			leaks := hostcheck.Take(t, f.root)
			r, err := Setup(context.Background(), opts)
			if err == nil {
				r.Teardown(context.Background())
				t.Fatal("Setup succeeded")
			}
			if !errors.Is(err, tc.class) {
				t.Errorf("error %v, want class %v", err, tc.class)
			}
			if after := listDir(t, dir); after != before {
				t.Errorf("sandbox dir changed by a failed Setup: %q -> %q", before, after)
			}
			leaks.AssertNoLeaks(t)
		})
	}
}

func TestSetupCancelled(t *testing.T) {
	f := newFixture(t)
	dir := f.dir(t, "sbx")
	teardownOnFail(t, dir)
	leaks := hostcheck.Take(t, f.root)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Setup(ctx, f.opts(dir, false)); !errors.Is(err, context.Canceled) {
		t.Errorf("Setup on a cancelled context: %v", err)
	}
	leaks.AssertNoLeaks(t)
}

func listDir(t *testing.T, dir string) string {
	t.Helper()
	var names []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		names = append(names, strings.TrimPrefix(p, dir))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(names, " ")
}

func TestTeardownDirHalfSetUp(t *testing.T) {
	tests := []struct {
		name string
		// damage damages the setup; the func it returns, if any, runs after
		// TeardownDir and before the leak check.
		damage func(t *testing.T, dir string, r *Rootfs) func()
	}{
		{"complete", func(*testing.T, string, *Rootfs) func() { return nil }},
		{"overlay-unmounted", func(t *testing.T, dir string, r *Rootfs) func() {
			if err := unix.Unmount(r.Path(), 0); err != nil {
				t.Fatal(err)
			}
			return nil
		}},
		{"busy", func(t *testing.T, dir string, r *Rootfs) func() {
			// A host process still has a file open in the sandbox: the tree
			// is detached lazily and the loop device goes with the last close.
			f, err := os.Create(filepath.Join(r.Path(), "tmp", "open"))
			if err != nil {
				t.Fatal(err)
			}
			return func() { f.Close() }
		}},
		{"stacked-mount-on-rootfs", func(t *testing.T, dir string, r *Rootfs) func() {
			// Something (a runtime, an operator) mounted over the rootfs.
			if err := unix.Mount("tmpfs", filepath.Join(r.Path(), "tmp"), "tmpfs", 0, "size=1m"); err != nil {
				t.Fatal(err)
			}
			if err := unix.Mount("tmpfs", r.Path(), "tmpfs", 0, "size=1m"); err != nil {
				t.Fatal(err)
			}
			return nil
		}},
		{"loop-without-autoclear", func(t *testing.T, dir string, r *Rootfs) func() {
			// As left by a daemon that died between attaching a device
			// and mounting it, on a kernel path without autoclear.
			img := filepath.Join(dir, "storage", "stray.img")
			if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
				t.Fatal(err)
			}
			dev, err := attachLoop(img)
			if err != nil {
				t.Fatal(err)
			}
			info, err := unix.IoctlLoopGetStatus64(int(dev.Fd()))
			if err != nil {
				t.Fatal(err)
			}
			info.Flags &^= unix.LO_FLAGS_AUTOCLEAR
			if err := unix.IoctlLoopSetStatus64(int(dev.Fd()), info); err != nil {
				t.Fatal(err)
			}
			dev.Close()
			return nil
		}},
		{"storage-dir-only", func(t *testing.T, dir string, r *Rootfs) func() {
			if err := r.Teardown(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Join(dir, "storage", "lower", "0"), 0o700); err != nil {
				t.Fatal(err)
			}
			return nil
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			dir := f.dir(t, "sbx")
			teardownOnFail(t, dir)
			// The caller's files next to storage's must survive.
			if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte("{}"), 0o644); err != nil {
				t.Fatal(err)
			}
			leaks := hostcheck.Take(t, f.root)
			r, err := Setup(context.Background(), f.opts(dir, false))
			if err != nil {
				t.Fatal(err)
			}
			release := tc.damage(t, dir, r)
			// A fresh context that is already cancelled: teardown must not care.
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if err := TeardownDir(ctx, dir); err != nil {
				t.Fatal(err)
			}
			if err := TeardownDir(ctx, dir); err != nil {
				t.Errorf("second TeardownDir: %v", err)
			}
			if got := listDir(t, dir); got != " /config.json" {
				t.Errorf("left in sandbox dir: %q", got)
			}
			if release != nil {
				release()
			}
			leaks.AssertNoLeaks(t)
		})
	}
}

func TestTeardownDirMissing(t *testing.T) {
	if err := TeardownDir(context.Background(), filepath.Join(t.TempDir(), "gone")); err != nil {
		t.Errorf("TeardownDir of a missing dir: %v", err)
	}
	if err := TeardownDir(context.Background(), "relative"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("TeardownDir of a relative dir: %v", err)
	}
}

func BenchmarkSetupTeardown(b *testing.B) {
	for _, mode := range modes {
		b.Run(mode.name, func(b *testing.B) {
			f := newFixture(b)
			dir := f.dir(b, "sbx")
			teardownOnFail(b, dir)
			opts := f.opts(dir, mode.tmpfs)
			opts.SizeMB = 1024
			for b.Loop() {
				r, err := Setup(context.Background(), opts)
				if err != nil {
					b.Fatal(err)
				}
				if err := r.Teardown(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
