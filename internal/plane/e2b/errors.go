package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"

	"connectrpc.com/connect"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/errdefs/edge"
)

// errorBody is E2B's error shape (control plane and envd REST).
type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// classify returns what err becomes on the E2B planes: the one table's
// answer (internal/errdefs/edge), read through E2BStatus and Connect. A
// cancelled call is answered as cancelled: on these planes only a client
// that went away cancels one.
func classify(err error) edge.Answer {
	if errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return edge.Answer{Class: edge.Cancelled, Message: "cancelled"}
	}
	return edge.Classify(err)
}

// errf returns an error of class cls whose message is safe for clients.
func errf(cls error, format string, args ...any) error {
	return errdefs.Publicf(cls, format, args...)
}

// writeError answers a REST call with E2B's error shape.
func (h *Handler) writeError(w http.ResponseWriter, r *http.Request, err error) {
	a := classify(err)
	h.logError(r.Context(), a.E2BStatus, err)
	if ra := edge.Seconds(a.RetryAfterE2B()); ra != "" {
		w.Header().Set("Retry-After", ra)
	}
	writeJSON(w, a.E2BStatus, errorBody{Code: a.E2BStatus, Message: a.Message})
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
	a := classify(err)
	h.logError(ctx, a.E2BStatus, err)
	ce = connect.NewError(a.Connect, errors.New(a.Message))
	if ra := edge.Seconds(a.RetryAfterE2B()); ra != "" {
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
