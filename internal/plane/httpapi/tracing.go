package httpapi

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/airlockhq/airlock/internal/tracing"
)

// startRequestSpan starts the server span of one request, continuing the
// caller's trace when it sent a traceparent header. The route is only
// known after the mux matched, so the span is renamed in endRequestSpan.
// Only the method, route, status, request id and tenant are recorded: no
// paths (they carry file names), bodies, output or headers.
func startRequestSpan(r *http.Request) (context.Context, trace.Span) {
	ctx := otel.GetTextMapPropagator().Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	return otel.Tracer(tracing.TracerName).Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer))
}

// endRequestSpan names the span after the route and ends it.
func endRequestSpan(span trace.Span, method, route string, status int, rs *requestState) {
	// A no-op span (tracing off) skips building attributes.
	if span.IsRecording() {
		span.SetName(route)
		span.SetAttributes(
			attribute.String("http.request.method", method),
			attribute.String("http.route", route),
			attribute.Int("http.response.status_code", status),
			attribute.String("airlock.request_id", rs.id),
			attribute.String("airlock.tenant", rs.tenant),
		)
		if status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(status))
		}
	}
	span.End()
}
