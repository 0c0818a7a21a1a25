// Package storage prepares and tears down a sandbox's root filesystem: an overlay of idmapped, read-only template layers under a size-limited writable layer.
//
// Layout inside the sandbox directory (Options.Dir):
//
//	rootfs/          the merged overlay handed to the runtime
//	storage/         0700, nothing in it is visible to the sandbox
//	  disk.img       sparse ext4 image of the writable layer (absent with Tmpfs)
//	  rw/            mount of that image (or of a tmpfs): upper/ and work/
//	    host/        0700, host root's: the host's files charged to the
//	                 sandbox's quota, outside the overlay (PrivateDir)
//	  lower/<n>/     read-only idmapped mount of Layers[n]
//
// Every mount made here lives at or under the sandbox directory, so
// TeardownDir can find and undo all of it from /proc/self/mountinfo alone,
// e.g. after a daemon restart or a Setup that stopped half way.
package storage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/idmap"
)

// Options describe one sandbox's root filesystem.
type Options struct {
	Dir     string   // per-sandbox directory on the host (exists, owned by root); storage works inside it
	Layers  []string // read-only template directories on the host, lowest first
	UIDBase uint32   // host uid that container uid 0 maps to (same for gid)
	IDCount uint32   // size of the id range (65536)
	SizeMB  int64    // size of the writable layer (disk quota)
	Tmpfs   bool     // writable layer on tmpfs of SizeMB instead of a loop-mounted ext4 image
}

// Names inside Options.Dir.
const (
	rootfsName  = "rootfs"
	storageName = "storage"
	imageName   = "disk.img"
	rwName      = "rw"
	privateName = "host"
	upperName   = "upper"
	lowerName   = "lower"
)

// MinSizeMB is the smallest writable layer Setup accepts: below it mkfs.ext4
// cannot lay out a usable filesystem.
const MinSizeMB = 8

// teardownTimeout bounds a rollback or teardown that runs on a context
// detached from the caller's: a few unmounts never take this long unless the
// kernel is stuck writing back a huge dirty layer.
const teardownTimeout = 60 * time.Second

// Rootfs is a prepared, mounted root filesystem.
type Rootfs struct {
	dir string // resolved Options.Dir
}

// Path is the merged overlay directory to hand to runc as root.path.
func (r *Rootfs) Path() string { return filepath.Join(r.dir, rootfsName) }

// Teardown unmounts and removes everything Setup made. It is idempotent.
func (r *Rootfs) Teardown(ctx context.Context) error { return TeardownDir(ctx, r.dir) }

func (o Options) validate() error {
	switch {
	case !filepath.IsAbs(o.Dir):
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "storage dir %q is not absolute", o.Dir)
	case strings.ContainsAny(o.Dir, ",:\\"):
		// The overlay option string separates with these characters.
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "storage dir %q has a character overlayfs cannot take", o.Dir)
	case len(o.Layers) == 0:
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "no template layers")
	case o.IDCount == 0 || uint64(o.UIDBase)+uint64(o.IDCount) > 1<<32-1:
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "id range %d+%d", o.UIDBase, o.IDCount)
	case o.SizeMB < MinSizeMB:
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "writable layer of %d MB is below %d MB", o.SizeMB, MinSizeMB)
	case o.SizeMB > 1<<24:
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "writable layer of %d MB is too large", o.SizeMB)
	}
	for _, l := range o.Layers {
		fi, err := os.Stat(l)
		if err != nil {
			return errdefs.Wrap(errdefs.ErrNotFound, "template layer %q: %v", l, err)
		}
		if !fi.IsDir() {
			return errdefs.Wrap(errdefs.ErrInvalidArgument, "template layer %q is not a directory", l)
		}
	}
	return nil
}

