package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func previewPorts(t *testing.T, s *Store, id string) string {
	t.Helper()
	list, err := s.Previews(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	out := ""
	for _, p := range list {
		if p.SandboxID != id || !p.CreatedAt.Equal(t0) {
			t.Fatalf("preview %+v: want sandbox %s created %v", p, id, t0)
		}
		out += fmt.Sprintf("%d:%v ", p.Port, p.Public)
	}
	return out
}

// TestPreviews: exposed ports round-trip by port, re-exposing changes only
// public, and they go when unexposed, with their sandbox, or when their
// sandbox is no longer live.
func TestPreviews(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	a, b := sandbox("sbx_a", "acme", t0), sandbox("sbx_b", "acme", t0)
	for _, sb := range []Sandbox{a, b} {
		if _, err := s.CreateSandbox(ctx, sb, nil); err != nil {
			t.Fatal(err)
		}
	}
	put := func(id string, port int, public bool) {
		t.Helper()
		if err := s.PutPreview(ctx, Preview{SandboxID: id, Port: port, Public: public, CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
	}
	put("sbx_a", 8080, false)
	put("sbx_a", 3000, true)
	put("sbx_a", 8080, true)
	put("sbx_b", 5000, false)

	tests := []struct {
		name string
		step func() error
		a, b string
	}{
		{"Initial", func() error { return nil }, "3000:true 8080:true ", "5000:false "},
		{"Unexpose", func() error { return s.DeletePreview(ctx, "sbx_a", 3000) }, "8080:true ", "5000:false "},
		{"UnexposeUnknown", func() error { return s.DeletePreview(ctx, "sbx_a", 1) }, "8080:true ", "5000:false "},
		{"PruneKeepsLive", func() error { _, err := s.PrunePreviews(ctx, "running", "paused"); return err }, "8080:true ", "5000:false "},
		{"PruneStopped", func() error {
			b.State = "stopped"
			if err := s.UpdateSandbox(ctx, b); err != nil {
				return err
			}
			n, err := s.PrunePreviews(ctx, "running", "paused")
			if err == nil && n != 1 {
				err = fmt.Errorf("pruned %d rows, want 1", n)
			}
			return err
		}, "8080:true ", ""},
		{"DeleteAll", func() error { return s.DeletePreviews(ctx, "sbx_a") }, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.step(); err != nil {
				t.Fatal(err)
			}
			if got := previewPorts(t, s, "sbx_a"); got != tc.a {
				t.Errorf("sbx_a previews %q, want %q", got, tc.a)
			}
			if got := previewPorts(t, s, "sbx_b"); got != tc.b {
				t.Errorf("sbx_b previews %q, want %q", got, tc.b)
			}
		})
	}
}

// TestPreviewsGoWithTheirSandbox: purging a sandbox's record deletes its
// exposed ports; a port of a sandbox that has no record cannot be stored.
func TestPreviewsGoWithTheirSandbox(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	old := sandbox("sbx_old", "acme", t0)
	old.State, old.EndedAt = "stopped", &t0
	if _, err := s.CreateSandbox(ctx, old, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.PutPreview(ctx, Preview{SandboxID: "sbx_old", Port: 80, CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Purge(ctx, t0.Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("Purge = %d, %v", n, err)
	}
	if _, err := s.GetSandbox(ctx, "sbx_old", ""); !errdefs.IsNotFound(err) {
		t.Fatalf("sandbox kept: %v", err)
	}
	var n int
	if err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM sandbox_previews`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d preview rows left after purge (%v)", n, err)
	}
	if err := s.PutPreview(ctx, Preview{SandboxID: "sbx_none", Port: 80, CreatedAt: t0}); err == nil {
		t.Fatal("stored a preview of a sandbox without a record")
	}
}
