package auth

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
)

type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newLimitedAuth(t *testing.T, def RateLimit) (*Authenticator, *testClock) {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	c := &testClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	return New(st, WithClock(c.Now), WithRateLimit(def)), c
}

// call authenticates one request with secret.
func call(a *Authenticator, secret string) (Principal, error) {
	r := httptest.NewRequest("GET", "/v1/sandboxes", nil)
	r.Header.Set("Authorization", "Bearer "+secret)
	return a.Authenticate(context.Background(), r)
}

func TestRateLimitPerKey(t *testing.T) {
	a, clk := newLimitedAuth(t, RateLimit{RPS: 2, Burst: 3})
	ctx := context.Background()
	rps, burst, none := 10.0, 1, 0.0
	tests := []struct {
		name    string
		opts    []KeyOption
		allowed int           // requests that pass at once
		wait    time.Duration // Retry-After of the next one
	}{
		{"default", nil, 3, 500 * time.Millisecond},
		{"own-limit", []KeyOption{KeyRateLimit(&rps, &burst)}, 1, 100 * time.Millisecond},
		{"own-burst-default-rate", []KeyOption{KeyRateLimit(nil, &burst)}, 1, 500 * time.Millisecond},
		{"no-limit", []KeyOption{KeyRateLimit(&none, nil)}, 100, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := a.CreateKey(ctx, "acme", tt.name, false, tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			for i := range tt.allowed {
				if _, err := call(a, k.Secret); err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
			}
			_, err = call(a, k.Secret)
			if tt.wait == 0 {
				if err != nil {
					t.Fatalf("unlimited key refused: %v", err)
				}
				return
			}
			var rle *RateLimitError
			if !errors.As(err, &rle) || !errors.Is(err, errdefs.ErrRateLimited) || IsUnauthenticated(err) {
				t.Fatalf("over the limit: %v, want a rate limit error", err)
			}
			if d := rle.RetryAfter - tt.wait; d < -time.Millisecond || d > time.Millisecond {
				t.Fatalf("retry after %v, want %v", rle.RetryAfter, tt.wait)
			}
			clk.Advance(tt.wait)
			if _, err := call(a, k.Secret); err != nil {
				t.Fatalf("after waiting Retry-After: %v", err)
			}
		})
	}
}

// TestRateLimitKeysAreIndependent: one key's flood does not slow another
// key, even of the same tenant, and a changed default applies at once.
func TestRateLimitKeysAreIndependent(t *testing.T) {
	a, _ := newLimitedAuth(t, RateLimit{RPS: 1, Burst: 2})
	ctx := context.Background()
	k1, _ := a.CreateKey(ctx, "acme", "one", false)
	k2, _ := a.CreateKey(ctx, "acme", "two", false)
	for range 2 {
		call(a, k1.Secret)
	}
	if _, err := call(a, k1.Secret); !errors.Is(err, errdefs.ErrRateLimited) {
		t.Fatalf("k1 over its limit: %v", err)
	}
	if _, err := call(a, k2.Secret); err != nil {
		t.Fatalf("k2 limited by k1: %v", err)
	}
	a.SetDefaultRateLimit(RateLimit{})
	if _, err := call(a, k1.Secret); err != nil {
		t.Fatalf("after the default limit was lifted: %v", err)
	}
}

// TestRateLimitAfterAuthentication: a wrong or revoked key is
// unauthenticated, never rate limited, and takes nobody's token.
func TestRateLimitAfterAuthentication(t *testing.T) {
	a, _ := newLimitedAuth(t, RateLimit{RPS: 1, Burst: 1})
	ctx := context.Background()
	k, _ := a.CreateKey(ctx, "acme", "k", false)
	for range 5 {
		if _, err := call(a, "ak_wrong"); !IsUnauthenticated(err) {
			t.Fatalf("wrong key: %v", err)
		}
	}
	if _, err := call(a, k.Secret); err != nil {
		t.Fatalf("first request of a fresh key: %v", err)
	}
	if err := a.Revoke(ctx, Principal{Admin: true}, k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := call(a, k.Secret); !IsUnauthenticated(err) || errors.Is(err, errdefs.ErrRateLimited) {
		t.Fatalf("revoked key over its limit: %v, want unauthenticated", err)
	}
}

func TestRateLimitEvictsIdleKeys(t *testing.T) {
	a, clk := newLimitedAuth(t, RateLimit{RPS: 5, Burst: 10})
	ctx := context.Background()
	var secrets []string
	for i := range 50 {
		k, err := a.CreateKey(ctx, "acme", fmt.Sprint("k", i), false)
		if err != nil {
			t.Fatal(err)
		}
		secrets = append(secrets, k.Secret)
		call(a, k.Secret)
	}
	if n := a.Buckets(); n != 50 {
		t.Fatalf("buckets %d, want 50", n)
	}
	clk.Advance(2 * time.Minute)
	call(a, secrets[0])
	if n := a.Buckets(); n != 1 {
		t.Fatalf("buckets after the others idled: %d, want 1", n)
	}
}

func TestKeyRateLimitValidation(t *testing.T) {
	a, _ := newLimitedAuth(t, RateLimit{})
	neg, huge, zeroBurst := -1.0, 1e9, 0
	for _, o := range []KeyOption{KeyRateLimit(&neg, nil), KeyRateLimit(&huge, nil), KeyRateLimit(nil, &zeroBurst)} {
		if _, err := a.CreateKey(context.Background(), "acme", "bad", false, o); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("bad rate limit accepted: %v", err)
		}
	}
}
