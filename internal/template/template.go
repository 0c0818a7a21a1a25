// Package template builds, versions and looks up the read-only root filesystems sandboxes start from.
//
// A store directory (<data-dir>/templates) holds one directory per template
// name and one per version below it:
//
//	templates/
//	  .lock                 flock taken while a template is built
//	  .build-base-…/        a build in progress; never counts as a template
//	  base/1/rootfs/        the root filesystem, shared read-only by sandboxes
//	  base/1/meta.json      name, version, recipe hash, size, created_at
//	  python/1/rootfs/      the other shipped templates, built on demand
//	  layers/<key>/rootfs/  content layers of built and imported templates
//	                        (layers.go), stacked on a recipe's rootfs, and
//	                        snapshots' captured layers (snapshot.go)
//	  layers/<key>/.used-…  when each daemon sharing the store last used it
//	  checkpoints/<snap>/   snapshots' memory images (snapshot.go)
//
// A build happens in a temporary directory next to the versions and is
// renamed into place when it is complete, so a half-finished build is never
// seen as a template.
package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
	"github.com/airlockhq/airlock/internal/storage"
)

// Info describes one stored template version.
type Info struct {
	Name       string    `json:"name"`
	Version    int       `json:"version"`
	RecipeHash string    `json:"recipe_hash"`
	SizeBytes  int64     `json:"size_bytes"`
	CreatedAt  time.Time `json:"created_at"`
}

const (
	metaName    = "meta.json"
	rootfsName  = "rootfs"
	lockName    = ".lock"
	buildPrefix = ".build-"
)

// lockPoll is how often a caller waiting for another build re-tries the lock;
// builds take tens of seconds, so a fraction of a second is plenty.
const lockPoll = 250 * time.Millisecond

var validName = lazyregexp.New(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// Store keeps templates under one directory (<data-dir>/templates).
type Store struct {
	dir string
	// base is the recipe EnsureBase builds; tests swap in a fast one.
	base recipe
	// shipped are the other recipes EnsureShipped builds, by name.
	shipped map[string]recipe
	// user names this store's user among the daemons that may share the
	// directory (the path dir was given as: each daemon reaches a shared
	// store through its own data dir): see markUse.
	user string
}

// NewStore returns a store rooted at dir (<data-dir>/templates). The
// directory is created on first use.
func NewStore(dir string) *Store {
	sum := sha256.Sum256([]byte(filepath.Clean(dir)))
	s := &Store{dir: dir, base: debianBase, shipped: map[string]recipe{}, user: hex.EncodeToString(sum[:6])}
	for _, r := range shippedRecipes {
		s.shipped[r.name] = r
	}
	return s
}

// EnsureBase returns the base template, building it first if no version
// built from the current recipe exists. Progress lines (one per step, with
// elapsed seconds) go to progress, which may be nil. Concurrent callers, in
// this process or others, build it once: the others wait and reuse it.
func (s *Store) EnsureBase(ctx context.Context, progress io.Writer) (driver.Template, error) {
	return s.ensure(ctx, s.base, progress)
}

func (s *Store) ensure(ctx context.Context, r recipe, progress io.Writer) (driver.Template, error) {
	hash := r.hash()
	if t, ok := s.findBuilt(r.name, hash); ok {
		return t, nil
	}
	p := newProgress(progress)
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return driver.Template{}, fmt.Errorf("creating template store: %w", err)
	}
	unlock, err := s.lock(ctx, p)
	if err != nil {
		return driver.Template{}, err
	}
	defer unlock()
	// Someone else may have built it while we waited for the lock.
	if t, ok := s.findBuilt(r.name, hash); ok {
		p.step("template %s is ready (built by another caller)", r.name)
		return t, nil
	}
	s.removeStaleBuilds(ctx)

	version := 1
	if infos, err := s.versions(r.name); err == nil && len(infos) > 0 {
		version = infos[0].Version + 1
	}
	tmp, err := os.MkdirTemp(s.dir, buildPrefix+r.name+"-")
	if err != nil {
		return driver.Template{}, fmt.Errorf("creating build dir: %w", err)
	}
	done := false
	defer func() {
		if !done {
			s.removeBuild(ctx, tmp)
		}
	}()
	p.step("building template %s version %d", r.name, version)
	rootfs := filepath.Join(tmp, rootfsName)
	if err := r.build(ctx, rootfs, r.Spec, p); err != nil {
		return driver.Template{}, fmt.Errorf("building template %s: %w", r.name, err)
	}
	size, err := diskUsage(rootfs)
	if err != nil {
		return driver.Template{}, fmt.Errorf("measuring template: %w", err)
	}
	m := Info{Name: r.name, Version: version, RecipeHash: hash, SizeBytes: size, CreatedAt: time.Now().UTC().Truncate(time.Second)}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return driver.Template{}, err
	}
	if err := os.WriteFile(filepath.Join(tmp, metaName), append(b, '\n'), 0o644); err != nil {
		return driver.Template{}, fmt.Errorf("writing template meta: %w", err)
	}
	// Make the tree durable before it becomes visible: after a crash a
	// renamed but unsynced template could hold empty files.
	if err := syncFS(tmp); err != nil {
		return driver.Template{}, err
	}
	if err := os.MkdirAll(filepath.Join(s.dir, r.name), 0o700); err != nil {
		return driver.Template{}, fmt.Errorf("creating template dir: %w", err)
	}
	final := filepath.Join(s.dir, r.name, strconv.Itoa(version))
	if err := os.Rename(tmp, final); err != nil {
		return driver.Template{}, fmt.Errorf("publishing template: %w", err)
	}
	done = true
	p.step("template %s version %d ready (%d MB)", r.name, version, size>>20)
	return templateOf(s.dir, m), nil
}

