package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// TestMigrationKeepsOldSandboxes: a database of the schema before the
// durable-sandbox migration keeps its sandboxes, which read with the
// defaults (on_timeout kill, no idle timeout, no snapshot, no pool).
func TestMigrationKeepsOldSandboxes(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "airlock.db")
	all := migrations
	migrations = all[:8]
	s, err := Open(ctx, path)
	if err != nil {
		migrations = all
		t.Fatal(err)
	}
	if err = s.EnsureTenant(ctx, "acme"); err == nil {
		_, err = s.w.ExecContext(ctx, `INSERT INTO sandboxes(id, tenant, state, desired_state, spec, template, runtime, created_at,
		expires_at, timeout_s) VALUES ('sbx_old', 'acme', 'running', 'running', '{}', 'base', 'runc', ?, ?, 300)`, ts(t0), ts(t0.Add(time.Hour)))
	}
	s.Close()
	migrations = all
	if err != nil {
		t.Fatal(err)
	}
	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sb, err := s.GetSandbox(ctx, "sbx_old", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if sb.Lifecycle != (Lifecycle{OnTimeout: OnTimeoutKill}) || sb.SnapshotID != "" || sb.Pool != "" || sb.PauseMemory != "" || !sb.LastActiveAt.IsZero() {
		t.Fatalf("old sandbox after the migration: %+v", sb)
	}
}

