package template

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
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
	for _, p := range []string{live.tmp, freshNew, other} {
		if _, err := os.Stat(p); p != "" && err != nil {
			t.Errorf("%s was removed: %v", filepath.Base(p), err)
		}
	}
	for _, p := range []string{dead.tmp, trash, oldNew} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s stayed: %v", filepath.Base(p), err)
		}
	}
	// The live writer still commits.
	if _, err := live.Commit(strings.Repeat("b", 64), LayerMeta{}); err != nil {
		t.Fatalf("commit after another daemon's start: %v", err)
	}
}
