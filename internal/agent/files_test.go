package agent_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agent"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/testutil"
)

// fileEnv is an agent whose file root is a temp dir laid out like a sandbox:
// /home/user (uid 1000) and /srv (root-owned, 0755).
type fileEnv struct {
	*env
	dir string // the root on the host
}

func newFileEnv(t *testing.T, mod ...func(*agent.Config)) *fileEnv {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"home/user", "srv", "etc"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(filepath.Join(dir, "home/user"), 1000, 1000); err != nil {
			t.Fatal(err)
		}
	}
	mods := append([]func(*agent.Config){func(c *agent.Config) {
		c.Root = dir
		uid := "1000"
		if os.Geteuid() != 0 {
			uid = strconv.Itoa(os.Geteuid())
		}
		passwd := filepath.Join(t.TempDir(), "passwd")
		writeFile(t, passwd, "root:x:0:0:root:/root:/bin/sh\nuser:x:"+uid+":"+uid+"::/home/user:/bin/sh\n")
		c.PasswdFile = passwd
	}}, mod...)
	return &fileEnv{env: newEnv(t, mods...), dir: dir}
}

func (f *fileEnv) host(p string) string { return filepath.Join(f.dir, p) }

func (f *fileEnv) write(t *testing.T, p, user, content string) {
	t.Helper()
	n, err := f.c.WriteFile(ctxT(t), p, user, 0, strings.NewReader(content), 0)
	if err != nil {
		t.Fatalf("WriteFile %s: %v", p, err)
	}
	if n != int64(len(content)) {
		t.Fatalf("wrote %d of %d", n, len(content))
	}
}

func (f *fileEnv) read(t *testing.T, p, user string) (string, error) {
	t.Helper()
	rc, _, err := f.c.ReadFile(ctxT(t), p, user)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	return string(b), err
}

func TestWriteReadRoundTrip(t *testing.T) {
	f := newFileEnv(t)
	ctx := ctxT(t)
	tests := []struct {
		name, path string
		mode       os.FileMode
		size       int
		hostPath   string
		wantMode   uint32
	}{
		{"relative_to_home", "a.txt", 0, 10, "home/user/a.txt", 0o644},
		{"absolute", "/home/user/b.bin", 0o600, 1 << 20, "home/user/b.bin", 0o600},
		{"creates_parents", "/home/user/x/y/z.txt", 0o640, 3, "home/user/x/y/z.txt", 0o640},
		{"empty", "/home/user/empty", 0, 0, "home/user/empty", 0o644},
		{"large_odd_size", "/home/user/big", 0, 3<<20 + 17, "home/user/big", 0o644},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := bytes.Repeat([]byte("0123456789abcdef"), tt.size/16+1)[:tt.size]
			n, err := f.c.WriteFile(ctx, tt.path, "", tt.mode, bytes.NewReader(data), 0)
			if err != nil || n != int64(tt.size) {
				t.Fatalf("WriteFile = %d, %v", n, err)
			}
			onHost, err := os.ReadFile(f.host(tt.hostPath))
			if err != nil || !bytes.Equal(onHost, data) {
				t.Fatalf("host file: %v, equal %v", err, bytes.Equal(onHost, data))
			}
			rc, fi, err := f.c.ReadFile(ctx, tt.path, "")
			if err != nil {
				t.Fatal(err)
			}
			back, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || !bytes.Equal(back, data) {
				t.Fatalf("read back %d bytes, %v", len(back), err)
			}
			if fi.Size != int64(tt.size) || fi.Type != agentproto.FileTypeFile || fi.Mode != tt.wantMode {
				t.Fatalf("info %+v", fi)
			}
			if os.Geteuid() == 0 && fi.Uid != 1000 {
				t.Fatalf("owner %d, want 1000", fi.Uid)
			}
		})
	}
	t.Run("overwrite_keeps_mode", func(t *testing.T) {
		if _, err := f.c.WriteFile(ctx, "keep", "", 0o600, strings.NewReader("v1"), 0); err != nil {
			t.Fatal(err)
		}
		f.write(t, "keep", "", "v2")
		fi, err := f.c.Stat(ctx, "keep", "")
		if err != nil || fi.Mode != 0o600 || fi.Size != 2 {
			t.Fatalf("stat %+v %v", fi, err)
		}
	})
	t.Run("no_temp_files_left", func(t *testing.T) {
		entries, _ := os.ReadDir(f.host("home/user"))
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".airlock-upload-") {
				t.Fatalf("temp file left: %s", e.Name())
			}
		}
	})
}

