package tracing

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protowire"
)

// exporter sends spans to an OTLP/HTTP collector in the protobuf encoding,
// as otlptracehttp does, without its dependencies: otlptracehttp links
// gRPC, grpc-gateway and the generated OTLP types into the binary, whose
// package initialisation every command of the one airlock binary paid at
// start (the CLI's client commands included). The request is encoded with
// protowire by hand from opentelemetry-proto's field numbers;
// TestExporterMatchesOTLPTraceHTTP checks it against otlptracehttp's.
type exporter struct {
	url     string
	header  http.Header
	gzip    bool
	timeout time.Duration
	hc      *http.Client
	// retryFirst and retryMax bound the waits between attempts, retryFor
	// the whole export (otlptracehttp's defaults: 5 s, 30 s, 1 min).
	retryFirst, retryMax, retryFor time.Duration
	stopped                        atomic.Bool
}

const (
	contentTypeProto = "application/x-protobuf"
	maxResponseBody  = 64 << 10
)

// newExporter returns an exporter for the collector URL u (its path
// included), configured further by the standard OTEL_EXPORTER_OTLP_*
// variables that apply to it: headers, timeout and compression, the
// traces-specific form first.
func newExporter(u *url.URL, getenv func(string) string) (*exporter, error) {
	e := &exporter{
		url: u.String(), header: http.Header{}, timeout: 10 * time.Second,
		hc:         &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()},
		retryFirst: 5 * time.Second, retryMax: 30 * time.Second, retryFor: time.Minute,
	}
	env := func(name string) string {
		if v := getenv("OTEL_EXPORTER_OTLP_TRACES_" + name); v != "" {
			return v
		}
		return getenv("OTEL_EXPORTER_OTLP_" + name)
	}
	if v := env("HEADERS"); v != "" {
		for _, kv := range strings.Split(v, ",") {
			k, val, ok := strings.Cut(kv, "=")
			k, kerr := url.PathUnescape(strings.TrimSpace(k))
			val, verr := url.PathUnescape(strings.TrimSpace(val))
			if !ok || k == "" || kerr != nil || verr != nil {
				return nil, errors.New("OTEL_EXPORTER_OTLP_HEADERS: want key=value,… (URL-encoded)")
			}
			e.header.Set(k, val)
		}
	}
	if v := env("TIMEOUT"); v != "" {
		ms, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return nil, errors.New("OTEL_EXPORTER_OTLP_TIMEOUT: want milliseconds")
		}
		e.timeout = time.Duration(ms) * time.Millisecond
	}
	switch v := env("COMPRESSION"); v {
	case "", "none":
	case "gzip":
		e.gzip = true
	default:
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_COMPRESSION %q: want gzip or none", v)
	}
	return e, nil
}

// ExportSpans implements sdktrace.SpanExporter: one POST of all spans,
// retried on 429, 502, 503 and 504 (after Retry-After when given) with
// exponential backoff until retryFor has passed or ctx is done.
func (e *exporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if e.stopped.Load() || len(spans) == 0 {
		return nil
	}
	body := encodeRequest(spans)
	if e.gzip {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		_, _ = zw.Write(body)
		_ = zw.Close()
		body = b.Bytes()
	}
	deadline := time.Now().Add(e.retryFor)
	wait := e.retryFirst
	for {
		retryAfter, err := e.post(ctx, body)
		var re retryableError
		if err == nil || !errors.As(err, &re) {
			return err
		}
		d := max(wait, retryAfter)
		if time.Now().Add(d).After(deadline) {
			return fmt.Errorf("giving up after %s: %w", e.retryFor, err)
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		case <-time.After(d):
		}
		wait = min(2*wait, e.retryMax)
	}
}

// retryableError is an answer worth asking again.
type retryableError struct{ err error }

func (e retryableError) Error() string { return e.err.Error() }
func (e retryableError) Unwrap() error { return e.err }

