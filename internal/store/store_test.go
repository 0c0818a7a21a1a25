package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func openTest(t *testing.T) *Store {
	t.Helper()
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func sandbox(id, tenant string, created time.Time) Sandbox {
	return Sandbox{
		ID: id, Tenant: tenant, State: "running", DesiredState: "running",
		Spec: json.RawMessage(`{"template":"base"}`), Template: "base", TemplateVersion: 1, Runtime: "runc",
		CreatedAt: created, ExpiresAt: created.Add(5 * time.Minute), TimeoutS: 300,
		Metadata: map[string]string{"user": "u-" + id},
	}
}

func TestOpenMigratesOnceAndReopens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "airlock.db")
	ctx := context.Background()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateKey(ctx, Key{ID: "key_1", Tenant: "t1", Prefix: "ak_x", Hash: []byte("h1"), CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	var mode string
	if err := s.w.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode = %q, %v; want wal", mode, err)
	}
	s.Close()
	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	v, err := s.SchemaVersion(ctx)
	if err != nil || v != len(migrations) {
		t.Fatalf("schema version = %d, %v; want %d", v, err, len(migrations))
	}
	if _, err := s.GetKey(ctx, "key_1"); err != nil {
		t.Fatalf("key lost across reopen: %v", err)
	}
}

