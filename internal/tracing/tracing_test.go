package tracing

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.uber.org/goleak"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// receiver is an in-process OTLP/HTTP collector on loopback that keeps the
// bodies POSTed to /v1/traces.
type receiver struct {
	mu     sync.Mutex
	bodies [][]byte
	other  int // requests to any other path or method
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
		rc.other++
		http.Error(w, "no", http.StatusNotFound)
		return
	}
	rc.bodies = append(rc.bodies, b)
	// An empty ExportTraceServiceResponse: full success.
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

func (rc *receiver) snapshot() (posts int, all []byte, other int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.bodies), bytes.Join(rc.bodies, nil), rc.other
}

func TestSetupExports(t *testing.T) {
	rc := &receiver{}
	ts := httptest.NewServer(rc) // listens on 127.0.0.1
	defer ts.Close()

	shutdown, err := Setup(t.Context(), Config{Endpoint: ts.URL, ServiceName: "airlock-test", Version: "v9.8.7"})
	if err != nil {
		t.Fatal(err)
	}
	_, span := otel.Tracer(TracerName).Start(context.Background(), "exported-span-name")
	if !span.IsRecording() {
		t.Fatal("span is not recording after Setup")
	}
	span.End()
	// Shutdown flushes the batch: the span must have been POSTed by then.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	posts, all, other := rc.snapshot()
	if posts == 0 || other != 0 {
		t.Fatalf("%d POSTs to /v1/traces, %d other requests", posts, other)
	}
	// Protobuf carries strings verbatim: the span and resource are in it.
	for _, want := range []string{"exported-span-name", "airlock-test", "v9.8.7", "service.name"} {
		if !bytes.Contains(all, []byte(want)) {
			t.Errorf("exported body lacks %q", want)
		}
	}
	// Shutdown put the previous (no-op) provider back.
	_, after := otel.Tracer(TracerName).Start(context.Background(), "after")
	if after.IsRecording() {
		t.Error("span still recording after shutdown")
	}
	after.End()
}

func TestSetupDisabled(t *testing.T) {
	before := otel.GetTracerProvider()
	shutdown, err := Setup(t.Context(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	if otel.GetTracerProvider() != before {
		t.Error("empty endpoint installed a tracer provider")
	}
	_, span := otel.Tracer(TracerName).Start(context.Background(), "x")
	if span.IsRecording() {
		t.Error("span recording with tracing off")
	}
	span.End()
	if err := shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestSetupBadEndpoint(t *testing.T) {
	for _, ep := range []string{"127.0.0.1:4318", "ftp://127.0.0.1:4318", "http://", "::bad"} {
		t.Run(ep, func(t *testing.T) {
			_, err := Setup(t.Context(), Config{Endpoint: ep})
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("err = %v, want invalid argument", err)
			}
		})
	}
}

// BenchmarkSpanDisabled is the cost of one span with tracing off, as on
// the exec path.
func BenchmarkSpanDisabled(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, span := otel.Tracer(TracerName).Start(ctx, "manager.exec")
		if span.IsRecording() {
			b.Fatal("recording")
		}
		span.End()
	}
}
