package store

import (
	"context"
	"path/filepath"
	"testing"
)

func TestTenantQuotaRoundTrip(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	if q, err := s.TenantQuota(ctx, "nobody"); err != nil || q != nil {
		t.Fatalf("unknown tenant: %s %v", q, err)
	}
	if err := s.SetTenantQuota(ctx, "acme", []byte(`{"cpu":2}`)); err != nil {
		t.Fatal(err)
	}
	if q, err := s.TenantQuota(ctx, "acme"); err != nil || string(q) != `{"cpu":2}` {
		t.Fatalf("stored quota: %s %v", q, err)
	}
	// The override lives beside the tenant's network default, not over it.
	if err := s.SetTenantNetwork(ctx, "acme", []byte(`{"mode":"open"}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.SetTenantQuota(ctx, "acme", nil); err != nil {
		t.Fatal(err)
	}
	if q, err := s.TenantQuota(ctx, "acme"); err != nil || q != nil {
		t.Fatalf("cleared quota: %s %v", q, err)
	}
	if n, err := s.TenantNetwork(ctx, "acme"); err != nil || string(n) != `{"mode":"open"}` {
		t.Fatalf("network after quota cleared: %s %v", n, err)
	}
}

func TestKeyRateLimitRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "airlock.db")
	ctx := context.Background()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	rps, burst := 2.5, 7
	zero := 0.0
	keys := []Key{
		{ID: "key_default", Tenant: "t1", Prefix: "ak_a", Hash: []byte("h1"), CreatedAt: t0},
		{ID: "key_own", Tenant: "t1", Prefix: "ak_b", Hash: []byte("h2"), CreatedAt: t0, RateLimitRPS: &rps, RateLimitBurst: &burst},
		{ID: "key_unlimited", Tenant: "t1", Prefix: "ak_c", Hash: []byte("h3"), CreatedAt: t0, RateLimitRPS: &zero},
	}
	for _, k := range keys {
		if err := s.CreateKey(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	// Read back after a reopen, through both the hot path and the plain one.
	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, want := range keys {
		byHash, err := s.KeyByHash(ctx, want.Hash)
		if err != nil {
			t.Fatal(err)
		}
		byID, err := s.GetKey(ctx, want.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, got := range []Key{byHash, byID} {
			if !eqFloat(got.RateLimitRPS, want.RateLimitRPS) || !eqInt(got.RateLimitBurst, want.RateLimitBurst) {
				t.Fatalf("%s: rate %v/%v, want %v/%v", want.ID, got.RateLimitRPS, got.RateLimitBurst, want.RateLimitRPS, want.RateLimitBurst)
			}
		}
	}
}

func eqFloat(a, b *float64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
func eqInt(a, b *int) bool       { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
