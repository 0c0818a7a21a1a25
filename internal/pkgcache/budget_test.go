package pkgcache

import (
	"bytes"
	"errors"
	"sync/atomic"
	"testing"
)

// TestBudgetRestored: a budget made with what was already used refuses
// what a fresh one of the same limit would still let through.
func TestBudgetRestored(t *testing.T) {
	tests := []struct {
		name      string
		limit     int64
		used      int64
		write     int
		wantN     int
		wantCap   bool
		wantUsed  int64
		exhausted bool
	}{
		{"FreshFits", 100, 0, 60, 60, false, 60, false},
		{"RestoredCutsAtCap", 100, 70, 60, 30, true, 100, true},
		{"RestoredAlreadyExhausted", 100, 100, 10, 0, true, 100, true},
		{"RestoredNoCapCountsOn", 0, 500, 10, 10, false, 510, false},
		{"NegativeUsedIsZero", 100, -5, 10, 10, false, 10, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBudgetWith(BudgetConfig{Limit: tc.limit, Used: tc.used})
			var out bytes.Buffer
			n, err := b.Writer(&out).Write(make([]byte, tc.write))
			if n != tc.wantN || out.Len() != tc.wantN {
				t.Fatalf("wrote %d (%d through), want %d", n, out.Len(), tc.wantN)
			}
			if got := errors.Is(err, ErrCapExceeded); got != tc.wantCap {
				t.Fatalf("err %v, want cap exceeded %v", err, tc.wantCap)
			}
			if b.Used() != tc.wantUsed || b.Exhausted() != tc.exhausted {
				t.Fatalf("used %d exhausted %v, want %d %v", b.Used(), b.Exhausted(), tc.wantUsed, tc.exhausted)
			}
		})
	}
}

// TestBudgetOnStep: OnStep is told each time the count crosses a multiple
// of Step (once per crossing, however many steps one write spans), and
// never otherwise.
func TestBudgetOnStep(t *testing.T) {
	var calls atomic.Int32
	b := NewBudgetWith(BudgetConfig{Used: 5, Step: 10, OnStep: func() { calls.Add(1) }})
	w := b.Writer(&bytes.Buffer{})
	steps := []struct {
		write int
		want  int32
	}{
		{4, 0},  // 9
		{1, 1},  // 10: crossed
		{9, 1},  // 19
		{25, 2}, // 44: one call for 20, 30 and 40
		{0, 2},
		{6, 3}, // 50
	}
	for i, s := range steps {
		if _, err := w.Write(make([]byte, s.write)); err != nil {
			t.Fatal(err)
		}
		if got := calls.Load(); got != s.want {
			t.Fatalf("step %d (used %d): %d calls, want %d", i, b.Used(), got, s.want)
		}
	}
	// Without a step nothing is called.
	nb := NewBudgetWith(BudgetConfig{OnStep: func() { t.Fatal("called without a step") }})
	nb.Writer(&bytes.Buffer{}).Write(make([]byte, 100))
}
