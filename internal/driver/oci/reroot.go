package oci

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/mountinfo"
	"github.com/airlockhq/airlock/internal/storage"
)

// A reset in place (driver.RootResetter): the sandbox's init, the agent,
// keeps running, with its namespaces, cgroup, uid range, network and
// socket; every other process is killed and the init's mount namespace is
// moved onto a new root of the given layers over an empty upper directory
// on the same writable layer. The runtime is not run again, which is
// what makes it cheaper than a destroy and a create: runc's start-up is
// most of a create (docs/benchmarks.md).
//
// The root is swapped as runc made it in the first place, from the host
// side of the namespace: storage.Restage mounts the new overlay on the
// host; a clone of it (open_tree) is attached in the sandbox's mount
// namespace by a thread of the daemon that joined it (setns, then chroot
// to the init's root); the runtime's mounts at the top of the old root
// (/proc, /dev, /sys, the agent binary, resolv.conf, the secrets tmpfs)
// are moved into the new one, each with what is mounted below it; then
// pivot_root makes the new root the namespace's, and the init's (the
// kernel moves the root and cwd of every process of the namespace that
// had the old root), and the old root is detached. The thread is never
// given back to the Go scheduler: it dies with its goroutine.
//
// Nothing of the sandbox takes part: every process that could act in it is
// dead (frozen, listed from its cgroup, killed) before the swap, the
// mount points come from the kernel's mountinfo, and paths in the new root
// are resolved with RESOLVE_IN_ROOT|RESOLVE_NO_SYMLINKS, so that a
// snapshot's layer whose /dev is a symlink cannot send a mount elsewhere.

// ResetRoot returns running sandbox id to a new root of tmpl's layers,
// keeping its init. An error wrapping errdefs.ErrNotImplemented means the
// runtime cannot (Config.ResetInPlace is off) and nothing was changed.
func (c *Core) ResetRoot(ctx context.Context, id string, tmpl driver.Template) error {
	if !c.cfg.ResetInPlace {
		return errdefs.Wrap(errdefs.ErrNotImplemented, "%s driver does not reset in place", c.cfg.Name)
	}
	if err := checkID(id); err != nil {
		return err
	}
	if len(tmpl.Layers) == 0 {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "template %q has no layers", tmpl.Name)
	}
	st, err := loadState(c.Dir(id))
	if err != nil {
		return fmt.Errorf("resetting sandbox %s: %w", id, err)
	}
	p := c.Init(id)
	if p == nil || !st.Started {
		return errdefs.Wrap(errdefs.ErrInvalidState, "sandbox %s is not running", id)
	}
	select {
	case <-p.Done():
		return errdefs.Wrap(errdefs.ErrInvalidState, "sandbox %s is not running", id)
	default:
	}
	// The runtime's mounts must be where its bundle put them: a sandbox
	// that moved one (a directory above it renamed) is reset the slow
	// way, by the runtime, which mounts them where the bundle says.
	tops, err := topMounts(p.Pid())
	if err != nil {
		return fmt.Errorf("resetting sandbox %s: %w", id, err)
	}
	if err := checkTopMounts(st.Dir, tops); err != nil {
		return err
	}
	log := c.logger(id)
	t0 := time.Now()
	if err := c.killAllButInit(ctx, id, p.Pid()); err != nil {
		return fmt.Errorf("resetting sandbox %s: %w", id, err)
	}
	t1 := time.Now()
	staged, err := storage.Restage(ctx, storage.Options{
		Dir: st.Dir, Layers: tmpl.Layers, UIDBase: st.UIDBase, IDCount: st.IDCount,
	})
	if err != nil {
		return fmt.Errorf("resetting sandbox %s: %w", id, err)
	}
	t2 := time.Now()
	if err := c.reroot(p.Pid(), p.Done(), tops, staged.Path(), st.UIDBase); err != nil {
		staged.Abort(ctx)
		return fmt.Errorf("resetting sandbox %s: %w", id, err)
	}
	t3 := time.Now()
	if err := staged.Commit(ctx); err != nil {
		return fmt.Errorf("resetting sandbox %s: %w", id, err)
	}
	log.Debug("sandbox reset in place", "kill_us", t1.Sub(t0).Microseconds(), "stage_us", t2.Sub(t1).Microseconds(),
		"reroot_us", t3.Sub(t2).Microseconds(), "commit_us", time.Since(t3).Microseconds())
	return nil
}

