package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/errdefs"
)

func auditEvent(i int, tenant, sandbox, typ string) audit.Event {
	return audit.Event{
		ID: fmt.Sprintf("aud_%03d", i), Time: t0.Add(time.Duration(i) * time.Second), Type: typ,
		Tenant: tenant, SandboxID: sandbox, Template: "base", RequestID: fmt.Sprintf("req_%d", i),
		Detail: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)),
	}
}

func ids(evs []audit.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.ID)
	}
	return out
}

func TestAuditEvents(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	var all []audit.Event
	for i := range 10 {
		tenant, sbx, typ := "t1", "sbx_a", audit.TypeExec
		switch {
		case i%3 == 1:
			tenant, sbx = "t2", "sbx_b"
		case i%3 == 2:
			typ = audit.TypeEgress
		}
		all = append(all, auditEvent(i, tenant, sbx, typ))
	}
	all = append(all, audit.Event{ID: "aud_anon", Time: t0.Add(time.Hour), Type: audit.TypeAuthFailure})
	// Two batches, as the recorder writes them.
	if err := s.InsertAuditEvents(ctx, all[:4]); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertAuditEvents(ctx, all[4:]); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		f    AuditFilter
		want []string
	}{
		{"all", AuditFilter{}, ids(all)},
		{"tenant", AuditFilter{Tenant: "t2"}, []string{"aud_001", "aud_004", "aud_007"}},
		{"sandbox", AuditFilter{SandboxID: "sbx_a", Types: []string{audit.TypeEgress}}, []string{"aud_002", "aud_005", "aud_008"}},
		{"other_tenants_sandbox", AuditFilter{Tenant: "t1", SandboxID: "sbx_b"}, nil},
		{"types", AuditFilter{Types: []string{audit.TypeAuthFailure}}, []string{"aud_anon"}},
		{"since_until", AuditFilter{Since: t0.Add(3 * time.Second), Until: t0.Add(5 * time.Second)}, []string{"aud_003", "aud_004"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := s.ListAuditEvents(ctx, tt.f)
			if err != nil {
				t.Fatal(err)
			}
			if got := ids(p.Events); !slices.Equal(got, tt.want) || p.HasMore {
				t.Fatalf("got %v (more %v), want %v", got, p.HasMore, tt.want)
			}
		})
	}
	t.Run("fields", func(t *testing.T) {
		p, err := s.ListAuditEvents(ctx, AuditFilter{SandboxID: "sbx_b", Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		e := p.Events[0]
		if e.ID != "aud_001" || !e.Time.Equal(t0.Add(time.Second)) || e.Type != audit.TypeExec || e.Tenant != "t2" ||
			e.Template != "base" || e.RequestID != "req_1" || string(e.Detail) != `{"n":1}` || e.Seq <= 0 {
			t.Fatalf("event %+v", e)
		}
	})
	t.Run("cursor_paging_and_polling", func(t *testing.T) {
		var got []string
		f := AuditFilter{Limit: 3}
		for pages := 0; ; pages++ {
			p, err := s.ListAuditEvents(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, ids(p.Events)...)
			if p.NextCursor == "" {
				t.Fatal("no next cursor")
			}
			f.Cursor = p.NextCursor
			if !p.HasMore {
				break
			}
			if pages > 10 {
				t.Fatal("paging does not end")
			}
		}
		if !slices.Equal(got, ids(all)) {
			t.Fatalf("paged %v, want %v", got, ids(all))
		}
		// Caught up: an empty page keeps the cursor; a new event shows up.
		p, err := s.ListAuditEvents(ctx, f)
		if err != nil || len(p.Events) != 0 || p.NextCursor != f.Cursor {
			t.Fatalf("caught-up page %+v, %v", p, err)
		}
		if err := s.InsertAuditEvents(ctx, []audit.Event{auditEvent(99, "t1", "sbx_a", audit.TypeDelete)}); err != nil {
			t.Fatal(err)
		}
		p, err = s.ListAuditEvents(ctx, f)
		if err != nil || !slices.Equal(ids(p.Events), []string{"aud_099"}) {
			t.Fatalf("poll after a new event: %v, %v", ids(p.Events), err)
		}
	})
	t.Run("bad_cursor", func(t *testing.T) {
		for _, c := range []string{"x", encodeCursor(cursor{T: 1, ID: "sbx_a"}), "YS0x"} {
			if _, err := s.ListAuditEvents(ctx, AuditFilter{Cursor: c}); !errdefs.IsInvalidArgument(err) {
				t.Errorf("cursor %q: %v, want invalid argument", c, err)
			}
		}
	})
	t.Run("append_only", func(t *testing.T) {
		_, err := s.w.ExecContext(ctx, `UPDATE audit_events SET detail = '{}' WHERE id = 'aud_001'`)
		if err == nil || !strings.Contains(err.Error(), "append-only") {
			t.Fatalf("update of an audit event: %v", err)
		}
	})
	t.Run("purge", func(t *testing.T) {
		if _, err := s.Purge(ctx, t0.Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		p, err := s.ListAuditEvents(ctx, AuditFilter{Limit: 2})
		if err != nil || !slices.Equal(ids(p.Events), []string{"aud_005", "aud_006"}) {
			t.Fatalf("after purge: %v, %v", ids(p.Events), err)
		}
	})
}

// TestExecRequestID: FinishExec returns the request that started the exec
// (its audit event names it), also when it is finished from a context
// without the request (the exec's tracker), and nothing for a failed one.
func TestExecRequestID(t *testing.T) {
	s := openTest(t)
	ctx := audit.WithRequestID(context.Background(), "req_abc")
	e := Exec{ID: "ex_1", SandboxID: "sbx_a", Tenant: "t1", Argv: []string{"true"}, User: "user", Status: "running", StartedAt: t0}
	if err := s.CreateExec(ctx, e); err != nil {
		t.Fatal(err)
	}
	end := t0.Add(time.Second)
	code := 0
	e.Status, e.EndedAt, e.ExitCode = "exited", &end, &code
	if rid, err := s.FinishExec(context.Background(), e, nil); err != nil || rid != "req_abc" {
		t.Fatalf("FinishExec = %q, %v; want req_abc", rid, err)
	}
	if got, err := s.GetExec(ctx, "sbx_a", "ex_1"); err != nil || got.Status != "exited" {
		t.Fatalf("after finish: %+v, %v", got, err)
	}
	if rid, err := s.FinishExec(ctx, Exec{ID: "ex_missing", Status: "exited"}, nil); !errdefs.IsNotFound(err) || rid != "" {
		t.Fatalf("finishing a missing exec: %q, %v", rid, err)
	}
}

func TestTenantNetwork(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	if n, err := s.TenantNetwork(ctx, "nobody"); n != nil || err != nil {
		t.Fatalf("unknown tenant: %s, %v", n, err)
	}
	pol := json.RawMessage(`{"mode":"allowlist","allow":["pypi.org"]}`)
	if err := s.SetTenantNetwork(ctx, "t1", pol); err != nil {
		t.Fatal(err)
	}
	if n, err := s.TenantNetwork(ctx, "t1"); string(n) != string(pol) || err != nil {
		t.Fatalf("stored %s, %v", n, err)
	}
	if err := s.SetTenantNetwork(ctx, "t1", nil); err != nil {
		t.Fatal(err)
	}
	if n, err := s.TenantNetwork(ctx, "t1"); n != nil || err != nil {
		t.Fatalf("cleared: %s, %v", n, err)
	}
}
