package e2b

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/errdefs/edge"
	"github.com/airlockhq/airlock/internal/service/sandbox"
)

// TestRetryableAnswers: every 503 and 429 of the E2B planes carries
// Retry-After, on REST answers and Connect errors alike; a runtime the host
// lacks is permanent (400, no Retry-After).
func TestRetryableAnswers(t *testing.T) {
	h := &Handler{log: slog.New(slog.DiscardHandler)}
	for _, cl := range edge.Table {
		t.Run(cl.Message, func(t *testing.T) {
			err := fmt.Errorf("wrapped: %w", cl.Err)
			retryable := cl.E2BStatus == http.StatusServiceUnavailable || cl.E2BStatus == http.StatusTooManyRequests
			w := httptest.NewRecorder()
			h.writeError(w, httptest.NewRequest("GET", "/files", nil), err)
			if (w.Header().Get("Retry-After") != "") != retryable {
				t.Fatalf("REST %d with Retry-After %q", w.Code, w.Header().Get("Retry-After"))
			}
			var ce *connect.Error
			if !errors.As(h.connectError(context.Background(), err), &ce) || (ce.Meta().Get("Retry-After") != "") != retryable {
				t.Fatalf("Connect %v with Retry-After %q", ce, ce.Meta().Get("Retry-After"))
			}
		})
	}
	tests := []struct {
		name   string
		err    error
		status int
		retry  string
	}{
		{"runtime_absent", errdefs.ErrRuntimeAbsent, 400, ""},
		{"runtime_unhealthy", errdefs.ErrRuntimeUnavailable, 503, "30"},
		{"template_unsupported", errdefs.ErrTemplateUnsupported, 400, ""},
		{"template_build_failed", fmt.Errorf("%w: bld_1", sandbox.ErrTemplateBuildFailed), http.StatusFailedDependency, ""},
		{"own_retry_after", &sandbox.PublicError{Msg: "building", RetryAfter: time.Minute, Err: errdefs.ErrUnavailable}, 503, "60"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			h.writeError(w, httptest.NewRequest("POST", "/sandboxes", nil), tt.err)
			if w.Code != tt.status || w.Header().Get("Retry-After") != tt.retry {
				t.Fatalf("%d Retry-After %q, want %d %q", w.Code, w.Header().Get("Retry-After"), tt.status, tt.retry)
			}
		})
	}
}
