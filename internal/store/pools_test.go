package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// TestPoolMemberDrainAndClaimKeyed: a claim binds its idempotency key in
// the claim's transaction; a drain and a claim never both take a member;
// draining members are stray until gone; gone ones are never listed.
func TestPoolMemberDrainAndClaimKeyed(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	if _, err := s.PutPool(ctx, Pool{Tenant: "acme", Name: "warm", Template: "base", Size: 3, CreatedAt: t0, UpdatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	member(t, s, "sbx_a", t0, true, "running")
	member(t, s, "sbx_b", t0.Add(time.Second), true, "running")
	member(t, s, "sbx_c", t0.Add(2*time.Second), true, "running")

	idem := &Idempotency{Key: "k1", RequestHash: "h1"}
	m, existing, err := s.ClaimPoolMemberKeyed(ctx, "acme", "warm", t0, idem)
	if err != nil || existing != nil || m.SandboxID != "sbx_a" || m.State != MemberClaimed {
		t.Fatalf("claim: %+v %+v %v", m, existing, err)
	}
	if rec, err := s.IdempotencyKey(ctx, "acme", "k1"); err != nil || rec == nil || rec.SandboxID != "sbx_a" || rec.RequestHash != "h1" {
		t.Fatalf("key after claim: %+v %v", rec, err)
	}
	// The same key again claims nothing and answers the binding.
	m, existing, err = s.ClaimPoolMemberKeyed(ctx, "acme", "warm", t0, idem)
	if !errors.Is(err, errdefs.ErrAlreadyExists) || existing == nil || existing.SandboxID != "sbx_a" || m.SandboxID != "" {
		t.Fatalf("claim with a used key: %+v %+v %v", m, existing, err)
	}
	if c, _ := s.PoolCounts(ctx, "acme", "warm"); c.Ready != 2 || c.Claimed != 1 {
		t.Fatalf("counts %+v", c)
	}

	// A drain takes a ready member once; a claimed one is never drained.
	if ok, err := s.SetPoolMemberState(ctx, "sbx_b", MemberDraining, MemberReady); err != nil || !ok {
		t.Fatalf("drain: %v %v", ok, err)
	}
	if ok, _ := s.SetPoolMemberState(ctx, "sbx_b", MemberDraining, MemberReady); ok {
		t.Fatal("drained twice")
	}
	if ok, _ := s.SetPoolMemberState(ctx, "sbx_a", MemberDraining, MemberReady); ok {
		t.Fatal("a claimed member was drained")
	}
	if _, err := s.SetPoolMemberState(ctx, "sbx_b", MemberGone); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("no from state: %v", err)
	}
	// The draining one is no longer claimable: the next claim gets sbx_c.
	if m, err := s.ClaimPoolMember(ctx, "acme", "warm", t0); err != nil || m.SandboxID != "sbx_c" {
		t.Fatalf("claim after a drain: %+v %v", m, err)
	}
	if _, err := s.ClaimPoolMember(ctx, "acme", "warm", t0); !errdefs.IsNotFound(err) {
		t.Fatalf("claim of an empty pool: %v", err)
	}
	// Draining is stray (a daemon that died mid-drain finishes it), even
	// with its pool there and its sandbox running; gone is not.
	strays, err := s.StrayPoolMembers(ctx)
	if err != nil || len(strays) != 1 || strays[0].SandboxID != "sbx_b" {
		t.Fatalf("strays %+v %v", strays, err)
	}
	if ok, err := s.SetPoolMemberState(ctx, "sbx_b", MemberGone, MemberDraining); err != nil || !ok {
		t.Fatalf("gone: %v %v", ok, err)
	}
	if strays, _ := s.StrayPoolMembers(ctx); len(strays) != 0 {
		t.Fatalf("strays after gone: %+v", strays)
	}
	// A gone member's record is never listed (its row hides it); the
	// claimed ones are.
	recs, _, err := s.ListSandboxes(ctx, SandboxFilter{Tenant: "acme"})
	if err != nil || len(recs) != 2 {
		t.Fatalf("listed %d records (%v), want the 2 claimed", len(recs), err)
	}
	for _, r := range recs {
		if r.ID == "sbx_b" {
			t.Fatal("a gone member is listed")
		}
	}
	// Its row goes once its record is purged.
	if err := s.ForgetGonePoolMembers(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetPoolMember(ctx, "sbx_b"); err != nil {
		t.Fatalf("a gone member with a record was forgotten: %v", err)
	}
}
