package template

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// recipe says how a template is made. Everything that changes the result is
// in the hashed fields, so editing them makes EnsureBase build a new version.
type recipe struct {
	name string
	// Spec is what is hashed.
	Spec recipeSpec
	// build makes the root filesystem at rootfs, which does not exist yet.
	build func(ctx context.Context, rootfs string, spec recipeSpec, p *progress) error
}

type recipeSpec struct {
	Suite   string   `json:"suite"`
	Variant string   `json:"variant"`
	Include []string `json:"include"`
	// Apt are installed with apt-get in the new tree after debootstrap:
	// debootstrap's own resolver does not handle alternatives and virtual
	// packages, which bigger package sets (npm) depend on.
	Apt      []string `json:"apt,omitempty"`
	User     string   `json:"user"`
	UID      int      `json:"uid"`
	Hostname string   `json:"hostname"`
	// Sudo lets User run anything as root with sudo, without a password
	// (/etc/sudoers.d/<user>), as in E2B's base image. Root in the sandbox
	// is no privilege over User (any exec may run as root), so this only
	// saves code written for E2B an exec option; it needs the sudo package.
	Sudo bool `json:"sudo,omitempty"`
	// Revision is bumped by hand when the code of the steps changes.
	Revision int `json:"revision"`
}

func (r recipe) hash() string {
	b, _ := json.Marshal(struct {
		Name string     `json:"name"`
		Spec recipeSpec `json:"spec"`
	}{r.name, r.Spec})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// debianSpec is Debian minbase with python3, CA certificates and a user:
// what every shipped template starts from (shipped.go).
var debianSpec = recipeSpec{
	Suite:    "bookworm",
	Variant:  "minbase", // bash and coreutils come with it
	Include:  []string{"python3", "ca-certificates"},
	User:     "user",
	UID:      1000,
	Hostname: "sandbox",
	Revision: 1,
}

// e2bBasePackages are what code written against E2B's base image takes for
// granted besides python3: git, curl, sudo (for the user), `python` as
// python3, and node (Debian's: Node 18). All from Debian's main, with their
// dependencies, without recommends. Not npm: Debian's brings 350 packages
// of its own (+100 MB installed, most of the build's apt time); the `node`
// template has it.
var e2bBasePackages = []string{"git", "curl", "sudo", "python-is-python3", "nodejs"}

// debianBase is the base template: debianSpec, the tools of E2B's base
// image (e2bBasePackages) and sudo for the user. Revision 3 added them
// (2 was never shipped).
var debianBase = recipe{
	name: "base",
	Spec: func() recipeSpec {
		s := withPackages(debianSpec, 3, e2bBasePackages...)
		s.Sudo = true
		return s
	}(),
	build: buildDebian,
}

// killGrace is how long debootstrap's process group gets after cancellation
// before its output pipes are abandoned.
const killGrace = 5 * time.Second

func buildDebian(ctx context.Context, rootfs string, spec recipeSpec, p *progress) error {
	mirror, err := Mirror()
	if err != nil {
		return err
	}
	bin, err := lookSbin("debootstrap")
	if err != nil {
		return err
	}
	p.step("debootstrap %s (%s) from %s", spec.Suite, spec.Variant, mirror)
	out := &toolOutput{p: p, prefix: "debootstrap"}
	cmd := exec.CommandContext(ctx, bin,
		"--variant="+spec.Variant,
		"--include="+strings.Join(spec.Include, ","),
		spec.Suite, rootfs, mirror)
	cmd.Env = append(os.Environ(), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive",
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin")
	cmd.Stdout, cmd.Stderr = out, out
	// debootstrap is a shell script that runs wget, dpkg and chroot: put them
	// in one process group and kill the group on cancellation.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = killGrace
	err = cmd.Run()
	out.Close()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: debootstrap: %v; last output:\n%s", errdefs.ErrUnavailable, err, out.Tail())
	}
	if len(spec.Apt) > 0 {
		if err := aptInstall(ctx, rootfs, spec.Apt, p); err != nil {
			return err
		}
	}
	p.step("configuring user, hostname and caches")
	if err := customize(rootfs, spec); err != nil {
		return fmt.Errorf("customizing rootfs: %w", err)
	}
	return nil
}

// aptInstall installs pkgs into the debootstrapped tree at rootfs with its
// own apt-get, in a chroot, as debootstrap runs the base packages'
// maintainer scripts: Debian's packages from the host's mirror (the tree's
// sources.list and resolver are still the ones debootstrap copied).
// Services are not started (policy-rc.d), recommends are not installed.
func aptInstall(ctx context.Context, rootfs string, pkgs []string, p *progress) error {
	chroot, err := lookSbin("chroot")
	if err != nil {
		return err
	}
	proc := filepath.Join(rootfs, "proc")
	if err := os.MkdirAll(proc, 0o555); err != nil {
		return err
	}
	if err := syscall.Mount("proc", proc, "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc for apt: %w", err)
	}
	defer syscall.Unmount(proc, syscall.MNT_DETACH)
	policy := filepath.Join(rootfs, "usr/sbin/policy-rc.d")
	if err := os.WriteFile(policy, []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
		return err
	}
	defer os.Remove(policy)
	run := func(what string, args ...string) error {
		out := &toolOutput{p: p, prefix: "apt"}
		cmd := exec.CommandContext(ctx, chroot, append([]string{rootfs}, args...)...)
		cmd.Env = []string{"LC_ALL=C", "DEBIAN_FRONTEND=noninteractive", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
		cmd.Stdout, cmd.Stderr = out, out
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		cmd.WaitDelay = killGrace
		err := cmd.Run()
		out.Close()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%w: %s: %v; last output:\n%s", errdefs.ErrUnavailable, what, err, out.Tail())
		}
		return nil
	}
	p.step("apt-get update")
	if err := run("apt-get update", "apt-get", "-q", "update"); err != nil {
		return err
	}
	p.step("apt-get install %d packages: %s", len(pkgs), strings.Join(pkgs, " "))
	args := append([]string{"apt-get", "-q", "-y", "--no-install-recommends", "install"}, pkgs...)
	if err := run("apt-get install", args...); err != nil {
		return err
	}
	p.step("apt-get clean")
	return run("apt-get clean", "apt-get", "clean")
}

