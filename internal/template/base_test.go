package template

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/hostcheck"
	"github.com/airlockhq/airlock/internal/storage"
	"github.com/airlockhq/airlock/internal/testutil"
)

func TestCustomize(t *testing.T) {
	testutil.RequiresRoot(t)
	root := t.TempDir()
	files := map[string]string{
		"etc/passwd":                       "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin", // no final newline
		"etc/group":                        "root:x:0:\n",
		"etc/shadow":                       "root:*:19000:0:99999:7:::\n",
		"etc/gshadow":                      "root:*::\n",
		"etc/skel/.bashrc":                 "# bashrc\n",
		"etc/skel/.profile":                "# profile\n",
		"var/cache/apt/archives/libc6.deb": "deb",
		"var/cache/apt/pkgcache.bin":       "bin",
		"var/lib/apt/lists/x_Packages":     "pkgs",
		"var/lib/apt/lists/partial/y":      "part",
		"var/cache/apt/archives/lock":      "",
		"usr/bin/keep":                     "keep",
		"usr/bin/sudo":                     "sudo",
		"etc/sudoers.d/README":             "# drop-ins\n",
	}
	for p, data := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "etc/shadow"), 0o640); err != nil {
		t.Fatal(err)
	}
	// debootstrap leaves the host's resolver; a symlink must not be followed.
	outside := filepath.Join(t.TempDir(), "host-resolv.conf")
	if err := os.WriteFile(outside, []byte("nameserver 10.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "etc/resolv.conf")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}

	spec := debianBase.Spec
	for range 2 { // idempotent
		if err := customize(root, spec); err != nil {
			t.Fatal(err)
		}
	}

	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	t.Run("databases", func(t *testing.T) {
		for _, c := range []struct{ file, want string }{
			{"etc/passwd", "user:x:1000:1000::/home/user:/bin/bash\n"},
			{"etc/group", "user:x:1000:\n"},
			{"etc/shadow", "user:*:"},
			{"etc/gshadow", "user:!::\n"},
		} {
			got := read(c.file)
			if strings.Count(got, c.want) != 1 {
				t.Errorf("%s: want one %q in:\n%s", c.file, c.want, got)
			}
		}
		if !strings.Contains(read("etc/passwd"), "/usr/sbin/nologin\nuser:") {
			t.Error("entry not appended on its own line")
		}
		if fi, err := os.Stat(filepath.Join(root, "etc/shadow")); err != nil || fi.Mode().Perm() != 0o640 {
			t.Errorf("shadow mode changed: %v %v", fi.Mode(), err)
		}
	})
	t.Run("home", func(t *testing.T) {
		for _, p := range []string{"home/user", "home/user/.bashrc", "home/user/.profile"} {
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(root, p), &st); err != nil {
				t.Fatal(err)
			}
			if st.Uid != 1000 || st.Gid != 1000 {
				t.Errorf("%s owned by %d:%d", p, st.Uid, st.Gid)
			}
		}
	})
	t.Run("modes", func(t *testing.T) {
		for _, c := range []struct {
			path string
			mode os.FileMode
		}{
			{"tmp", os.ModeDir | os.ModeSticky | 0o777},
			{".airlock", os.ModeDir | 0o755},
		} {
			fi, err := os.Stat(filepath.Join(root, c.path))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode() != c.mode {
				t.Errorf("%s mode %v, want %v", c.path, fi.Mode(), c.mode)
			}
		}
	})
	t.Run("network-files", func(t *testing.T) {
		if got := read("etc/hostname"); got != "sandbox\n" {
			t.Errorf("hostname %q", got)
		}
		if !strings.Contains(read("etc/hosts"), "127.0.0.1\tlocalhost") {
			t.Error("no localhost in /etc/hosts")
		}
		if strings.Contains(read("etc/resolv.conf"), "10.0.0.1") {
			t.Error("host resolver kept")
		}
		if b, _ := os.ReadFile(outside); string(b) != "nameserver 10.0.0.1\n" {
			t.Error("wrote through the resolv.conf symlink to the host")
		}
	})
	t.Run("sudoers", func(t *testing.T) {
		p := filepath.Join(root, "etc/sudoers.d/user")
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&0o7777 != 0o440 || st.Uid != 0 || st.Gid != 0 || st.Mode&unix.S_IFMT != unix.S_IFREG {
			t.Errorf("sudoers drop-in: mode %o, owner %d:%d; want a 0440 file of root's", st.Mode, st.Uid, st.Gid)
		}
		if got := read("etc/sudoers.d/user"); !strings.Contains(got, "\nuser ALL=(ALL:ALL) NOPASSWD: ALL\n") || !strings.Contains(got, "\nDefaults !fqdn\n") {
			t.Errorf("sudoers drop-in:\n%s", got)
		}
	})
	t.Run("caches", func(t *testing.T) {
		for _, p := range []string{"var/cache/apt/archives/libc6.deb", "var/cache/apt/pkgcache.bin", "var/lib/apt/lists/x_Packages", "var/lib/apt/lists/partial"} {
			if _, err := os.Lstat(filepath.Join(root, p)); !os.IsNotExist(err) {
				t.Errorf("%s not cleaned: %v", p, err)
			}
		}
		if read("usr/bin/keep") != "keep" {
			t.Error("removed too much")
		}
	})
}

