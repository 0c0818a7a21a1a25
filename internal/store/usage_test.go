package store

import (
	"context"
	"math"
	"testing"
	"time"
)

func TestAccrueUsage(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	t0 := time.Date(2026, 1, 2, 10, 59, 0, 0, time.UTC)
	q := UsageQuantities{RunningS: 120, VCPUAllocS: 240, EgressBytes: 1200}
	a := UsageAccrual{SandboxID: "sbx_1", Tenant: "acme", Template: "base:1", From: t0, To: t0.Add(2 * time.Minute), Q: q, CPUSeconds: 3, TxBytes: 1200}
	tests := []struct {
		name    string
		a       UsageAccrual
		applied bool
	}{
		{"first starts the cursor", a, true},
		{"replay is dropped", a, false},
		{"stale from is dropped", func() UsageAccrual { b := a; b.From, b.To = t0.Add(time.Minute), t0.Add(3*time.Minute); return b }(), false},
		{"next interval applies", func() UsageAccrual {
			b := a
			b.From, b.To, b.Q = a.To, a.To.Add(time.Minute), UsageQuantities{RunningS: 60}
			return b
		}(), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ok, err := s.AccrueUsage(ctx, tc.a)
			if err != nil || ok != tc.applied {
				t.Fatalf("AccrueUsage = %v, %v; want %v", ok, err, tc.applied)
			}
		})
	}
	rows, err := s.ListUsage(ctx, UsageFilter{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	// 10:59-11:01 splits in half across two hours, then 11:01-11:02.
	if len(rows) != 2 {
		t.Fatalf("rows %+v", rows)
	}
	if rows[0].Q.RunningS != 60 || rows[1].Q.RunningS != 120 || rows[0].Q.VCPUAllocS != 120 || rows[0].Q.EgressBytes != 600 {
		t.Fatalf("rows %+v", rows)
	}
	var total float64
	for _, r := range rows {
		total += r.Q.RunningS
	}
	if math.Abs(total-180) > 1e-9 {
		t.Fatalf("total running %v, want 180", total)
	}
	c, ok, err := s.GetUsageCursor(ctx, "sbx_1")
	if err != nil || !ok || !c.AccountedAt.Equal(t0.Add(3*time.Minute)) || c.TxBytes != 1200 {
		t.Fatalf("cursor %+v %v %v", c, ok, err)
	}
	if rows, _ := s.ListUsage(ctx, UsageFilter{Tenant: "other"}); len(rows) != 0 {
		t.Fatalf("other tenant sees %+v", rows)
	}
	if rows, _ := s.ListUsage(ctx, UsageFilter{From: t0.Add(time.Hour)}); len(rows) != 1 {
		t.Fatalf("from filter: %+v", rows)
	}
}
