package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
)

// A snapshot's filesystem is a LayerSet: the layers of the template
// version it descends from, shared with that template and its sandboxes,
// and the layers captured over them, each a content layer of this store
// (layers/<key>, made from a sandbox's writable layer as a build step's
// layer is). Nothing of the template is copied: a snapshot costs its own
// captured layer. Its memory image, when it has one, is a checkpoint
// directory beside the layers:
//
//	templates/
//	  checkpoints/<snap id>/   a memory image (driver.Checkpointer's dir)
//	  checkpoints/.tmp-…/      one being written; renamed into place
//
// The layer set's record is the store's (store.Snapshot: BaseLayers,
// CapturedLayers, Checkpoint); layer collection keeps its layers because
// store.ReferencedTemplateLayers names them.
const checkpointsDir = "checkpoints"

// MaxStackedLayers is how many read-only layers a sandbox can stack:
// overlayfs takes the lower directories in one mount option string (the
// build's limit for a template too).
const MaxStackedLayers = 40

var snapshotIDRE = lazyregexp.New(`^snap_[a-z0-9]{1,64}$`)

// SnapshotLayerKey returns the content key of snapshot id's own captured
// layer. It is derived from the id, not the content, so the snapshot's
// record can hold the layer's ref before the capture writes it (layer
// collection then never takes it half-way). A snapshot's layer is its
// own: two snapshots never share one.
func SnapshotLayerKey(id string) string {
	h := sha256.Sum256([]byte("airlock snapshot layer\x00" + id))
	return hex.EncodeToString(h[:])
}

// SnapshotLayerRef returns the ref of snapshot id's own captured layer.
func SnapshotLayerRef(id string) string { return LayerRef(SnapshotLayerKey(id)) }

// LayerSet is a snapshot's filesystem in the layer store.
type LayerSet struct {
	// Base are the template version's layer refs, lowest first: shared,
	// never the snapshot's to remove.
	Base []string
	// Captured are the layers captured over Base, lowest first: those of
	// the snapshots it descends from (a sandbox started from a snapshot
	// and snapshotted again), then its own.
	Captured []string
}

// Refs returns every ref of the set, lowest first: the driver stacks
// them read-only under a sandbox's writable layer.
func (l LayerSet) Refs() []string {
	return append(append([]string{}, l.Base...), l.Captured...)
}

// Over returns the set of a snapshot taken of a sandbox that runs on l:
// l with ref captured on top.
func (l LayerSet) Over(ref string) LayerSet {
	return LayerSet{Base: append([]string{}, l.Base...), Captured: append(append([]string{}, l.Captured...), ref)}
}

// Own returns the snapshot's own layer (the top captured one), "" when it
// has none.
func (l LayerSet) Own() string {
	if len(l.Captured) == 0 {
		return ""
	}
	return l.Captured[len(l.Captured)-1]
}

// Validate checks that every ref names a layer of a store, that none
// repeats, that captured layers are content layers, and that a sandbox can
// stack them all (MaxStackedLayers): a snapshot of a sandbox that already
// stacks the most is refused before anything is captured.
func (l LayerSet) Validate() error {
	if len(l.Base) == 0 {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "a layer set needs its template's layers")
	}
	seen := map[string]bool{}
	for i, ref := range l.Refs() {
		if !ValidLayerRef(ref) {
			return errdefs.Wrap(errdefs.ErrInvalidArgument, "layer ref %q", ref)
		}
		if i >= len(l.Base) && !strings.HasPrefix(ref, layersDir+"/") {
			return errdefs.Wrap(errdefs.ErrInvalidArgument, "captured layer %q is not a content layer", ref)
		}
		if seen[ref] {
			return errdefs.Wrap(errdefs.ErrInvalidArgument, "layer %s appears twice", ref)
		}
		seen[ref] = true
	}
	if n := len(l.Base) + len(l.Captured); n > MaxStackedLayers {
		return errdefs.Wrap(errdefs.ErrInvalidArgument,
			"the snapshot would stack %d layers, more than the %d a sandbox can: snapshot a sandbox started from the template instead", n, MaxStackedLayers)
	}
	return nil
}

