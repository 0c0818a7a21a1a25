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
	limit int64 // 0: no cap
	used  atomic.Int64
}

// NewBudget returns a budget of limit bytes; 0 or less means no cap.
func NewBudget(limit int64) *Budget {
	if limit < 0 {
		limit = 0
	}
	return &Budget{limit: limit}
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
			b.used.Add(int64(n))
			if err != nil {
				return n, err
			}
			return n, bw.capErr()
		}
	}
	n, err := bw.w.Write(p)
	b.used.Add(int64(n))
	return n, err
}

func (bw *budgetWriter) capErr() error {
	return fmt.Errorf("%w (%d MiB)", ErrCapExceeded, bw.b.limit>>20)
}