// Setup mounts the root filesystem described by opts inside opts.Dir and
// returns it. opts.Dir must not hold an earlier rootfs (call TeardownDir
// first). On error nothing is left mounted or created.
func Setup(ctx context.Context, opts Options) (_ *Rootfs, retErr error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// mountinfo shows resolved paths; resolving once here keeps every later
	// comparison (teardown, usage) exact.
	dir, err := filepath.EvalSymlinks(opts.Dir)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrNotFound, "storage dir %q: %v", opts.Dir, err)
	}
	rootfs := filepath.Join(dir, rootfsName)
	st := filepath.Join(dir, storageName)
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, errdefs.Wrap(errdefs.ErrAlreadyExists, "rootfs already set up in %s", dir)
		}
		return nil, fmt.Errorf("creating rootfs dir: %w", err)
	}
	if err := os.Mkdir(st, 0o700); err != nil {
		_ = os.Remove(rootfs)
		if errors.Is(err, fs.ErrExist) {
			return nil, errdefs.Wrap(errdefs.ErrAlreadyExists, "storage already set up in %s", dir)
		}
		return nil, fmt.Errorf("creating storage dir: %w", err)
	}
	defer func() {
		if retErr == nil {
			return
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), teardownTimeout)
		defer cancel()
		if err := teardown(cctx, dir, []string{rootfs, st}); err != nil {
			slog.ErrorContext(cctx, "storage rollback failed", "dir", dir, "err", err)
		}
	}()

	rw := filepath.Join(st, rwName)
	if err := os.Mkdir(rw, 0o700); err != nil {
		return nil, fmt.Errorf("creating rw dir: %w", err)
	}
	if opts.Tmpfs {
		data := fmt.Sprintf("size=%dm,uid=%d,gid=%d,mode=0700", opts.SizeMB, opts.UIDBase, opts.UIDBase)
		if err := unix.Mount("tmpfs", rw, "tmpfs", unix.MS_NODEV|unix.MS_NOSUID, data); err != nil {
			return nil, fmt.Errorf("mounting tmpfs layer: %w", classify(err))
		}
	} else if err := mountImage(ctx, filepath.Join(st, imageName), rw, opts); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	lowers := make([]string, len(opts.Layers))
	if err := os.Mkdir(filepath.Join(st, lowerName), 0o700); err != nil {
		return nil, fmt.Errorf("creating lower dir: %w", err)
	}
	for i, layer := range opts.Layers {
		// overlayfs wants the top layer first.
		l := filepath.Join(st, lowerName, strconv.Itoa(i))
		lowers[len(lowers)-1-i] = l
		if err := os.Mkdir(l, 0o700); err != nil {
			return nil, fmt.Errorf("creating lower dir: %w", err)
		}
		if err := idmap.Mount(layer, l, opts.UIDBase, opts.IDCount); err != nil {
			return nil, fmt.Errorf("mounting template layer %d: %w", i, err)
		}
	}

	upper, work := filepath.Join(rw, upperName), filepath.Join(rw, "work")
	// The merged root directory takes its owner and mode from upper/, so copy
	// them from the top layer's root as the sandbox sees it (through idmap).
	var top unix.Stat_t
	if err := unix.Stat(lowers[0], &top); err != nil {
		return nil, fmt.Errorf("stat top layer: %w", err)
	}
	for _, d := range []struct {
		path     string
		mode     uint32
		uid, gid uint32
	}{
		{upper, top.Mode & 0o7777, top.Uid, top.Gid},
		{work, 0o700, opts.UIDBase, opts.UIDBase},
	} {
		if err := os.Mkdir(d.path, 0o700); err != nil {
			return nil, fmt.Errorf("creating %s: %w", filepath.Base(d.path), err)
		}
		if err := os.Chown(d.path, int(d.uid), int(d.gid)); err != nil {
			return nil, fmt.Errorf("chown %s: %w", filepath.Base(d.path), err)
		}
		if err := os.Chmod(d.path, fs.FileMode(d.mode&0o777)|unixModeBits(d.mode)); err != nil {
			return nil, fmt.Errorf("chmod %s: %w", filepath.Base(d.path), err)
		}
	}

	if err := os.Mkdir(filepath.Join(rw, privateName), 0o700); err != nil {
		return nil, fmt.Errorf("creating private dir: %w", err)
	}

	data := "lowerdir=" + strings.Join(lowers, ":") + ",upperdir=" + upper + ",workdir=" + work + ",index=off"
	if len(data) >= os.Getpagesize() {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "too many template layers for overlayfs options")
	}
	if err := unix.Mount("overlay", rootfs, "overlay", 0, data); err != nil {
		return nil, fmt.Errorf("mounting overlay: %w", classify(err))
	}
	return &Rootfs{dir: dir}, nil
}

// PrivateDir returns the directory of the sandbox in dir (Options.Dir)
// where the host keeps files written on the sandbox's behalf (the agent's
// log): on the writable layer's file system, beside the overlay's upper
// and work dirs, so what lands there counts against the sandbox's disk
// quota (or its tmpfs size) and nothing more, yet it is no part of the
// sandbox's root and nothing inside can see or reach it. It is host root's,
// mode 0700, made here if the layer has none (storage set up by an earlier
// version). It fails with an error wrapping errdefs.ErrNotFound when no
// writable layer is mounted in dir: the directory would then be on the
// host's own disk.
func PrivateDir(dir string) (string, error) {
	rw, mnt, err := mountedLayer(dir)
	if err != nil {
		return "", err
	}
	p := filepath.Join(rw, privateName)
	if err := unix.Mkdir(p, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return "", fmt.Errorf("creating private dir: %w", classify(err))
	}
	var fi unix.Stat_t
	if err := unix.Lstat(p, &fi); err != nil {
		return "", fmt.Errorf("private dir: %w", classify(err))
	}
	if fi.Mode&unix.S_IFMT != unix.S_IFDIR || fi.Uid != 0 || fi.Dev != mnt.Dev {
		return "", errdefs.Wrap(errdefs.ErrInternal, "private dir of %s is not host root's directory on its writable layer", dir)
	}
	return p, nil
}

