package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/errdefs/edge"
	"github.com/airlockhq/airlock/internal/service/sandbox"
)

// TestRetryableAnswers: every 503 and 429 carries Retry-After (docs/api.md
// promises it), whatever class produced it, including classes added to the
// table later; what can never succeed as asked is a 4xx without it.
func TestRetryableAnswers(t *testing.T) {
	for _, cl := range edge.Table {
		t.Run(cl.Code+"/"+cl.Err.Error(), func(t *testing.T) {
			c := classify(fmt.Errorf("wrapped: %w", cl.Err))
			retryable := c.Status == http.StatusServiceUnavailable || c.Status == http.StatusTooManyRequests
			if retryable != (c.RetryAfterHTTP() > 0) {
				t.Fatalf("status %d with Retry-After %v", c.Status, c.RetryAfterHTTP())
			}
		})
	}
	tests := []struct {
		name   string
		err    error
		status int
		code   string
		retry  time.Duration
	}{
		{"runtime_absent", &sandbox.PublicError{Msg: "runtime gvisor is not available on this host", Err: errdefs.ErrRuntimeAbsent},
			400, api.CodeRuntimeUnavailable, 0},
		{"runtime_unhealthy", &sandbox.PublicError{Msg: "runtime gvisor is not usable on this host now", Err: errdefs.ErrRuntimeUnavailable},
			503, api.CodeRuntimeUnavailable, 30 * time.Second},
		{"template_unsupported", &sandbox.PublicError{Msg: "no kernel", Err: errdefs.ErrTemplateUnsupported},
			400, api.CodeTemplateUnsupported, 0},
		{"agent", sandbox.ErrAgentUnavailable, 503, api.CodeAgentUnavailable, 5 * time.Second},
		{"timeout", fmt.Errorf("dialing: %w", context.DeadlineExceeded), 503, api.CodeUnavailable, 5 * time.Second},
		{"own_retry_after", &sandbox.PublicError{Msg: "building", RetryAfter: time.Minute, Err: errdefs.ErrUnavailable},
			503, api.CodeUnavailable, time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := classify(tt.err)
			if c.Status != tt.status || c.Code != tt.code || c.RetryAfterHTTP() != tt.retry {
				t.Fatalf("classify = %d %s Retry-After %v, want %d %s %v", c.Status, c.Code, c.RetryAfterHTTP(), tt.status, tt.code, tt.retry)
			}
			// And on the wire.
			s := &Server{metrics: NewMetrics(nil)}
			w := httptest.NewRecorder()
			r := httptest.NewRequest("POST", "/v1/sandboxes", nil)
			r = r.WithContext(context.WithValue(r.Context(), keyLogger, slog.New(slog.DiscardHandler)))
			s.writeError(w, r, tt.err)
			if got, want := w.Header().Get("Retry-After"), retryHeader(tt.retry); w.Code != tt.status || got != want {
				t.Fatalf("response %d Retry-After %q, want %d %q", w.Code, got, tt.status, want)
			}
		})
	}
	if !errors.Is(errdefs.ErrTemplateUnsupported, errdefs.ErrInvalidArgument) || !errors.Is(errdefs.ErrRuntimeAbsent, errdefs.ErrRuntimeUnavailable) {
		t.Fatal("a subclass is not its parent class")
	}
}

func retryHeader(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return fmt.Sprint(int(d / time.Second))
}
