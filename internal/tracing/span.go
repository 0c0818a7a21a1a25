package tracing

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// StartSpan starts a child span of ctx's span for one step of an operation
// on sandbox id ("" when not yet known). Spans carry ids only: never
// commands, paths, env, output or error texts, which may hold secrets.
func StartSpan(ctx context.Context, name, id string) (context.Context, trace.Span) {
	// The global provider is read per span (not cached) so that installing
	// one later, or a test's, takes effect.
	ctx, span := otel.Tracer(TracerName).Start(ctx, name)
	if id != "" && span.IsRecording() {
		span.SetAttributes(attribute.String("airlock.sandbox_id", id))
	}
	return ctx, span
}

// EndSpan ends span, marking it failed when err is set. Only the error's
// presence is recorded: its text may quote sandbox paths or output.
func EndSpan(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, "failed")
	}
	span.End()
}
