package template

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/testutil"
)

// commitLayer writes a content layer holding one file.
func commitLayer(t *testing.T, s *Store, key, file string) string {
	t.Helper()
	w, err := s.NewLayer()
	mk(t, "new layer", err)
	mk(t, "file", os.WriteFile(filepath.Join(w.Root(), file), []byte(file), 0o644))
	ref, err := w.Commit(key, LayerMeta{CreatedBy: "test"})
	mk(t, "commit", err)
	return ref
}

// collect runs layer collection the way its caller (the builder's GC)
// does: the store's referenced layers are kept, recent layers only by the
// grace period, which is off here; it returns the refs trashed.
func collect(t *testing.T, s *Store, st *store.Store) []string {
	t.Helper()
	ctx := context.Background()
	keep, err := st.ReferencedTemplateLayers(ctx)
	mk(t, "referenced layers", err)
	purged, err := st.PurgedTemplateLayers(ctx)
	mk(t, "purged layers", err)
	s.KeepRecentLayers(keep, purged, time.Now().Add(time.Hour)) // no grace: nothing is recent enough
	removed, finish, err := s.TrashLayers(keep)
	mk(t, "trash", err)
	mk(t, "finish", finish(ctx))
	sort.Strings(removed)
	return removed
}

// TestSnapshotLayersSurviveCollection: a snapshot's own captured layer is
// referenced by no template, only by the snapshot's record, and layer
// collection keeps it exactly as long as the snapshot (or a live sandbox
// started from it) may use it. Without the snapshot layers in
// store.ReferencedTemplateLayers the first collection takes it.
func TestSnapshotLayersSurviveCollection(t *testing.T) {
	ctx := context.Background()
	s := newLayerStore(t)
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "airlock.db"))
	mk(t, "open store", err)
	t.Cleanup(func() { st.Close() })
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

	tplLayer := commitLayer(t, s, strings.Repeat("a", 64), "template")
	orphan := commitLayer(t, s, strings.Repeat("b", 64), "orphan")
	v, err := st.StartTemplateBuild(ctx, store.TemplateVersion{ID: "tpl_1", Tenant: "acme", Name: "app", Source: "spec", CreatedAt: t0},
		store.TemplateBuild{ID: "bld_1", CreatedAt: t0})
	mk(t, "start build", err)
	mk(t, "finish build", st.FinishTemplateBuild(ctx, "bld_1", store.BuildResult{OK: true, Layers: []string{"base/1", tplLayer}, EndedAt: t0}))

	// The snapshot's record holds its layer's ref before the capture
	// writes it.
	set := LayerSet{Base: []string{"base/1", tplLayer}}.Over(SnapshotLayerRef("snap_1"))
	mk(t, "validate", set.Validate())
	mk(t, "record snapshot", st.CreateSnapshot(ctx, store.Snapshot{ID: "snap_1", Tenant: "acme", SandboxID: "sbx_src",
		Template: "app", TemplateVersion: v, Runtime: "runc", BaseLayers: set.Base, CapturedLayers: set.Captured, CreatedAt: t0}))
	own := commitLayer(t, s, SnapshotLayerKey("snap_1"), "snapshot")
	if own != set.Own() {
		t.Fatalf("captured ref %s, the set's %s", own, set.Own())
	}
	if got := collect(t, s, st); !slices.Equal(got, []string{orphan}) {
		t.Fatalf("collected %v while the snapshot is being created, want only %s", got, orphan)
	}
	mk(t, "finish snapshot", st.FinishSnapshot(ctx, "snap_1", store.SnapshotResult{OK: true, At: t0}))
	if got := collect(t, s, st); len(got) != 0 || !s.HasLayer(SnapshotLayerKey("snap_1")) {
		t.Fatalf("collected %v with the snapshot ready", got)
	}

	// Deleted while a sandbox started from it runs: kept.
	sb := store.Sandbox{ID: "sbx_child", Tenant: "acme", State: "running", DesiredState: "running", Template: "app",
		TemplateVersion: v, Runtime: "runc", CreatedAt: t0, ExpiresAt: t0.Add(time.Hour), SnapshotID: "snap_1"}
	_, err = st.CreateSandbox(ctx, sb, nil)
	mk(t, "create sandbox", err)
	mk(t, "delete snapshot", st.DeleteSnapshot(ctx, "snap_1", "acme", t0))
	if got := collect(t, s, st); len(got) != 0 {
		t.Fatalf("collected %v under a live sandbox", got)
	}
	// The sandbox gone, the snapshot's layer goes; the template's stays.
	sb.State = "stopped"
	mk(t, "stop sandbox", st.UpdateSandbox(ctx, sb))
	if got := collect(t, s, st); !slices.Equal(got, []string{own}) || !s.HasLayer(strings.Repeat("a", 64)) {
		t.Fatalf("collected %v, want %s", got, own)
	}
}