func TestWriteFileTooLarge(t *testing.T) {
	f := newFileEnv(t)
	ctx := ctxT(t)
	f.write(t, "/home/user/capped", "", "original")
	big := bytes.Repeat([]byte("x"), 8<<20)
	_, err := f.c.WriteFile(ctx, "/home/user/capped", "", 0, bytes.NewReader(big), 1000)
	if !errors.Is(err, errdefs.ErrTooLarge) {
		t.Fatalf("err = %v, want too large", err)
	}
	if got, _ := f.read(t, "/home/user/capped", ""); got != "original" {
		t.Fatalf("file changed to %d bytes", len(got))
	}
	if n, err := f.c.WriteFile(ctx, "/home/user/exact", "", 0, bytes.NewReader(big[:1000]), 1000); err != nil || n != 1000 {
		t.Fatalf("exactly the limit: %d %v", n, err)
	}
	entries, _ := os.ReadDir(f.host("home/user"))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".airlock-upload-") {
			t.Fatalf("temp file left: %s", e.Name())
		}
	}
	// The session still works after the aborted upload.
	if err := f.c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

// failingReader fails after some bytes, like a client body that breaks.
type failingReader struct{ n int }

func (r *failingReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, errors.New("body broke")
	}
	n := min(len(p), r.n)
	clear(p[:n])
	r.n -= n
	return n, nil
}

func TestWriteFileSourceError(t *testing.T) {
	f := newFileEnv(t)
	ctx := ctxT(t)
	_, err := f.c.WriteFile(ctx, "/home/user/broken", "", 0, &failingReader{n: 1 << 20}, 0)
	if err == nil || !strings.Contains(err.Error(), "body broke") {
		t.Fatalf("err = %v", err)
	}
	if _, err := f.c.Stat(ctx, "/home/user/broken", ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("partial upload became a file: %v", err)
	}
}

func TestStat(t *testing.T) {
	f := newFileEnv(t)
	ctx := ctxT(t)
	f.write(t, "/home/user/file", "", "12345")
	if err := os.Symlink("file", f.host("home/user/link")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path, typ, target string
		size              int64
	}{
		{"/home/user/file", "file", "", 5},
		{"/home/user", "dir", "", -1},
		{"/home/user/link", "symlink", "file", 4},
		{"/", "dir", "", -1},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			fi, err := f.c.Stat(ctx, tt.path, "")
			if err != nil {
				t.Fatal(err)
			}
			if fi.Type != tt.typ || fi.LinkTarget != tt.target || fi.Path != tt.path || (tt.size >= 0 && fi.Size != tt.size) {
				t.Fatalf("stat %+v", fi)
			}
			if time.Since(fi.ModTime) > time.Hour {
				t.Fatalf("mod time %v", fi.ModTime)
			}
		})
	}
	if _, err := f.c.Stat(ctx, "/home/user/missing", ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing: %v", err)
	}
	if _, err := f.c.Stat(ctx, "/home/user/file/below", ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("below a file: %v", err)
	}
}

