package template

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestRemoveStaleSharedStore: a daemon starting on a store another daemon
// writes to removes only what a dead writer left.
func TestRemoveStaleSharedStore(t *testing.T) {
	s := NewStore(t.TempDir())
	live, err := s.NewLayer()
	if err != nil {
		t.Fatal(err)
	}
	defer live.Discard()
	dead, err := s.NewLayer()
	if err != nil {
		t.Fatal(err)
	}
	dead.dir.unlock() // its process is gone
	dir := filepath.Join(s.Dir(), layersDir)
	trash := filepath.Join(dir, trashPrefix+"x")
	oldNew := filepath.Join(dir, newPrefix+"old")
	freshNew := filepath.Join(dir, newPrefix+"fresh")
	for _, p := range []string{trash, oldNew, freshNew} {
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * newGrace)
	if err := os.Chtimes(oldNew, old, old); err != nil {
		t.Fatal(err)
	}
	// Another process holds a write too (flock(1) from util-linux).
	other := filepath.Join(dir, tmpPrefix+"other")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if fl, err := exec.LookPath("flock"); err == nil {
		cmd := exec.Command(fl, "-n", other, "sleep", "30")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		for i := 0; !held(other); i++ {
			if i > 500 {
				t.Fatal("flock(1) did not take its lock")
			}
			time.Sleep(10 * time.Millisecond)
		}
	} else {
		other = "" // checked in-process only
	}

	if err := s.RemoveStaleLayerWrites(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{live.dir.path, freshNew, other} {
		if _, err := os.Stat(p); p != "" && err != nil {
			t.Errorf("%s was removed: %v", filepath.Base(p), err)
		}
	}
	for _, p := range []string{dead.dir.path, trash, oldNew} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s stayed: %v", filepath.Base(p), err)
		}
	}
	// The live writer still commits.
	if _, err := live.Commit(strings.Repeat("b", 64), LayerMeta{}); err != nil {
		t.Fatalf("commit after another daemon's start: %v", err)
	}
}

// TestSharedStoreKeepsOthersLayers: a daemon's collection keeps a layer
// that another daemon sharing the store used within the grace, even a
// layer of a template this one deleted; its own use changes nothing.
func TestSharedStoreKeepsOthersLayers(t *testing.T) {
	dir := t.TempDir()
	linkA, linkB := filepath.Join(t.TempDir(), "templates"), filepath.Join(t.TempDir(), "templates")
	for _, l := range []string{linkA, linkB} {
		if err := os.Symlink(dir, l); err != nil {
			t.Fatal(err)
		}
	}
	a, b := NewStore(linkA), NewStore(linkB)
	key := strings.Repeat("c", 64)
	w, err := a.NewLayer()
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour).UTC()
	ref, err := w.Commit(key, LayerMeta{CreatedAt: old})
	if err != nil {
		t.Fatal(err)
	}
	since := time.Now().Add(-time.Hour)
	purged := map[string]bool{ref: true}
	kept := func(s *Store) bool {
		keep := map[string]bool{}
		s.KeepRecentLayers(keep, purged, since)
		return keep[ref]
	}
	if _, err := a.LayerPaths([]string{ref}); err != nil {
		t.Fatal(err)
	}
	if kept(a) {
		t.Fatal("a daemon's own use kept a layer of its deleted template")
	}
	if _, err := b.LayerPaths([]string{ref}); err != nil {
		t.Fatal(err)
	}
	if !kept(a) {
		t.Fatal("another daemon's recent use did not keep the layer")
	}
	if !kept(b) {
		t.Fatal("a's recent use did not keep the layer for b")
	}
	// Uses before the grace keep nothing.
	for _, s := range []*Store{a, b} {
		m := filepath.Join(dir, layersDir, key, usePrefix+s.user)
		if err := os.Chtimes(m, old, old); err != nil {
			t.Fatal(err)
		}
	}
	if kept(a) || kept(b) {
		t.Fatal("a use before the grace kept the layer")
	}
}

// TestTrashChecksGraceAgain: a layer published after a collection computed
// what to keep (by another daemon sharing the store, whose lock this one's
// does not cover) is not taken; one of a template this daemon purged is.
func TestTrashChecksGraceAgain(t *testing.T) {
	s := NewStore(t.TempDir())
	keep := map[string]bool{} // computed before the layers below existed
	since := time.Now().Add(-time.Hour)
	commit := func(key string) string {
		w, err := s.NewLayer()
		if err != nil {
			t.Fatal(err)
		}
		ref, err := w.Commit(key, LayerMeta{})
		if err != nil {
			t.Fatal(err)
		}
		return ref
	}
	fresh, purged := commit(strings.Repeat("d", 64)), commit(strings.Repeat("e", 64))
	removed, finish, err := s.TrashLayersGrace(keep, map[string]bool{purged: true}, since)
	if err != nil {
		t.Fatal(err)
	}
	if err := finish(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{purged}) {
		t.Fatalf("removed %v, want only the purged %s", removed, purged)
	}
	if !s.HasLayer(strings.Repeat("d", 64)) {
		t.Fatalf("the fresh layer %s was taken", fresh)
	}
}
