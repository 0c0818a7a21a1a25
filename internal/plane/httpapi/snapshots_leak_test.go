package httpapi_test

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/template"
)

// TestE2ESnapshotCyclesDoNotLeak runs 100 cycles of snapshot, create from
// it, reset to it, fork, and deletes: the daemon's goroutines and open
// files stay flat, every deleted snapshot's record and layer go, and
// (daemontest's own check at the end) no mount, loop device, cgroup,
// sandbox file or process is left.
func TestE2ESnapshotCyclesDoNotLeak(t *testing.T) {
	const cycles, warmup = 100, 10
	e := newE2E(t)
	ctx := context.Background()
	cl := e.env.Client(e.env.Key(t, "leaky"))
	// A loaded host takes minutes for the cycles: more than the default TTL.
	src, err := cl.NewSandbox(ctx, client.WithTTL(2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	layers := filepath.Join(e.env.DataDir(), "templates", "layers")
	var snaps []string
	var baseG, baseFD int
	for i := range cycles {
		if i == warmup {
			baseG, baseFD = settle(t)
		}
		run(t, src, "date +%s%N > /home/user/cycle")
		sn, err := src.Snapshot(ctx, "", false)
		if err != nil {
			t.Fatalf("cycle %d: snapshot: %v", i, err)
		}
		snaps = append(snaps, sn.ID)
		cp, err := cl.NewSandbox(ctx, client.WithSnapshot(sn.ID))
		if err != nil {
			t.Fatalf("cycle %d: create from snapshot: %v", i, err)
		}
		run(t, cp, "echo x > /home/user/x")
		if err := cp.Reset(ctx, sn.ID); err != nil {
			t.Fatalf("cycle %d: reset: %v", i, err)
		}
		forks, err := cp.Fork(ctx, 1, nil, nil)
		if err != nil {
			t.Fatalf("cycle %d: fork: %v", i, err)
		}
		for _, sb := range append(forks, cp) {
			if err := sb.Close(); err != nil {
				t.Fatalf("cycle %d: delete %s: %v", i, sb.ID(), err)
			}
		}
		if err := cl.DeleteSnapshot(ctx, sn.ID); err != nil {
			t.Fatalf("cycle %d: delete snapshot: %v", i, err)
		}
	}
	// The collector runs after each deletion: every snapshot's layer goes.
	deadline := time.Now().Add(time.Minute)
	for _, id := range snaps {
		p := filepath.Join(layers, template.SnapshotLayerKey(id))
		for {
			if _, err := os.Stat(p); os.IsNotExist(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("snapshot %s's layer is still there", id)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if l, err := cl.ListSnapshots(ctx, client.SnapshotListOptions{}); err != nil || len(l.Snapshots) != 0 {
		t.Fatalf("snapshots left: %+v, %v", l, err)
	}
	if l, err := cl.ListSandboxes(ctx, client.ListOptions{}); err != nil || len(l.Sandboxes) != 1 || l.Sandboxes[0].ID != src.ID() {
		t.Fatalf("sandboxes left: %+v, %v", l, err)
	}
	g, fd := settle(t)
	t.Logf("goroutines %d → %d, open files %d → %d over %d cycles", baseG, g, baseFD, fd, cycles-warmup)
	// A leak per cycle would add 90 or more.
	if g > baseG+30 || fd > baseFD+30 {
		t.Fatalf("leak: goroutines %d → %d, open files %d → %d over %d cycles", baseG, g, baseFD, fd, cycles-warmup)
	}
}

// settle waits for idle connections and background work to wind down and
// returns this process's goroutines and open files (the daemon runs in
// it).
func settle(t *testing.T) (goroutines, fds int) {
	t.Helper()
	time.Sleep(time.Second)
	runtime.GC()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return runtime.NumGoroutine(), len(ents)
}
