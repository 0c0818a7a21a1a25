package agent

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"sync"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// fsRoot resolves sandbox paths below one directory fd with openat2:
// RESOLVE_IN_ROOT makes ".." and absolute symlinks stop at the root (the
// kernel does it, race-free), RESOLVE_NO_MAGICLINKS refuses /proc/PID/root
// style links that would jump out of the sandbox's mount namespace.
type fsRoot struct {
	fd   int
	path string
}

func openFSRoot(p string) (*fsRoot, error) {
	fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", p, err)
	}
	return &fsRoot{fd: fd, path: p}, nil
}

func (r *fsRoot) close() { unix.Close(r.fd) }

// dir returns the directory fd paths are resolved below, and how to let
// go of it. The sandbox's own root ("/") is opened again for every call:
// a reset in place moves the agent onto a new root (pivot_root, see
// internal/driver/oci/reroot.go), and an fd opened at start would still
// name the old one.
func (r *fsRoot) dir() (int, func(), error) {
	if r.path != "/" {
		return r.fd, func() {}, nil
	}
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, nil, err
	}
	return fd, func() { unix.Close(fd) }, nil
}

var (
	openat2Once sync.Once
	openat2OK   bool
)

// hasOpenat2 reports whether the kernel has openat2 (gVisor of 2022 does not).
func hasOpenat2() bool {
	openat2Once.Do(func() {
		fd, err := unix.Openat2(unix.AT_FDCWD, "/", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC})
		if err == nil {
			unix.Close(fd)
		}
		openat2OK = !errors.Is(err, unix.ENOSYS)
	})
	return openat2OK
}

// rel turns a clean absolute sandbox path into a name relative to the root.
func rel(p string) string {
	p = strings.TrimPrefix(p, "/")
	if p == "" {
		return "."
	}
	return p
}

// open opens p (clean, absolute) below the root, following symlinks inside
// it. With nofollow, a final symlink is not followed (O_NOFOLLOW: with
// O_PATH it opens the link itself, otherwise it fails with ELOOP).
func (r *fsRoot) open(p string, flags int, mode uint32) (int, error) {
	flags |= unix.O_CLOEXEC
	if hasOpenat2() {
		dfd, release, err := r.dir()
		if err != nil {
			return -1, err
		}
		defer release()
		for {
			fd, err := unix.Openat2(dfd, rel(p), &unix.OpenHow{
				Flags:   uint64(flags),
				Mode:    uint64(mode),
				Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
			})
			// EAGAIN: a concurrent rename raced the lookup; retry.
			if err == unix.EAGAIN || err == unix.EINTR {
				continue
			}
			return fd, err
		}
	}
	// Without openat2 the agent relies on being in the sandbox's own mount
	// namespace, where "/" is the sandbox root anyway.
	if r.path != "/" {
		return -1, &agentproto.Error{Code: agentproto.CodeUnsupported, Message: "file root needs openat2"}
	}
	return unix.Open(p, flags, mode)
}

// openParent opens the directory holding p and returns it with p's base
// name, for *at calls that act on the last component itself (never
// following it).
func (r *fsRoot) openParent(p string) (int, string, error) {
	if p == "/" {
		return -1, "", &agentproto.Error{Code: agentproto.CodeInvalidArgument, Message: "not allowed on /"}
	}
	dir, base := path.Split(p)
	fd, err := r.open(path.Clean(dir), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, "", err
	}
	return fd, base, nil
}

// mkdirAll creates p and its missing parents with mode and returns an
// O_PATH fd of p. Each level is looked up through the root again, so symlinks
// on the way are followed only inside the root.
func (r *fsRoot) mkdirAll(p string, mode uint32) (int, error) {
	if fd, err := r.open(p, unix.O_PATH|unix.O_DIRECTORY, 0); err == nil {
		return fd, nil
	} else if err != unix.ENOENT {
		return -1, err
	}
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	cur := "/"
	for _, part := range parts {
		if part == "" {
			continue
		}
		pfd, err := r.open(cur, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return -1, err
		}
		err = unix.Mkdirat(pfd, part, mode)
		unix.Close(pfd)
		if err != nil && err != unix.EEXIST {
			return -1, err
		}
		cur = path.Join(cur, part)
	}
	return r.open(p, unix.O_PATH|unix.O_DIRECTORY, 0)
}

// cleanPath makes a request path absolute and clean: relative paths are
// relative to the user's home.
func cleanPath(p, home string) (string, error) {
	if p == "" {
		return "", &agentproto.Error{Code: agentproto.CodeInvalidArgument, Message: "path is required"}
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", &agentproto.Error{Code: agentproto.CodeInvalidArgument, Message: "path contains a NUL byte"}
	}
	if !utf8.ValidString(p) {
		// Never from JSON (which makes it U+FFFD), but a name is never
		// guessed at.
		return "", &agentproto.Error{Code: agentproto.CodeInvalidArgument, Message: "path is not valid UTF-8"}
	}
	if !path.IsAbs(p) {
		p = path.Join(home, p)
	}
	return path.Clean(p), nil
}