// post sends body once. A retryable failure is a retryableError, with the
// server's Retry-After when it sent one.
func (e *exporter) post(ctx context.Context, body []byte) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	for k, v := range e.header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", contentTypeProto)
	req.Header.Set("User-Agent", "airlock OTLP exporter")
	if e.gzip {
		req.Header.Set("Content-Encoding", "gzip")
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) && ue.Temporary() {
			return 0, retryableError{err}
		}
		return 0, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody))
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode <= 299:
		// A partial success (some spans rejected) is reported, not retried.
		if resp.Header.Get("Content-Type") == contentTypeProto {
			if n, msg := partialSuccess(raw); n != 0 || msg != "" {
				return 0, fmt.Errorf("OTLP partial success: %d spans rejected: %s", n, msg)
			}
		}
		return 0, nil
	case resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode == http.StatusBadGateway,
		resp.StatusCode == http.StatusServiceUnavailable, resp.StatusCode == http.StatusGatewayTimeout:
		var after time.Duration
		if s, err := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 32); err == nil && s > 0 {
			after = time.Duration(s) * time.Second
		}
		return after, retryableError{fmt.Errorf("OTLP collector answered %s", resp.Status)}
	default:
		return 0, fmt.Errorf("OTLP collector answered %s: %s", resp.Status, excerpt(raw))
	}
}

// Shutdown implements sdktrace.SpanExporter.
func (e *exporter) Shutdown(context.Context) error {
	e.stopped.Store(true)
	e.hc.CloseIdleConnections()
	return nil
}

// excerpt is the first line of a collector's error body, bounded.
func excerpt(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	if s == "" {
		s = "(empty)"
	}
	return s
}

// partialSuccess reads ExportTraceServiceResponse.partial_success
// (field 1: rejected_spans = 1, error_message = 2).
func partialSuccess(b []byte) (rejected int64, msg string) {
	ps := field(b, 1)
	if ps == nil {
		return 0, ""
	}
	for len(ps) > 0 {
		num, typ, n := protowire.ConsumeTag(ps)
		if n < 0 {
			return rejected, msg
		}
		ps = ps[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(ps)
			if m < 0 {
				return rejected, msg
			}
			rejected, ps = int64(v), ps[m:]
		case num == 2 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(ps)
			if m < 0 {
				return rejected, msg
			}
			msg, ps = string(v), ps[m:]
		default:
			m := protowire.ConsumeFieldValue(num, typ, ps)
			if m < 0 {
				return rejected, msg
			}
			ps = ps[m:]
		}
	}
	return rejected, msg
}

// field returns the contents of the first length-delimited field num of
// the message b, or nil.
func field(b []byte, num protowire.Number) []byte {
	for len(b) > 0 {
		n, typ, m := protowire.ConsumeTag(b)
		if m < 0 {
			return nil
		}
		b = b[m:]
		if n == num && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b)
			return v
		}
		m = protowire.ConsumeFieldValue(n, typ, b)
		if m < 0 {
			return nil
		}
		b = b[m:]
	}
	return nil
}

// The encoding of opentelemetry-proto's ExportTraceServiceRequest
// (collector/trace/v1, trace/v1, common/v1, resource/v1), grouped as
// otlptrace's tracetransform groups: one ResourceSpans per resource, one
// ScopeSpans per instrumentation scope within it, in order of first
// appearance.

// encodeRequest encodes an ExportTraceServiceRequest of spans.
func encodeRequest(spans []sdktrace.ReadOnlySpan) []byte {
	type scopeGroup struct {
		scope instrumentation.Scope
		spans []sdktrace.ReadOnlySpan
	}
	type resourceGroup struct {
		res    *resource.Resource
		scopes []*scopeGroup
	}
	var groups []*resourceGroup
	byRes := map[attribute.Distinct]*resourceGroup{}
	for _, s := range spans {
		if s == nil {
			continue
		}
		k := s.Resource().Equivalent()
		g := byRes[k]
		if g == nil {
			g = &resourceGroup{res: s.Resource()}
			byRes[k] = g
			groups = append(groups, g)
		}
		var sg *scopeGroup
		for _, c := range g.scopes {
			if c.scope == s.InstrumentationScope() {
				sg = c
				break
			}
		}
		if sg == nil {
			sg = &scopeGroup{scope: s.InstrumentationScope()}
			g.scopes = append(g.scopes, sg)
		}
		sg.spans = append(sg.spans, s)
	}
	var req []byte
	for _, g := range groups {
		req = appendMessage(req, 1, func(rs []byte) []byte { // ResourceSpans
			if g.res != nil {
				rs = appendMessage(rs, 1, func(r []byte) []byte { // Resource
					return appendAttrSet(r, 1, g.res.Set())
				})
			}
			for _, sg := range g.scopes {
				rs = appendMessage(rs, 2, func(ss []byte) []byte { // ScopeSpans
					if sg.scope != (instrumentation.Scope{}) {
						ss = appendMessage(ss, 1, func(is []byte) []byte { // InstrumentationScope
							is = appendString(is, 1, sg.scope.Name)
							is = appendString(is, 2, sg.scope.Version)
							return appendAttrSet(is, 3, &sg.scope.Attributes)
						})
					}
					for _, s := range sg.spans {
						ss = appendMessage(ss, 2, func(b []byte) []byte { return appendSpan(b, s) })
					}
					return appendString(ss, 3, sg.scope.SchemaURL)
				})
			}
			if g.res != nil {
				rs = appendString(rs, 3, g.res.SchemaURL())
			}
			return rs
		})
	}
	return req
}

