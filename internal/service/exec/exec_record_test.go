package exec_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/service/exec"
	"github.com/airlockhq/airlock/internal/service/servicetest"
)

// newEnv runs the services on a fresh store and the fake driver (whose
// agents are real, in this process).
func newEnv(t *testing.T) *servicetest.Env {
	t.Helper()
	return servicetest.Start(t, servicetest.Options{})
}

// TestExecAnswersBeforeItsRecord holds the store's write lock while an exec
// ends: its result must reach the caller (and a listing) without waiting
// for the store, and the record must land once the lock is released.
func TestExecAnswersBeforeItsRecord(t *testing.T) {
	e0 := newEnv(t)
	m, x, st, dbPath := e0.Sandboxes, e0.Execs, e0.Store, e0.DBPath
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := auth.Principal{Tenant: "acme"}
	res, err := m.Create(ctx, p, api.CreateSandboxRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	id := res.Sandbox.ID
	defer m.Delete(context.WithoutCancel(ctx), p, id)

	// The exec waits for its stdin, so that the lock is taken after its
	// record was created and before it ends.
	shell := "read line; echo got $line"
	e, err := x.Exec(ctx, p, id, api.ExecRequest{Shell: &shell}, exec.Options{StdinOpen: true})
	if err != nil {
		t.Fatal(err)
	}

	locker, err := sql.Open("sqlite", "file:"+dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close()
	conn, err := locker.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	locked := true
	unlock := func() {
		if locked {
			locked = false
			if _, err := conn.ExecContext(context.Background(), "ROLLBACK"); err != nil {
				t.Error(err)
			}
		}
	}
	defer unlock()

	if _, err := x.WriteStdin(ctx, p, id, e.ID(), strings.NewReader("hello\n"), true); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
	r, err := e.Wait(wctx)
	wcancel()
	if err != nil {
		t.Fatalf("the result waited for the store: %v", err)
	}
	if r.Status != api.ExecExited || r.Stdout == nil || *r.Stdout != "got hello\n" {
		t.Fatalf("result %+v", r)
	}
	// The store still says running; the listing must not.
	if rec, err := st.GetExec(ctx, id, e.ID()); err != nil || rec.EndedAt != nil {
		t.Fatalf("store record %+v, %v: want it still running while locked", rec, err)
	}
	list, err := x.ListExecs(ctx, p, id, 10, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Execs) != 1 || list.Execs[0].Status != api.ExecExited || list.Execs[0].ExitCode == nil || *list.Execs[0].ExitCode != 0 {
		t.Fatalf("listing %+v, want the exec ended", list.Execs)
	}
	got, err := x.GetExec(ctx, p, id, e.ID())
	if err != nil || got.Status != api.ExecExited || got.Stdout == nil || *got.Stdout != "got hello\n" {
		t.Fatalf("GetExec = %+v, %v", got, err)
	}

	unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec, err := st.GetExec(ctx, id, e.ID())
		if err == nil && rec.EndedAt != nil && rec.Status == api.ExecExited {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("record never finished: %+v, %v", rec, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
