// Package idmap makes read-only idmapped mounts that show a host directory to a sandbox's user namespace with shifted owners.
//
// runc 1.1.5 ignores idmap mount options, so the daemon itself clones each
// template layer with open_tree, attaches the sandbox's uid mapping with
// mount_setattr(MOUNT_ATTR_IDMAP) and moves the result into place. The mapping
// comes from a user namespace file descriptor; creating one costs a process,
// so namespaces are cached per (base, count): uid ranges are reused by slot.
package idmap

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// holdEnv marks the short-lived helper process UserNS starts: it only has to
// exist until the parent opened its /proc/PID/ns/user, so it blocks on stdin.
const holdEnv = "_AIRLOCK_IDMAP_HOLD"

func init() {
	if os.Getenv(holdEnv) != "1" {
		return
	}
	// The parent kills us as soon as it has our namespace; reading a pipe it
	// never writes keeps us parked without running anything of the binary.
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

type key struct{ base, count uint32 }

var cache = struct {
	sync.RWMutex
	fds map[key]*os.File
	// inflight serialises creation per key so a burst of sandboxes on a new
	// range starts one helper process, not one each.
	inflight map[key]*sync.Mutex
}{fds: map[key]*os.File{}, inflight: map[key]*sync.Mutex{}}

// Mount makes a read-only, recursive, idmapped bind mount of src at dst (an
// existing directory): a file owned by uid u on disk shows as owned by base+u
// through dst (same for gids), and as u inside a user namespace that maps 0 to
// base. Ids at or above count show as the overflow id.
func Mount(src, dst string, base, count uint32) error {
	if err := validRange(base, count); err != nil {
		return err
	}
	if _, err := userNS(base, count); err != nil {
		return err
	}
	tree, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", src, classify(err))
	}
	defer unix.Close(tree)

	cache.RLock()
	f := cache.fds[key{base, count}]
	var fd uintptr
	if f != nil {
		fd = f.Fd()
	}
	attr := unix.MountAttr{
		Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY,
		Userns_fd: uint64(fd),
	}
	if f == nil {
		err = errdefs.Wrap(errdefs.ErrInternal, "user namespace cache reset during mount")
	} else {
		err = unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr)
	}
	cache.RUnlock()
	if err != nil {
		return fmt.Errorf("idmapping %s: %w", src, classify(err))
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount to %s: %w", dst, classify(err))
	}
	return nil
}

// Prepare creates and caches the user namespace for (base, count) ahead of
// the first Mount, so that Mount does not pay for it.
func Prepare(base, count uint32) error {
	if err := validRange(base, count); err != nil {
		return err
	}
	_, err := userNS(base, count)
	return err
}

// Reset closes every cached user namespace. Mounts made earlier keep their
// mapping. It is meant for tests and for shutdown.
func Reset() {
	cache.Lock()
	defer cache.Unlock()
	for k, f := range cache.fds {
		f.Close()
		delete(cache.fds, k)
	}
}

func validRange(base, count uint32) error {
	if count == 0 || uint64(base)+uint64(count) > 1<<32-1 {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "id range %d+%d", base, count)
	}
	return nil
}

// userNS returns the cached user namespace for (base, count), creating it
// if needed. The returned file stays owned by the cache.
func userNS(base, count uint32) (*os.File, error) {
	k := key{base, count}
	cache.RLock()
	f := cache.fds[k]
	cache.RUnlock()
	if f != nil {
		return f, nil
	}

	cache.Lock()
	mu := cache.inflight[k]
	if mu == nil {
		mu = new(sync.Mutex)
		cache.inflight[k] = mu
	}
	cache.Unlock()
	mu.Lock()
	defer mu.Unlock()

	cache.RLock()
	f = cache.fds[k]
	cache.RUnlock()
	if f != nil {
		return f, nil
	}
	f, err := newUserNS(base, count)
	if err != nil {
		return nil, err
	}
	cache.Lock()
	cache.fds[k] = f
	cache.Unlock()
	return f, nil
}

// newUserNS starts a helper in a new user namespace with the mapping and
// keeps a handle on the namespace. The helper is this very binary (always
// present, no dependency on host tools) parked by init before main runs;
// it is killed as soon as its namespace is open, so it costs one fork+exec.
func newUserNS(base, count uint32) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("pipe: %w", err)
	}
	defer r.Close()
	defer w.Close()

	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(base), Size: int(count)}}
	cmd := &exec.Cmd{
		Path:  "/proc/self/exe",
		Args:  []string{"airlock-userns"},
		Env:   []string{holdEnv + "=1"},
		Stdin: r,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags:                 syscall.CLONE_NEWUSER,
			UidMappings:                m,
			GidMappings:                m,
			GidMappingsEnableSetgroups: false,
			Pdeathsig:                  syscall.SIGKILL,
		},
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting user namespace helper: %w", classify(err))
	}
	// Start returns after the mappings were written and exec succeeded, so
	// the namespace is complete before we open it.
	f, openErr := os.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid))
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if openErr != nil {
		return nil, fmt.Errorf("opening user namespace: %w", classify(openErr))
	}
	return f, nil
}

// classify maps errnos from the mount and namespace syscalls to error classes.
func classify(err error) error {
	switch {
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return fmt.Errorf("%w: %w", errdefs.ErrPermissionDenied, err)
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
	case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EINVAL), errors.Is(err, unix.EOPNOTSUPP):
		// EINVAL is what mount_setattr gives when the filesystem cannot be idmapped.
		return fmt.Errorf("%w: %w", errdefs.ErrRuntimeUnavailable, err)
	default:
		return fmt.Errorf("%w: %w", errdefs.ErrInternal, err)
	}
}
