package audit

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// memSink keeps what it is given; gate, when set, holds every insert until
// it is closed; fail makes inserts fail.
type memSink struct {
	mu      sync.Mutex
	batches [][]Event
	gate    chan struct{}
	fail    error
}

func (s *memSink) InsertAuditEvents(ctx context.Context, evs []Event) error {
	if s.gate != nil {
		<-s.gate
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	s.batches = append(s.batches, append([]Event(nil), evs...))
	return nil
}

func (s *memSink) events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Event
	for _, b := range s.batches {
		out = append(out, b...)
	}
	return out
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newRec(t *testing.T, sink Sink, queue int) *Recorder {
	t.Helper()
	r, err := New(Config{Sink: sink, Queue: queue, Batch: 4, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func TestRecordFlushAndBatches(t *testing.T) {
	sink := &memSink{}
	r := newRec(t, sink, 100)
	for i := range 10 {
		r.Record(Event{Type: TypeExec, SandboxID: "sbx_" + strings.Repeat("a", i+1)})
	}
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	evs := sink.events()
	if len(evs) != 10 {
		t.Fatalf("written %d events, want 10", len(evs))
	}
	for i, e := range evs {
		if !strings.HasPrefix(e.ID, "aud_") || len(e.ID) < 20 || e.Time.IsZero() || e.Time.Location() != time.UTC ||
			string(e.Detail) != "{}" || len(e.SandboxID) != i+5 {
			t.Fatalf("event %d: %+v", i, e)
		}
	}
	sink.mu.Lock()
	for _, b := range sink.batches {
		if len(b) > 4 {
			t.Errorf("batch of %d events, limit 4", len(b))
		}
	}
	sink.mu.Unlock()
	if w, d, _ := r.Stats(); w != 10 || d != 0 {
		t.Fatalf("stats written %d dropped %d", w, d)
	}
}

func TestDropsAreCounted(t *testing.T) {
	sink := &memSink{gate: make(chan struct{})}
	r := newRec(t, sink, 2)
	// The writer takes a batch (at most 4) and blocks in the sink; two more
	// fill the queue; the rest are dropped, never blocking the caller.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 20 {
			r.Record(Event{Type: TypeEgress})
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Record blocked on a full queue")
	}
	close(sink.gate)
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	w, d, _ := r.Stats()
	if w+d != 20 || d < 20-4-2 || len(sink.events()) != int(w) {
		t.Fatalf("written %d, dropped %d, sink has %d", w, d, len(sink.events()))
	}
}

func TestFailedWritesAreCountedAsDropped(t *testing.T) {
	sink := &memSink{fail: errors.New("disk full")}
	r := newRec(t, sink, 10)
	r.Record(Event{Type: TypeCreate})
	r.Record(Event{Type: TypeDelete})
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if w, d, _ := r.Stats(); w != 0 || d != 2 {
		t.Fatalf("written %d dropped %d, want 0 and 2", w, d)
	}
}

func TestCloseWritesQueuedAndDropsLater(t *testing.T) {
	sink := &memSink{}
	r, err := New(Config{Sink: sink, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		r.Record(Event{Type: TypeExec})
	}
	r.Close()
	if n := len(sink.events()); n != 50 {
		t.Fatalf("close wrote %d of 50 queued events", n)
	}
	r.Record(Event{Type: TypeExec})
	if _, d, _ := r.Stats(); d != 1 {
		t.Fatalf("an event after close was not counted as dropped (%d)", d)
	}
	if err := r.Flush(context.Background()); err != nil {
		t.Fatalf("flush after close: %v", err)
	}
	r.Close() // idempotent
}

func TestRecordDetailRedacts(t *testing.T) {
	sink := &memSink{}
	r := newRec(t, sink, 10)
	mask := func(s string) string { return strings.ReplaceAll(s, "hunter2", "*******") }
	detail := map[string]any{
		"argv":  []string{"curl", "-H", "token: hunter2"},
		"inner": map[string]any{"domain": "hunter2.evil.test", "port": 443},
		"n":     7,
	}
	r.RecordDetail(Event{Type: TypeExec}, detail, mask)
	// Raw JSON with a redactor is redacted too.
	r.RecordDetail(Event{Type: TypeEgress}, json.RawMessage(`{"domain":"x.hunter2.test"}`), mask)
	r.RecordDetail(Event{Type: TypeCreate}, struct {
		A string `json:"a"`
	}{"hunter2"}, nil)
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	evs := sink.events()
	if len(evs) != 3 {
		t.Fatalf("%d events", len(evs))
	}
	if s := string(evs[0].Detail); strings.Contains(s, "hunter2") || !strings.Contains(s, `"token: *******"`) ||
		!strings.Contains(s, `"*******.evil.test"`) || !strings.Contains(s, `"port":443`) || !strings.Contains(s, `"n":7`) {
		t.Fatalf("detail %s", s)
	}
	if s := string(evs[1].Detail); s != `{"domain":"x.*******.test"}` {
		t.Fatalf("raw detail %s", s)
	}
	if s := string(evs[2].Detail); s != `{"a":"hunter2"}` {
		t.Fatalf("detail without redactor %s", s)
	}
}

func TestRequestIDContext(t *testing.T) {
	ctx := context.Background()
	if RequestID(ctx) != "" {
		t.Fatal("request id from an empty context")
	}
	if got := RequestID(WithRequestID(ctx, "req_1")); got != "req_1" {
		t.Fatalf("got %q", got)
	}
}

func TestNilRecorderIsANoop(t *testing.T) {
	var r *Recorder
	r.Record(Event{Type: TypeExec})
	r.RecordDetail(Event{Type: TypeExec}, map[string]int{}, nil)
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}
