package network_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/network"
)

// TestDownloadCapSurvivesRestart: the count of what a sandbox downloaded
// is saved while it runs (before any shutdown) and a restarted Manager
// goes on from it, so that the cap is not granted again: a wheel that a
// fresh budget would let through is refused after the restart.
func TestDownloadCapSurvivesRestart(t *testing.T) {
	wheelLen := int64(len(wheelBody))
	capBytes := 2*wheelLen + wheelLen/2
	w, _, _ := newPkgWorld(t, capBytes)
	ctx := context.Background()
	const id = "pkgrestart"
	a, s := w.sandbox(t, id, pkgPolicy)
	wheel := "http://" + network.PackageHost + "/pypi/files/demo_pkg-1.0.0-py3-none-any.whl"
	for i := range 2 {
		if code, body, _, err := fetch(t, s, a, w.ca, wheel); err != nil || code != http.StatusOK || body != wheelBody {
			t.Fatalf("wheel %d: %d %v", i, code, err)
		}
	}
	// The mirror counts a write once it returned, which can be after the
	// client read the last byte.
	used := 2 * wheelLen
	deadline := time.Now().Add(15 * time.Second)
	for a.Budget().Used() != used {
		if time.Now().After(deadline) {
			t.Fatalf("used %d, want two wheels (%d)", a.Budget().Used(), used)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Saved by the running Manager, as a daemon killed now would leave it.
	file := filepath.Join(w.stateDir, "sandboxes", id+".budget")
	for {
		var saved struct{ Used int64 }
		b, err := os.ReadFile(file)
		if err == nil && json.Unmarshal(b, &saved) == nil && saved.Used == used {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("budget file %q (%v), want used %d", b, err, used)
		}
		time.Sleep(50 * time.Millisecond)
	}

	if err := w.m.Close(); err != nil {
		t.Fatal(err)
	}
	w.m = w.newManager(t)
	if err := w.m.Recover(ctx, id, pkgPolicy); err != nil {
		t.Fatal(err)
	}
	a2, _ := w.m.Attachment(id)
	if got := a2.Budget().Used(); got != used || a2.Budget().Limit() != capBytes {
		t.Fatalf("after restart used %d of %d, want %d of %d", got, a2.Budget().Limit(), used, capBytes)
	}
	// A fresh budget would fit a third wheel; the restored one does not.
	if code, body, _, err := fetch(t, s, a2, w.ca, wheel); err != nil || code != http.StatusInsufficientStorage {
		t.Fatalf("wheel after restart: %d %v (%d bytes), want refused at the cap", code, err, len(body))
	}
	if err := w.m.Teardown(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("budget file after teardown: %v", err)
	}
}
