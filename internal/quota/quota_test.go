package quota

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *fakeClock { return &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestBucketsAllow(t *testing.T) {
	tests := []struct {
		name  string
		rate  float64
		burst int
		// steps: advance, then expect ok (and, when refused, the wait).
		steps []struct {
			advance time.Duration
			ok      bool
			retry   time.Duration
		}
	}{
		{name: "burst-then-refill", rate: 2, burst: 3, steps: []struct {
			advance time.Duration
			ok      bool
			retry   time.Duration
		}{
			{0, true, 0}, {0, true, 0}, {0, true, 0},
			{0, false, 500 * time.Millisecond},
			{250 * time.Millisecond, false, 250 * time.Millisecond},
			{250 * time.Millisecond, true, 0},
			{0, false, 500 * time.Millisecond},
			// A long idle refills only up to the burst.
			{time.Hour, true, 0}, {0, true, 0}, {0, true, 0}, {0, false, 500 * time.Millisecond},
		}},
		{name: "no-limit", rate: 0, burst: 0, steps: []struct {
			advance time.Duration
			ok      bool
			retry   time.Duration
		}{{0, true, 0}, {0, true, 0}, {0, true, 0}, {0, true, 0}}},
		{name: "slow-rate", rate: 0.1, burst: 1, steps: []struct {
			advance time.Duration
			ok      bool
			retry   time.Duration
		}{{0, true, 0}, {0, false, 10 * time.Second}, {9 * time.Second, false, time.Second}, {time.Second, true, 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			b := NewBuckets(c.Now)
			for i, s := range tt.steps {
				c.Advance(s.advance)
				ok, _, retry := b.Allow("key_a", tt.rate, tt.burst)
				if ok != s.ok || (!ok && absDiff(retry, s.retry) > time.Millisecond) {
					t.Fatalf("step %d: ok %v retry %v, want %v %v", i, ok, retry, s.ok, s.retry)
				}
			}
		})
	}
}

func TestBucketsAreIndependentAndFollowLimitChanges(t *testing.T) {
	c := newClock()
	b := NewBuckets(c.Now)
	if ok, _, _ := b.Allow("a", 1, 1); !ok {
		t.Fatal("first call of a refused")
	}
	if ok, _, _ := b.Allow("a", 1, 1); ok {
		t.Fatal("a's empty bucket allowed")
	}
	if ok, _, _ := b.Allow("b", 1, 1); !ok {
		t.Fatal("b suffers from a's bucket")
	}
	// The burst lowered below the tokens held: the bucket shrinks at once.
	for range 5 {
		b.Allow("c", 1, 10)
	}
	if _, left, _ := b.Allow("c", 1, 2); left != 1 {
		t.Fatalf("tokens after lowering the burst: %d, want 1", left)
	}
}

// TestBucketsEvictIdleKeys: memory follows the keys in use.
func TestBucketsEvictIdleKeys(t *testing.T) {
	c := newClock()
	b := NewBuckets(c.Now)
	for i := range 10000 {
		b.Allow(fmt.Sprintf("key_%d", i), 10, 20)
	}
	if n := b.Len(); n != 10000 {
		t.Fatalf("held %d buckets, want 10000", n)
	}
	// Half a second later, none has refilled: nothing may go yet.
	c.Advance(sweepEvery / 2)
	b.Allow("key_0", 10, 20)
	if n := b.Len(); n != 10000 {
		t.Fatalf("held %d buckets before the sweep, want 10000", n)
	}
	c.Advance(sweepEvery)
	b.Allow("key_fresh", 10, 20)
	if n := b.Len(); n != 1 {
		t.Fatalf("held %d buckets after the idle ones refilled, want 1", n)
	}
	// An evicted bucket comes back full, which is what it would have been.
	for i := range 20 {
		if ok, _, _ := b.Allow("key_7", 10, 20); !ok {
			t.Fatalf("call %d of an evicted key refused", i)
		}
	}
	if ok, _, _ := b.Allow("key_7", 10, 20); ok {
		t.Fatal("evicted key got more than its burst")
	}
}

func TestWindowsAllow(t *testing.T) {
	c := newClock()
	w := NewWindows(time.Minute, c.Now)
	// 3 per minute, spread over 30 s.
	for i := range 3 {
		if ok, _ := w.Allow("acme", 3); !ok {
			t.Fatalf("event %d refused", i)
		}
		c.Advance(10 * time.Second)
	}
	// t=30s: the first event (t=0) leaves at t=60s.
	ok, retry := w.Allow("acme", 3)
	if ok || retry != 30*time.Second {
		t.Fatalf("4th event: ok %v retry %v, want refused for 30s", ok, retry)
	}
	if n := w.Count("acme"); n != 3 {
		t.Fatalf("count %d, want 3 (a refused event is not counted)", n)
	}
	if ok, _ := w.Allow("other", 3); !ok {
		t.Fatal("another tenant suffers from acme's window")
	}
	c.Advance(30 * time.Second) // t=60s: the first is out, exactly
	if ok, _ := w.Allow("acme", 3); !ok {
		t.Fatal("refused once the oldest left the window")
	}
	// A limit lowered under the count: wait for enough to leave, not one.
	ok, retry = w.Allow("acme", 2)
	if ok || retry != 20*time.Second { // events at 10, 20, 60: the one at 20 must go too
		t.Fatalf("lowered limit: ok %v retry %v, want refused for 20s", ok, retry)
	}
	if ok, _ := w.Allow("acme", 0); !ok {
		t.Fatal("limit 0 (none) refused")
	}
}

func TestWindowsEvictIdleKeys(t *testing.T) {
	c := newClock()
	w := NewWindows(time.Minute, c.Now)
	for i := range 1000 {
		w.Allow(fmt.Sprintf("t%d", i), 100)
	}
	c.Advance(2 * time.Minute)
	w.Allow("busy", 100)
	if n := w.Len(); n != 1 {
		t.Fatalf("held %d windows, want 1", n)
	}
	if n := w.Count("t5"); n != 0 {
		t.Fatalf("count of an evicted tenant %d", n)
	}
}

// TestWindowsMemoryBounded: however many events are tried, one key keeps
// at most its limit of time stamps.
func TestWindowsMemoryBounded(t *testing.T) {
	c := newClock()
	w := NewWindows(time.Minute, c.Now)
	for range 100000 {
		w.Allow("acme", 50)
		c.Advance(10 * time.Millisecond)
	}
	w.mu.Lock()
	n := cap(w.m["acme"].ts)
	w.mu.Unlock()
	if n > 4*50+128 {
		t.Fatalf("window kept capacity %d for a limit of 50", n)
	}
}

func TestConcurrentUse(t *testing.T) {
	b := NewBuckets(nil)
	w := NewWindows(time.Minute, nil)
	var wg sync.WaitGroup
	var allowed [8]int
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				b.Allow("k", 0.001, 100)
				if ok, _ := w.Allow("t", 500); ok {
					allowed[g]++
				}
			}
		}()
	}
	wg.Wait()
	total := 0
	for _, n := range allowed {
		total += n
	}
	if total != 500 {
		t.Fatalf("%d events allowed under a limit of 500", total)
	}
}

func absDiff(a, b time.Duration) time.Duration {
	if a > b {
		return a - b
	}
	return b - a
}
