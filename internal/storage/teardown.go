package storage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/mountinfo"
)

// busyRetry is how long an unmount that fails with EBUSY is retried before it
// falls back to a lazy unmount: a host process (runc exec, a test) may still
// be leaving the tree.
const busyRetry = 200 * time.Millisecond

// TeardownDir undoes Setup knowing only opts.Dir (e.g. after a daemon restart
// or a Setup that stopped half way): it unmounts every mount at or under dir,
// deepest first, detaches loop devices backed by files under dir and removes
// the files storage made (rootfs/ and storage/; other files in dir are the
// caller's). It is idempotent, and it runs to the end even if ctx is cancelled.
func TeardownDir(ctx context.Context, dir string) error {
	if !filepath.IsAbs(dir) {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "storage dir %q is not absolute", dir)
	}
	real, err := filepath.EvalSymlinks(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("resolving %s: %w", dir, err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), teardownTimeout)
	defer cancel()
	if err := unmountAll(ctx, real, []string{real}); err != nil {
		return err
	}
	return removeFiles(real, []string{filepath.Join(real, rootfsName), filepath.Join(real, storageName)})
}

// UnmountTree unmounts every mount at or under dir (deepest first, busy ones
// lazily after a short wait) and detaches loop devices backed by files under
// dir. It removes no files. Other packages use it before they delete a tree a
// tool may have left mounts in (debootstrap mounts /proc and /sys in its target).
func UnmountTree(ctx context.Context, dir string) error {
	if !filepath.IsAbs(dir) {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "dir %q is not absolute", dir)
	}
	real, err := filepath.EvalSymlinks(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("resolving %s: %w", dir, err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), teardownTimeout)
	defer cancel()
	return unmountAll(ctx, real, []string{real})
}

// teardown unmounts what lies under roots (inside dir), detaches loop devices
// backed by files under dir and removes roots.
func teardown(ctx context.Context, dir string, roots []string) error {
	if err := unmountAll(ctx, dir, roots); err != nil {
		return err
	}
	return removeFiles(dir, roots)
}

func unmountAll(ctx context.Context, dir string, roots []string) error {
	var errs []error
	if err := unmountUnder(ctx, roots); err != nil {
		errs = append(errs, err)
	}
	// With LO_FLAGS_AUTOCLEAR the unmounts already freed our devices; this
	// catches a device bound by a Setup that died before mounting it.
	loops, err := boundLoops()
	if err != nil {
		errs = append(errs, fmt.Errorf("listing loop devices: %w", err))
	}
	for _, l := range loops {
		if under(l.Backing, dir) {
			if err := detachLoop(l.Name); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// unmountUnder unmounts everything at or under roots. It works in passes,
// deepest and newest first, because a mount hidden under another one on the
// same path is only reachable once the upper one is gone. When a pass makes
// no progress for busyRetry (a host process still inside the tree), the rest
// is detached lazily.
func unmountUnder(ctx context.Context, roots []string) error {
	deadline := time.Now().Add(busyRetry)
	for {
		all, err := mountinfo.Read()
		if err != nil {
			return fmt.Errorf("reading mountinfo: %w", err)
		}
		sel := mountsUnder(all, roots)
		if len(sel) == 0 {
			return nil
		}
		progress := false
		var busy []string
		for _, m := range sel {
			err := unix.Unmount(m.Target, unix.UMOUNT_NOFOLLOW)
			switch {
			case err == nil:
				progress = true
			case errors.Is(err, unix.EBUSY):
				busy = append(busy, m.Target)
			case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
				// Hidden under another mount or gone meanwhile: next pass.
			default:
				return fmt.Errorf("unmounting %s: %w", m.Target, err)
			}
		}
		if progress {
			continue
		}
		if len(busy) == 0 {
			// Nothing we can reach: it cannot be unmounted from here.
			return errdefs.Wrap(errdefs.ErrInternal, "cannot reach mount %s", sel[0].Target)
		}
		if time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		for _, target := range busy {
			slog.WarnContext(ctx, "mount busy, detaching lazily", "target", target)
			if err := unix.Unmount(target, unix.UMOUNT_NOFOLLOW|unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("detaching %s: %w", target, err)
			}
		}
	}
}

// removeFiles removes paths after checking that nothing is mounted under
// them any more: removing through a live mount would delete the sandbox's
// data or, worse, a template's.
func removeFiles(dir string, paths []string) error {
	all, err := mountinfo.Read()
	if err != nil {
		return fmt.Errorf("reading mountinfo: %w", err)
	}
	if left := mountsUnder(all, paths); len(left) > 0 {
		return errdefs.Wrap(errdefs.ErrInternal, "still mounted after teardown: %s", left[0].Target)
	}
	var errs []error
	for _, p := range paths {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}
