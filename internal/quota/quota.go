// Package quota provides tenancy's rate limiters: token buckets per API key and sliding one-minute windows of exec starts per tenant, both bounded in memory.
//
// Neither keeps a goroutine: idle entries are swept on the calls themselves,
// at most once per sweep interval, so a limiter holds state only for keys
// that were used recently.
package quota

import (
	"math"
	"sync"
	"time"
)

// sweepEvery is how often idle entries are looked for. A minute keeps the
// sweep's cost (one pass over the map) negligible beside the calls, while
// idle entries live at most about a minute longer than they must.
const sweepEvery = time.Minute

// Buckets are token buckets keyed by a string (an API key id). Each call
// names the bucket's rate and burst, so a changed limit applies at once.
// A bucket that has refilled completely is the same as a new one, so it is
// dropped: memory follows the keys in use, not every key ever seen.
type Buckets struct {
	now func() time.Time

	mu        sync.Mutex
	m         map[string]*bucket
	lastSweep time.Time
}

type bucket struct {
	tokens float64
	last   time.Time
	rate   float64
	burst  float64
}

// NewBuckets returns empty buckets read against clock now (nil: time.Now).
func NewBuckets(now func() time.Time) *Buckets {
	if now == nil {
		now = time.Now
	}
	return &Buckets{now: now, m: map[string]*bucket{}, lastSweep: now()}
}

// Allow takes a token from key's bucket, which holds burst tokens and
// refills at rate per second. It reports whether there was one, how many
// whole tokens are left, and, when there was none, how long until there is.
// A rate of 0 or less means no limit.
func (b *Buckets) Allow(key string, rate float64, burst int) (ok bool, remaining int, retryAfter time.Duration) {
	if rate <= 0 {
		return true, math.MaxInt32, 0
	}
	burst = max(burst, 1)
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sweepLocked(now)
	bk := b.m[key]
	if bk == nil {
		bk = &bucket{tokens: float64(burst), last: now}
		b.m[key] = bk
	}
	bk.rate, bk.burst = rate, float64(burst)
	bk.refill(now)
	bk.tokens = min(bk.tokens, bk.burst) // a lowered burst applies at once
	if bk.tokens >= 1 {
		bk.tokens--
		return true, int(bk.tokens), 0
	}
	wait := time.Duration((1 - bk.tokens) / rate * float64(time.Second))
	return false, 0, max(wait, time.Millisecond)
}

func (bk *bucket) refill(now time.Time) {
	if d := now.Sub(bk.last); d > 0 {
		bk.tokens = min(bk.burst, bk.tokens+d.Seconds()*bk.rate)
		bk.last = now
	}
}

// sweepLocked drops full buckets, at most once per sweepEvery.
func (b *Buckets) sweepLocked(now time.Time) {
	if now.Sub(b.lastSweep) < sweepEvery {
		return
	}
	b.lastSweep = now
	for k, bk := range b.m {
		bk.refill(now)
		if bk.tokens >= bk.burst {
			delete(b.m, k)
		}
	}
}

// Len returns how many buckets are held (tests, metrics).
func (b *Buckets) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.m)
}

// Windows count events per key (a tenant) over a sliding window: at most
// limit events in any span. Each key keeps the times of its events in the
// window, so its memory is bounded by its limit; keys with no event in the
// window are dropped.
type Windows struct {
	now  func() time.Time
	span time.Duration
	base time.Time // times are kept as offsets from it (monotonic)

	mu        sync.Mutex
	m         map[string]*window
	lastSweep time.Time
}

type window struct {
	ts   []time.Duration // event times, oldest first, from ts[head] on
	head int
}

// NewWindows returns sliding windows of span read against clock now (nil:
// time.Now).
func NewWindows(span time.Duration, now func() time.Time) *Windows {
	if now == nil {
		now = time.Now
	}
	t := now()
	return &Windows{now: now, span: span, base: t, m: map[string]*window{}, lastSweep: t}
}

// Allow records an event for key if fewer than limit happened within the
// last span; otherwise it records nothing and says how long until the
// oldest leaves the window. A limit of 0 or less means no limit (and
// nothing is recorded).
func (w *Windows) Allow(key string, limit int64) (ok bool, retryAfter time.Duration) {
	if limit <= 0 {
		return true, 0
	}
	now := w.now().Sub(w.base)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sweepLocked(now)
	win := w.m[key]
	if win == nil {
		win = &window{}
		w.m[key] = win
	}
	win.prune(now - w.span)
	if n := int64(len(win.ts) - win.head); n >= limit {
		// The event that must leave before another fits: the n-limit+1th
		// oldest (more than one when the limit was lowered).
		oldest := win.ts[win.head+int(n-limit)]
		return false, max(oldest+w.span-now, time.Millisecond)
	}
	win.ts = append(win.ts, now)
	return true, 0
}

// Count returns key's events within the last span.
func (w *Windows) Count(key string) int64 {
	now := w.now().Sub(w.base)
	w.mu.Lock()
	defer w.mu.Unlock()
	win := w.m[key]
	if win == nil {
		return 0
	}
	win.prune(now - w.span)
	return int64(len(win.ts) - win.head)
}

// prune forgets events at or before cutoff, compacting now and then so
// that the slice does not keep growing at its end.
func (win *window) prune(cutoff time.Duration) {
	for win.head < len(win.ts) && win.ts[win.head] <= cutoff {
		win.head++
	}
	if win.head == len(win.ts) {
		win.ts, win.head = win.ts[:0], 0
		return
	}
	if win.head > 64 && win.head > len(win.ts)/2 {
		n := copy(win.ts, win.ts[win.head:])
		win.ts, win.head = win.ts[:n], 0
	}
}

// sweepLocked drops keys with no event in the window, at most once per
// sweepEvery.
func (w *Windows) sweepLocked(now time.Duration) {
	if now-w.lastSweep.Sub(w.base) < sweepEvery {
		return
	}
	w.lastSweep = w.base.Add(now)
	for k, win := range w.m {
		win.prune(now - w.span)
		if len(win.ts) == 0 {
			delete(w.m, k)
		}
	}
}

// Len returns how many keys are held (tests, metrics).
func (w *Windows) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.m)
}
