package network

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// budgetManager is a Manager with just what saving download counts needs:
// a state dir and a flusher whose ticker never fires during the test
// (only kicks and the final flush save).
func budgetManager(t *testing.T, limit int64) *Manager {
	t.Helper()
	m := &Manager{
		cfg: Config{MaxDownloadBytes: limit}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		sbxDir: t.TempDir(), sbx: map[string]*Attachment{},
	}
	m.startBudgetFlusher(time.Hour)
	t.Cleanup(m.stopBudgetFlusher)
	return m
}

func (m *Manager) addBudgetAttachment(id string) *Attachment {
	a := &Attachment{m: m, id: id}
	a.budget = m.newBudget(m.cfg.MaxDownloadBytes, 0)
	m.mu.Lock()
	m.sbx[id] = a
	m.mu.Unlock()
	return a
}

func savedCount(t *testing.T, a *Attachment) (int64, bool) {
	t.Helper()
	b, err := os.ReadFile(a.budgetPath())
	if os.IsNotExist(err) {
		return 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	var bf budgetFile
	if err := json.Unmarshal(b, &bf); err != nil {
		t.Fatalf("budget file %q: %v", b, err)
	}
	return bf.Used, true
}

// TestBudgetSavedOnStep: a count that grows by budgetFlushStep is saved
// at once, without waiting for the (here: hour-long) interval; a small
// change waits for the next save, and the final flush at stop saves it.
func TestBudgetSavedOnStep(t *testing.T) {
	m := budgetManager(t, 0)
	a := m.addBudgetAttachment("sbx_step")
	w := a.budget.Writer(io.Discard)
	if _, err := w.Write(make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	if _, ok := savedCount(t, a); ok {
		t.Fatal("a small count was saved before any step or interval")
	}
	if _, err := w.Write(make([]byte, budgetFlushStep)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if n, ok := savedCount(t, a); ok && n == budgetFlushStep+1000 {
			break
		}
		if time.Now().After(deadline) {
			n, _ := savedCount(t, a)
			t.Fatalf("saved count %d after crossing a step, want %d", n, budgetFlushStep+1000)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := w.Write(make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	m.stopBudgetFlusher()
	if n, _ := savedCount(t, a); n != budgetFlushStep+1010 {
		t.Fatalf("saved count %d after the final flush, want %d", n, budgetFlushStep+1010)
	}
}

// TestRestoreBudget: what a previous daemon saved is what the sandbox has
// used; a missing or unreadable file counts from zero.
func TestRestoreBudget(t *testing.T) {
	tests := []struct {
		name  string
		file  string // "" for none
		limit int64
		want  int64
		full  bool
	}{
		{"Saved", `{"used":1234}`, 10000, 1234, false},
		{"SavedOverCap", `{"used":20000}`, 10000, 20000, true},
		{"NoFile", "", 10000, 0, false},
		{"Garbage", `{"used":`, 10000, 0, false},
		{"NegativeIsZero", `{"used":-7}`, 10000, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := budgetManager(t, tc.limit)
			a := &Attachment{m: m, id: "sbx_r"}
			if tc.file != "" {
				if err := os.WriteFile(a.budgetPath(), []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			a.restoreBudget()
			if a.budget.Used() != tc.want || a.budget.Limit() != tc.limit || a.budget.Exhausted() != tc.full {
				t.Fatalf("restored used %d limit %d exhausted %v, want %d %d %v",
					a.budget.Used(), a.budget.Limit(), a.budget.Exhausted(), tc.want, tc.limit, tc.full)
			}
			// Restoring is not a change: nothing is rewritten.
			before, _ := os.ReadFile(a.budgetPath())
			a.mu.Lock()
			err := a.saveBudgetLocked()
			a.mu.Unlock()
			after, _ := os.ReadFile(a.budgetPath())
			if err != nil || !bytes.Equal(before, after) {
				t.Fatalf("save after restore: %v, %q -> %q", err, before, after)
			}
		})
	}
}

// TestBudgetNotSavedAfterTeardown: a torn-down sandbox's count is never
// written again (its file would outlive it).
func TestBudgetNotSavedAfterTeardown(t *testing.T) {
	m := budgetManager(t, 0)
	a := m.addBudgetAttachment("sbx_gone")
	a.budget.Writer(io.Discard).Write(make([]byte, 10))
	a.mu.Lock()
	a.gone = true
	err := a.saveBudgetLocked()
	a.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(m.sbxDir, "sbx_gone.budget")); !os.IsNotExist(err) {
		t.Fatalf("budget file of a torn-down sandbox: %v", err)
	}
}