// Get returns template name at version; version 0 means the newest. A missing
// template is an error wrapping errdefs.ErrNotFound.
func (s *Store) Get(name string, version int) (driver.Template, error) {
	if !validName.MatchString(name) || version < 0 {
		return driver.Template{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "template %q version %d", name, version)
	}
	if version > 0 {
		m, err := readMeta(filepath.Join(s.dir, name, strconv.Itoa(version)))
		if err != nil {
			return driver.Template{}, errdefs.Wrap(errdefs.ErrNotFound, "template %s version %d", name, version)
		}
		return templateOf(s.dir, m), nil
	}
	infos, err := s.versions(name)
	if err != nil || len(infos) == 0 {
		return driver.Template{}, errdefs.Wrap(errdefs.ErrNotFound, "template %s", name)
	}
	return templateOf(s.dir, infos[0]), nil
}

// List returns every stored template version, by name, newest version first.
func (s *Store) List() ([]Info, error) {
	ents, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing templates: %w", err)
	}
	var out []Info
	for _, e := range ents {
		if !e.IsDir() || !validName.MatchString(e.Name()) || e.Name() == layersDir || e.Name() == checkpointsDir {
			continue
		}
		infos, err := s.versions(e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, infos...)
	}
	return out, nil
}

// versions lists the complete versions of name, newest first.
func (s *Store) versions(name string) ([]Info, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing template %s: %w", name, err)
	}
	var out []Info
	for _, e := range ents {
		v, err := strconv.Atoi(e.Name())
		if err != nil || v <= 0 || !e.IsDir() {
			continue
		}
		m, err := readMeta(filepath.Join(s.dir, name, e.Name()))
		if err != nil || m.Name != name || m.Version != v {
			continue // not a complete template
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version > out[j].Version })
	return out, nil
}

// findBuilt returns the newest version of name built from the recipe hash.
func (s *Store) findBuilt(name, hash string) (driver.Template, bool) {
	infos, err := s.versions(name)
	if err != nil {
		return driver.Template{}, false
	}
	for _, m := range infos {
		if m.RecipeHash == hash {
			return templateOf(s.dir, m), true
		}
	}
	return driver.Template{}, false
}

func readMeta(dir string) (Info, error) {
	var m Info
	b, err := os.ReadFile(filepath.Join(dir, metaName))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, err
	}
	if fi, err := os.Stat(filepath.Join(dir, rootfsName)); err != nil || !fi.IsDir() {
		return m, errors.New("template without rootfs")
	}
	return m, nil
}

func templateOf(storeDir string, m Info) driver.Template {
	return driver.Template{
		Name:    m.Name,
		Version: m.Version,
		Layers:  []string{filepath.Join(storeDir, m.Name, strconv.Itoa(m.Version), rootfsName)},
	}
}

// lock takes the store's build lock, waiting until ctx is done. flock
// excludes other processes and, through separate open files, other callers
// in this one.
func (s *Store) lock(ctx context.Context, p *progress) (func(), error) {
	f, err := os.OpenFile(filepath.Join(s.dir, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening template lock: %w", err)
	}
	said := false
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking template store: %w", err)
		}
		if !said {
			p.step("waiting for another build of the template")
			said = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(lockPoll):
		}
	}
}

// removeStaleBuilds deletes build directories of builds that died; it runs
// under the lock, so no build is in progress.
func (s *Store) removeStaleBuilds(ctx context.Context) {
	m, _ := filepath.Glob(filepath.Join(s.dir, buildPrefix+"*"))
	for _, d := range m {
		s.removeBuild(ctx, d)
	}
}

// removeBuild deletes a build directory after unmounting what a killed
// debootstrap may have left mounted in it (/proc, /sys): deleting through
// those mounts would reach the host's files.
func (s *Store) removeBuild(ctx context.Context, dir string) {
	if err := storage.UnmountTree(ctx, dir); err != nil {
		return // leave it for the next build rather than delete through a mount
	}
	_ = os.RemoveAll(dir)
}

// diskUsage sums the disk blocks of the files under root, counting hard
// links once, like du.
func diskUsage(root string) (int64, error) {
	seen := map[[2]uint64]bool{}
	var total int64
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		k := [2]uint64{st.Dev, st.Ino}
		if st.Nlink > 1 && seen[k] {
			return nil
		}
		seen[k] = true
		total += st.Blocks * 512
		return nil
	})
	return total, err
}

func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncing template: %w", err)
	}
	return nil
}

// versionDir is the directory of a recipe-built template version.
func versionDir(storeDir, name string, version int) string {
	return filepath.Join(storeDir, name, strconv.Itoa(version))
}
