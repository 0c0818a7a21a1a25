package httpapi_test

import (
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/airlockhq/airlock/api"
)

// withSpans installs a tracer provider that keeps every ended span in
// memory, for the rest of the test.
func withSpans(t *testing.T) *tracetest.InMemoryExporter {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	otel.SetTracerProvider(tp)
	t.Cleanup(func() {
		otel.SetTracerProvider(noop.NewTracerProvider())
		tp.Shutdown(t.Context())
	})
	return exp
}

func spanAttr(s tracetest.SpanStub, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// TestTracingSpans runs a create and an exec through the real HTTP server
// and checks the span tree: one server span per request, named after the
// route, with the manager's steps as its children; and that no span
// carries the exec's output or the sandbox's secret.
func TestTracingSpans(t *testing.T) {
	exp := withSpans(t)
	h := newHarness(t)
	const secret = "trace-secret-7f3a9c"
	key := h.key("acme")

	cr := h.req("POST", "/v1/sandboxes", key, api.CreateSandboxRequest{Secrets: map[string]string{"TOKEN": secret}})
	h.expect(cr, http.StatusCreated, "")
	var sb api.Sandbox
	cr.json(t, &sb)
	// The output is computed by the shell, so it appears in no request.
	er := h.req("POST", "/v1/sandboxes/"+sb.ID+"/exec", key, api.ExecRequest{Shell: sh(`echo "out-marker-$((6*7))"; echo "$TOKEN"`)})
	h.expect(er, http.StatusOK, "")
	var res api.ExecResult
	er.json(t, &res)
	const output = "out-marker-42"
	if !strings.Contains(strp(res.Stdout), output) {
		t.Fatalf("stdout %q lacks %q", strp(res.Stdout), output)
	}
	// exec.run ends when the tracker has finished, which may be just after
	// the response.
	byName := func(name string) []tracetest.SpanStub {
		var out []tracetest.SpanStub
		for _, s := range exp.GetSpans() {
			if s.Name == name {
				out = append(out, s)
			}
		}
		return out
	}
	eventually(t, "exec.run span", func() bool { return len(byName("exec.run")) == 1 })

	one := func(name string) tracetest.SpanStub {
		t.Helper()
		ss := byName(name)
		if len(ss) != 1 {
			t.Fatalf("%d spans named %q, want 1; all: %v", len(ss), name, names(exp.GetSpans()))
		}
		return ss[0]
	}
	childOf := func(child, parent tracetest.SpanStub) {
		t.Helper()
		if child.Parent.SpanID() != parent.SpanContext.SpanID() || child.SpanContext.TraceID() != parent.SpanContext.TraceID() {
			t.Errorf("span %q: parent %s, want %q (%s)", child.Name, child.Parent.SpanID(), parent.Name, parent.SpanContext.SpanID())
		}
	}

	tests := []struct {
		route  string
		resp   resp
		status int64
		steps  []string // children of the manager span
		mgr    string
	}{
		{"POST /v1/sandboxes", cr, http.StatusCreated, []string{"network.setup", "driver.create", "driver.start", "agent.ready"}, "manager.create"},
		{"POST /v1/sandboxes/{id}/exec", er, http.StatusOK, []string{"exec.run"}, "manager.exec"},
	}
	for _, tt := range tests {
		t.Run(tt.mgr, func(t *testing.T) {
			srv := one(tt.route)
			if srv.SpanKind != trace.SpanKindServer || srv.Parent.IsValid() {
				t.Errorf("server span: kind %v, parent %v", srv.SpanKind, srv.Parent)
			}
			want := map[string]attribute.Value{
				"http.route":                attribute.StringValue(tt.route),
				"http.response.status_code": attribute.Int64Value(tt.status),
				"airlock.request_id":        attribute.StringValue(tt.resp.Header.Get("X-Request-Id")),
				"airlock.tenant":            attribute.StringValue("acme"),
			}
			for k, v := range want {
				if got, ok := spanAttr(srv, k); !ok || got != v {
					t.Errorf("server span %s = %v, want %v", k, got.String(), v.String())
				}
			}
			mgr := one(tt.mgr)
			childOf(mgr, srv)
			if v, _ := spanAttr(mgr, "airlock.sandbox_id"); v.AsString() != sb.ID {
				t.Errorf("%s sandbox_id = %q, want %q", tt.mgr, v.AsString(), sb.ID)
			}
			for _, step := range tt.steps {
				s := one(step)
				childOf(s, mgr)
				if s.EndTime.Before(s.StartTime) {
					t.Errorf("span %q ends before it starts", step)
				}
			}
		})
	}

	t.Run("no-output-or-secrets", func(t *testing.T) {
		for _, s := range exp.GetSpans() {
			texts := []string{s.Name, s.Status.Description}
			for _, kv := range s.Attributes {
				texts = append(texts, string(kv.Key), kv.Value.String())
			}
			for _, ev := range s.Events {
				texts = append(texts, ev.Name)
				for _, kv := range ev.Attributes {
					texts = append(texts, kv.Value.String())
				}
			}
			for _, txt := range texts {
				if strings.Contains(txt, secret) || strings.Contains(txt, output) {
					t.Errorf("span %q carries %q", s.Name, txt)
				}
			}
		}
	})
}

func names(ss tracetest.SpanStubs) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.Name
	}
	return out
}
