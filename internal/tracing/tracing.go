// Package tracing installs OpenTelemetry tracing exported over OTLP/HTTP, or nothing when no endpoint is set.
//
// Code that makes spans uses otel.Tracer("airlock") from the global
// provider: until Setup installs one that is the no-op tracer, so spans
// cost next to nothing when tracing is off. The exporter is this package's
// own (otlp.go): the OpenTelemetry one would link gRPC into the one airlock
// binary, whose every command, the CLI's included, then initialises it.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// TracerName is the instrumentation name of every airlock span.
const TracerName = "airlock"

// Config says where traces go and how the service is named in them.
type Config struct {
	// Endpoint is the OTLP/HTTP collector's base URL, e.g.
	// http://127.0.0.1:4318 (spans are POSTed to /v1/traces under it);
	// empty disables tracing.
	Endpoint string
	// ServiceName is the service.name resource attribute; default "airlock".
	ServiceName string
	// Version is the service.version resource attribute.
	Version string
}

// Setup installs a global tracer provider that batches spans to
// cfg.Endpoint, and the W3C trace-context propagator so that a caller's
// traceparent header continues its trace. With an empty Endpoint it installs
// nothing. shutdown flushes the spans still queued (bounded by ctx) and puts
// back the previous provider; it is never nil.
func Setup(ctx context.Context, cfg Config) (shutdown func(context.Context) error, err error) {
	if cfg.Endpoint == "" {
		return func(context.Context) error { return nil }, nil
	}
	u, err := url.Parse(cfg.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "otlp endpoint %q: want http(s)://host:port", cfg.Endpoint)
	}
	if cfg.ServiceName == "" {
		cfg.ServiceName = "airlock"
	}
	// The URL's scheme says plain HTTP or TLS; a bare base URL gets the
	// standard /v1/traces.
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces"
	}
	exp, err := newExporter(u, getenv)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "otlp exporter: %v", err)
	}
	res := resource.NewSchemaless(
		attribute.String("service.name", cfg.ServiceName),
		attribute.String("service.version", cfg.Version),
	)
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(2*time.Second)),
		sdktrace.WithResource(res),
	)
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	// Export failures (collector down) go to the daemon's log instead of
	// the SDK's default stderr logger.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		slog.Warn("tracing", "err", err)
	}))
	slog.Info("tracing enabled", "otlp_endpoint", u.Redacted())
	return func(ctx context.Context) error {
		err := tp.Shutdown(ctx)
		otel.SetTracerProvider(prevTP)
		otel.SetTextMapPropagator(prevProp)
		if err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("tracing shutdown: %w", err)
		}
		return nil
	}, nil
}
