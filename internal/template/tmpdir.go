package template

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A store's directory may be shared by more than one daemon on a host (the
// test daemons share one template cache): a daemon that starts must not
// take another's unfinished writes for a dead daemon's. So every temporary
// directory a writer makes is held with an exclusive flock(2) on it for as
// long as it is written; the lock goes with the writer's process, so a
// dead daemon's directories are unlocked and only those are removed.

// A writer makes its directory under newPrefix, locks it and only then
// renames it to its temporary name (the lock follows the inode): a
// directory named tmpPrefix… is locked from its first moment. A newPrefix
// directory lives for microseconds; one older than newGrace is a dead
// writer's.
const (
	newPrefix = ".new-"
	newGrace  = time.Minute
)

// lockedTemp is a temporary directory in dir, named prefix…, held locked.
type lockedTemp struct {
	path string
	lock *os.File
}

// newLockedTemp makes a temporary directory in dir and locks it.
func newLockedTemp(dir, prefix string) (*lockedTemp, error) {
	n, err := os.MkdirTemp(dir, newPrefix)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(n)
	if err == nil {
		if err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
		}
	}
	if err != nil {
		os.RemoveAll(n)
		return nil, fmt.Errorf("locking a temporary directory: %w", err)
	}
	p := filepath.Join(dir, prefix+strings.TrimPrefix(filepath.Base(n), newPrefix))
	if err := os.Rename(n, p); err != nil {
		os.RemoveAll(n)
		f.Close()
		return nil, err
	}
	return &lockedTemp{path: p, lock: f}, nil
}

// unlock releases the lock (after the directory was published or removed).
func (t *lockedTemp) unlock() {
	if t != nil && t.lock != nil {
		t.lock.Close()
		t.lock = nil
	}
}

// remove removes the directory and releases its lock.
func (t *lockedTemp) remove() {
	if t == nil {
		return
	}
	_ = os.RemoveAll(t.path)
	t.unlock()
}

// removeStale removes the entries of dir named with one of prefixes (or
// newPrefix) that no live writer holds: unfinished writes and half-removed
// trash of a dead daemon. Trash is never locked: removing it twice at once
// is harmless.
func removeStale(dir string, prefixes ...string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		switch {
		case strings.HasPrefix(e.Name(), newPrefix):
			if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < newGrace {
				continue
			}
		case !hasAnyPrefix(e.Name(), prefixes):
			continue
		case held(p):
			continue
		}
		if err := os.RemoveAll(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// held reports whether a live writer holds temporary directory p.
func held(p string) bool {
	if !strings.HasPrefix(filepath.Base(p), tmpPrefix) {
		return false
	}
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return true
	}
	return false
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