// mountedLayer returns the mount point of the writable layer of the
// sandbox in dir and its stat, or an error wrapping errdefs.ErrNotFound
// when none is mounted there.
func mountedLayer(dir string) (string, *unix.Stat_t, error) {
	st := filepath.Join(dir, storageName)
	rw := filepath.Join(st, rwName)
	var parent, mnt unix.Stat_t
	if err := unix.Stat(st, &parent); err != nil {
		return "", nil, errdefs.Wrap(errdefs.ErrNotFound, "no storage in %s", dir)
	}
	if err := unix.Stat(rw, &mnt); err != nil || mnt.Dev == parent.Dev {
		return "", nil, errdefs.Wrap(errdefs.ErrNotFound, "no writable layer mounted in %s", dir)
	}
	return rw, &mnt, nil
}

// UpperDir returns the overlay's upper directory of the sandbox in dir
// (Options.Dir): what the sandbox changed over its template layers, as
// overlayfs keeps it (whiteouts, opaque directories), owned by the
// sandbox's uids. It fails with an error wrapping errdefs.ErrNotFound when
// no writable layer is mounted in dir. The directory belongs to the
// sandbox: nothing in it may be followed.
func UpperDir(dir string) (string, error) {
	rw, _, err := mountedLayer(dir)
	if err != nil {
		return "", err
	}
	return filepath.Join(rw, upperName), nil
}

// unixModeBits turns setuid/setgid/sticky bits of a stat mode into os bits.
func unixModeBits(m uint32) fs.FileMode {
	var fm fs.FileMode
	if m&unix.S_ISUID != 0 {
		fm |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		fm |= fs.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		fm |= fs.ModeSticky
	}
	return fm
}

// mountImage creates a sparse ext4 image of opts.SizeMB at image, attaches it
// to a loop device and mounts it at target, owned by the sandbox's root.
func mountImage(ctx context.Context, image, target string, opts Options) error {
	if err := makeImage(ctx, image, opts.SizeMB); err != nil {
		return err
	}
	loop, err := attachLoop(image)
	if err != nil {
		return err
	}
	// The loop device is set to clear itself on last close: keep our handle
	// until the mount holds its own reference, then let go, so that unmount
	// alone frees the device.
	defer loop.Close()
	// noinit_itable: the image is sparse, so its inode tables already read as
	// zeroes; letting ext4lazyinit zero them would write tens of MB per sandbox.
	// The layer is scratch, gone with its sandbox and useless after a host
	// crash, so durability buys nothing: noauto_da_alloc keeps a file
	// renamed over another (every upload, many editors) from forcing its
	// writeback at once, and nobarrier keeps fsync in the sandbox (package
	// managers call it per file) from flushing the host disk's cache.
	if err := unix.Mount(loop.Name(), target, "ext4", unix.MS_NODEV|unix.MS_NOSUID, scratchMountOptions); err != nil {
		return fmt.Errorf("mounting %s: %w", loop.Name(), classify(err))
	}
	// Images are shared templates (see makeImage): give the root to the sandbox here.
	if err := os.Chown(target, int(opts.UIDBase), int(opts.UIDBase)); err != nil {
		return fmt.Errorf("chown writable layer: %w", err)
	}
	return nil
}

// scratchMountOptions are the ext4 options of the writable layer (see
// mountImage for why).
const scratchMountOptions = "noinit_itable,noauto_da_alloc,nobarrier"

var mkfsPath = sync.OnceValues(func() (string, error) {
	if p, err := exec.LookPath("mkfs.ext4"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errdefs.Wrap(errdefs.ErrRuntimeUnavailable, "mkfs.ext4 not found (install e2fsprogs)")
})

// mkfs formats image as a scratch ext4.
func mkfs(ctx context.Context, image string) error {
	bin, err := mkfsPath()
	if err != nil {
		return err
	}
	args := []string{
		"-q", "-F",
		"-b", "4096",
		// One inode per 8 KiB: sandboxes unpack package trees full of small files.
		"-i", "8192",
		"-m", "0", // the quota is the sandbox's, keep nothing back for root
		// A scratch layer dies with its sandbox: no journal, no room to grow.
		"-O", "^has_journal,^resize_inode",
		// The image is sparse: inode tables read as zeroes without being written.
		"-E", "lazy_itable_init=1,nodiscard",
		image,
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: mkfs.ext4: %v: %s", errdefs.ErrInternal, err, tail(out, 512))
	}
	return nil
}

func tail(b []byte, n int) string {
	s := strings.TrimSpace(string(b))
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return s
}

// classify maps errnos of mount and file syscalls to error classes.
func classify(err error) error {
	switch {
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return fmt.Errorf("%w: %w", errdefs.ErrCapacityExhausted, err)
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return fmt.Errorf("%w: %w", errdefs.ErrPermissionDenied, err)
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
	case errors.Is(err, unix.ENODEV), errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("%w: %w", errdefs.ErrRuntimeUnavailable, err)
	default:
		return fmt.Errorf("%w: %w", errdefs.ErrInternal, err)
	}
}
