package storage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/idmap"
	"github.com/airlockhq/airlock/internal/mountinfo"
)

// A reset in place gives a sandbox whose root is set up (and in use by its
// init) a fresh root over new layers without tearing down its writable
// layer's file system: Restage mounts the new overlay beside the current one
// (an empty upper on the same ext4 image or tmpfs, new idmapped lower
// mounts), the runtime moves its processes' root onto it, and Commit puts it
// where the old one was and deletes the old upper. The layout inside
// storage/ stays Setup's once committed (rw/upper, rw/work, lower*/):
// UpperDir, usage and TeardownDir see nothing different.

// Names of a staged root.
const (
	stagedName = "rootfs.new"
	newSuffix  = ".new"
	oldSuffix  = ".old"
)

// Staged is a new root filesystem mounted beside a sandbox's current one.
type Staged struct {
	dir    string // resolved Options.Dir
	lowers string // storage/lower.<n> of the new layers
	done   bool
}

// Path is the new merged overlay, mounted on the host. The runtime takes a
// clone of it (open_tree) into the sandbox's mount namespace.
func (s *Staged) Path() string { return filepath.Join(s.dir, stagedName) }

// Restage mounts a new root for the sandbox in opts.Dir, whose root Setup
// made and which still runs on it: the template layers opts.Layers under an
// empty upper directory on the sandbox's writable layer (opts.SizeMB and
// opts.Tmpfs are those of the existing layer and are not changed). On error
// nothing new is left.
func Restage(ctx context.Context, opts Options) (_ *Staged, retErr error) {
	if opts.SizeMB == 0 {
		opts.SizeMB = MinSizeMB // the existing layer's size is not Restage's to check
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	dir, err := filepath.EvalSymlinks(opts.Dir)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrNotFound, "storage dir %q: %v", opts.Dir, err)
	}
	rw, _, err := mountedLayer(dir)
	if err != nil {
		return nil, err
	}
	st := filepath.Join(dir, storageName)
	s := &Staged{dir: dir}
	// Whatever an earlier restage that stopped half way left goes first.
	s.clear(ctx)
	defer func() {
		if retErr != nil {
			s.Abort(ctx)
		}
	}()

	// The lower mounts of the new root: storage/lower.<n>/<i>, n one above
	// every set there is.
	gen := 1
	ents, err := os.ReadDir(st)
	if err != nil {
		return nil, fmt.Errorf("reading storage dir: %w", err)
	}
	for _, e := range ents {
		if n, ok := strings.CutPrefix(e.Name(), lowerName+"."); ok {
			if v, err := strconv.Atoi(n); err == nil && v >= gen {
				gen = v + 1
			}
		}
	}
	s.lowers = filepath.Join(st, lowerName+"."+strconv.Itoa(gen))
	if err := os.Mkdir(s.lowers, 0o700); err != nil {
		return nil, fmt.Errorf("creating lower dir: %w", err)
	}
	lowers := make([]string, len(opts.Layers))
	for i, layer := range opts.Layers {
		l := filepath.Join(s.lowers, strconv.Itoa(i))
		lowers[len(lowers)-1-i] = l
		if err := os.Mkdir(l, 0o700); err != nil {
			return nil, fmt.Errorf("creating lower dir: %w", err)
		}
		if err := idmap.Mount(layer, l, opts.UIDBase, opts.IDCount); err != nil {
			return nil, fmt.Errorf("mounting template layer %d: %w", i, err)
		}
	}

	// The new upper and work dirs take the old ones' owner and mode (the
	// old upper's root is the merged root's, as Setup made it).
	upper, work := filepath.Join(rw, upperName+newSuffix), filepath.Join(rw, "work"+newSuffix)
	for _, d := range [][2]string{{filepath.Join(rw, upperName), upper}, {filepath.Join(rw, "work"), work}} {
		var fi unix.Stat_t
		if err := unix.Lstat(d[0], &fi); err != nil {
			return nil, fmt.Errorf("stat %s: %w", filepath.Base(d[0]), classify(err))
		}
		if err := os.Mkdir(d[1], 0o700); err != nil {
			return nil, fmt.Errorf("creating %s: %w", filepath.Base(d[1]), err)
		}
		if err := os.Lchown(d[1], int(fi.Uid), int(fi.Gid)); err != nil {
			return nil, fmt.Errorf("chown %s: %w", filepath.Base(d[1]), err)
		}
		if err := os.Chmod(d[1], fs.FileMode(fi.Mode&0o777)|unixModeBits(fi.Mode)); err != nil {
			return nil, fmt.Errorf("chmod %s: %w", filepath.Base(d[1]), err)
		}
	}
	data := "lowerdir=" + strings.Join(lowers, ":") + ",upperdir=" + upper + ",workdir=" + work + ",index=off"
	if len(data) >= os.Getpagesize() {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "too many template layers for overlayfs options")
	}
	if err := os.Mkdir(s.Path(), 0o755); err != nil {
		return nil, fmt.Errorf("creating staged rootfs dir: %w", err)
	}
	if err := unix.Mount("overlay", s.Path(), "overlay", 0, data); err != nil {
		return nil, fmt.Errorf("mounting overlay: %w", classify(err))
	}
	return s, nil
}

