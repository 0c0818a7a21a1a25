package auth

import (
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
)

// Bounds of a key's own rate limit: far above any honest client, low
// enough that the numbers stay meaningful.
const (
	maxRateLimitRPS   = 1000000
	maxRateLimitBurst = 1000000
)

// RateLimit is a request rate: a token bucket of Burst requests, refilled
// at RPS per second. RPS 0 means no limit.
type RateLimit struct {
	RPS   float64
	Burst int
}

// SetDefaultRateLimit sets the rate limit of keys without their own; it
// applies from the next request on.
func (a *Authenticator) SetDefaultRateLimit(l RateLimit) {
	if l.RPS < 0 {
		l.RPS = 0
	}
	if l.RPS > 0 && l.Burst < 1 {
		// A bucket needs room for one request; a burst of a second's
		// worth is what a client that paces itself needs.
		l.Burst = max(1, int(l.RPS))
	}
	a.limits.Store(&l)
}

// DefaultRateLimit returns the rate limit of keys without their own.
func (a *Authenticator) DefaultRateLimit() RateLimit { return *a.limits.Load() }

// limitOf returns key k's effective rate limit: its own fields over the
// default.
func (a *Authenticator) limitOf(k store.Key) RateLimit {
	l := a.DefaultRateLimit()
	if k.RateLimitRPS != nil {
		l.RPS = *k.RateLimitRPS
	}
	if k.RateLimitBurst != nil {
		l.Burst = *k.RateLimitBurst
	}
	if l.RPS > 0 && l.Burst < 1 {
		l.Burst = max(1, int(l.RPS))
	}
	return l
}

// RateLimitError is a request refused because its key is over its rate
// limit. Its class is errdefs.ErrRateLimited.
type RateLimitError struct {
	// Limit is the key's limit.
	Limit RateLimit
	// RetryAfter is how long until the key has a request again.
	RetryAfter time.Duration
}

// Error describes the refusal (safe to show: it names no key).
func (e *RateLimitError) Error() string {
	return fmt.Sprintf("api key is over its rate limit of %g requests per second (burst %d)", e.Limit.RPS, e.Limit.Burst)
}

// Unwrap returns the class.
func (e *RateLimitError) Unwrap() error { return errdefs.ErrRateLimited }

// take takes a token of p's key, or says how long to wait for one.
func (a *Authenticator) take(p Principal) error {
	l := p.RateLimit
	if l.RPS <= 0 {
		return nil
	}
	if ok, _, wait := a.buckets.Allow(p.KeyID, l.RPS, l.Burst); !ok {
		rle := &RateLimitError{Limit: l, RetryAfter: wait}
		return &errdefs.Public{Msg: rle.Error(), RetryAfter: wait, Err: rle}
	}
	return nil
}

// Buckets returns how many keys' rate limit buckets are held (tests: idle
// keys are evicted).
func (a *Authenticator) Buckets() int { return a.buckets.Len() }