func TestList(t *testing.T) {
	f := newFileEnv(t)
	ctx := ctxT(t)
	for _, p := range []string{"d/a", "d/sub/b", "d/sub/deeper/c"} {
		f.write(t, "/home/user/"+p, "", "x")
	}
	if err := os.Symlink("/srv", f.host("home/user/d/lnk")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, f.host("srv/not-listed"), "x")
	names := func(files []agentproto.FileInfo) []string {
		var out []string
		for _, fi := range files {
			out = append(out, strings.TrimPrefix(fi.Path, "/home/user/d/")+":"+fi.Type)
		}
		return out
	}
	tests := []struct {
		depth int
		want  []string
	}{
		{0, []string{"a:file", "lnk:symlink", "sub:dir"}},
		{1, []string{"a:file", "lnk:symlink", "sub:dir"}},
		{2, []string{"a:file", "lnk:symlink", "sub:dir", "sub/b:file", "sub/deeper:dir"}},
		{5, []string{"a:file", "lnk:symlink", "sub:dir", "sub/b:file", "sub/deeper:dir", "sub/deeper/c:file"}},
	}
	for _, tt := range tests {
		t.Run(strconv.Itoa(tt.depth), func(t *testing.T) {
			files, err := f.c.List(ctx, "/home/user/d", "", tt.depth)
			if err != nil {
				t.Fatal(err)
			}
			got := names(files)
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
	if _, err := f.c.List(ctx, "/home/user/d/a", "", 1); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("list of a file: %v", err)
	}
	if _, err := f.c.List(ctx, "/nope", "", 1); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("list of nothing: %v", err)
	}
}

func TestMkdirMoveRemove(t *testing.T) {
	f := newFileEnv(t)
	ctx := ctxT(t)
	steps := []struct {
		name string
		do   func() error
		want error
	}{
		{"mkdir_missing_parent", func() error { return f.c.Mkdir(ctx, "/home/user/p/q", "", false) }, errdefs.ErrNotFound},
		{"mkdir_parents", func() error { return f.c.Mkdir(ctx, "/home/user/p/q/r", "", true) }, nil},
		{"mkdir_parents_again", func() error { return f.c.Mkdir(ctx, "/home/user/p/q/r", "", true) }, nil},
		{"mkdir_exists", func() error { return f.c.Mkdir(ctx, "/home/user/p", "", false) }, errdefs.ErrAlreadyExists},
		{"write", func() error {
			_, err := f.c.WriteFile(ctx, "/home/user/p/q/r/f", "", 0, strings.NewReader("data"), 0)
			return err
		}, nil},
		{"move_file", func() error { return f.c.Move(ctx, "/home/user/p/q/r/f", "/home/user/moved", "") }, nil},
		{"move_missing", func() error { return f.c.Move(ctx, "/home/user/nothing", "/home/user/x", "") }, errdefs.ErrNotFound},
		{"move_into_missing_dir", func() error { return f.c.Move(ctx, "/home/user/moved", "/home/user/no/dir/x", "") }, errdefs.ErrNotFound},
		{"move_dir", func() error { return f.c.Move(ctx, "/home/user/p", "/home/user/p2", "") }, nil},
		{"remove_nonempty", func() error { return f.c.Remove(ctx, "/home/user/p2", "", false) }, errdefs.ErrInvalidArgument},
		{"remove_recursive", func() error { return f.c.Remove(ctx, "/home/user/p2", "", true) }, nil},
		{"remove_missing", func() error { return f.c.Remove(ctx, "/home/user/p2", "", true) }, errdefs.ErrNotFound},
		{"remove_file", func() error { return f.c.Remove(ctx, "/home/user/moved", "", false) }, nil},
		{"remove_root", func() error { return f.c.Remove(ctx, "/", "", true) }, errdefs.ErrInvalidArgument},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			err := s.do()
			if s.want == nil && err != nil || s.want != nil && !errors.Is(err, s.want) {
				t.Fatalf("err = %v, want %v", err, s.want)
			}
		})
	}
	if _, err := os.Stat(f.host("home/user/p2")); !os.IsNotExist(err) {
		t.Fatalf("p2 still there: %v", err)
	}
	if _, err := os.Stat(f.host("home/user/moved")); !os.IsNotExist(err) {
		t.Fatalf("moved still there: %v", err)
	}
	t.Run("remove_symlink_not_target", func(t *testing.T) {
		f.write(t, "/home/user/target/keep", "", "x")
		if err := os.Symlink("target", f.host("home/user/tlink")); err != nil {
			t.Fatal(err)
		}
		if err := f.c.Remove(ctx, "/home/user/tlink", "", true); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(f.host("home/user/target/keep")); err != nil {
			t.Fatalf("target damaged: %v", err)
		}
	})
}

