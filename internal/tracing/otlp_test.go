package tracing

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
)

// collector keeps the request bodies POSTed to it (gunzipped) and answers
// with the statuses in answers, then 200.
type collector struct {
	mu      sync.Mutex
	bodies  [][]byte
	headers []http.Header
	answers []int
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var rd io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rd = zr
	}
	b, err := io.ReadAll(rd)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	c.bodies = append(c.bodies, b)
	c.headers = append(c.headers, r.Header.Clone())
	status := http.StatusOK
	if len(c.answers) > 0 {
		status, c.answers = c.answers[0], c.answers[1:]
	}
	c.mu.Unlock()
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "0")
	}
	w.WriteHeader(status)
}

func (c *collector) last(t *testing.T) ([]byte, http.Header) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.bodies) == 0 {
		t.Fatal("the collector got nothing")
	}
	return c.bodies[len(c.bodies)-1], c.headers[len(c.headers)-1]
}

// testSpans are spans with everything OTLP carries: two resources (one with
// a schema URL), two scopes (with version, schema URL, attributes) under one
// of them, every attribute type, events, links to a remote span, a remote
// parent, trace state, every status and kind, dropped counts.
func testSpans(t *testing.T) []sdktrace.ReadOnlySpan {
	t.Helper()
	tid := trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	ts, err := trace.ParseTraceState("vendor=value,other=x")
	if err != nil {
		t.Fatal(err)
	}
	sc := func(sid byte, remote bool) trace.SpanContext {
		return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{sid, 0, 0, 0, 0, 0, 0, 1},
			TraceFlags: trace.FlagsSampled, TraceState: ts, Remote: remote})
	}
	start := time.Unix(1_700_000_000, 123456789)
	res1 := resource.NewSchemaless(attribute.String("service.name", "airlock"), attribute.String("service.version", "v1"))
	res2 := resource.NewWithAttributes("https://opentelemetry.io/schemas/1.26.0", attribute.String("service.name", "other"))
	scope1 := instrumentation.Scope{Name: "airlock"}
	scope2 := instrumentation.Scope{Name: "airlock/other", Version: "v2", SchemaURL: "https://example.com/s",
		Attributes: attribute.NewSet(attribute.Bool("scoped", true))}
	all := []attribute.KeyValue{
		attribute.String("s", "str"), attribute.String("empty", ""), attribute.Bool("b", true), attribute.Bool("f", false),
		attribute.Int64("i", -42), attribute.Int64("zero", 0), attribute.Float64("d", 3.25), attribute.Float64("dz", 0),
		attribute.StringSlice("ss", []string{"a", "", "c"}), attribute.BoolSlice("bs", []bool{true, false}),
		attribute.Int64Slice("is", []int64{1, 0, -1}), attribute.Float64Slice("ds", []float64{0.5, 0}),
		attribute.StringSlice("none", nil),
	}
	stubs := tracetest.SpanStubs{
		{
			Name: "POST /v1/sandboxes/{id}/exec", SpanContext: sc(1, false), Parent: sc(9, true),
			SpanKind: trace.SpanKindServer, StartTime: start, EndTime: start.Add(3 * time.Millisecond),
			Attributes: all, DroppedAttributes: 2,
			Events: []sdktrace.Event{
				{Name: "exception", Time: start.Add(time.Millisecond), Attributes: []attribute.KeyValue{attribute.String("exception.message", "boom")}, DroppedAttributeCount: 1},
				{Name: "bare", Time: start.Add(2 * time.Millisecond)},
			},
			DroppedEvents: 3,
			Links: []sdktrace.Link{
				{SpanContext: sc(7, true), Attributes: []attribute.KeyValue{attribute.Int("n", 1)}, DroppedAttributeCount: 4},
				{SpanContext: sc(8, false)},
			},
			DroppedLinks: 5,
			Status:       sdktrace.Status{Code: codes.Error, Description: "sandbox crashed"},
			Resource:     res1, InstrumentationScope: scope1,
		},
		{
			Name: "manager.exec", SpanContext: sc(2, false), Parent: sc(1, false), SpanKind: trace.SpanKindInternal,
			StartTime: start, EndTime: start.Add(time.Millisecond), Status: sdktrace.Status{Code: codes.Ok},
			Resource: res1, InstrumentationScope: scope1,
		},
		{
			Name: "client", SpanContext: sc(3, false), SpanKind: trace.SpanKindClient, StartTime: start, EndTime: start,
			Resource: res1, InstrumentationScope: scope2,
		},
		{Name: "producer", SpanContext: sc(4, false), SpanKind: trace.SpanKindProducer, Resource: res2, InstrumentationScope: scope2},
		{Name: "consumer", SpanContext: sc(5, false), SpanKind: trace.SpanKindConsumer, Resource: res2},
		{Name: "unspecified", SpanContext: sc(6, false), Resource: res2, InstrumentationScope: scope1},
	}
	return stubs.Snapshots()
}

