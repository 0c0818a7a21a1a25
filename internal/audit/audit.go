// Package audit records airlock's audit trail: append-only events (sandbox lifecycle, execs, file writes, egress, authentication failures) queued off the hot path and written to the store in batches.
//
// A caller hands an event to Recorder.Record, which never blocks: the event
// goes into a bounded queue, and one writer goroutine inserts whatever has
// queued up in one transaction. When the queue is full the event is dropped
// and counted (Stats, the airlock_audit_events_dropped_total metric) and a
// warning is logged, so a drop is never silent. Details are turned into JSON
// and redacted by the writer, so that the caller pays for neither.
package audit

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlockhq/airlock/api"
)

// Types of Event (the API's constants). Stable strings: add, never rename.
const (
	TypeCreate         = api.AuditCreate         // a sandbox was created (detail: template, runtime, network, ready_ms)
	TypeExec           = api.AuditExec           // a command ended (api.ExecAuditDetail)
	TypeFileWrite      = api.AuditFileWrite      // a file upload, tar upload, mkdir, move or remove (api.FileAuditDetail)
	TypePackageInstall = api.AuditPackageInstall // a package fetched from a registry
	TypeEgress         = api.AuditEgress         // a network decision (api.EgressAuditDetail)
	TypeNetworkUpdate  = api.AuditNetworkUpdate  // a sandbox's egress policy changed
	TypePause          = api.AuditPause
	TypeResume         = api.AuditResume
	TypeSnapshot       = api.AuditSnapshot
	TypeDelete         = api.AuditDelete
	TypeExpiry         = api.AuditExpiry      // a sandbox reached its timeout and was stopped
	TypeAuthFailure    = api.AuditAuthFailure // a request with a missing or invalid api key
	TypeError          = api.AuditError       // a sandbox crashed or failed to start
	TypePreview        = api.AuditPreview     // a preview port exposed, closed or opened (api.PreviewAuditDetail)
	TypeCode           = api.AuditCode        // a code-interpreter cell ran (api.CodeAuditDetail)
)

// Types lists every event type, for validation and docs.
var Types = []string{
	TypeCreate, TypeExec, TypeFileWrite, TypePackageInstall, TypeEgress, TypeNetworkUpdate,
	TypePause, TypeResume, TypeSnapshot, TypeDelete, TypeExpiry, TypeAuthFailure, TypeError,
	TypePreview, TypeCode,
}

// Event is one audit record.
type Event struct {
	// ID is aud_ followed by random characters; Record assigns it.
	ID string
	// Seq orders the trail: the store assigns it, increasing in the order
	// events were written. Cursors are positions in it.
	Seq  int64
	Time time.Time
	Type string
	// Tenant is empty for an authentication failure of an unknown key
	// (only admins see those).
	Tenant    string
	SandboxID string
	Template  string
	RequestID string
	// Detail is a JSON object whose fields depend on Type.
	Detail json.RawMessage
}

// Sink stores events (the store implements it).
type Sink interface {
	// InsertAuditEvents appends evs in one transaction.
	InsertAuditEvents(ctx context.Context, evs []Event) error
}

// Redactor masks secret values in a string, keeping its length.
type Redactor func(string) string

// Defaults of Config.
const (
	// DefaultQueue holds a burst of events (a sandbox's DNS storm) while
	// the writer commits: a few MiB at most.
	DefaultQueue = 8192
	// DefaultBatch bounds one transaction; SQLite inserts a few hundred
	// small rows in about a millisecond.
	DefaultBatch = 512
	// writeTimeout bounds one batch insert: the store's busy timeout is
	// seconds, more means the store is broken.
	writeTimeout = 30 * time.Second
	// dropLogEvery rate-limits the warning about dropped events.
	dropLogEvery = 10 * time.Second
)

// Config configures a Recorder.
type Config struct {
	// Sink receives the events. Required.
	Sink Sink
	// Queue is how many events may wait for the writer; default DefaultQueue.
	Queue int
	// Batch is the most events written in one transaction; default DefaultBatch.
	Batch int
	// Logger logs write failures and drops; default slog.Default().
	Logger *slog.Logger
	// Now is the clock of events recorded without a time; default time.Now.
	Now func() time.Time
}

// item is a queued event, or a flush marker (done set).
type item struct {
	ev     Event
	detail any
	redact Redactor
	done   chan struct{}
}

// Recorder queues events and writes them in batches. Its methods are safe
// for concurrent use.
type Recorder struct {
	cfg Config
	log *slog.Logger
	ch  chan item

	// mu guards closed against sends on ch: Record holds it shared, Close
	// exclusively, so that no send races the channel's close.
	mu     sync.RWMutex
	closed bool
	done   chan struct{}

	written atomic.Uint64
	dropped atomic.Uint64
	lastLog atomic.Int64 // unix nanos of the last drop warning
}

// New starts a Recorder. Close it to write what is queued and stop.
func New(cfg Config) (*Recorder, error) {
	if cfg.Sink == nil {
		return nil, errors.New("audit: sink is required")
	}
	if cfg.Queue <= 0 {
		cfg.Queue = DefaultQueue
	}
	if cfg.Batch <= 0 {
		cfg.Batch = DefaultBatch
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	r := &Recorder{
		cfg: cfg, log: cfg.Logger.With("component", "audit"),
		ch: make(chan item, cfg.Queue), done: make(chan struct{}),
	}
	go r.run()
	return r, nil
}

// Record queues e, whose Detail is already JSON (or empty). It never
// blocks; a full queue drops the event and counts it.
func (r *Recorder) Record(e Event) {
	r.enqueue(item{ev: e})
}

// RecordDetail queues e with detail, a value that becomes e.Detail as JSON
// in the writer, every string in it passed through redact (nil: none)
// first. detail must not be changed after the call.
func (r *Recorder) RecordDetail(e Event, detail any, redact Redactor) {
	r.enqueue(item{ev: e, detail: detail, redact: redact})
}

func (r *Recorder) enqueue(it item) {
	if r == nil {
		return
	}
	if it.ev.ID == "" {
		it.ev.ID = NewID()
	}
	if it.ev.Time.IsZero() {
		it.ev.Time = r.cfg.Now()
	}
	it.ev.Time = it.ev.Time.UTC()
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		r.drop(it.ev, "recorder closed")
		return
	}
	select {
	case r.ch <- it:
	default:
		r.drop(it.ev, "queue full")
	}
}