func TestTarRoundTrip(t *testing.T) {
	f := newFileEnv(t)
	ctx := ctxT(t)
	f.write(t, "/home/user/src/a.txt", "", "alpha")
	f.write(t, "/home/user/src/sub/b.txt", "", strings.Repeat("b", 300000))
	if err := f.c.Mkdir(ctx, "/home/user/src/empty", "", false); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.txt", f.host("home/user/src/link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f.host("home/user/src/a.txt"), 0o751); err != nil {
		t.Fatal(err)
	}
	// Old times on the directories, set last (their entries touch them):
	// the copy keeps them.
	old := time.Date(2020, 5, 17, 10, 0, 0, 0, time.UTC)
	for _, d := range []string{"home/user/src/sub", "home/user/src/empty"} {
		if err := os.Chtimes(f.host(d), old, old); err != nil {
			t.Fatal(err)
		}
	}
	rc, err := f.c.TarOut(ctx, "/home/user/src", "")
	if err != nil {
		t.Fatal(err)
	}
	archive, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	sort.Strings(names)
	if want := "a.txt,empty/,link,sub/,sub/b.txt"; strings.Join(names, ",") != want {
		t.Fatalf("archive has %v", names)
	}
	if err := f.c.TarIn(ctx, "/home/user/dst/nested", "", bytes.NewReader(archive)); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a.txt", "sub/b.txt"} {
		want, _ := os.ReadFile(f.host("home/user/src/" + p))
		got, err := os.ReadFile(f.host("home/user/dst/nested/" + p))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s differs: %v", p, err)
		}
	}
	if target, err := os.Readlink(f.host("home/user/dst/nested/link")); err != nil || target != "a.txt" {
		t.Fatalf("link %q %v", target, err)
	}
	if fi, err := os.Stat(f.host("home/user/dst/nested/a.txt")); err != nil || fi.Mode().Perm() != 0o751 {
		t.Fatalf("mode %v %v", fi.Mode(), err)
	}
	if fi, err := os.Stat(f.host("home/user/dst/nested/empty")); err != nil || !fi.IsDir() {
		t.Fatalf("empty dir: %v", err)
	}
	for _, d := range []string{"sub", "empty"} {
		if fi, err := os.Stat(f.host("home/user/dst/nested/" + d)); err != nil || !fi.ModTime().Equal(old) {
			t.Errorf("directory %s: mtime %v (%v), want %v", d, fi.ModTime(), err, old)
		}
	}
	t.Run("single_file", func(t *testing.T) {
		rc, err := f.c.TarOut(ctx, "/home/user/src/a.txt", "")
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		tr := tar.NewReader(rc)
		h, err := tr.Next()
		if err != nil || h.Name != "a.txt" || h.Size != 5 {
			t.Fatalf("entry %+v %v", h, err)
		}
	})
}

// tarball builds an archive from entries.
type entry struct {
	name, link string
	typ        byte
	body       string
}