// decode parses an ExportTraceServiceRequest and orders its resource spans
// (otlptrace's come out of a map, in any order).
func decode(t *testing.T, b []byte) *coltracepb.ExportTraceServiceRequest {
	t.Helper()
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		t.Fatalf("not an ExportTraceServiceRequest: %v", err)
	}
	key := func(i int) string { return prototext.Format(req.ResourceSpans[i].GetResource()) }
	sort.Slice(req.ResourceSpans, func(i, j int) bool { return key(i) < key(j) })
	return &req
}

// TestExporterMatchesOTLPTraceHTTP sends the same spans through this
// package's exporter and through OpenTelemetry's otlptracehttp, and
// requires the two requests to decode to the same message.
func TestExporterMatchesOTLPTraceHTTP(t *testing.T) {
	spans := testSpans(t)

	ours := &collector{}
	srv1 := httptest.NewServer(ours)
	defer srv1.Close()
	u, _ := url.Parse(srv1.URL + "/v1/traces")
	exp, err := newExporter(u, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if err := exp.ExportSpans(t.Context(), spans); err != nil {
		t.Fatal(err)
	}
	if err := exp.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	body, hdr := ours.last(t)
	if ct := hdr.Get("Content-Type"); ct != "application/x-protobuf" {
		t.Errorf("Content-Type = %q", ct)
	}

	theirs := &collector{}
	srv2 := httptest.NewServer(theirs)
	defer srv2.Close()
	ref, err := otlptracehttp.New(t.Context(), otlptracehttp.WithEndpointURL(srv2.URL+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	if err := ref.ExportSpans(t.Context(), spans); err != nil {
		t.Fatal(err)
	}
	if err := ref.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	refBody, _ := theirs.last(t)

	got, want := decode(t, body), decode(t, refBody)
	if len(want.ResourceSpans) != 2 {
		t.Fatalf("otlptracehttp sent %d resource spans, want 2", len(want.ResourceSpans))
	}
	if !proto.Equal(got, want) {
		t.Errorf("our request differs from otlptracehttp's:\nours:\n%s\notlptracehttp:\n%s",
			prototext.Format(got), prototext.Format(want))
	}
}

func TestExporterEnvironment(t *testing.T) {
	c := &collector{}
	srv := httptest.NewServer(c)
	defer srv.Close()
	u, _ := url.Parse(srv.URL + "/v1/traces")
	env := map[string]string{
		"OTEL_EXPORTER_OTLP_HEADERS":        "authorization=Bearer%20tok,x-general=1",
		"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-traces=2",
		"OTEL_EXPORTER_OTLP_COMPRESSION":    "gzip",
		"OTEL_EXPORTER_OTLP_TIMEOUT":        "2500",
	}
	exp, err := newExporter(u, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if exp.timeout != 2500*time.Millisecond {
		t.Errorf("timeout = %v", exp.timeout)
	}
	spans := testSpans(t)
	if err := exp.ExportSpans(t.Context(), spans); err != nil {
		t.Fatal(err)
	}
	body, hdr := c.last(t)
	// The traces-specific variable wins over the general one, whole.
	if hdr.Get("X-Traces") != "2" || hdr.Get("X-General") != "" || hdr.Get("Authorization") != "" {
		t.Errorf("headers = %v", hdr)
	}
	if hdr.Get("Content-Encoding") != "gzip" {
		t.Errorf("Content-Encoding = %q", hdr.Get("Content-Encoding"))
	}
	if !bytes.Equal(body, encodeRequest(spans)) {
		t.Error("the gzipped body does not decompress to the request")
	}

	delete(env, "OTEL_EXPORTER_OTLP_TRACES_HEADERS")
	if exp, err = newExporter(u, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if exp.header.Get("Authorization") != "Bearer tok" || exp.header.Get("X-General") != "1" {
		t.Errorf("headers = %v", exp.header)
	}

	for _, bad := range []map[string]string{
		{"OTEL_EXPORTER_OTLP_HEADERS": "novalue"},
		{"OTEL_EXPORTER_OTLP_TIMEOUT": "10s"},
		{"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"},
	} {
		if _, err := newExporter(u, func(k string) string { return bad[k] }); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func TestExporterRetries(t *testing.T) {
	c := &collector{answers: []int{http.StatusServiceUnavailable, http.StatusTooManyRequests, http.StatusOK}}
	srv := httptest.NewServer(c)
	defer srv.Close()
	u, _ := url.Parse(srv.URL + "/v1/traces")
	exp, err := newExporter(u, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	exp.retryFirst, exp.retryMax = time.Millisecond, 2*time.Millisecond
	if err := exp.ExportSpans(t.Context(), testSpans(t)); err != nil {
		t.Fatalf("after two retryable answers: %v", err)
	}
	if n := len(c.bodies); n != 3 {
		t.Errorf("%d attempts, want 3", n)
	}

	// A refusal is not retried; its status and body excerpt are the error.
	var calls atomic.Int32
	srv2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		http.Error(w, "bad span\nmore", http.StatusBadRequest)
	}))
	defer srv2.Close()
	u2, _ := url.Parse(srv2.URL + "/v1/traces")
	exp2, _ := newExporter(u2, func(string) string { return "" })
	err = exp2.ExportSpans(t.Context(), testSpans(t))
	if err == nil || !strings.Contains(err.Error(), "400") || !strings.Contains(err.Error(), "bad span") || strings.Contains(err.Error(), "more") {
		t.Errorf("err = %v", err)
	}
	if calls.Load() != 1 {
		t.Errorf("%d attempts at a 400, want 1", calls.Load())
	}

	// Retries stop when the context ends.
	always := &collector{answers: []int{503, 503, 503, 503, 503, 503, 503, 503}}
	srv3 := httptest.NewServer(always)
	defer srv3.Close()
	u3, _ := url.Parse(srv3.URL + "/v1/traces")
	exp3, _ := newExporter(u3, func(string) string { return "" })
	exp3.retryFirst = time.Hour
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := exp3.ExportSpans(ctx, testSpans(t)); err == nil {
		t.Error("an export retried past its context did not fail")
	}
	// …and when the next wait would pass retryFor.
	exp3.retryFirst, exp3.retryFor = time.Second, 10*time.Millisecond
	if err := exp3.ExportSpans(t.Context(), testSpans(t)); err == nil || !strings.Contains(err.Error(), "giving up") {
		t.Errorf("err = %v, want giving up", err)
	}
}

func TestPartialSuccess(t *testing.T) {
	resp := &coltracepb.ExportTraceServiceResponse{PartialSuccess: &coltracepb.ExportTracePartialSuccess{RejectedSpans: 3, ErrorMessage: "too old"}}
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	if n, msg := partialSuccess(b); n != 3 || msg != "too old" {
		t.Errorf("partialSuccess = %d, %q", n, msg)
	}
	if n, msg := partialSuccess(nil); n != 0 || msg != "" {
		t.Errorf("empty response: %d, %q", n, msg)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(b)
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	exp, _ := newExporter(u, func(string) string { return "" })
	if err := exp.ExportSpans(t.Context(), testSpans(t)); err == nil || !strings.Contains(err.Error(), "3 spans rejected: too old") {
		t.Errorf("err = %v", err)
	}
	if errors.Is(err, context.Canceled) {
		t.Error("unexpected cancel")
	}
}
