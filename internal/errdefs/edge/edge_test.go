package edge_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/errdefs/edge"
)

// classes are the errdefs classes every row's class must be one of, with
// the SDK's class of the same meaning. A subclass is its parent's kind, so
// a client that does not know it still sees the right class.
var classes = []struct{ server, sdk error }{
	{errdefs.ErrNotFound, client.ErrNotFound},
	{errdefs.ErrInvalidArgument, client.ErrInvalidArgument},
	{errdefs.ErrAlreadyExists, client.ErrAlreadyExists},
	{errdefs.ErrConflict, client.ErrConflict},
	{errdefs.ErrInvalidState, client.ErrInvalidState},
	{errdefs.ErrUnauthenticated, client.ErrUnauthenticated},
	{errdefs.ErrPermissionDenied, client.ErrPermissionDenied},
	{errdefs.ErrTooLarge, client.ErrTooLarge},
	{errdefs.ErrQuotaExceeded, client.ErrQuotaExceeded},
	{errdefs.ErrRateLimited, client.ErrRateLimited},
	{errdefs.ErrCapacityExhausted, client.ErrCapacityExhausted},
	{errdefs.ErrRuntimeUnavailable, client.ErrRuntimeUnavailable},
	{errdefs.ErrUnavailable, client.ErrUnavailable},
	{errdefs.ErrNotImplemented, client.ErrNotImplemented},
	{errdefs.ErrInternal, client.ErrInternal},
}

// TestSDKAgrees: every API error code the server sends maps, in the Go
// SDK's own table (client/errors.go, a module that cannot import this
// one), to the class of the row the server sends it for. A code added to
// the server's table and not to the SDK's, or mapped to another class
// there, fails here. A code that several rows share (conflict for
// already-exists and conflict) is its least specific row's: the last one.
func TestSDKAgrees(t *testing.T) {
	rows := append(append([]edge.Class{}, edge.Table...), edge.Internal, edge.Timeout, edge.MethodNotAllowed)
	want := map[string]error{}
	status := map[string]int{}
	var codes []string
	for _, row := range rows {
		var cls error
		for _, c := range classes {
			if errors.Is(row.Err, c.server) {
				cls = c.sdk
				break
			}
		}
		if cls == nil {
			t.Fatalf("class %q of code %s is no errdefs class the SDK knows: give it a parent class", row.Err, row.Code)
		}
		if _, seen := want[row.Code]; !seen {
			codes = append(codes, row.Code)
		}
		want[row.Code], status[row.Code] = cls, row.Status
	}
	for _, code := range codes {
		t.Run(code, func(t *testing.T) {
			ae := &client.APIError{StatusCode: status[code], Code: code}
			if got := ae.Class(); got != want[code] {
				t.Fatalf("SDK maps %d %s to %v, the server sends it for %v", status[code], code, got, want[code])
			}
			if !errors.Is(ae, want[code]) {
				t.Fatalf("errors.Is(%s, %v) is false in the SDK", code, want[code])
			}
		})
	}
	// What the server answers as retryable the SDK retries.
	for _, row := range rows {
		ae := &client.APIError{StatusCode: row.Status, Code: row.Code, RetryAfter: edge.Classify(row.Err).RetryAfterHTTP()}
		if _, retry := client.RetryAfter(ae); edge.Retryable(row.Status) != retry {
			t.Errorf("%d %s: retryable %v on the server, %v in the SDK", row.Status, row.Code, edge.Retryable(row.Status), retry)
		}
	}
}

// TestTable: subclasses come before their parents (else they never
// match), every row names a code and a message, and the retryable answers
// of each plane have a Retry-After.
func TestTable(t *testing.T) {
	for i, row := range edge.Table {
		if row.Code == "" || row.Message == "" || row.Status == 0 || row.E2BStatus == 0 {
			t.Errorf("row %d (%v) is incomplete", i, row.Err)
		}
		for _, later := range edge.Table[i+1:] {
			if errors.Is(later.Err, row.Err) {
				t.Errorf("%v comes after its parent %v: it never matches", later.Err, row.Err)
			}
		}
		a := edge.Classify(fmt.Errorf("wrapped: %w", row.Err))
		if a.Class != row {
			t.Errorf("%v classifies as %v", row.Err, a.Err)
		}
		if edge.Retryable(row.Status) != (a.RetryAfterHTTP() > 0) || edge.Retryable(row.E2BStatus) != (a.RetryAfterE2B() > 0) {
			t.Errorf("%v: statuses %d/%d with Retry-After %v/%v", row.Err, row.Status, row.E2BStatus, a.RetryAfterHTTP(), a.RetryAfterE2B())
		}
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		name           string
		err            error
		status         int
		code, msg      string
		retry, retry2b time.Duration
	}{
		{"no class", errors.New("open /var/lib/airlock/x: permission denied"), 500, "internal", "internal error", 0, 0},
		{"public", &errdefs.Public{Msg: "sandbox is stopped", Err: errdefs.ErrInvalidState}, 409, "invalid_state", "sandbox is stopped", 0, 0},
		{"outermost public", &errdefs.Public{Msg: "outer", Err: fmt.Errorf("x: %w", errdefs.Publicf(errdefs.ErrNotFound, "inner"))}, 404, "not_found", "outer", 0, 0},
		{"class text", fmt.Errorf("%w: /host/path", errdefs.ErrNotFound), 404, "not_found", "not found", 0, 0},
		{"timeout outranks", fmt.Errorf("%w: %w", errdefs.ErrNotFound, context.DeadlineExceeded), 503, "unavailable", "timed out", edge.RetryDefault, 0},
		{"body", fmt.Errorf("decoding: %w", &http.MaxBytesError{Limit: 10}), 413, "payload_too_large", "request body exceeds 10 bytes", 0, 0},
		{"own retry", &errdefs.Public{Msg: "building", RetryAfter: time.Minute, Err: errdefs.ErrTemplateBuilding, BuildID: "bld_1"}, 503, "template_building", "building", time.Minute, time.Minute},
		{"quota", errdefs.ErrQuotaExceeded, 429, "quota_exceeded", "quota exceeded", edge.RetryDefault, 0},
		{"runtime", errdefs.ErrRuntimeUnavailable, 503, "runtime_unavailable", "runtime unavailable", edge.RetryRuntime, edge.RetryRuntime},
		{"runtime absent", errdefs.ErrRuntimeAbsent, 400, "runtime_unavailable", "runtime not available on this host", 0, 0},
		{"capability", &errdefs.Public{Msg: "runtime runc cannot snapshot memory", Err: errdefs.ErrCapabilityUnsupported}, 400,
			"capability_unsupported", "runtime runc cannot snapshot memory", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := edge.Classify(tt.err)
			if a.Status != tt.status || a.Code != tt.code || a.Message != tt.msg || a.RetryAfterHTTP() != tt.retry || a.RetryAfterE2B() != tt.retry2b {
				t.Fatalf("got %d %s %q retry %v/%v, want %d %s %q %v/%v", a.Status, a.Code, a.Message, a.RetryAfterHTTP(), a.RetryAfterE2B(),
					tt.status, tt.code, tt.msg, tt.retry, tt.retry2b)
			}
		})
	}
	if a := edge.Classify(&errdefs.Public{Msg: "m", BuildID: "bld_1", Err: errdefs.ErrTemplateBuildFailed}); a.BuildID != "bld_1" || a.Status != 424 {
		t.Fatalf("build id: %+v", a)
	}
}