func TestKeys(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	k := Key{ID: "key_a", Tenant: "acme", Name: "ci", Prefix: "ak_abcd", Hash: []byte("hash-a"), CreatedAt: t0}
	if err := s.CreateKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateKey(ctx, Key{ID: "key_b", Tenant: "acme", Prefix: "p", Hash: []byte("hash-a"), CreatedAt: t0}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("duplicate hash: err = %v, want already exists", err)
	}
	if err := s.CreateKey(ctx, Key{ID: "key_c", Tenant: "other", Prefix: "p", Hash: []byte("hash-c"), Admin: true, CreatedAt: t0.Add(time.Second)}); err != nil {
		t.Fatal(err)
	}
	got, err := s.KeyByHash(ctx, []byte("hash-a"))
	if err != nil || got.ID != "key_a" || got.Tenant != "acme" || got.Name != "ci" || got.RevokedAt != nil || !got.CreatedAt.Equal(t0) {
		t.Fatalf("KeyByHash = %+v, %v", got, err)
	}
	if _, err := s.KeyByHash(ctx, []byte("nope")); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown hash: err = %v, want not found", err)
	}
	n, err := s.CountAdminKeys(ctx)
	if err != nil || n != 1 {
		t.Fatalf("CountAdminKeys = %d, %v; want 1", n, err)
	}
	acme, _ := s.ListKeys(ctx, "acme")
	all, _ := s.ListKeys(ctx, "")
	if len(acme) != 1 || len(all) != 2 {
		t.Fatalf("ListKeys acme=%d all=%d, want 1 and 2", len(acme), len(all))
	}
	if err := s.RevokeKey(ctx, "key_a", t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := s.RevokeKey(ctx, "key_a", t0.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	got, _ = s.KeyByHash(ctx, []byte("hash-a"))
	if got.RevokedAt == nil || !got.RevokedAt.Equal(t0.Add(time.Hour)) {
		t.Fatalf("RevokedAt = %v, want the first revocation time", got.RevokedAt)
	}
	if err := s.RevokeKey(ctx, "key_zzz", t0); !errdefs.IsNotFound(err) {
		t.Fatalf("revoke unknown: err = %v", err)
	}
	if err := s.RevokeKeysNamed(ctx, "other-name", []byte("keep"), t0); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.CountAdminKeys(ctx); n != 1 {
		t.Fatalf("RevokeKeysNamed touched a key of another name")
	}
}

func TestSandboxRoundTrip(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	sb := sandbox("sbx_1", "acme", t0)
	sb.Handle = json.RawMessage(`{"id":"sbx_1","driver":"runc"}`)
	sb.Secrets = []byte{1, 2, 3}
	if _, err := s.CreateSandbox(ctx, sb, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateSandbox(ctx, sb, nil); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("duplicate id: err = %v", err)
	}
	got, err := s.GetSandbox(ctx, "sbx_1", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if got.Tenant != "acme" || got.Metadata["user"] != "u-sbx_1" || string(got.Handle) != string(sb.Handle) ||
		!got.ExpiresAt.Equal(sb.ExpiresAt) || got.PausedAt != nil || string(got.Secrets) != "\x01\x02\x03" {
		t.Fatalf("round trip: got %+v", got)
	}
	// Another tenant sees exactly what a missing id gives.
	_, errOther := s.GetSandbox(ctx, "sbx_1", "evil")
	_, errMissing := s.GetSandbox(ctx, "sbx_nope", "evil")
	if !errdefs.IsNotFound(errOther) || !errdefs.IsNotFound(errMissing) {
		t.Fatalf("other tenant: %v; missing: %v", errOther, errMissing)
	}
	if _, err := s.GetSandbox(ctx, "sbx_1", ""); err != nil {
		t.Fatalf("admin (no tenant) get: %v", err)
	}
	p := t0.Add(time.Minute)
	got.State, got.PausedAt, got.PausedTotal = "paused", &p, 3*time.Second
	got.ErrorCode, got.ErrorMessage = "x", "y"
	if err := s.UpdateSandbox(ctx, got); err != nil {
		t.Fatal(err)
	}
	again, _ := s.GetSandbox(ctx, "sbx_1", "")
	if again.State != "paused" || again.PausedAt == nil || !again.PausedAt.Equal(p) || again.PausedTotal != 3*time.Second || again.ErrorCode != "x" {
		t.Fatalf("update: got %+v", again)
	}
	if err := s.UpdateSandbox(ctx, sandbox("sbx_missing", "acme", t0)); !errdefs.IsNotFound(err) {
		t.Fatalf("update missing: %v", err)
	}
}

func TestIdempotencyKey(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	idem := &Idempotency{Key: "k1", RequestHash: "h"}
	if _, err := s.CreateSandbox(ctx, sandbox("sbx_1", "acme", t0), idem); err != nil {
		t.Fatal(err)
	}
	existing, err := s.CreateSandbox(ctx, sandbox("sbx_2", "acme", t0), idem)
	if !errors.Is(err, errdefs.ErrAlreadyExists) || existing == nil || existing.SandboxID != "sbx_1" || existing.RequestHash != "h" {
		t.Fatalf("retry: existing=%+v err=%v", existing, err)
	}
	if _, err := s.GetSandbox(ctx, "sbx_2", ""); !errdefs.IsNotFound(err) {
		t.Fatalf("a retry must not insert a second sandbox: %v", err)
	}
	// Keys are per tenant.
	if _, err := s.CreateSandbox(ctx, sandbox("sbx_3", "other", t0), idem); err != nil {
		t.Fatalf("same key, other tenant: %v", err)
	}
	if err := s.DeleteIdempotencyKey(ctx, "acme", "k1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateSandbox(ctx, sandbox("sbx_4", "acme", t0), idem); err != nil {
		t.Fatalf("after delete: %v", err)
	}
}

func TestListSandboxesPaginationAndFilters(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	// 7 sandboxes of acme, two share a timestamp (the id breaks the tie), one of other.
	for i := 0; i < 7; i++ {
		created := t0.Add(time.Duration(i) * time.Second)
		if i == 6 {
			created = t0.Add(5 * time.Second)
		}
		sb := sandbox(fmt.Sprintf("sbx_%d", i), "acme", created)
		if i%2 == 0 {
			sb.State = "stopped"
		}
		if _, err := s.CreateSandbox(ctx, sb, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.CreateSandbox(ctx, sandbox("sbx_x", "other", t0), nil); err != nil {
		t.Fatal(err)
	}
	var ids []string
	cur := ""
	pages := 0
	for {
		page, next, err := s.ListSandboxes(ctx, SandboxFilter{Tenant: "acme", Limit: 3, Cursor: cur})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, sb := range page {
			ids = append(ids, sb.ID)
		}
		if next == "" {
			break
		}
		cur = next
	}
	want := []string{"sbx_6", "sbx_5", "sbx_4", "sbx_3", "sbx_2", "sbx_1", "sbx_0"}
	if fmt.Sprint(ids) != fmt.Sprint(want) || pages != 3 {
		t.Fatalf("pages=%d ids=%v, want 3 pages of %v", pages, ids, want)
	}
	running, _, err := s.ListSandboxes(ctx, SandboxFilter{Tenant: "acme", States: []string{"running"}})
	if err != nil || len(running) != 3 {
		t.Fatalf("state filter: %d, %v; want 3", len(running), err)
	}
	byMeta, _, err := s.ListSandboxes(ctx, SandboxFilter{Metadata: map[string]string{"user": "u-sbx_3"}})
	if err != nil || len(byMeta) != 1 || byMeta[0].ID != "sbx_3" {
		t.Fatalf("metadata filter: %+v, %v", byMeta, err)
	}
	all, _, _ := s.ListSandboxes(ctx, SandboxFilter{})
	if len(all) != 8 {
		t.Fatalf("admin list: %d, want 8", len(all))
	}
	for _, bad := range []SandboxFilter{
		{Cursor: "!!"}, {Cursor: "e30"}, {Limit: -1}, {Limit: MaxPageSize + 1},
		{Metadata: map[string]string{`a"b`: "x"}},
	} {
		if _, _, err := s.ListSandboxes(ctx, bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("filter %+v: err = %v, want invalid argument", bad, err)
		}
	}
	live, err := s.SandboxesInStates(ctx, "running")
	if err != nil || len(live) != 4 {
		t.Fatalf("SandboxesInStates = %d, %v; want 4", len(live), err)
	}
}

func TestExecs(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	sh := "echo hi"
	for i := 0; i < 5; i++ {
		e := Exec{ID: fmt.Sprintf("ex_%d", i), SandboxID: "sbx_1", Tenant: "acme", User: "user", Status: "running",
			StartedAt: t0.Add(time.Duration(i) * time.Second)}
		if i%2 == 0 {
			e.Argv = []string{"echo", "a b"}
		} else {
			e.Shell = &sh
		}
		if err := s.CreateExec(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreateExec(ctx, Exec{ID: "ex_0", SandboxID: "sbx_1", Tenant: "acme", User: "u", Status: "running", StartedAt: t0}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("duplicate exec: %v", err)
	}
	e, err := s.GetExec(ctx, "sbx_1", "ex_2")
	if err != nil || e.Status != "running" || e.ExitCode != nil || len(e.Argv) != 2 || e.Argv[1] != "a b" || e.Shell != nil {
		t.Fatalf("GetExec = %+v, %v", e, err)
	}
	if _, err := s.GetExec(ctx, "sbx_other", "ex_2"); !errdefs.IsNotFound(err) {
		t.Fatalf("exec of another sandbox: %v", err)
	}
	code := 3
	end := t0.Add(time.Minute)
	e.Status, e.ExitCode, e.EndedAt, e.DurationMS, e.Truncated, e.StdoutBytes = "exited", &code, &end, 55000, true, 9
	if _, err := s.FinishExec(ctx, e, []byte("events")); err != nil {
		t.Fatal(err)
	}
	got, _ := s.GetExec(ctx, "sbx_1", "ex_2")
	if got.Status != "exited" || got.ExitCode == nil || *got.ExitCode != 3 || !got.Truncated || got.StdoutBytes != 9 || got.EndedAt == nil {
		t.Fatalf("after finish: %+v", got)
	}
	out, err := s.ExecOutput(ctx, "ex_2")
	if err != nil || string(out) != "events" {
		t.Fatalf("ExecOutput = %q, %v", out, err)
	}
	if out, err := s.ExecOutput(ctx, "ex_1"); err != nil || out != nil {
		t.Fatalf("ExecOutput of running exec = %q, %v; want nil", out, err)
	}
	running, _ := s.RunningExecs(ctx, "sbx_1")
	if len(running) != 4 {
		t.Fatalf("RunningExecs = %d, want 4", len(running))
	}
	page, next, err := s.ListExecs(ctx, "sbx_1", 2, "")
	if err != nil || len(page) != 2 || page[0].ID != "ex_4" || next == "" {
		t.Fatalf("ListExecs page 1: %v %q %v", page, next, err)
	}
	page, next, _ = s.ListExecs(ctx, "sbx_1", 2, next)
	page3, next3, _ := s.ListExecs(ctx, "sbx_1", 2, next)
	if len(page) != 2 || page[0].ID != "ex_2" || len(page3) != 1 || page3[0].ID != "ex_0" || next3 != "" {
		t.Fatalf("ListExecs pages 2,3: %v %v %q", page, page3, next3)
	}
}

func TestPurge(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	old := sandbox("sbx_old", "acme", t0)
	old.State, old.EndedAt = "stopped", &t0
	young := sandbox("sbx_young", "acme", t0)
	later := t0.Add(48 * time.Hour)
	young.State, young.EndedAt = "stopped", &later
	live := sandbox("sbx_live", "acme", t0)
	for _, sb := range []Sandbox{old, young, live} {
		if _, err := s.CreateSandbox(ctx, sb, &Idempotency{Key: sb.ID, RequestHash: "h"}); err != nil {
			t.Fatal(err)
		}
	}
	ended := t0
	if err := s.CreateExec(ctx, Exec{ID: "ex_old", SandboxID: "sbx_old", Tenant: "acme", User: "u", Status: "exited", StartedAt: t0, EndedAt: &ended}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.FinishExec(ctx, Exec{ID: "ex_old", Status: "exited", EndedAt: &ended}, []byte("x")); err != nil {
		t.Fatal(err)
	}
	n, err := s.Purge(ctx, t0.Add(24*time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("Purge = %d, %v; want 1", n, err)
	}
	if _, err := s.GetSandbox(ctx, "sbx_old", ""); !errdefs.IsNotFound(err) {
		t.Fatal("old sandbox kept")
	}
	for _, id := range []string{"sbx_young", "sbx_live"} {
		if _, err := s.GetSandbox(ctx, id, ""); err != nil {
			t.Fatalf("%s purged: %v", id, err)
		}
	}
	if _, err := s.GetExec(ctx, "sbx_old", "ex_old"); !errdefs.IsNotFound(err) {
		t.Fatal("old exec kept")
	}
	if out, _ := s.ExecOutput(ctx, "ex_old"); out != nil {
		t.Fatal("old exec output kept")
	}
}

// TestConcurrentWriters checks that the single writer serialises concurrent
// writes without SQLITE_BUSY while readers keep reading.
func TestConcurrentWriters(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for g := 0; g < 8; g++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				id := fmt.Sprintf("sbx_%d_%d", g, i)
				if _, err := s.CreateSandbox(ctx, sandbox(id, "acme", t0.Add(time.Duration(i))), nil); err != nil {
					errs <- err
				}
			}
		}()
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				if _, _, err := s.ListSandboxes(ctx, SandboxFilter{Tenant: "acme", Limit: 10}); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	all, err := s.SandboxesInStates(ctx, "running")
	if err != nil || len(all) != 160 {
		t.Fatalf("got %d sandboxes, %v; want 160", len(all), err)
	}
}

// TestFilesOwnerOnly: the database and its WAL and shared-memory files are
// readable by their owner alone, for a new store and for one an older
// airlock left world-readable.
func TestFilesOwnerOnly(t *testing.T) {
	ctx := context.Background()
	check := func(path string) {
		t.Helper()
		for _, p := range []string{path, path + "-wal", path + "-shm"} {
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("%s has mode %v, want 0600", filepath.Base(p), fi.Mode().Perm())
			}
		}
	}
	write := func(s *Store) {
		t.Helper()
		if err := s.CreateKey(ctx, Key{ID: "key_" + strconv.Itoa(int(time.Now().UnixNano())), Tenant: "t1", Prefix: "ak_x",
			Hash: []byte(time.Now().String()), CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "airlock.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	write(s)
	check(path) // the WAL and shm exist while the store is open
	s.Close()

	old := filepath.Join(t.TempDir(), "airlock.db")
	if s, err = Open(ctx, old); err != nil {
		t.Fatal(err)
	}
	write(s)
	for _, p := range []string{old, old + "-wal", old + "-shm"} {
		os.Chmod(p, 0o644)
	}
	if s2, err := Open(ctx, old); err != nil {
		t.Fatal(err)
	} else {
		write(s2)
		check(old)
		s2.Close()
	}
	s.Close()
}