func TestSandboxDurableFields(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	sb := sandbox("sbx_1", "acme", t0)
	sb.Lifecycle = Lifecycle{OnTimeout: OnTimeoutPause, AutoResume: true, IdleTimeoutS: 60}
	sb.SnapshotID, sb.Pool, sb.LastActiveAt = "snap_1", "warm", t0.Add(time.Second)
	if _, err := s.CreateSandbox(ctx, sb, nil); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSandbox(ctx, "sbx_1", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if got.Lifecycle != sb.Lifecycle || got.SnapshotID != "snap_1" || got.Pool != "warm" || !got.LastActiveAt.Equal(sb.LastActiveAt) {
		t.Fatalf("round trip: %+v", got)
	}
	// An empty on_timeout is kill.
	other := sandbox("sbx_2", "acme", t0)
	if _, err := s.CreateSandbox(ctx, other, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetSandbox(ctx, "sbx_2", ""); got.Lifecycle.OnTimeout != OnTimeoutKill {
		t.Fatalf("default on_timeout %q", got.Lifecycle.OnTimeout)
	}

	// A pause to disk is recorded with how it holds the sandbox.
	p := t0.Add(time.Minute)
	got.State, got.PausedAt, got.PauseMemory = "paused", &p, "disk"
	got.Lifecycle.IdleTimeoutS = 0
	if err := s.UpdateSandbox(ctx, got); err != nil {
		t.Fatal(err)
	}
	again, _ := s.GetSandbox(ctx, "sbx_1", "")
	if again.PauseMemory != "disk" || again.Lifecycle.IdleTimeoutS != 0 || !again.Lifecycle.AutoResume {
		t.Fatalf("update: %+v", again)
	}

	// Activity never moves back: a touch after the record was read
	// survives the update of that older record.
	stale := again
	if err := s.TouchSandbox(ctx, "sbx_1", t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := s.TouchSandbox(ctx, "sbx_1", t0); err != nil { // earlier: no change
		t.Fatal(err)
	}
	stale.ReadyMS = 7
	if err := s.UpdateSandbox(ctx, stale); err != nil {
		t.Fatal(err)
	}
	again, _ = s.GetSandbox(ctx, "sbx_1", "")
	if !again.LastActiveAt.Equal(t0.Add(time.Hour)) || again.ReadyMS != 7 {
		t.Fatalf("activity %v (want %v), ready_ms %d", again.LastActiveAt, t0.Add(time.Hour), again.ReadyMS)
	}
	if err := s.TouchSandbox(ctx, "sbx_nope", t0); !errdefs.IsNotFound(err) {
		t.Fatalf("touch missing: %v", err)
	}
}

func TestIdleSandboxes(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	for _, c := range []struct {
		id     string
		state  string
		idle   int64
		active time.Time
	}{
		{"sbx_idle", "running", 60, t0},                       // idle since t0
		{"sbx_busy", "running", 60, t0.Add(50 * time.Second)}, // active 30 s before now
		{"sbx_never", "running", 0, t0},                       // no idle timeout
		{"sbx_paused", "paused", 60, t0},                      // paused already
		{"sbx_fresh", "running", 60, time.Time{}},             // no activity: counts from its create (t0+40s)
	} {
		sb := sandbox(c.id, "acme", t0)
		if c.id == "sbx_fresh" {
			sb.CreatedAt = t0.Add(40 * time.Second)
		}
		sb.State, sb.Lifecycle.IdleTimeoutS, sb.LastActiveAt = c.state, c.idle, c.active
		if _, err := s.CreateSandbox(ctx, sb, nil); err != nil {
			t.Fatal(err)
		}
	}
	now := t0.Add(80 * time.Second)
	idle, err := s.IdleSandboxes(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, sb := range idle {
		ids = append(ids, sb.ID)
	}
	if !slices.Equal(ids, []string{"sbx_idle"}) {
		t.Fatalf("idle at +80s: %v", ids)
	}
	idle, _ = s.IdleSandboxes(ctx, t0.Add(110*time.Second))
	if len(idle) != 3 { // sbx_idle, sbx_busy (50+60), sbx_fresh (40+60)
		t.Fatalf("idle at +110s: %d", len(idle))
	}
}

// snap returns a ready snapshot record of tenant over template app@1.
func snap(id, tenant, name string, created time.Time, captured ...string) Snapshot {
	return Snapshot{
		ID: id, Tenant: tenant, Name: name, SandboxID: "sbx_src", Template: "app", TemplateVersion: 1, Runtime: "runc",
		State: SnapshotReady, BaseLayers: []string{"base/1", "layers/a"}, CapturedLayers: captured,
		Config: json.RawMessage(`{"env":{"A":"1"}}`), Spec: json.RawMessage(`{"resources":{"disk_mb":1024}}`),
		SizeBytes: 4096, CreatedAt: created,
	}
}

func TestSnapshots(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	sn := snap("snap_1", "acme", "after-setup", t0, "layers/s1")
	sn.State = "" // recorded as creating
	if err := s.CreateSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSnapshot(ctx, "snap_1", "acme")
	if err != nil || got.State != SnapshotCreating || !slices.Equal(got.Layers(), []string{"base/1", "layers/a", "layers/s1"}) ||
		string(got.Config) != `{"env":{"A":"1"}}` || got.Name != "after-setup" {
		t.Fatalf("get creating: %+v, %v", got, err)
	}
	// Tenant scoping: another tenant's snapshot is exactly a missing one.
	_, errOther := s.GetSnapshot(ctx, "snap_1", "evil")
	_, errMissing := s.GetSnapshot(ctx, "snap_nope", "evil")
	if !errdefs.IsNotFound(errOther) || !errdefs.IsNotFound(errMissing) {
		t.Fatalf("other tenant: %v; missing: %v", errOther, errMissing)
	}
	if _, err := s.GetSnapshot(ctx, "snap_1", ""); err != nil {
		t.Fatalf("admin get: %v", err)
	}
	// Names are unique per tenant among live snapshots.
	if err := s.CreateSnapshot(ctx, snap("snap_2", "acme", "after-setup", t0)); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("duplicate name: %v", err)
	}
	if err := s.CreateSnapshot(ctx, snap("snap_1", "acme", "", t0)); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("duplicate id: %v", err)
	}
	if err := s.CreateSnapshot(ctx, snap("snap_o", "other", "after-setup", t0.Add(time.Second))); err != nil {
		t.Fatalf("same name, other tenant: %v", err)
	}

	if err := s.FinishSnapshot(ctx, "snap_1", SnapshotResult{OK: true, Checkpoint: "checkpoints/snap_1", SizeBytes: 10, MemoryBytes: 4, At: t0}); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishSnapshot(ctx, "snap_1", SnapshotResult{OK: true, At: t0}); !errors.Is(err, errdefs.ErrInvalidState) {
		t.Fatalf("finishing twice: %v", err)
	}
	if err := s.FinishSnapshot(ctx, "snap_nope", SnapshotResult{}); !errdefs.IsNotFound(err) {
		t.Fatalf("finishing a missing one: %v", err)
	}
	got, _ = s.GetSnapshot(ctx, "snap_1", "acme")
	if got.State != SnapshotReady || got.Checkpoint != "checkpoints/snap_1" || got.SizeBytes != 10 || got.MemoryBytes != 4 || got.ReadyAt == nil {
		t.Fatalf("ready: %+v", got)
	}

	// A failed capture is never found, and releases its name.
	bad := snap("snap_bad", "acme", "broken", t0.Add(2*time.Second), "layers/bad")
	bad.State = SnapshotCreating
	if err := s.CreateSnapshot(ctx, bad); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishSnapshot(ctx, "snap_bad", SnapshotResult{Error: "disk full"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSnapshot(ctx, "snap_bad", ""); !errdefs.IsNotFound(err) {
		t.Fatalf("failed snapshot found: %v", err)
	}
	if err := s.CreateSnapshot(ctx, snap("snap_bad2", "acme", "broken", t0.Add(3*time.Second))); err != nil {
		t.Fatalf("a failed snapshot's name: %v", err)
	}

	// Unfinished captures fail at a restart.
	if err := s.CreateSnapshot(ctx, Snapshot{ID: "snap_dying", Tenant: "acme", SandboxID: "sbx_src", Template: "app",
		TemplateVersion: 1, Runtime: "runc", CreatedAt: t0.Add(4 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.FailUnfinishedSnapshots(ctx, "daemon restarted"); err != nil || n != 1 {
		t.Fatalf("failed %d unfinished, %v", n, err)
	}

	// Listing: the tenant's creating and ready ones, newest first, paged.
	for i := range 3 {
		if err := s.CreateSnapshot(ctx, snap(fmt.Sprintf("snap_p%d", i), "acme", "", t0.Add(time.Duration(10+i)*time.Second))); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	cur := ""
	for {
		page, next, err := s.ListSnapshots(ctx, SnapshotFilter{Tenant: "acme", Limit: 2, Cursor: cur})
		if err != nil {
			t.Fatal(err)
		}
		for _, sn := range page {
			ids = append(ids, sn.ID)
		}
		if next == "" {
			break
		}
		cur = next
	}
	if want := []string{"snap_p2", "snap_p1", "snap_p0", "snap_bad2", "snap_1"}; !slices.Equal(ids, want) {
		t.Fatalf("list %v, want %v", ids, want)
	}
	if l, _, err := s.ListSnapshots(ctx, SnapshotFilter{Tenant: "acme", Name: "after-setup"}); err != nil || len(l) != 1 || l[0].ID != "snap_1" {
		t.Fatalf("by name: %+v %v", l, err)
	}
	if l, _, err := s.ListSnapshots(ctx, SnapshotFilter{SandboxID: "sbx_src"}); err != nil || len(l) != 6 {
		t.Fatalf("admin by sandbox: %d %v", len(l), err)
	}
	if l, _, _ := s.ListSnapshots(ctx, SnapshotFilter{Tenant: "evil"}); len(l) != 0 {
		t.Fatalf("another tenant lists %d", len(l))
	}
	if _, _, err := s.ListSnapshots(ctx, SnapshotFilter{Cursor: "!!"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad cursor: %v", err)
	}

	// Delete: another tenant's is not found, a deleted one is deleted
	// again without error, a creating one cannot be deleted.
	if err := s.DeleteSnapshot(ctx, "snap_1", "evil", t0); !errdefs.IsNotFound(err) {
		t.Fatalf("delete of another tenant's: %v", err)
	}
	if err := s.DeleteSnapshot(ctx, "snap_bad", "acme", t0); !errdefs.IsNotFound(err) {
		t.Fatalf("delete of a failed one: %v", err)
	}
	if err := s.CreateSnapshot(ctx, Snapshot{ID: "snap_c", Tenant: "acme", SandboxID: "x", Template: "app", TemplateVersion: 1,
		Runtime: "runc", CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSnapshot(ctx, "snap_c", "acme", t0); !errors.Is(err, errdefs.ErrInvalidState) {
		t.Fatalf("delete while creating: %v", err)
	}
	for range 2 {
		if err := s.DeleteSnapshot(ctx, "snap_1", "acme", t0); err != nil {
			t.Fatalf("delete: %v", err)
		}
	}
	if _, err := s.GetSnapshot(ctx, "snap_1", "acme"); !errdefs.IsNotFound(err) {
		t.Fatalf("deleted snapshot found: %v", err)
	}
	if err := s.CreateSnapshot(ctx, snap("snap_1b", "acme", "after-setup", t0.Add(time.Minute))); err != nil {
		t.Fatalf("a deleted snapshot's name: %v", err)
	}
}

func TestSnapshotCollectionAndLayers(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	_, b1 := startBuild(t, s, "acme", "app", 1)
	finish(t, s, b1, true, "base/1", "layers/a")

	for _, sn := range []Snapshot{
		snap("snap_ready", "acme", "", t0, "layers/ready"),
		snap("snap_used", "acme", "", t0, "layers/ready", "layers/used"), // a child of snap_ready's sandbox
		snap("snap_gone", "acme", "", t0, "layers/gone"),
		snap("snap_fail", "acme", "", t0, "layers/fail"),
	} {
		if sn.ID == "snap_fail" {
			sn.State = SnapshotCreating
		}
		if err := s.CreateSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.FinishSnapshot(ctx, "snap_fail", SnapshotResult{Error: "x"}); err != nil {
		t.Fatal(err)
	}
	// A live sandbox started from snap_used, which is then deleted.
	sb := sandbox("sbx_child", "acme", t0)
	sb.Template, sb.TemplateVersion, sb.SnapshotID = "app", 1, "snap_used"
	if _, err := s.CreateSandbox(ctx, sb, nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"snap_used", "snap_gone"} {
		if err := s.DeleteSnapshot(ctx, id, "acme", t0); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.SnapshotInUse(ctx, "snap_used"); err != nil || n != 1 {
		t.Fatalf("in use %d %v", n, err)
	}
	keep, err := s.ReferencedTemplateLayers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for ref, want := range map[string]bool{
		"base/1": true, "layers/a": true, // the template's
		"layers/ready": true, // a ready snapshot's own layer
		"layers/used":  true, // a deleted snapshot's, a live sandbox runs on it
		"layers/gone":  false, "layers/fail": false,
	} {
		if keep[ref] != want {
			t.Errorf("layer %s kept %v, want %v", ref, keep[ref], want)
		}
	}
	coll, err := s.CollectableSnapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, sn := range coll {
		ids = append(ids, sn.ID)
	}
	sort.Strings(ids)
	if !slices.Equal(ids, []string{"snap_fail", "snap_gone"}) {
		t.Fatalf("collectable %v", ids)
	}
	if err := s.PurgeSnapshot(ctx, "snap_ready"); !errors.Is(err, errdefs.ErrInvalidState) {
		t.Fatalf("purging a ready snapshot: %v", err)
	}
	for _, id := range []string{"snap_gone", "snap_gone", "snap_nope"} {
		if err := s.PurgeSnapshot(ctx, id); err != nil {
			t.Fatalf("purge %s: %v", id, err)
		}
	}
	// Once the child stops, the deleted snapshot is collectable and its
	// layer free.
	sb, _ = s.GetSandbox(ctx, "sbx_child", "")
	sb.State = "stopped"
	if err := s.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if keep, _ := s.ReferencedTemplateLayers(ctx); keep["layers/used"] || !keep["layers/ready"] {
		t.Errorf("after the child stopped: %v", keep)
	}
	if coll, _ := s.CollectableSnapshots(ctx); len(coll) != 2 {
		t.Errorf("collectable after the child stopped: %+v", coll)
	}

	// A deleted template version a live snapshot descends from is not
	// collected (the snapshot still needs its layers and is resolved by
	// it); once the snapshot is deleted, it is.
	if _, err := s.DeleteTemplateVersions(ctx, "acme", "app", 0, t0); err != nil {
		t.Fatal(err)
	}
	if dead, err := s.CollectableTemplateVersions(ctx); err != nil || len(dead) != 0 {
		t.Fatalf("collectable versions with a live snapshot: %+v %v", dead, err)
	}
	if err := s.DeleteSnapshot(ctx, "snap_ready", "acme", t0); err != nil {
		t.Fatal(err)
	}
	if dead, err := s.CollectableTemplateVersions(ctx); err != nil || len(dead) != 1 || dead[0].Name != "app" {
		t.Fatalf("collectable versions: %+v %v", dead, err)
	}
}

func TestPools(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	p := Pool{Tenant: "acme", Name: "warm", Template: "python", Runtime: "runc", Resources: json.RawMessage(`{"cpu":1}`),
		Size: 3, CreatedAt: t0, UpdatedAt: t0}
	if created, err := s.PutPool(ctx, p); err != nil || !created {
		t.Fatalf("put: %v %v", created, err)
	}
	if err := s.SetPoolError(ctx, "acme", "warm", "template not found"); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetPool(ctx, "acme", "warm"); err != nil || got.Error != "template not found" || got.Size != 3 || string(got.Resources) != `{"cpu":1}` {
		t.Fatalf("get: %+v %v", got, err)
	}
	p.Size, p.Template, p.CreatedAt, p.UpdatedAt = 5, "python@2", t0.Add(time.Hour), t0.Add(time.Hour)
	if created, err := s.PutPool(ctx, p); err != nil || created {
		t.Fatalf("replace: %v %v", created, err)
	}
	got, _ := s.GetPool(ctx, "acme", "warm")
	if got.Size != 5 || got.Template != "python@2" || !got.CreatedAt.Equal(t0) || !got.UpdatedAt.Equal(t0.Add(time.Hour)) || got.Error != "" {
		t.Fatalf("replaced: %+v", got)
	}
	if _, err := s.PutPool(ctx, Pool{Tenant: "acme", Name: "neg", Template: "x", Size: -1}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("negative size: %v", err)
	}
	if _, err := s.PutPool(ctx, Pool{Tenant: "other", Name: "warm", Template: "base", Size: 1, CreatedAt: t0, UpdatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetPool(ctx, "evil", "warm"); !errdefs.IsNotFound(err) {
		t.Fatalf("another tenant's pool: %v", err)
	}
	if l, err := s.ListPools(ctx, "acme"); err != nil || len(l) != 1 || l[0].Tenant != "acme" {
		t.Fatalf("list acme: %+v %v", l, err)
	}
	if l, err := s.ListPools(ctx, ""); err != nil || len(l) != 2 || l[0].Tenant != "acme" || l[1].Tenant != "other" {
		t.Fatalf("list all: %+v %v", l, err)
	}
	if err := s.DeletePool(ctx, "evil", "warm"); !errdefs.IsNotFound(err) {
		t.Fatalf("delete another tenant's: %v", err)
	}
	if err := s.DeletePool(ctx, "other", "warm"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeletePool(ctx, "other", "warm"); !errdefs.IsNotFound(err) {
		t.Fatalf("delete twice: %v", err)
	}
	if err := s.SetPoolError(ctx, "other", "warm", "x"); err != nil {
		t.Fatalf("error of a deleted pool: %v", err)
	}
}

// member makes a pool member of acme/warm with its sandbox in state.
func member(t *testing.T, s *Store, id string, created time.Time, ready bool, state string) {
	t.Helper()
	ctx := context.Background()
	if err := s.AddPoolMember(ctx, PoolMember{SandboxID: id, Tenant: "acme", Pool: "warm", CreatedAt: created}); err != nil {
		t.Fatal(err)
	}
	sb := sandbox(id, "acme", created)
	sb.State, sb.Pool = state, "warm"
	if _, err := s.CreateSandbox(ctx, sb, nil); err != nil {
		t.Fatal(err)
	}
	if ready {
		if err := s.SetPoolMemberReady(ctx, id, created); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPoolMembers(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	if err := s.AddPoolMember(ctx, PoolMember{SandboxID: "sbx_x", Tenant: "acme", Pool: "warm", CreatedAt: t0}); !errdefs.IsNotFound(err) {
		t.Fatalf("member of a missing pool: %v", err)
	}
	if _, err := s.PutPool(ctx, Pool{Tenant: "acme", Name: "warm", Template: "base", Size: 4, CreatedAt: t0, UpdatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	member(t, s, "sbx_m2", t0.Add(2*time.Second), true, "running")
	member(t, s, "sbx_m1", t0.Add(time.Second), true, "running")
	member(t, s, "sbx_dead", t0, true, "error") // its sandbox crashed: never claimed
	member(t, s, "sbx_m3", t0.Add(3*time.Second), false, "starting")
	if err := s.AddPoolMember(ctx, PoolMember{SandboxID: "sbx_m1", Tenant: "acme", Pool: "warm", CreatedAt: t0}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("duplicate member: %v", err)
	}
	if err := s.SetPoolMemberReady(ctx, "sbx_m1", t0); !errors.Is(err, errdefs.ErrInvalidState) {
		t.Fatalf("ready twice: %v", err)
	}
	if err := s.SetPoolMemberReady(ctx, "sbx_nope", t0); !errdefs.IsNotFound(err) {
		t.Fatalf("ready of a missing member: %v", err)
	}
	if c, err := s.PoolCounts(ctx, "acme", "warm"); err != nil || c != (PoolCounts{Starting: 1, Ready: 3}) {
		t.Fatalf("counts %+v %v", c, err)
	}

	// Unclaimed members are nobody's sandboxes yet: not listed.
	list := func(f SandboxFilter) []string {
		t.Helper()
		l, _, err := s.ListSandboxes(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, sb := range l {
			ids = append(ids, sb.ID)
		}
		sort.Strings(ids)
		return ids
	}
	if ids := list(SandboxFilter{Tenant: "acme"}); len(ids) != 0 {
		t.Fatalf("unclaimed members listed: %v", ids)
	}
	if ids := list(SandboxFilter{Tenant: "acme", PoolMembers: true}); len(ids) != 4 {
		t.Fatalf("with members: %v", ids)
	}

	// Claims take the oldest ready member whose sandbox runs, each once,
	// also when they race.
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		got []string
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := s.ClaimPoolMember(ctx, "acme", "warm", t0.Add(time.Minute))
			if errdefs.IsNotFound(err) {
				return
			}
			if err != nil || m.State != MemberClaimed || m.ClaimedAt == nil {
				t.Errorf("claim: %+v %v", m, err)
				return
			}
			mu.Lock()
			got = append(got, m.SandboxID)
			mu.Unlock()
		}()
	}
	wg.Wait()
	sort.Strings(got)
	if !slices.Equal(got, []string{"sbx_m1", "sbx_m2"}) {
		t.Fatalf("claimed %v", got)
	}
	if _, err := s.ClaimPoolMember(ctx, "evil", "warm", t0); !errdefs.IsNotFound(err) {
		t.Fatalf("claim from another tenant's pool: %v", err)
	}
	if m, err := s.GetPoolMember(ctx, "sbx_m1"); err != nil || m.State != MemberClaimed || m.Pool != "warm" {
		t.Fatalf("member: %+v %v", m, err)
	}
	if _, err := s.GetPoolMember(ctx, "sbx_nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("missing member: %v", err)
	}
	if ids := list(SandboxFilter{Tenant: "acme"}); !slices.Equal(ids, []string{"sbx_m1", "sbx_m2"}) {
		t.Fatalf("claimed members are sandboxes: %v", ids)
	}
	if c, _ := s.PoolCounts(ctx, "acme", "warm"); c != (PoolCounts{Starting: 1, Ready: 1, Claimed: 2}) {
		t.Fatalf("counts after claims %+v", c)
	}

	// Stray: an unclaimed member whose sandbox is not live.
	stray := func() []string {
		t.Helper()
		l, err := s.StrayPoolMembers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range l {
			ids = append(ids, m.SandboxID)
		}
		return ids
	}
	if ids := stray(); !slices.Equal(ids, []string{"sbx_dead"}) {
		t.Fatalf("stray %v", ids)
	}
	if err := s.RemovePoolMember(ctx, "sbx_dead"); err != nil {
		t.Fatal(err)
	}
	if err := s.RemovePoolMember(ctx, "sbx_dead"); err != nil {
		t.Fatalf("remove twice: %v", err)
	}
	// A deleted pool leaves its unclaimed members stray, its claimed ones
	// ordinary sandboxes.
	if err := s.DeletePool(ctx, "acme", "warm"); err != nil {
		t.Fatal(err)
	}
	if ids := stray(); !slices.Equal(ids, []string{"sbx_m3"}) {
		t.Fatalf("stray after the pool went %v", ids)
	}
	if ms, err := s.PoolMembers(ctx, "acme", "warm"); err != nil || len(ms) != 3 || ms[0].SandboxID != "sbx_m1" {
		t.Fatalf("members %+v %v", ms, err)
	}

	// Purge forgets claimed members whose sandbox stopped.
	sb, _ := s.GetSandbox(ctx, "sbx_m1", "")
	sb.State = "stopped"
	if err := s.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Purge(ctx, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetPoolMember(ctx, "sbx_m1"); !errdefs.IsNotFound(err) {
		t.Fatalf("purged claimed member: %v", err)
	}
	if _, err := s.GetPoolMember(ctx, "sbx_m2"); err != nil {
		t.Fatalf("a live claimed member was purged: %v", err)
	}
}

func TestUsagePausedDisk(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	a := UsageAccrual{SandboxID: "sbx_1", Tenant: "acme", From: t0, To: t0.Add(time.Minute),
		Q: UsageQuantities{PausedS: 60, PausedDiskS: 45}}
	if ok, err := s.AccrueUsage(ctx, a); err != nil || !ok {
		t.Fatal(ok, err)
	}
	rows, err := s.ListUsage(ctx, UsageFilter{Tenant: "acme"})
	if err != nil || len(rows) != 1 || rows[0].Q.PausedDiskS != 45 || rows[0].Q.PausedS != 60 {
		t.Fatalf("rows %+v %v", rows, err)
	}
	if q := a.Q.Add(a.Q).Scale(0.5); q.PausedDiskS != 45 {
		t.Fatalf("add and scale: %+v", q)
	}
}