// killAllButInit kills every process of sandbox id's cgroup but its init
// (host pid init) and waits until they are gone. The group is frozen while
// they are listed and signalled: nothing forks or exits in between, so no
// pid is missed or reused.
func (c *Core) killAllButInit(ctx context.Context, id string, init int) error {
	g := c.Group(id)
	if err := g.SetFrozen(ctx, true); err != nil {
		_ = g.SetFrozen(context.WithoutCancel(ctx), false)
		return err
	}
	pids, err := g.Procs()
	if err == nil {
		for _, pid := range pids {
			if pid != init {
				if kerr := unix.Kill(pid, unix.SIGKILL); kerr != nil && !errors.Is(kerr, unix.ESRCH) {
					err = fmt.Errorf("killing %d: %w", pid, kerr)
				}
			}
		}
	}
	if terr := g.SetFrozen(context.WithoutCancel(ctx), false); terr != nil {
		return errors.Join(err, terr)
	}
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(pids, func(p int) bool { return p != init }) {
		return nil
	}
	deadline := time.Now().Add(KillWait)
	for {
		left, err := g.Procs()
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(left, func(p int) bool { return p != init }) {
			return nil
		}
		if !slices.Contains(left, init) {
			return errdefs.Wrap(errdefs.ErrInvalidState, "the sandbox's init ended during the reset")
		}
		if time.Now().After(deadline) {
			return errdefs.Wrap(errdefs.ErrUnavailable, "%d processes outlived SIGKILL", len(left)-1)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// topMount is a mount at the top of a sandbox's root (its parent is the
// root mount), as the init's mountinfo names it.
type topMount struct {
	point string // absolute, in the sandbox
	dir   bool   // a directory (else a file) is mounted on
}

// topMounts reads the mounts at the top of init's root from its mountinfo
// (paths there are relative to the init's root).
func topMounts(pid int) ([]topMount, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ents, err := mountinfo.Parse(f)
	if err != nil {
		return nil, err
	}
	root := -1
	for _, e := range ents {
		if e.Target == "/" {
			root = e.ID // the last mount on / is the one in use
		}
	}
	if root < 0 {
		return nil, errors.New("no root mount in the sandbox's mountinfo")
	}
	var out []topMount
	for _, e := range ents {
		if e.ParentID != root || e.ID == root || e.Target == "/" {
			continue
		}
		var fi unix.Stat_t
		if err := unix.Lstat(fmt.Sprintf("/proc/%d/root%s", pid, e.Target), &fi); err != nil {
			return nil, fmt.Errorf("stat %s: %w", e.Target, err)
		}
		out = append(out, topMount{point: e.Target, dir: fi.Mode&unix.S_IFMT == unix.S_IFDIR})
	}
	return out, nil
}

// checkTopMounts fails with errdefs.ErrNotImplemented unless every mount
// in tops is at a destination of the bundle in dir.
func checkTopMounts(dir string, tops []topMount) error {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return fmt.Errorf("reading the bundle: %w", err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("decoding the bundle: %w", err)
	}
	for _, t := range tops {
		if !slices.ContainsFunc(s.Mounts, func(m specs.Mount) bool { return filepath.Clean(m.Destination) == t.point }) {
			return errdefs.Wrap(errdefs.ErrNotImplemented, "the sandbox's mount at %q is not where its bundle put it", t.point)
		}
	}
	return nil
}

// reroot moves the mount namespace of init (host pid, done closed when it
// ends) onto the overlay mounted at staged on the host. Files it makes in
// the new root (mount points the layers lack) are owned by uid, the
// sandbox's root.
func (c *Core) reroot(pid int, done <-chan struct{}, tops []topMount, staged string, uid uint32) error {
	rootfd, err := unix.Open(fmt.Sprintf("/proc/%d/root", pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening the sandbox's root: %w", err)
	}
	defer unix.Close(rootfd)
	nsfd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening the sandbox's mount namespace: %w", err)
	}
	defer unix.Close(nsfd)
	select {
	case <-done:
		// The pid may name another process now: what was opened is not
		// the sandbox's.
		return errdefs.Wrap(errdefs.ErrInvalidState, "the sandbox's init ended during the reset")
	default:
	}
	tree, err := unix.OpenTree(unix.AT_FDCWD, staged, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("cloning the new root: %w", err)
	}
	defer unix.Close(tree)
	return onThrowawayThread(func() error { return rerootThread(nsfd, rootfd, tree, tops, uid) })
}

// onMainThread reports whether the calling (locked) goroutine runs on the
// process's main thread; a test replaces it.
var onMainThread = func() bool { return unix.Gettid() == unix.Getpid() }

// onThrowawayThread runs fn on an OS thread of its own that exits after
// it: fn may leave the daemon's mount namespace and root. The thread is
// never the main one: the main thread does not exit when its goroutine
// ends (the runtime wedges it), and /proc/self is the main thread's view,
// so a main thread left in a sandbox's namespace would show every later
// mountinfo read the sandbox's mounts.
func onThrowawayThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// Locked and never unlocked: the thread exits with this goroutine.
		runtime.LockOSThread()
		if onMainThread() {
			// Hold the main thread here, so that the goroutine below runs
			// on another one, and give it back unharmed.
			defer runtime.UnlockOSThread()
			errc <- onThrowawayThread(fn)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// rerootThread runs on a thread of its own (see reroot).
func rerootThread(nsfd, rootfd, tree int, tops []topMount, uid uint32) error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare(CLONE_FS): %w", err)
	}
	if err := unix.Setns(nsfd, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("joining the sandbox's mount namespace: %w", err)
	}
	if err := unix.Fchdir(rootfd); err != nil {
		return err
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot to the sandbox's root: %w", err)
	}
	// A fresh mount point in the old root (which is discarded) for the
	// new one; Mkdir fails rather than follow anything already there.
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return err
	}
	mp := "/.airlock-reset-" + hex.EncodeToString(rnd[:])
	if err := unix.Mkdir(mp, 0o700); err != nil {
		return fmt.Errorf("making the new root's mount point: %w", err)
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, mp, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attaching the new root: %w", err)
	}
	nr, err := unix.Open(mp, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(nr)
	for _, t := range tops {
		dst, err := mountPoint(nr, strings.TrimPrefix(t.point, "/"), t.dir, uid)
		if err != nil {
			return fmt.Errorf("mount point %s in the new root: %w", t.point, err)
		}
		err = unix.MoveMount(unix.AT_FDCWD, t.point, dst, "", unix.MOVE_MOUNT_T_EMPTY_PATH)
		unix.Close(dst)
		if err != nil {
			return fmt.Errorf("moving %s into the new root: %w", t.point, err)
		}
	}
	if err := unix.Fchdir(nr); err != nil {
		return err
	}
	// pivot_root(".", "."): the old root ends on top of the new one, and
	// is detached from there.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the old root: %w", err)
	}
	return nil
}

// resolveInRoot is how paths in a new root are resolved: never out of it,
// never through a symlink (a layer made from a sandbox's files is its
// user's to shape).
const resolveInRoot = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// mountPoint opens path rel below root (an O_PATH fd), making it (a
// directory when dir, else an empty file) and any missing parent
// directories, owned by uid, when it is not there.
func mountPoint(root int, rel string, dir bool, uid uint32) (int, error) {
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: resolveInRoot}
	fd, err := unix.Openat2(root, rel, &how)
	if err == nil || !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	parent := filepath.Dir(rel)
	pfd := root
	if parent != "." {
		if pfd, err = mountPoint(root, parent, true, uid); err != nil {
			return -1, err
		}
		defer unix.Close(pfd)
	}
	// The parent must be a directory reached without a symlink: Openat2
	// said so. Make the entry, then open it the same way.
	name := filepath.Base(rel)
	dirfd, err := unix.Openat2(pfd, ".", &unix.OpenHow{Flags: unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveInRoot})
	if err != nil {
		return -1, err
	}
	defer unix.Close(dirfd)
	if dir {
		err = unix.Mkdirat(dirfd, name, 0o755)
	} else {
		var f int
		f, err = unix.Openat(dirfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
		if err == nil {
			unix.Close(f)
		}
	}
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, err
	}
	if err == nil {
		if err := unix.Fchownat(dirfd, name, int(uid), int(uid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return -1, err
		}
	}
	return unix.Openat2(dirfd, name, &how)
}