func lookSbin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin"} {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errdefs.Wrap(errdefs.ErrRuntimeUnavailable, "%s not found (install it with apt)", name)
}

// customize finishes a debootstrapped tree without running anything in it:
// the user, hostname, hosts, /tmp, the agent's mount point, and no caches.
func customize(root string, spec recipeSpec) error {
	uid := spec.UID
	home := "/home/" + spec.User
	days := time.Now().Unix() / 86400
	for _, e := range []struct{ file, line string }{
		{"etc/passwd", fmt.Sprintf("%s:x:%d:%d::%s:/bin/bash", spec.User, uid, uid, home)},
		{"etc/group", fmt.Sprintf("%s:x:%d:", spec.User, uid)},
		// "*": no password login; the agent starts the user's processes.
		{"etc/shadow", fmt.Sprintf("%s:*:%d:0:99999:7:::", spec.User, days)},
		{"etc/gshadow", fmt.Sprintf("%s:!::", spec.User)},
	} {
		if err := addEntry(filepath.Join(root, e.file), e.line); err != nil {
			return err
		}
	}

	if spec.Sudo {
		if err := allowSudo(root, spec.User); err != nil {
			return err
		}
	}

	h := filepath.Join(root, home)
	if err := os.MkdirAll(h, 0o755); err != nil {
		return err
	}
	if err := copySkel(filepath.Join(root, "etc/skel"), h, uid); err != nil {
		return err
	}
	if err := os.Chown(h, uid, uid); err != nil {
		return err
	}
	if err := os.Chmod(h, 0o755); err != nil {
		return err
	}

	files := []struct {
		path, data string
	}{
		{"etc/hostname", spec.Hostname + "\n"},
		{"etc/hosts", "127.0.0.1\tlocalhost\n127.0.1.1\t" + spec.Hostname + "\n" +
			"::1\t\tlocalhost ip6-localhost ip6-loopback\nff02::1\t\tip6-allnodes\nff02::2\t\tip6-allrouters\n"},
		// debootstrap copied the host's resolver; the sandbox's network
		// decides its own, so nothing of the host stays in the template.
		{"etc/resolv.conf", "# written by airlock when the sandbox has a network\n"},
	}
	for _, f := range files {
		p := filepath.Join(root, f.path)
		_ = os.Remove(p) // may be a symlink pointing outside the tree
		if err := os.WriteFile(p, []byte(f.data), 0o644); err != nil {
			return err
		}
	}

	for _, d := range []struct {
		path string
		mode fs.FileMode
	}{
		{"tmp", 0o777 | fs.ModeSticky},
		{".airlock", 0o755},
	} {
		p := filepath.Join(root, d.path)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return err
		}
	}

	for _, pat := range []string{
		"var/cache/apt/archives/*.deb",
		"var/cache/apt/archives/partial/*",
		"var/cache/apt/*.bin",
		"var/lib/apt/lists/*",
	} {
		m, err := filepath.Glob(filepath.Join(root, pat))
		if err != nil {
			return err
		}
		for _, p := range m {
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// allowSudo lets user run every command as anyone with sudo, without a
// password: a drop-in of /etc/sudoers.d, which Debian's /etc/sudoers reads.
// sudo refuses a drop-in that is not root's or is writable by others, so
// it is 0440 and root's, and checked with visudo when the tree has it.
func allowSudo(root, user string) error {
	if _, err := os.Stat(filepath.Join(root, "usr/bin/sudo")); err != nil {
		return fmt.Errorf("sudo for %s: the sudo package is not installed: %w", user, err)
	}
	dir := filepath.Join(root, "etc/sudoers.d")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	p := filepath.Join(dir, user)
	_ = os.Remove(p) // may be a symlink
	// !fqdn: a sandbox's host name (its id) is in no hosts file and no DNS;
	// looking it up would cost every sudo a warning and a DNS query.
	rule := "# written by airlock: the sandbox's user may act as root (any exec may anyway)\n" +
		user + " ALL=(ALL:ALL) NOPASSWD: ALL\n" +
		"Defaults !fqdn\n"
	if err := os.WriteFile(p, []byte(rule), 0o440); err != nil {
		return err
	}
	if err := os.Chmod(p, 0o440); err != nil { // whatever the umask
		return err
	}
	return os.Chown(p, 0, 0)
}

// addEntry appends line to a colon-separated database file (passwd, group…)
// unless an entry of that name exists. The file keeps its mode and owner.
func addEntry(path, line string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	name, _, _ := strings.Cut(line, ":")
	for _, l := range strings.Split(string(b), "\n") {
		if n, _, _ := strings.Cut(l, ":"); n == name {
			return nil
		}
	}
	if len(b) > 0 && !bytes.HasSuffix(b, []byte("\n")) {
		b = append(b, '\n')
	}
	b = append(b, line+"\n"...)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// copySkel copies the regular files of skel (not recursive: Debian's skel is
// flat) into home, owned by uid.
func copySkel(skel, home string, uid int) error {
	ents, err := os.ReadDir(skel)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		b, err := os.ReadFile(filepath.Join(skel, e.Name()))
		if err != nil {
			return err
		}
		dst := filepath.Join(home, e.Name())
		if err := os.WriteFile(dst, b, fi.Mode().Perm()); err != nil {
			return err
		}
		if err := os.Chown(dst, uid, uid); err != nil {
			return err
		}
	}
	return nil
}
