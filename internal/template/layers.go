package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
)

// Layers live in the store directory beside the recipe-built templates:
//
//	templates/
//	  layers/<key>/rootfs/    one read-only layer: files with container ids
//	                          (host uid = container uid), overlay whiteouts
//	                          (0/0 character devices) and opaque directories
//	                          (trusted.overlay.opaque=y)
//	  layers/<key>/layer.json what made it (LayerMeta)
//	  layers/.tmp-…/          a layer being written; renamed into place
//	  layers/.trash-…/        a collected layer being removed
//
// A layer is named by a ref relative to the store directory: "layers/<key>"
// for a content layer, "<name>/<version>" for the root filesystem of a
// recipe-built template (base/1). Its files are at <dir>/<ref>/rootfs.
const (
	layersDir   = "layers"
	layerMeta   = "layer.json"
	tmpPrefix   = ".tmp-"
	trashPrefix = ".trash-"
)

// LayerKeyRE matches a content layer key: a sha256 in hex.
var LayerKeyRE = lazyregexp.New(`^[0-9a-f]{64}$`)

var layerRefRE = lazyregexp.New(`^(layers/[0-9a-f]{64}|[a-z0-9][a-z0-9._-]{0,62}/[1-9][0-9]{0,8})$`)

// LayerMeta describes how a content layer was made.
type LayerMeta struct {
	Key       string    `json:"key"`
	Parent    string    `json:"parent,omitempty"`
	CreatedBy string    `json:"created_by"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// LayerRef returns the ref of content layer key.
func LayerRef(key string) string { return layersDir + "/" + key }

// RecipeRef returns the ref of a recipe-built template's root filesystem.
func RecipeRef(name string, version int) string { return fmt.Sprintf("%s/%d", name, version) }

// ValidLayerRef reports whether ref names a layer of the store.
func ValidLayerRef(ref string) bool { return layerRefRE.MatchString(ref) }

// LayerPath returns the host directory of the layer ref (its rootfs).
func (s *Store) LayerPath(ref string) (string, error) {
	if !ValidLayerRef(ref) {
		return "", errdefs.Wrap(errdefs.ErrInvalidArgument, "layer ref %q", ref)
	}
	return filepath.Join(s.dir, filepath.FromSlash(ref), rootfsName), nil
}

// LayerPaths maps refs to host directories, checking that each exists.
func (s *Store) LayerPaths(refs []string) ([]string, error) {
	out := make([]string, len(refs))
	for i, ref := range refs {
		p, err := s.LayerPath(ref)
		if err != nil {
			return nil, err
		}
		if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
			return nil, errdefs.Wrap(errdefs.ErrNotFound, "layer %s is missing", ref)
		}
		if strings.HasPrefix(ref, layersDir+"/") {
			s.markUse(filepath.Dir(p))
		}
		out[i] = p
	}
	return out, nil
}

// Use markers. A store's directory may be shared by daemons (the test
// daemons share one cache), each of which knows only its own templates: a
// collection in one would remove a layer another's templates and sandboxes
// use. So each use of a content layer leaves a marker of the store's user
// in the layer's directory (refreshed at most once a minute), and a
// collection keeps a layer that another user used within the grace period
// (KeepRecentLayers). A daemon alone on its store sees only its own
// markers, which change nothing.
const (
	usePrefix  = ".used-"
	useRefresh = time.Minute
)

func (s *Store) markUse(layerDir string) {
	m := filepath.Join(layerDir, usePrefix+s.user)
	if fi, err := os.Stat(m); err == nil && time.Since(fi.ModTime()) < useRefresh {
		return
	}
	now := time.Now()
	if err := os.Chtimes(m, now, now); errors.Is(err, fs.ErrNotExist) {
		if f, err := os.OpenFile(m, os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
			f.Close()
		}
	}
}

// usedByOthers reports whether a user other than this store's used the
// layer in dir after since.
func (s *Store) usedByOthers(dir string, since time.Time) bool {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, usePrefix) || name == usePrefix+s.user {
			continue
		}
		if fi, err := e.Info(); err == nil && fi.ModTime().After(since) {
			return true
		}
	}
	return false
}

// HasLayer reports whether content layer key exists.
func (s *Store) HasLayer(key string) bool {
	fi, err := os.Stat(filepath.Join(s.dir, layersDir, key, rootfsName))
	return err == nil && fi.IsDir()
}

// ReadLayerMeta returns what made content layer key.
func (s *Store) ReadLayerMeta(key string) (LayerMeta, error) {
	var m LayerMeta
	b, err := os.ReadFile(filepath.Join(s.dir, layersDir, key, layerMeta))
	if err != nil {
		return m, err
	}
	return m, json.Unmarshal(b, &m)
}

// LayerWriter is a content layer being written. Write its files under
// Root, then Commit it or Discard it.
type LayerWriter struct {
	s   *Store
	dir *lockedTemp // the temporary directory, held until published or removed
}

// NewLayer starts a content layer in a temporary directory of the store.
func (s *Store) NewLayer() (*LayerWriter, error) {
	dir := filepath.Join(s.dir, layersDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating layer store: %w", err)
	}
	lt, err := newLockedTemp(dir, tmpPrefix)
	if err != nil {
		return nil, fmt.Errorf("creating layer: %w", err)
	}
	if err := os.Mkdir(filepath.Join(lt.path, rootfsName), 0o755); err != nil {
		lt.remove()
		return nil, fmt.Errorf("creating layer: %w", err)
	}
	return &LayerWriter{s: s, dir: lt}, nil
}

// Root is the directory the layer's files go in.
func (w *LayerWriter) Root() string { return filepath.Join(w.dir.path, rootfsName) }

// Commit makes the layer durable and publishes it as key, returning its
// ref. If another build published the same key meanwhile, that layer is
// kept and this one discarded: equal keys mean equal inputs.
func (w *LayerWriter) Commit(key string, meta LayerMeta) (string, error) {
	if !LayerKeyRE.MatchString(key) {
		w.Discard()
		return "", errdefs.Wrap(errdefs.ErrInvalidArgument, "layer key %q", key)
	}
	size, err := diskUsage(w.Root())
	if err != nil {
		w.Discard()
		return "", fmt.Errorf("measuring layer: %w", err)
	}
	meta.Key, meta.SizeBytes = key, size
	if meta.CreatedAt.IsZero() {
		meta.CreatedAt = time.Now().UTC().Truncate(time.Second)
	}
	b, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		w.Discard()
		return "", err
	}
	if err := os.WriteFile(filepath.Join(w.dir.path, layerMeta), append(b, '\n'), 0o644); err != nil {
		w.Discard()
		return "", fmt.Errorf("writing layer meta: %w", err)
	}
	if err := syncFS(w.dir.path); err != nil {
		w.Discard()
		return "", err
	}
	final := filepath.Join(w.s.dir, layersDir, key)
	if err := os.Rename(w.dir.path, final); err != nil {
		w.Discard()
		if w.s.HasLayer(key) {
			return LayerRef(key), nil
		}
		return "", fmt.Errorf("publishing layer: %w", err)
	}
	w.dir.unlock()
	return LayerRef(key), nil
}

// Discard removes the unfinished layer.
func (w *LayerWriter) Discard() {
	w.dir.remove()
}

// RemoveStaleLayerWrites removes the unfinished and half-removed layers
// that a dead daemon left; a live writer's (of this daemon or another
// sharing the store) stay.
func (s *Store) RemoveStaleLayerWrites() error {
	return removeStale(filepath.Join(s.dir, layersDir), tmpPrefix, trashPrefix)
}

// KeepRecentLayers adds to keep every content layer made after since,
// except those in except: a failed build's finished steps stay for its
// retry. A layer another daemon sharing the store used after since is
// kept whatever this one thinks of it (see markUse).
func (s *Store) KeepRecentLayers(keep, except map[string]bool, since time.Time) {
	ents, _ := os.ReadDir(filepath.Join(s.dir, layersDir))
	for _, e := range ents {
		if LayerKeyRE.MatchString(e.Name()) && s.recent(e.Name(), except, since) {
			keep[LayerRef(e.Name())] = true
		}
	}
}

// recent reports whether content layer key is kept by the grace: another
// daemon sharing the store used it after since, or (unless except names
// it) it was made after since.
func (s *Store) recent(key string, except map[string]bool, since time.Time) bool {
	if s.usedByOthers(filepath.Join(s.dir, layersDir, key), since) {
		return true
	}
	if except[LayerRef(key)] {
		return false
	}
	m, err := s.ReadLayerMeta(key)
	return err == nil && m.CreatedAt.After(since)
}

// TrashLayers moves every content layer whose ref is not in keep out of
// the store (it is gone for lookups at once) and returns the refs it moved
// and a function that deletes their files, which may take long and needs
// no lock.
func (s *Store) TrashLayers(keep map[string]bool) ([]string, func(context.Context) error, error) {
	return s.TrashLayersGrace(keep, nil, time.Time{})
}

// TrashLayersGrace is TrashLayers that checks the grace (KeepRecentLayers)
// again for each layer right before moving it: a layer another daemon
// sharing the store published after this collection computed keep is
// never taken (its own collection lock does not cover other daemons).
// A zero since checks nothing.
func (s *Store) TrashLayersGrace(keep, except map[string]bool, since time.Time) ([]string, func(context.Context) error, error) {
	dir := filepath.Join(s.dir, layersDir)
	nothing := func(context.Context) error { return nil }
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nothing, nil
	}
	if err != nil {
		return nil, nothing, fmt.Errorf("listing layers: %w", err)
	}
	var (
		removed []string
		trash   []string
		errs    []error
	)
	for _, e := range ents {
		if !e.IsDir() || !LayerKeyRE.MatchString(e.Name()) || keep[LayerRef(e.Name())] {
			continue
		}
		if !since.IsZero() && s.recent(e.Name(), except, since) {
			continue
		}
		t := filepath.Join(dir, trashPrefix+e.Name())
		if err := os.Rename(filepath.Join(dir, e.Name()), t); err != nil {
			errs = append(errs, fmt.Errorf("collecting layer: %w", err))
			continue
		}
		removed = append(removed, LayerRef(e.Name()))
		trash = append(trash, t)
	}
	finish := func(ctx context.Context) error {
		var errs []error
		for _, t := range trash {
			if err := ctx.Err(); err != nil {
				return err // the rest goes with RemoveStaleLayerWrites
			}
			errs = append(errs, os.RemoveAll(t))
		}
		return errors.Join(errs...)
	}
	return removed, finish, errors.Join(errs...)
}

// RemoveRecipeVersion deletes a recipe-built template version (ref
// "<name>/<version>") whose catalog entry was purged.
func (s *Store) RemoveRecipeVersion(ctx context.Context, ref string) error {
	if !ValidLayerRef(ref) || strings.HasPrefix(ref, layersDir+"/") {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "recipe ref %q", ref)
	}
	dir := filepath.Join(s.dir, filepath.FromSlash(ref))
	// Renamed to a build-dir name first: the version stops being listed at
	// once, and a failed removal is finished by the next build.
	tmp := filepath.Join(s.dir, buildPrefix+"gc-"+strings.ReplaceAll(ref, "/", "-"))
	if err := os.Rename(dir, tmp); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("removing template version: %w", err)
	}
	s.removeBuild(ctx, tmp)
	return nil
}

// LayerSize returns the disk use recorded for layer ref (0 if unknown).
func (s *Store) LayerSize(ref string) int64 {
	if key, ok := strings.CutPrefix(ref, layersDir+"/"); ok {
		if m, err := s.ReadLayerMeta(key); err == nil {
			return m.SizeBytes
		}
		return 0
	}
	if !ValidLayerRef(ref) {
		return 0
	}
	if m, err := readMeta(filepath.Join(s.dir, filepath.FromSlash(ref))); err == nil {
		return m.SizeBytes
	}
	return 0
}