// Commit makes the staged root the sandbox's, once the runtime moved the
// sandbox onto it: the old overlay and its lower mounts are unmounted, the
// new overlay takes rootfs/, the new upper and work dirs take the old ones'
// names, and the old ones are deleted (freeing their bytes on the layer).
func (s *Staged) Commit(ctx context.Context) error {
	if s.done {
		return errdefs.Wrap(errdefs.ErrInvalidState, "staged root already committed or aborted")
	}
	s.done = true
	rootfs := filepath.Join(s.dir, rootfsName)
	st := filepath.Join(s.dir, storageName)
	rw := filepath.Join(st, rwName)
	// The old root's mounts: rootfs/ and every lower set but the new one.
	mounts, err := mountinfo.Read()
	if err != nil {
		return err
	}
	var old []string
	for _, m := range mounts {
		if m.Target == rootfs || (strings.HasPrefix(m.Target, st+"/"+lowerName) && !strings.HasPrefix(m.Target, s.lowers+"/")) {
			old = append(old, m.Target)
		}
	}
	// Deepest first, each lazily: the sandbox no longer uses them, but a
	// host process reading its files (a download) might.
	for i := len(old) - 1; i >= 0; i-- {
		if err := unix.Unmount(old[i], unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmounting old root %s: %w", old[i], classify(err))
		}
	}
	// A bind, not a move: a move is refused under a shared mount (the
	// host's / often is).
	if err := unix.Mount(s.Path(), rootfs, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("mounting the new root at rootfs: %w", classify(err))
	}
	if err := unix.Unmount(s.Path(), unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmounting the staged root: %w", classify(err))
	}
	_ = os.Remove(s.Path())
	for _, name := range []string{upperName, "work"} {
		cur := filepath.Join(rw, name)
		if err := os.Rename(cur, cur+oldSuffix); err != nil {
			return fmt.Errorf("retiring old %s: %w", name, err)
		}
		if err := os.Rename(cur+newSuffix, cur); err != nil {
			return fmt.Errorf("naming new %s: %w", name, err)
		}
	}
	s.removeOld(ctx)
	return nil
}

// Abort undoes Restage: the staged overlay and its lower mounts go, and the
// new upper and work dirs with them. The sandbox's current root is left
// as it was. Safe to call after a failed Restage or twice.
func (s *Staged) Abort(ctx context.Context) {
	if s.done {
		return
	}
	s.done = true
	s.clear(ctx)
}

// clear removes what a staged root is made of, if anything.
func (s *Staged) clear(ctx context.Context) {
	st := filepath.Join(s.dir, storageName)
	rw := filepath.Join(st, rwName)
	roots := []string{s.Path()}
	if s.lowers != "" {
		roots = append(roots, s.lowers)
	}
	if err := unmountUnder(ctx, roots); err != nil {
		slog.WarnContext(ctx, "removing a staged root", "dir", s.dir, "err", err)
		return
	}
	for _, p := range append(roots, filepath.Join(rw, upperName+newSuffix), filepath.Join(rw, "work"+newSuffix)) {
		if err := os.RemoveAll(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			slog.WarnContext(ctx, "removing a staged root", "path", p, "err", err)
		}
	}
	s.removeOld(ctx)
}

// removeOld deletes the old upper and work dirs and the emptied lower
// mount dirs of earlier roots.
func (s *Staged) removeOld(ctx context.Context) {
	st := filepath.Join(s.dir, storageName)
	rw := filepath.Join(st, rwName)
	for _, p := range []string{filepath.Join(rw, upperName+oldSuffix), filepath.Join(rw, "work"+oldSuffix)} {
		// The work dir's work/ is mode 000: RemoveAll as root gets through.
		if err := os.RemoveAll(p); err != nil {
			slog.WarnContext(ctx, "removing an old upper layer", "path", p, "err", err)
		}
	}
	ents, err := os.ReadDir(st)
	if err != nil {
		return
	}
	mounts, err := mountinfo.Read()
	if err != nil {
		return
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), lowerName) {
			continue
		}
		p := filepath.Join(st, e.Name())
		if p == s.lowers {
			continue
		}
		if _, busy := mountinfo.MountedUnder(mounts, p); busy {
			continue
		}
		// Only empty mount point dirs are left in it: Remove, not RemoveAll,
		// so that nothing below a mount could ever be deleted.
		subs, _ := os.ReadDir(p)
		for _, sub := range subs {
			_ = os.Remove(filepath.Join(p, sub.Name()))
		}
		_ = os.Remove(p)
	}
}