func TestLayerSet(t *testing.T) {
	base := LayerSet{Base: []string{"base/1", LayerRef(strings.Repeat("a", 64))}}
	one := base.Over(SnapshotLayerRef("snap_1"))
	two := one.Over(SnapshotLayerRef("snap_2"))
	if len(base.Captured) != 0 || len(one.Captured) != 1 || one.Own() != SnapshotLayerRef("snap_1") || two.Own() != SnapshotLayerRef("snap_2") {
		t.Fatalf("over: %+v %+v %+v", base, one, two)
	}
	if !slices.Equal(two.Refs(), []string{"base/1", base.Base[1], SnapshotLayerRef("snap_1"), SnapshotLayerRef("snap_2")}) {
		t.Fatalf("refs %v", two.Refs())
	}
	if SnapshotLayerKey("snap_1") == SnapshotLayerKey("snap_2") || !LayerKeyRE.MatchString(SnapshotLayerKey("snap_1")) {
		t.Fatal("snapshot layer keys")
	}
	many := base
	for i := range MaxStackedLayers - 2 {
		many = many.Over(SnapshotLayerRef("snap_" + strings.Repeat("x", i+1)))
	}
	if err := many.Validate(); err != nil {
		t.Fatalf("%d layers: %v", len(many.Refs()), err)
	}
	for name, l := range map[string]LayerSet{
		"no base":         {Captured: []string{SnapshotLayerRef("snap_1")}},
		"bad ref":         {Base: []string{"../etc"}},
		"twice":           one.Over(SnapshotLayerRef("snap_1")),
		"captured recipe": base.Over("base/1"),
		"too many":        many.Over(SnapshotLayerRef("snap_last")),
	} {
		if err := l.Validate(); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestLayerSetSize(t *testing.T) {
	s := newLayerStore(t)
	a := commitLayer(t, s, strings.Repeat("a", 64), "a")
	b := commitLayer(t, s, SnapshotLayerKey("snap_1"), "b")
	c := commitLayer(t, s, SnapshotLayerKey("snap_2"), "c")
	shared, own := s.LayerSetSize(LayerSet{Base: []string{a}, Captured: []string{b, c}})
	if own != s.LayerSize(c) || shared != s.LayerSize(a)+s.LayerSize(b) || own <= 0 {
		t.Fatalf("shared %d own %d", shared, own)
	}
}

func TestCaptureSnapshotLayer(t *testing.T) {
	testutil.RequiresRoot(t)
	s := newLayerStore(t)
	ctx := context.Background()
	wl := driver.WritableLayer{Dir: fakeUpper(t), UIDBase: fakeBase, IDCount: 65536, RuntimeNames: []string{"proc", ".airlock"}}
	ref, stats, err := s.CaptureSnapshotLayer(ctx, "snap_1", wl, "base/1")
	if err != nil {
		t.Fatal(err)
	}
	if ref != SnapshotLayerRef("snap_1") || stats.Whiteouts != 1 {
		t.Fatalf("ref %s stats %+v", ref, stats)
	}
	m, err := s.ReadLayerMeta(SnapshotLayerKey("snap_1"))
	if err != nil || m.Parent != "base/1" || m.CreatedBy != "snapshot snap_1" || m.SizeBytes <= 0 {
		t.Fatalf("meta %+v %v", m, err)
	}
	root, err := s.LayerPath(ref)
	mk(t, "layer path", err)
	if b, err := os.ReadFile(filepath.Join(root, "home/user/notes")); err != nil || string(b) != "mine\n" {
		t.Fatalf("captured file: %q %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(root, ".airlock")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the runtime's directory was captured: %v", err)
	}
	if _, _, err := s.CaptureSnapshotLayer(ctx, "snap_1", wl, "base/1"); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("second capture: %v", err)
	}
	if _, _, err := s.CaptureSnapshotLayer(ctx, "../x", wl, "base/1"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad id: %v", err)
	}
}

func TestCheckpoints(t *testing.T) {
	s := newLayerStore(t)
	ctx := context.Background()
	if _, err := s.NewCheckpoint("snap/../x"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad id: %v", err)
	}
	w, err := s.NewCheckpoint("snap_1")
	mk(t, "new", err)
	mk(t, "write", os.WriteFile(filepath.Join(w.Dir(), "pages.img"), make([]byte, 8192), 0o600))
	ref, size, err := w.Commit()
	if err != nil || ref != CheckpointRef("snap_1") || size < 8192 {
		t.Fatalf("commit %s %d %v", ref, size, err)
	}
	dir, err := s.CheckpointPath(ref)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "pages.img")); err != nil {
		t.Fatal(err)
	}
	// An unfinished one is not listed and is swept as stale; a discarded
	// one leaves nothing.
	stale, err := s.NewCheckpoint("snap_2")
	mk(t, "new", err)
	gone, err := s.NewCheckpoint("snap_3")
	mk(t, "new", err)
	gone.Discard()
	gone.Discard()
	if refs, err := s.Checkpoints(); err != nil || !slices.Equal(refs, []string{ref}) {
		t.Fatalf("checkpoints %v %v", refs, err)
	}
	// A live writer's directory stays; the lock goes with its process.
	mk(t, "stale", s.RemoveStaleCheckpointWrites())
	if _, err := os.Stat(stale.Dir()); err != nil {
		t.Fatalf("a live write was removed: %v", err)
	}
	stale.dir.unlock()
	mk(t, "stale", s.RemoveStaleCheckpointWrites())
	if _, err := os.Stat(stale.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale write left: %v", err)
	}
	// The template listing never takes the checkpoints for a template.
	if infos, err := s.List(); err != nil || len(infos) != 0 {
		t.Fatalf("list %+v %v", infos, err)
	}
	mk(t, "remove", s.RemoveCheckpoint(ctx, ref))
	mk(t, "remove again", s.RemoveCheckpoint(ctx, ref))
	if _, err := s.CheckpointPath(ref); !errdefs.IsNotFound(err) {
		t.Fatalf("removed checkpoint: %v", err)
	}
	for _, bad := range []string{"layers/" + strings.Repeat("a", 64), "checkpoints/../layers", "checkpoints/x"} {
		if _, err := s.CheckpointPath(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v", bad, err)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(s.Dir(), checkpointsDir)); len(ents) != 0 {
		t.Fatalf("left %v", ents)
	}
}