// drop counts a lost event and warns, at most every dropLogEvery.
func (r *Recorder) drop(e Event, why string) {
	n := r.dropped.Add(1)
	now := time.Now().UnixNano()
	last := r.lastLog.Load()
	if now-last >= int64(dropLogEvery) && r.lastLog.CompareAndSwap(last, now) {
		r.log.Warn("audit events dropped", "why", why, "type", e.Type, "sandbox_id", e.SandboxID, "dropped_total", n)
	}
}

// Flush waits until every event recorded before the call is written (or
// dropped after failing), or ctx is done.
func (r *Recorder) Flush(ctx context.Context) error {
	if r == nil {
		return nil
	}
	done := make(chan struct{})
	r.mu.RLock()
	if r.closed {
		r.mu.RUnlock()
		return nil
	}
	select {
	case r.ch <- item{done: done}:
		r.mu.RUnlock()
	case <-ctx.Done():
		r.mu.RUnlock()
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close writes what is queued and stops the writer. Events recorded after
// it are dropped (and counted).
func (r *Recorder) Close() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.ch)
	}
	r.mu.Unlock()
	<-r.done
	return nil
}

// Stats reports how many events were written and dropped so far, and how
// many wait in the queue.
func (r *Recorder) Stats() (written, dropped uint64, queued int) {
	if r == nil {
		return 0, 0, 0
	}
	return r.written.Load(), r.dropped.Load(), len(r.ch)
}

// run is the writer: it takes what has queued up (at most Batch events)
// and writes it in one transaction.
func (r *Recorder) run() {
	defer close(r.done)
	batch := make([]Event, 0, r.cfg.Batch)
	var flushed []chan struct{}
	for {
		it, ok := <-r.ch
		if !ok {
			return
		}
		batch, flushed = r.add(batch, flushed, it)
	drain:
		for len(batch) < r.cfg.Batch {
			select {
			case it, ok := <-r.ch:
				if !ok {
					r.write(batch)
					release(flushed)
					return
				}
				batch, flushed = r.add(batch, flushed, it)
			default:
				break drain
			}
		}
		r.write(batch)
		release(flushed)
		batch, flushed = batch[:0], flushed[:0]
	}
}

func (r *Recorder) add(batch []Event, flushed []chan struct{}, it item) ([]Event, []chan struct{}) {
	if it.done != nil {
		return batch, append(flushed, it.done)
	}
	e := it.ev
	if it.detail != nil {
		d, err := Detail(it.detail, it.redact)
		if err != nil {
			r.log.Error("encoding audit detail", "type", e.Type, "err", err)
			d = json.RawMessage(`{}`)
		}
		e.Detail = d
	} else if len(e.Detail) > 0 && it.redact != nil {
		if d, err := Detail(e.Detail, it.redact); err == nil {
			e.Detail = d
		}
	}
	if len(e.Detail) == 0 {
		e.Detail = json.RawMessage(`{}`)
	}
	return append(batch, e), flushed
}

func release(chs []chan struct{}) {
	for _, c := range chs {
		close(c)
	}
}

// write inserts batch, retrying once: a failure is logged and the events
// counted as dropped.
func (r *Recorder) write(batch []Event) {
	if len(batch) == 0 {
		return
	}
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
		err = r.cfg.Sink.InsertAuditEvents(ctx, batch)
		cancel()
		if err == nil {
			r.written.Add(uint64(len(batch)))
			return
		}
	}
	r.dropped.Add(uint64(len(batch)))
	r.log.Error("writing audit events failed; events lost", "count", len(batch), "err", err)
}

// NewID returns a new event id: aud_ and 12 random bytes in base32, like
// the other ids of the API. (auth.RandomID cannot be used here: the store,
// which auth depends on, depends on this package.)
func NewID() string {
	b := make([]byte, 12)
	rand.Read(b) // crypto/rand.Read never fails on Linux
	return "aud_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}

// Detail encodes v as a JSON object, passing every string in it (map keys
// excepted) through redact when it is not nil. v may be json.RawMessage.
func Detail(v any, redact Redactor) (json.RawMessage, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding audit detail: %w", err)
	}
	if redact == nil {
		return b, nil
	}
	var tree any
	if err := json.Unmarshal(b, &tree); err != nil {
		return nil, fmt.Errorf("decoding audit detail: %w", err)
	}
	tree = redactTree(tree, redact)
	return json.Marshal(tree)
}

func redactTree(v any, redact Redactor) any {
	switch x := v.(type) {
	case string:
		return redact(x)
	case map[string]any:
		for k, e := range x {
			x[k] = redactTree(e, redact)
		}
	case []any:
		for i, e := range x {
			x[i] = redactTree(e, redact)
		}
	}
	return v
}

type ctxKey struct{}

// WithRequestID returns ctx carrying the API request id that events
// recorded on its behalf are tagged with.
func WithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// RequestID returns the request id ctx carries, "" if none.
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(ctxKey{}).(string)
	return id
}

// ValidType reports whether t is one of Types.
func ValidType(t string) bool {
	for _, x := range Types {
		if x == t {
			return true
		}
	}
	return false
}
