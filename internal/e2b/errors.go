package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"connectrpc.com/connect"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/manager"
)

// errorBody is E2B's error shape (control plane and envd REST).
type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// class is what an error class becomes on each plane.
type class struct {
	err     error
	status  int
	connect connect.Code
	msg     string // when the error carries no public message
}

// classes maps errdefs classes, most specific first. Only this table turns
// error classes into statuses and Connect codes.
var classes = []class{
	{manager.ErrSandboxNotFound, http.StatusNotFound, connect.CodeNotFound, "sandbox not found"},
	{manager.ErrTemplateNotFound, http.StatusNotFound, connect.CodeNotFound, "template not found"},
	{manager.ErrTemplateBuilding, http.StatusServiceUnavailable, connect.CodeUnavailable, "template is being built"},
	{manager.ErrTemplateBuildFailed, http.StatusFailedDependency, connect.CodeFailedPrecondition, "template build failed"},
	{errdefs.ErrNotFound, http.StatusNotFound, connect.CodeNotFound, "not found"},
	{errdefs.ErrInvalidArgument, http.StatusBadRequest, connect.CodeInvalidArgument, "invalid argument"},
	{errdefs.ErrUnauthenticated, http.StatusUnauthorized, connect.CodeUnauthenticated, "missing or invalid api key"},
	{errdefs.ErrPermissionDenied, http.StatusForbidden, connect.CodePermissionDenied, "permission denied"},
	{errdefs.ErrAlreadyExists, http.StatusConflict, connect.CodeAlreadyExists, "already exists"},
	{errdefs.ErrConflict, http.StatusConflict, connect.CodeAborted, "conflict"},
	{errdefs.ErrInvalidState, http.StatusConflict, connect.CodeFailedPrecondition, "invalid state"},
	{errdefs.ErrTooLarge, http.StatusRequestEntityTooLarge, connect.CodeResourceExhausted, "payload too large"},
	// A full sandbox disk: envd's 507, which the SDK maps to NotEnoughSpaceError.
	{errdefs.ErrQuotaExceeded, http.StatusInsufficientStorage, connect.CodeResourceExhausted, "quota exceeded"},
	{errdefs.ErrRateLimited, http.StatusTooManyRequests, connect.CodeResourceExhausted, "rate limited"},
	{errdefs.ErrCapacityExhausted, http.StatusServiceUnavailable, connect.CodeUnavailable, "host is at capacity"},
	// A runtime the host lacks is permanent (the server plane's 400
	// runtime_unavailable); one it has but that is unhealthy may recover.
	{errdefs.ErrRuntimeAbsent, http.StatusBadRequest, connect.CodeFailedPrecondition, "runtime not available on this host"},
	{errdefs.ErrRuntimeUnavailable, http.StatusServiceUnavailable, connect.CodeUnavailable, "runtime unavailable"},
	{errdefs.ErrUnavailable, http.StatusServiceUnavailable, connect.CodeUnavailable, "service unavailable"},
	{errdefs.ErrNotImplemented, http.StatusNotImplemented, connect.CodeUnimplemented, "not implemented"},
}

// classify returns err's class and a client-safe message: the error's
// public message when it has one, else the class's fixed text. Raw error
// text never reaches the client (it may hold host paths).
func classify(err error) (class, string) {
	c := class{status: http.StatusInternalServerError, connect: connect.CodeInternal, msg: "internal error"}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return class{status: http.StatusGatewayTimeout, connect: connect.CodeDeadlineExceeded}, "timed out"
	case errors.Is(err, context.Canceled):
		return class{status: 499, connect: connect.CodeCanceled}, "cancelled"
	}
	for _, cl := range classes {
		if errors.Is(err, cl.err) {
			c = cl
			break
		}
	}
	msg := c.msg
	var (
		pe *manager.PublicError
		ae *agentproto.Error
		pm *publicErr
	)
	switch {
	case errors.As(err, &pe):
		msg = pe.Msg
	case errors.As(err, &pm):
		msg = pm.msg
	case errors.As(err, &ae) && c.status != http.StatusInternalServerError:
		msg = ae.Message
	}
	return c, msg
}

// publicErr is an error this package raises with a client-safe text.
type publicErr struct {
	msg string
	cls error
}

func (p *publicErr) Error() string { return p.msg }
func (p *publicErr) Unwrap() error { return p.cls }

// errf returns an error of class cls whose message is safe for clients.
func errf(cls error, format string, args ...any) error {
	return &publicErr{msg: fmt.Sprintf(format, args...), cls: cls}
}

// retryAfter is the Retry-After of a retryable answer (429, 503), as the
// server plane sends it (see server.retryAfterOf), or "".
func retryAfter(err error, status int) string {
	if status != http.StatusServiceUnavailable && status != http.StatusTooManyRequests {
		return ""
	}
	var pe *manager.PublicError
	switch {
	case errors.As(err, &pe) && pe.RetryAfter > 0:
		return strconv.Itoa(int((pe.RetryAfter + time.Second - 1) / time.Second))
	case errors.Is(err, errdefs.ErrRuntimeUnavailable):
		return "30" // the manager's health TTL: an unhealthy runtime is probed again then
	}
	return "5"
}

// writeError answers a REST call with E2B's error shape.
func (h *Handler) writeError(w http.ResponseWriter, r *http.Request, err error) {
	c, msg := classify(err)
	h.logError(r.Context(), c.status, err)
	if ra := retryAfter(err, c.status); ra != "" {
		w.Header().Set("Retry-After", ra)
	}
	writeJSON(w, c.status, errorBody{Code: c.status, Message: msg})
}

// connectError turns err into a Connect error for the RPC planes.
func (h *Handler) connectError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	c, msg := classify(err)
	h.logError(ctx, c.status, err)
	ce = connect.NewError(c.connect, errors.New(msg))
	if ra := retryAfter(err, c.status); ra != "" {
		ce.Meta().Set("Retry-After", ra)
	}
	return ce
}

func (h *Handler) logError(ctx context.Context, status int, err error) {
	level := slog.LevelDebug
	if status >= 500 && status != http.StatusNotImplemented && status != http.StatusGatewayTimeout {
		level = slog.LevelError
	}
	h.log.Log(ctx, level, "e2b request failed", "status", status, "err", err)
}

// writeJSON sends v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// decodeJSON reads a JSON body (at most 1 MiB) into v; an empty body leaves
// v as it is.
func decodeJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<20))
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return errf(errdefs.ErrInvalidArgument, "invalid json body")
	}
	return nil
}