// TestDropRuntimeMountPoints: the empty /run/secrets a runtime made for
// the secrets' tmpfs is left out of a captured layer (runc would give a
// copy's tmpfs its 0755 and lock the sandbox user out), one holding the
// sandbox's files stays, and a /run that is a symlink is not followed.
func TestDropRuntimeMountPoints(t *testing.T) {
	root := t.TempDir()
	mk(t, "mkdir", os.MkdirAll(filepath.Join(root, "run", "secrets"), 0o755))
	mk(t, "drop", dropRuntimeMountPoints(root))
	if _, err := os.Lstat(filepath.Join(root, "run", "secrets")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("empty mount point kept: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(root, "run")); err != nil {
		t.Fatalf("its parent went too: %v", err)
	}

	mk(t, "mkdir", os.MkdirAll(filepath.Join(root, "run", "secrets"), 0o755))
	mk(t, "file", os.WriteFile(filepath.Join(root, "run", "secrets", "mine"), []byte("x"), 0o644))
	mk(t, "drop", dropRuntimeMountPoints(root))
	if _, err := os.Stat(filepath.Join(root, "run", "secrets", "mine")); err != nil {
		t.Fatalf("the sandbox's own file went: %v", err)
	}

	// /run → a host directory with an empty secrets/: never touched.
	host := t.TempDir()
	mk(t, "mkdir", os.Mkdir(filepath.Join(host, "secrets"), 0o755))
	other := t.TempDir()
	mk(t, "symlink", os.Symlink(host, filepath.Join(other, "run")))
	mk(t, "drop", dropRuntimeMountPoints(other))
	if _, err := os.Stat(filepath.Join(host, "secrets")); err != nil {
		t.Fatalf("followed a symlink out of the layer: %v", err)
	}
}

// TestRemoveSnapshotLayer: a purged snapshot's own layer goes at once; a
// missing one is no error; a bad id is refused.
func TestRemoveSnapshotLayer(t *testing.T) {
	s := newLayerStore(t)
	ctx := context.Background()
	ref := commitLayer(t, s, SnapshotLayerKey("snap_gone"), "f")
	keep := commitLayer(t, s, SnapshotLayerKey("snap_kept"), "g")
	mk(t, "remove", s.RemoveSnapshotLayer(ctx, "snap_gone"))
	if s.HasLayer(SnapshotLayerKey("snap_gone")) {
		t.Fatalf("%s is still there", ref)
	}
	if !s.HasLayer(SnapshotLayerKey("snap_kept")) {
		t.Fatalf("%s went too", keep)
	}
	mk(t, "remove again", s.RemoveSnapshotLayer(ctx, "snap_gone"))
	if err := s.RemoveSnapshotLayer(ctx, "../x"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad id: %v", err)
	}
}
