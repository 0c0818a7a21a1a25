package pkgcache

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"
)

// ErrCapExceeded is returned when a sandbox's download cap is used up.
var ErrCapExceeded = errors.New("download cap exceeded")

// Budget is one sandbox's download cap: the bytes it received through the
// package cache and the egress proxy, and the most it may. It is safe for
// concurrent use; a nil Budget counts nothing and never refuses.
type Budget struct {
	limit  int64 // 0: no cap
	used   atomic.Int64
	step   int64  // 0: no onStep
	onStep func() // see BudgetConfig.OnStep
}

// NewBudget returns a budget of limit bytes; 0 or less means no cap.
func NewBudget(limit int64) *Budget {
	return NewBudgetWith(BudgetConfig{Limit: limit})
}

// BudgetConfig configures NewBudgetWith.
type BudgetConfig struct {
	// Limit is the cap in bytes; 0 or less means no cap.
	Limit int64
	// Used is what was counted already, e.g. restored after a daemon
	// restart so that the cap is not granted afresh.
	Used int64
	// OnStep, when set with Step > 0, is called each time the count
	// crosses a multiple of Step, so that the owner can persist it without
	// waiting for its next periodic save. It runs on the goroutine that
	// counted and must not block.
	OnStep func()
	Step   int64
}

// NewBudgetWith returns a budget configured by c.
func NewBudgetWith(c BudgetConfig) *Budget {
	b := &Budget{limit: max(c.Limit, 0)}
	b.used.Store(max(c.Used, 0))
	if c.OnStep != nil && c.Step > 0 {
		b.step, b.onStep = c.Step, c.OnStep
	}
	return b
}

// Limit is the cap in bytes, 0 for none.
func (b *Budget) Limit() int64 {
	if b == nil {
		return 0
	}
	return b.limit
}

// Used is the bytes counted so far.
func (b *Budget) Used() int64 {
	if b == nil {
		return 0
	}
	return b.used.Load()
}

// Exhausted reports whether nothing more may be received.
func (b *Budget) Exhausted() bool {
	return b != nil && b.limit > 0 && b.used.Load() >= b.limit
}

// Fits reports whether n more bytes stay within the cap.
func (b *Budget) Fits(n int64) bool {
	return b == nil || b.limit == 0 || b.used.Load()+n <= b.limit
}

// Writer wraps w so that every byte written is counted against b; a write
// that would cross the cap writes what still fits and fails with an error
// wrapping ErrCapExceeded.
func (b *Budget) Writer(w io.Writer) io.Writer {
	if b == nil {
		return w
	}
	return &budgetWriter{b: b, w: w}
}

type budgetWriter struct {
	b *Budget
	w io.Writer
}

func (bw *budgetWriter) Write(p []byte) (int, error) {
	b := bw.b
	if b.limit > 0 {
		left := b.limit - b.used.Load()
		if left <= 0 {
			return 0, bw.capErr()
		}
		if int64(len(p)) > left {
			n, err := bw.w.Write(p[:left])
			b.add(int64(n))
			if err != nil {
				return n, err
			}
			return n, bw.capErr()
		}
	}
	n, err := bw.w.Write(p)
	b.add(int64(n))
	return n, err
}

// add counts n bytes and tells onStep when that crossed a step.
func (b *Budget) add(n int64) {
	if n <= 0 {
		return
	}
	now := b.used.Add(n)
	if b.onStep != nil && (now-n)/b.step != now/b.step {
		b.onStep()
	}
}

func (bw *budgetWriter) capErr() error {
	return fmt.Errorf("%w (%d MiB)", ErrCapExceeded, bw.b.limit>>20)
}