// appendSpan appends the fields of a Span.
func appendSpan(b []byte, s sdktrace.ReadOnlySpan) []byte {
	sc := s.SpanContext()
	tid, sid := sc.TraceID(), sc.SpanID()
	b = appendBytes(b, 1, tid[:])
	b = appendBytes(b, 2, sid[:])
	b = appendString(b, 3, sc.TraceState().String())
	if psid := s.Parent().SpanID(); psid.IsValid() {
		b = appendBytes(b, 4, psid[:])
	}
	b = appendString(b, 5, s.Name())
	b = appendVarint(b, 6, uint64(spanKind(s.SpanKind())))
	b = appendFixed64(b, 7, unixNano(s.StartTime()))
	b = appendFixed64(b, 8, unixNano(s.EndTime()))
	for _, kv := range s.Attributes() {
		b = appendMessage(b, 9, func(m []byte) []byte { return appendKeyValue(m, kv) })
	}
	b = appendVarint(b, 10, clampUint32(s.DroppedAttributes()))
	for _, ev := range s.Events() {
		b = appendMessage(b, 11, func(m []byte) []byte { // Span.Event
			m = appendFixed64(m, 1, unixNano(ev.Time))
			m = appendString(m, 2, ev.Name)
			for _, kv := range ev.Attributes {
				m = appendMessage(m, 3, func(k []byte) []byte { return appendKeyValue(k, kv) })
			}
			return appendVarint(m, 4, clampUint32(ev.DroppedAttributeCount))
		})
	}
	b = appendVarint(b, 12, clampUint32(s.DroppedEvents()))
	for _, l := range s.Links() {
		b = appendMessage(b, 13, func(m []byte) []byte { // Span.Link
			ltid, lsid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
			m = appendBytes(m, 1, ltid[:])
			m = appendBytes(m, 2, lsid[:])
			for _, kv := range l.Attributes {
				m = appendMessage(m, 4, func(k []byte) []byte { return appendKeyValue(k, kv) })
			}
			m = appendVarint(m, 5, clampUint32(l.DroppedAttributeCount))
			return appendFixed32(m, 6, spanFlags(l.SpanContext.TraceFlags(), l.SpanContext))
		})
	}
	b = appendVarint(b, 14, clampUint32(s.DroppedLinks()))
	st := s.Status()
	b = appendMessage(b, 15, func(m []byte) []byte { // Status, always present
		m = appendString(m, 2, st.Description)
		return appendVarint(m, 3, statusCode(st.Code))
	})
	return appendFixed32(b, 16, spanFlags(sc.TraceFlags(), s.Parent()))
}

// spanKind maps a span kind to OTLP's Span.SpanKind (the same numbers, but
// an unknown kind is UNSPECIFIED).
func spanKind(k trace.SpanKind) int {
	if k >= trace.SpanKindInternal && k <= trace.SpanKindConsumer {
		return int(k)
	}
	return 0
}

// statusCode maps a status to OTLP's Status.StatusCode: UNSET 0, OK 1,
// ERROR 2 (codes.Error is 1 and codes.Ok 2 in the API).
func statusCode(c codes.Code) uint64 {
	switch c {
	case codes.Ok:
		return 1
	case codes.Error:
		return 2
	}
	return 0
}

// spanFlags are the W3C trace flags in the low byte, plus
// SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE (0x100) and, when the parent (or the
// linked span) is remote, SPAN_FLAGS_CONTEXT_IS_REMOTE (0x200).
func spanFlags(tf trace.TraceFlags, parent trace.SpanContext) uint32 {
	f := uint32(tf) | 0x100
	if parent.IsRemote() {
		f |= 0x200
	}
	return f
}

func unixNano(t time.Time) uint64 { return uint64(max(0, t.UnixNano())) }