func tarball(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.body)), ModTime: time.Now()}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if e.typ == tar.TypeDir {
			h.Mode = 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestTarInRejectsEscapes(t *testing.T) {
	f := newFileEnv(t)
	ctx := ctxT(t)
	f.write(t, "/home/user/victim", "", "precious")
	tests := []struct {
		name    string
		entries []entry
	}{
		{"dotdot", []entry{{name: "../escaped", typ: tar.TypeReg, body: "x"}}},
		{"dotdot_inside", []entry{{name: "a/../../escaped", typ: tar.TypeReg, body: "x"}}},
		{"absolute", []entry{{name: "/home/user/escaped", typ: tar.TypeReg, body: "x"}}},
		{"symlink_dir_then_write_through", []entry{
			{name: "l", link: "/home/user", typ: tar.TypeSymlink},
			{name: "l/escaped", typ: tar.TypeReg, body: "x"}}},
		{"relative_symlink_dir_then_write", []entry{
			{name: "l2", link: "..", typ: tar.TypeSymlink},
			{name: "l2/escaped", typ: tar.TypeReg, body: "x"}}},
		{"symlink_file_then_overwrite", []entry{
			{name: "v", link: "/home/user/victim", typ: tar.TypeSymlink},
			{name: "v", typ: tar.TypeReg, body: "pwned"}}},
		{"hardlink_outside", []entry{{name: "h", link: "../victim", typ: tar.TypeLink}}},
		{"device", []entry{{name: "dev", typ: tar.TypeChar}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := "/home/user/unpack-" + tt.name
			err := f.c.TarIn(ctx, dir, "", bytes.NewReader(tarball(t, tt.entries...)))
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("err = %v, want invalid argument", err)
			}
			if _, err := os.Lstat(f.host("home/user/escaped")); err == nil {
				os.Remove(f.host("home/user/escaped"))
				t.Fatal("an entry escaped the directory")
			}
			if got, _ := os.ReadFile(f.host("home/user/victim")); string(got) != "precious" {
				t.Fatalf("victim is now %q", got)
			}
		})
	}
	// Symlinks themselves are fine, pointing anywhere: nothing follows them.
	t.Run("plain_symlink_ok", func(t *testing.T) {
		err := f.c.TarIn(ctx, "/home/user/ok", "", bytes.NewReader(tarball(t,
			entry{name: "etc", link: "/etc", typ: tar.TypeSymlink},
			entry{name: "d/", typ: tar.TypeDir},
			entry{name: "d/f", typ: tar.TypeReg, body: "fine"},
			entry{name: "d/hl", link: "d/f", typ: tar.TypeLink})))
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(f.host("home/user/ok/d/hl")); string(got) != "fine" {
			t.Fatalf("hard link reads %q", got)
		}
	})
}

// Paths resolve inside the root: ".." and symlinks pointing out of it stop
// at the root, like in a chroot.
func TestPathConfinement(t *testing.T) {
	f := newFileEnv(t)
	secret := filepath.Join(filepath.Dir(f.dir), "outside-secret")
	writeFile(t, secret, "host secret")
	t.Cleanup(func() { os.Remove(secret) })
	writeFile(t, f.host("etc/inside"), "sandbox file")
	for name, target := range map[string]string{
		"abs_link": "/etc",
		"rel_link": "../../../../../../etc",
		"up_link":  "..",
	} {
		if err := os.Symlink(target, f.host("home/user/"+name)); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		path string
		want string // "" = must fail
	}{
		{"/home/user/abs_link/inside", "sandbox file"},
		{"/home/user/rel_link/inside", "sandbox file"},
		{"/../../../etc/inside", "sandbox file"},
		{"/home/user/up_link/../outside-secret", ""},
		{"/../outside-secret", ""},
		{"/home/user/rel_link/../../outside-secret", ""},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			got, err := f.read(t, tt.path, "")
			if tt.want == "" {
				if err == nil {
					t.Fatalf("read %q outside the root", got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %q %v", got, err)
			}
		})
	}
	// Writes through an escaping symlink land inside the root too.
	if err := os.Chmod(f.host("etc"), 0o777); err != nil {
		t.Fatal(err)
	}
	f.write(t, "/home/user/abs_link/written", "", "w")
	if _, err := os.Stat(f.host("etc/written")); err != nil {
		t.Fatalf("write through link: %v", err)
	}
}