// LayerSetSize returns the recorded disk use of l's layers: shared (the
// template's and the parents' captured layers) and own (its top layer).
func (s *Store) LayerSetSize(l LayerSet) (shared, own int64) {
	for _, ref := range l.Base {
		shared += s.LayerSize(ref)
	}
	for i, ref := range l.Captured {
		if i == len(l.Captured)-1 {
			own = s.LayerSize(ref)
		} else {
			shared += s.LayerSize(ref)
		}
	}
	return shared, own
}

// CaptureSnapshotLayer copies wl, the writable layer of a sandbox that
// does not run (stopped, or frozen so that nothing writes it), into the
// content layer of snapshot id (SnapshotLayerRef) as a template layer
// (CaptureUpper: owners shifted back, whiteouts and opaque directories
// kept, the runtime's names left out), and returns its ref. parent is the
// layer it lies on (the set's top ref), recorded in its meta.
//
// The snapshot's record must hold the ref before this is called (and the
// record be stored while layer collection is held off), or a collection
// running meanwhile could take the new layer.
func (s *Store) CaptureSnapshotLayer(ctx context.Context, id string, wl driver.WritableLayer, parent string) (string, CaptureStats, error) {
	if !snapshotIDRE.MatchString(id) {
		return "", CaptureStats{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "snapshot id %q", id)
	}
	key := SnapshotLayerKey(id)
	if s.HasLayer(key) {
		return "", CaptureStats{}, errdefs.Wrap(errdefs.ErrAlreadyExists, "snapshot %s already has its layer", id)
	}
	w, err := s.NewLayer()
	if err != nil {
		return "", CaptureStats{}, err
	}
	stats, err := CaptureUpper(ctx, wl.Dir, w.Root(), IDShift{Base: wl.UIDBase, Count: wl.IDCount}, wl.RuntimeNames)
	if err != nil {
		w.Discard()
		return "", stats, fmt.Errorf("capturing the snapshot's layer: %w", err)
	}
	if err := dropRuntimeMountPoints(w.Root()); err != nil {
		w.Discard()
		return "", stats, fmt.Errorf("capturing the snapshot's layer: %w", err)
	}
	ref, err := w.Commit(key, LayerMeta{Parent: parent, CreatedBy: "snapshot " + id})
	return ref, stats, err
}

// CheckpointRef returns the ref of snapshot id's memory image.
func CheckpointRef(id string) string { return checkpointsDir + "/" + id }

// checkpointDir checks ref and returns its directory.
func (s *Store) checkpointDir(ref string) (string, error) {
	id, ok := strings.CutPrefix(ref, checkpointsDir+"/")
	if !ok || !snapshotIDRE.MatchString(id) {
		return "", errdefs.Wrap(errdefs.ErrInvalidArgument, "checkpoint ref %q", ref)
	}
	return filepath.Join(s.dir, checkpointsDir, id), nil
}

// CheckpointWriter is a memory image being written: a driver's
// Checkpoint writes into Dir, then Commit publishes it or Discard drops
// it.
type CheckpointWriter struct {
	s   *Store
	id  string
	tmp string
	dir *lockedTemp
}

// NewCheckpoint starts snapshot id's memory image in a new empty
// directory of the store.
func (s *Store) NewCheckpoint(id string) (*CheckpointWriter, error) {
	if !snapshotIDRE.MatchString(id) {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "snapshot id %q", id)
	}
	dir := filepath.Join(s.dir, checkpointsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating checkpoint store: %w", err)
	}
	lt, err := newLockedTemp(dir, tmpPrefix)
	if err != nil {
		return nil, fmt.Errorf("creating checkpoint: %w", err)
	}
	return &CheckpointWriter{s: s, id: id, tmp: lt.path, dir: lt}, nil
}

// Dir is the directory the image goes in (owned by root, mode 0700).
func (w *CheckpointWriter) Dir() string { return w.tmp }

// Commit makes the image durable and publishes it as snapshot id's,
// returning its ref and its size on disk.
func (w *CheckpointWriter) Commit() (string, int64, error) {
	size, err := diskUsage(w.tmp)
	if err != nil {
		w.Discard()
		return "", 0, fmt.Errorf("measuring checkpoint: %w", err)
	}
	if err := syncFS(w.tmp); err != nil {
		w.Discard()
		return "", 0, err
	}
	if err := os.Rename(w.tmp, filepath.Join(w.s.dir, checkpointsDir, w.id)); err != nil {
		w.Discard()
		return "", 0, fmt.Errorf("publishing checkpoint: %w", err)
	}
	w.tmp = ""
	w.dir.unlock()
	return CheckpointRef(w.id), size, nil
}