func clampUint32(v int) uint64 { return uint64(min(max(v, 0), math.MaxUint32)) }

// appendAttrSet appends each attribute of set as a KeyValue field num.
func appendAttrSet(b []byte, num protowire.Number, set *attribute.Set) []byte {
	for it := set.Iter(); it.Next(); {
		kv := it.Attribute()
		b = appendMessage(b, num, func(m []byte) []byte { return appendKeyValue(m, kv) })
	}
	return b
}

// appendKeyValue appends the fields of a KeyValue.
func appendKeyValue(b []byte, kv attribute.KeyValue) []byte {
	b = appendString(b, 1, string(kv.Key))
	return appendMessage(b, 2, func(m []byte) []byte { return appendAnyValue(m, kv.Value) })
}

// appendAnyValue appends the fields of an AnyValue (its oneof: string 1,
// bool 2, int 3, double 4, array 5, kvlist 6, bytes 7). An empty value is
// an AnyValue with none set; a type this code does not know is the string
// "INVALID", as in otlptrace.
func appendAnyValue(b []byte, v attribute.Value) []byte {
	array := func(n int, elem func(m []byte, i int) []byte) []byte {
		return appendMessage(b, 5, func(a []byte) []byte { // ArrayValue
			for i := range n {
				a = appendMessage(a, 1, func(m []byte) []byte { return elem(m, i) })
			}
			return a
		})
	}
	switch v.Type() {
	case attribute.EMPTY:
		return b
	case attribute.STRING:
		return appendStringAlways(b, 1, v.AsString())
	case attribute.BOOL:
		return appendVarintAlways(b, 2, protowire.EncodeBool(v.AsBool()))
	case attribute.INT64:
		return appendVarintAlways(b, 3, uint64(v.AsInt64()))
	case attribute.FLOAT64:
		return appendFixed64Always(b, 4, math.Float64bits(v.AsFloat64()))
	case attribute.BYTESLICE:
		return protowire.AppendBytes(protowire.AppendTag(b, 7, protowire.BytesType), v.AsByteSlice())
	case attribute.BOOLSLICE:
		s := v.AsBoolSlice()
		return array(len(s), func(m []byte, i int) []byte { return appendVarintAlways(m, 2, protowire.EncodeBool(s[i])) })
	case attribute.INT64SLICE:
		s := v.AsInt64Slice()
		return array(len(s), func(m []byte, i int) []byte { return appendVarintAlways(m, 3, uint64(s[i])) })
	case attribute.FLOAT64SLICE:
		s := v.AsFloat64Slice()
		return array(len(s), func(m []byte, i int) []byte { return appendFixed64Always(m, 4, math.Float64bits(s[i])) })
	case attribute.STRINGSLICE:
		s := v.AsStringSlice()
		return array(len(s), func(m []byte, i int) []byte { return appendStringAlways(m, 1, s[i]) })
	case attribute.SLICE:
		s := v.AsSlice()
		return array(len(s), func(m []byte, i int) []byte { return appendAnyValue(m, s[i]) })
	case attribute.MAP:
		kvs := v.AsMap()
		return appendMessage(b, 6, func(l []byte) []byte { // KeyValueList
			for _, kv := range kvs {
				l = appendMessage(l, 1, func(m []byte) []byte { return appendKeyValue(m, kv) })
			}
			return l
		})
	default:
		return appendStringAlways(b, 1, "INVALID")
	}
}

// appendMessage appends field num holding the message body writes.
func appendMessage(b []byte, num protowire.Number, body func([]byte) []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), body(nil))
}

// The proto3 scalars: a zero value is not written. The *Always forms are
// for oneof members, which are written even when zero.

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return appendStringAlways(b, num, s)
}

func appendStringAlways(b []byte, num protowire.Number, s string) []byte {
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return appendVarintAlways(b, num, v)
}

func appendVarintAlways(b []byte, num protowire.Number, v uint64) []byte {
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

func appendFixed64(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return appendFixed64Always(b, num, v)
}

func appendFixed64Always(b []byte, num protowire.Number, v uint64) []byte {
	return protowire.AppendFixed64(protowire.AppendTag(b, num, protowire.Fixed64Type), v)
}

func appendFixed32(b []byte, num protowire.Number, v uint32) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendFixed32(protowire.AppendTag(b, num, protowire.Fixed32Type), v)
}

// getenv is os.Getenv, a variable for tests.
var getenv = os.Getenv