// /proc/PID/root style magic links are refused: they would leave the
// sandbox's mount namespace. (Root "/" here, the production setting.)
func TestMagicLinksRefused(t *testing.T) {
	testutil.RequiresRoot(t)
	e := newEnv(t)
	ctx := ctxT(t)
	rc, _, err := e.c.ReadFile(ctx, "/proc/self/root/etc/hostname", "root")
	if err == nil {
		rc.Close()
		t.Fatal("read through /proc/self/root")
	}
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("err = %v, want invalid argument (ELOOP)", err)
	}
	// An ordinary path in "/" works.
	rc, _, err = e.c.ReadFile(ctx, "/proc/self/status", "root")
	if err != nil {
		t.Fatal(err)
	}
	rc.Close()
}

func TestFilePermissions(t *testing.T) {
	testutil.RequiresRoot(t)
	noGroups := filepath.Join(t.TempDir(), "group")
	writeFile(t, noGroups, "root:x:0:\n")
	f := newFileEnv(t, func(c *agent.Config) { c.GroupFile = noGroups })
	ctx := ctxT(t)
	writeFile(t, f.host("srv/root-only"), "secret")
	if err := os.Chmod(f.host("srv/root-only"), 0o600); err != nil {
		t.Fatal(err)
	}
	writeFile(t, f.host("srv/group-file"), "for extra")
	if err := os.Chown(f.host("srv/group-file"), 0, 1500); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f.host("srv/group-file"), 0o040); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(f.host("srv/closed/inner"), 0o700); err != nil {
		t.Fatal(err)
	}
	// The default fixture puts user in group extra (1500).
	f2 := newFileEnv(t)
	writeFile(t, f2.host("srv/group-file"), "for extra")
	if err := os.Chown(f2.host("srv/group-file"), 0, 1500); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f2.host("srv/group-file"), 0o040); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		do   func() error
		want error
	}{
		{"user_write_root_dir", func() error {
			_, err := f.c.WriteFile(ctx, "/srv/new", "user", 0, strings.NewReader("x"), 0)
			return err
		}, errdefs.ErrPermissionDenied},
		{"user_read_root_only", func() error { _, err := f.read(t, "/srv/root-only", "user"); return err }, errdefs.ErrPermissionDenied},
		{"user_mkdir_in_root_dir", func() error { return f.c.Mkdir(ctx, "/srv/d", "user", false) }, errdefs.ErrPermissionDenied},
		{"user_remove_in_root_dir", func() error { return f.c.Remove(ctx, "/srv/root-only", "user", false) }, errdefs.ErrPermissionDenied},
		{"user_list_closed_dir", func() error { _, err := f.c.List(ctx, "/srv/closed", "user", 1); return err }, errdefs.ErrPermissionDenied},
		{"user_stat_through_closed_dir", func() error { _, err := f.c.Stat(ctx, "/srv/closed/inner", "user"); return err }, errdefs.ErrPermissionDenied},
		{"user_tar_into_root_dir", func() error {
			return f.c.TarIn(ctx, "/srv/t", "user", bytes.NewReader(tarball(t, entry{name: "f", typ: tar.TypeReg, body: "x"})))
		}, errdefs.ErrPermissionDenied},
		{"user_no_group_no_read", func() error { _, err := f.read(t, "/srv/group-file", "user"); return err }, errdefs.ErrPermissionDenied},
		{"user_supplementary_group_reads", func() error { _, err := f2.read(t, "/srv/group-file", "user"); return err }, nil},
		{"root_reads_root_only", func() error { _, err := f.read(t, "/srv/root-only", "root"); return err }, nil},
		{"root_writes_root_dir", func() error {
			_, err := f.c.WriteFile(ctx, "/srv/by-root", "root", 0, strings.NewReader("x"), 0)
			return err
		}, nil},
		{"unknown_user", func() error { _, err := f.c.Stat(ctx, "/srv", "ghost"); return err }, errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.do()
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
	if _, err := os.Stat(f.host("srv/new")); !os.IsNotExist(err) {
		t.Fatal("denied write left a file")
	}
	var st syscall.Stat_t
	if err := syscall.Stat(f.host("srv/by-root"), &st); err != nil || st.Uid != 0 {
		t.Fatalf("root's file owner %d %v", st.Uid, err)
	}
	// The agent's own identity is intact after all of that.
	if err := syscall.Access(f.host("srv/root-only"), unix.R_OK); err != nil {
		t.Fatalf("agent lost root file access: %v", err)
	}
}

// A full disk is quota_exceeded, and the sandbox stays usable.
func TestWriteFileNoSpace(t *testing.T) {
	testutil.RequiresRoot(t)
	f := newFileEnv(t)
	ctx := ctxT(t)
	mnt := f.host("srv/small")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m,mode=0777"); err != nil {
		t.Skipf("mounting tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	_, err := f.c.WriteFile(ctx, "/srv/small/big", "user", 0, bytes.NewReader(make([]byte, 4<<20)), 0)
	if !errors.Is(err, errdefs.ErrQuotaExceeded) {
		t.Fatalf("err = %v, want quota exceeded", err)
	}
	entries, _ := os.ReadDir(mnt)
	if len(entries) != 0 {
		t.Fatalf("left behind: %v", entries)
	}
	f.write(t, "/srv/small/small", "user", "still works")
}

// TestNonUTF8Names: names that are not valid UTF-8 cannot travel in the
// protocol's JSON, whose encoder would make "a\xff" and "a\xfe" both
// "a\uFFFD" (and a write back to that name would reach another file). A
// listing or stat that meets one is refused, naming it escaped; a tar
// carries the bytes exactly, both ways.
func TestNonUTF8Names(t *testing.T) {
	f := newFileEnv(t)
	ctx := ctxT(t)
	if err := os.Mkdir(f.host("home/user/d"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a\xff", "a\xfe"} {
		writeFile(t, f.host("home/user/d/"+n), n)
	}
	if err := os.Symlink("t\xff", f.host("home/user/link")); err != nil {
		t.Fatal(err)
	}
	refused := func(t *testing.T, what string, err error, want string) {
		t.Helper()
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("%s = %v, want invalid argument", what, err)
		}
		if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "UTF-8") {
			t.Fatalf("%s: message %q does not name %s", what, err, want)
		}
	}
	t.Run("list", func(t *testing.T) {
		files, err := f.c.List(ctx, "/home/user/d", "", 1)
		refused(t, "List", err, `/home/user/d/a\xfe`)
		if len(files) > 0 {
			t.Fatalf("listed %+v", files)
		}
	})
	t.Run("list_deep", func(t *testing.T) {
		_, err := f.c.List(ctx, "/home/user", "", 3)
		refused(t, "List depth 3", err, `a\x`)
	})
	t.Run("stat_link_target", func(t *testing.T) {
		_, err := f.c.Stat(ctx, "/home/user/link", "")
		refused(t, "Stat", err, `"/home/user/link"`)
	})
	t.Run("tar_out_exact", func(t *testing.T) {
		rc, err := f.c.TarOut(ctx, "/home/user/d", "")
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		tr := tar.NewReader(rc)
		var names []string
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(tr)
			if string(body) != h.Name {
				t.Errorf("entry %q holds %q", h.Name, body)
			}
			// Readers must not take these bytes for the UTF-8 PAX promises.
			if h.PAXRecords["hdrcharset"] != "BINARY" {
				t.Errorf("entry %q: PAX records %v, want hdrcharset=BINARY", h.Name, h.PAXRecords)
			}
			names = append(names, h.Name)
		}
		sort.Strings(names)
		if strings.Join(names, ",") != "a\xfe,a\xff" {
			t.Fatalf("archive names %q", names)
		}
	})
	t.Run("tar_in_exact", func(t *testing.T) {
		err := f.c.TarIn(ctx, "/home/user/in", "", bytes.NewReader(tarball(t,
			entry{name: "b\xff", typ: tar.TypeReg, body: "one"},
			entry{name: "b\xfe", typ: tar.TypeReg, body: "two"})))
		if err != nil {
			t.Fatal(err)
		}
		for n, want := range map[string]string{"b\xff": "one", "b\xfe": "two"} {
			if got, err := os.ReadFile(f.host("home/user/in/" + n)); err != nil || string(got) != want {
				t.Fatalf("%q: %q %v", n, got, err)
			}
		}
	})
	t.Run("remove_parent", func(t *testing.T) {
		if err := f.c.Remove(ctx, "/home/user/in", "", true); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(f.host("home/user/in")); !os.IsNotExist(err) {
			t.Fatalf("still there: %v", err)
		}
	})
}