// Discard removes the unfinished image.
func (w *CheckpointWriter) Discard() {
	if w.tmp != "" {
		w.dir.remove()
		w.tmp = ""
	}
}

// CheckpointPath returns the directory of memory image ref, checking that
// it exists (errdefs.ErrNotFound otherwise): a driver's Restore reads it.
func (s *Store) CheckpointPath(ref string) (string, error) {
	dir, err := s.checkpointDir(ref)
	if err != nil {
		return "", err
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return "", errdefs.Wrap(errdefs.ErrNotFound, "checkpoint %s is missing", ref)
	}
	return dir, nil
}

// RemoveCheckpoint deletes memory image ref (a snapshot being purged); a
// missing one is not an error. It is moved aside first, so that it is
// gone for lookups at once and a removal cut short is finished by
// RemoveStaleCheckpointWrites.
func (s *Store) RemoveCheckpoint(ctx context.Context, ref string) error {
	dir, err := s.checkpointDir(ref)
	if err != nil {
		return err
	}
	trash := filepath.Join(s.dir, checkpointsDir, trashPrefix+filepath.Base(dir))
	if err := os.Rename(dir, trash); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("removing checkpoint: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return os.RemoveAll(trash)
}

// RemoveStaleCheckpointWrites removes the unfinished and half-removed
// memory images a dead daemon left; a live writer's (of this daemon or
// another sharing the store) stay.
func (s *Store) RemoveStaleCheckpointWrites() error {
	return removeStale(filepath.Join(s.dir, checkpointsDir), tmpPrefix, trashPrefix)
}

// Checkpoints returns the refs of every published memory image, for a
// sweep of those no snapshot record names (a daemon that died between
// publishing one and recording it).
func (s *Store) Checkpoints() ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, checkpointsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing checkpoints: %w", err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && snapshotIDRE.MatchString(e.Name()) {
			out = append(out, CheckpointRef(e.Name()))
		}
	}
	return out, nil
}

// runtimeMountPoints are mount points below the top level that a runtime
// makes in a writable layer when the template lacks them (the secrets'
// tmpfs, driver.Spec.SecretsTmpfs), as parent directory and name.
var runtimeMountPoints = [][2]string{{"run", "secrets"}}

// dropRuntimeMountPoints removes from captured layer root the empty
// mount points the runtime made: a sandbox started from the layer must get
// the runtime's own (runc gives a tmpfs the mode of the directory it
// mounts on: the captured 0755 would lock the sandbox user out of its
// secrets' directory). One that is not empty is the sandbox's and stays.
// root holds what a sandbox wrote: nothing in it is followed.
func dropRuntimeMountPoints(root string) error {
	rfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(rfd)
	for _, mp := range runtimeMountPoints {
		dfd, err := unix.Openat(rfd, mp[0], unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // absent, or not a directory: nothing of the runtime's
		}
		var st unix.Stat_t
		if unix.Fstatat(dfd, mp[1], &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			// ENOTEMPTY: the sandbox's own files; kept.
			if err := unix.Unlinkat(dfd, mp[1], unix.AT_REMOVEDIR); err != nil && err != unix.ENOTEMPTY && err != unix.EEXIST {
				unix.Close(dfd)
				return fmt.Errorf("removing mount point %s/%s: %w", mp[0], mp[1], err)
			}
		}
		unix.Close(dfd)
	}
	return nil
}

// RemoveSnapshotLayer deletes snapshot id's own captured layer, once its
// record is purged and no other record names the layer (a snapshot taken
// of a sandbox started from it stacks it too: the caller checks). A
// missing one is not an error. It is moved aside first, so that it is
// gone for lookups at once.
func (s *Store) RemoveSnapshotLayer(ctx context.Context, id string) error {
	if !snapshotIDRE.MatchString(id) {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "snapshot id %q", id)
	}
	key := SnapshotLayerKey(id)
	dir := filepath.Join(s.dir, layersDir)
	trash := filepath.Join(dir, trashPrefix+key)
	if err := os.Rename(filepath.Join(dir, key), trash); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("removing snapshot layer: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return err // RemoveStaleLayerWrites finishes it
	}
	return os.RemoveAll(trash)
}