// TestCustomizeSudo: a recipe with Sudo needs the sudo package in the
// tree, and one without writes no drop-in.
func TestCustomizeSudo(t *testing.T) {
	testutil.RequiresRoot(t)
	for _, tt := range []struct {
		name    string
		sudo    bool
		hasSudo bool
		wantErr bool
	}{
		{"sudo-installed", true, true, false},
		{"sudo-missing", true, false, true},
		{"no-sudo", false, true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for p, data := range map[string]string{
				"etc/passwd": "root:x:0:0:root:/root:/bin/bash\n", "etc/group": "root:x:0:\n",
				"etc/shadow": "root:*:19000:0:99999:7:::\n", "etc/gshadow": "root:*::\n",
			} {
				if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(root, p), []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if tt.hasSudo {
				if err := os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(root, "usr/bin/sudo"), nil, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			spec := debianSpec
			spec.Sudo = tt.sudo
			err := customize(root, spec)
			if (err != nil) != tt.wantErr {
				t.Fatalf("customize: %v, want error %v", err, tt.wantErr)
			}
			_, serr := os.Stat(filepath.Join(root, "etc/sudoers.d/user"))
			if want := tt.sudo && !tt.wantErr; (serr == nil) != want {
				t.Errorf("drop-in exists: %v, want %v", serr == nil, want)
			}
		})
	}
}

// TestShippedRecipeHashes: a recipe's hash names the versions built from
// it, so a change rebuilds that template in every cache. The table is to be
// updated on purpose, with the templates it rebuilds in mind: base changed
// at revision 3 (E2B's tools, sudo), the others did not move with it.
func TestShippedRecipeHashes(t *testing.T) {
	want := map[string]string{
		"base":             "31a21e9961b0549c",
		"python":           "e7ea2e5d9bf8555b",
		"node":             "d7aff69c3049a16d",
		"code-interpreter": "47a925c49f8e12b0",
	}
	got := map[string]string{debianBase.name: debianBase.hash()}
	for _, r := range shippedRecipes {
		got[r.name] = r.hash()
	}
	for name, h := range want {
		if got[name] != h {
			t.Errorf("recipe %s hashes to %s, the table says %s: update the table if the change is meant to rebuild it", name, got[name], h)
		}
	}
	if len(got) != len(want) {
		t.Errorf("recipes %v, table %v", got, want)
	}
	// Base revision 1, what caches built before E2B's tools: no longer base.
	if got["base"] == "9ce7a2934f7a8142" {
		t.Error("base still hashes as revision 1: caches would not rebuild it")
	}
	if !slices.Equal(NewStore(t.TempDir()).ShippedPackages("base"),
		[]string{"python3", "ca-certificates", "git", "curl", "sudo", "python-is-python3", "nodejs"}) {
		t.Errorf("ShippedPackages(base) = %v", NewStore(t.TempDir()).ShippedPackages("base"))
	}
}

// TestBase builds (once per machine; ~30 s) or reuses the real base template
// and checks what sandboxes rely on.
func TestBase(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "debootstrap")
	if testing.Short() {
		t.Skip("builds a Debian rootfs")
	}
	dir := filepath.Join(testutil.DataDir(), "templates")
	var out bytes.Buffer
	s := NewStore(dir)
	tmpl, err := s.EnsureBase(context.Background(), &out)
	if err != nil {
		t.Fatalf("EnsureBase: %v\nprogress:\n%s", err, out.String())
	}
	t.Logf("base template: version %d at %s", tmpl.Version, tmpl.Layers[0])
	root := tmpl.Layers[0]

	got, err := s.Get("base", tmpl.Version)
	if err != nil || got.Layers[0] != root {
		t.Errorf("Get(base, %d) = %+v, %v", tmpl.Version, got, err)
	}
	var meta Info
	b, err := os.ReadFile(filepath.Join(filepath.Dir(root), metaName))
	if err == nil {
		err = json.Unmarshal(b, &meta)
	}
	if err != nil || meta.Name != "base" || meta.Version != tmpl.Version || meta.RecipeHash != debianBase.hash() || meta.SizeBytes < 50<<20 {
		t.Errorf("meta.json %+v, %v", meta, err)
	}

	t.Run("commands", func(t *testing.T) {
		for _, c := range []struct {
			name string
			args []string
			want string
		}{
			{"python3", []string{"/usr/bin/python3", "-c", "import ssl, json; print(2 + 3)"}, "5\n"},
			{"bash", []string{"/bin/bash", "-c", "echo ${BASH_VERSION%%.*}"}, "5\n"},
			{"coreutils", []string{"/usr/bin/stat", "-c", "%U %G %a", "/home/user"}, "user user 755\n"},
			{"user-lookup", []string{"/usr/bin/id", "user"}, "uid=1000(user) gid=1000(user) groups=1000(user)\n"},
			{"ca-certificates", []string{"/bin/bash", "-c", "test -s /etc/ssl/certs/ca-certificates.crt && echo ok"}, "ok\n"},
			// What code written for E2B's base image runs.
			{"python", []string{"/usr/bin/python", "-c", "import sys; print(sys.version_info[0])"}, "3\n"},
			{"git", []string{"/bin/bash", "-c", "git --version | cut -d' ' -f1-2"}, "git version\n"},
			{"git-daemon", []string{"/bin/bash", "-c", "test -x /usr/lib/git-core/git-daemon && echo ok"}, "ok\n"},
			{"curl", []string{"/bin/bash", "-c", "curl --version | head -1 | cut -d' ' -f1"}, "curl\n"},
			{"node", []string{"/usr/bin/node", "-e", "console.log(6 * 7)"}, "42\n"},
			{"sudo", []string{"/bin/bash", "-c", "stat -c '%U %a' /usr/bin/sudo; /usr/sbin/visudo -c -q && echo valid"}, "root 4755\nvalid\n"},
		} {
			t.Run(c.name, func(t *testing.T) {
				cmd := exec.Command(c.args[0], c.args[1:]...)
				cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
				cmd.Dir = "/"
				cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
				got, err := cmd.CombinedOutput()
				if err != nil || string(got) != c.want {
					t.Errorf("%v: %q, %v; want %q", c.args, got, err, c.want)
				}
			})
		}
	})
	t.Run("files", func(t *testing.T) {
		for _, c := range []struct {
			path     string
			mode     os.FileMode
			uid, gid uint32
		}{
			{"tmp", os.ModeDir | os.ModeSticky | 0o777, 0, 0},
			{".airlock", os.ModeDir | 0o755, 0, 0},
			{"home/user", os.ModeDir | 0o755, 1000, 1000},
			{"etc/passwd", 0o644, 0, 0},
		} {
			fi, err := os.Lstat(filepath.Join(root, c.path))
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if fi.Mode() != c.mode || st.Uid != c.uid || st.Gid != c.gid {
				t.Errorf("/%s: %v %d:%d, want %v %d:%d", c.path, fi.Mode(), st.Uid, st.Gid, c.mode, c.uid, c.gid)
			}
		}
		debs, _ := filepath.Glob(filepath.Join(root, "var/cache/apt/archives/*.deb"))
		lists, _ := filepath.Glob(filepath.Join(root, "var/lib/apt/lists/*"))
		if len(debs)+len(lists) > 0 {
			t.Errorf("apt caches left: %d debs, %d lists", len(debs), len(lists))
		}
	})
	t.Run("through-storage", func(t *testing.T) {
		// The path every sandbox takes: an overlay of the idmapped template,
		// seen from the sandbox's user namespace.
		parent := t.TempDir()
		for _, d := range []string{filepath.Dir(parent), parent} {
			if err := os.Chmod(d, 0o711); err != nil {
				t.Fatal(err)
			}
		}
		leaks := hostcheck.Take(t, parent)
		const base = 4 << 20
		r, err := storage.Setup(context.Background(), storage.Options{
			Dir: parent, Layers: tmpl.Layers, UIDBase: base, IDCount: 65536, SizeMB: 64,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = storage.TeardownDir(context.Background(), parent) })
		m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: 65536}}
		cmd := exec.Command("/bin/bash", "-c", `id -u; stat -c '%u %g' /home/user /etc/passwd; touch /home/user/x && stat -c %u /home/user/x; python3 -c 'print("py ok")'`)
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER,
			UidMappings: m,
			GidMappings: m,
			Chroot:      r.Path(),
			Credential:  &syscall.Credential{Uid: 0, Gid: 0},
		}
		cmd.Dir = "/"
		cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
		got, err := cmd.CombinedOutput()
		want := "0\n1000 1000\n0 0\n0\npy ok\n"
		if err != nil || string(got) != want {
			t.Errorf("in the sandbox's view: %q, %v; want %q", got, err, want)
		}
		if _, err := os.Stat(filepath.Join(root, "home/user/x")); !os.IsNotExist(err) {
			t.Errorf("sandbox write reached the template: %v", err)
		}
		// sudo as the user: root of the sandbox's own namespace, and the
		// kernel's no_new_privs (which the runtimes set on the agent, so on
		// every exec: see docs/security.md) makes it refuse, saying why.
		sudo := exec.Command("/bin/bash", "-c", `id -u; sudo -n id -u; setpriv --no-new-privs sudo -n id -u; echo "exit $?"`)
		sudo.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER,
			UidMappings: m,
			GidMappings: m,
			// As runc, whose parent is privileged: setgroups allowed.
			GidMappingsEnableSetgroups: true,
			Chroot:                     r.Path(),
			Credential:                 &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{1000}},
		}
		sudo.Dir = "/home/user"
		sudo.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C", "HOME=/home/user", "USER=user"}
		got, err = sudo.CombinedOutput()
		out := string(got)
		if err != nil || !strings.HasPrefix(out, "1000\n0\n") || !strings.Contains(out, "no new privileges") || !strings.HasSuffix(out, "exit 1\n") {
			t.Errorf("sudo as the user: %q, %v; want uid 1000, then 0, then a refusal under no_new_privs", out, err)
		}
		if err := r.Teardown(context.Background()); err != nil {
			t.Fatal(err)
		}
		leaks.AssertNoLeaks(t)
	})
}

// TestBuildFailsOnUnreachableMirror runs the real debootstrap against a
// mirror on a closed loopback port: the build fails and registers nothing.
func TestBuildFailsOnUnreachableMirror(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "debootstrap")
	t.Setenv(MirrorEnv, "http://127.0.0.1:9/debian")
	dir := filepath.Join(t.TempDir(), "templates")
	var out bytes.Buffer
	_, err := NewStore(dir).EnsureBase(context.Background(), &out)
	if err == nil {
		t.Fatal("EnsureBase succeeded without a mirror")
	}
	// The error carries debootstrap's own words, for the operator.
	if !strings.Contains(err.Error(), "127.0.0.1:9") {
		t.Errorf("error without debootstrap's output: %v", err)
	}
	if !strings.Contains(out.String(), "debootstrap") {
		t.Errorf("progress did not mention debootstrap:\n%s", out.String())
	}
	assertNothingRegistered(t, dir, "base")
}