// TestDownloadFileOrDir checks read_file with Tar: a file's bytes, a
// directory as a tar stream described as a directory, a symlink to a
// directory refused as plain read_file refuses a directory (what Stat then
// TarOut or ReadFile gave before).
func TestDownloadFileOrDir(t *testing.T) {
	f := newFileEnv(t)
	ctx := ctxT(t)
	if !slices.Contains(f.c.Agent().Features, agentproto.FeatureReadTar) {
		t.Fatalf("features %v lack %s", f.c.Agent().Features, agentproto.FeatureReadTar)
	}
	f.write(t, "/home/user/d/a.txt", "", "alpha")
	f.write(t, "/home/user/d/sub/b.txt", "", "beta")
	if err := os.Symlink("d", f.host("home/user/dlink")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("d/a.txt", f.host("home/user/flink")); err != nil {
		t.Fatal(err)
	}

	for _, p := range []string{"/home/user/d/a.txt", "/home/user/flink"} {
		rc, fi, err := f.c.Download(ctx, p, "")
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || string(b) != "alpha" || fi.Type != agentproto.FileTypeFile || fi.Size != 5 {
			t.Errorf("%s: %q %v, info %+v", p, b, err, fi)
		}
	}

	rc, fi, err := f.c.Download(ctx, "/home/user/d", "")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	rc.Close()
	sort.Strings(names)
	if fi.Type != agentproto.FileTypeDir || fi.Path != "/home/user/d" || strings.Join(names, ",") != "a.txt,sub/,sub/b.txt" {
		t.Errorf("info %+v, entries %v", fi, names)
	}

	var ae *agentproto.Error
	if _, _, err := f.c.Download(ctx, "/home/user/dlink", ""); !errors.Is(err, errdefs.ErrInvalidArgument) || !errors.As(err, &ae) || ae.Code != agentproto.CodeIsADirectory {
		t.Errorf("symlink to a directory: %v", err)
	}
	// Without Tar a directory is still refused.
	if _, _, err := f.c.ReadFile(ctx, "/home/user/d", ""); !errors.As(err, &ae) || ae.Code != agentproto.CodeIsADirectory {
		t.Errorf("read_file of a directory: %v", err)
	}
}

// TestTarSpecialFilesRefused: a tar of a FIFO would wait for a writer
// forever and one of a device never ends: both are refused at once. A
// read of a FIFO waits for its writer and streams what it writes (the code
// interpreter's output comes that way).
func TestTarSpecialFilesRefused(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{fifo, "/dev/zero"} {
		rc, err := e.c.TarOut(ctx, p, "root")
		if err == nil {
			_, err = io.Copy(io.Discard, rc)
			rc.Close()
		}
		if err == nil {
			t.Fatalf("tar of %s succeeded", p)
		}
	}
	go func() {
		f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		if err == nil {
			f.WriteString("streamed")
			f.Close()
		}
	}()
	rc, _, err := e.c.ReadFile(ctx, fifo, "root")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(rc); string(b) != "streamed" {
		t.Fatalf("fifo read: %q", b)
	}
	rc.Close()
}
