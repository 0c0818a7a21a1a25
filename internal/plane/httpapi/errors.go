package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/errdefs/edge"
)

// classify is what err becomes at the HTTP API's edge: the one table's
// answer (internal/errdefs/edge).
func classify(err error) edge.Answer { return edge.Classify(err) }

// errf returns a server error of class cls with a client-safe message.
func errf(cls error, msg string) error { return &errdefs.Public{Msg: msg, Err: cls} }

// writeError sends err as the API's error body. The full error goes to the
// log (at error level for 5xx), never to the client.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	a := classify(err)
	log := logFrom(r.Context())
	switch {
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The client went away; nobody reads the answer.
		log.Debug("request cancelled by client", "err", err)
		a = edge.Answer{Class: edge.Cancelled, Message: edge.Cancelled.Message}
	case a.Status >= 500:
		log.Error("request failed", "status", a.Status, "code", a.Code, "err", err)
	default:
		log.Debug("request refused", "status", a.Status, "code", a.Code, "err", err)
	}
	s.metrics.observeError(a.Code)
	body := api.ErrorBody{Error: api.ErrorDetail{
		Code: a.Code, Message: a.Message, RequestID: requestIDFrom(r.Context()), SandboxID: a.SandboxID, BuildID: a.BuildID,
	}}
	if body.Error.SandboxID == "" && strings.Contains(r.Pattern, " /v1/sandboxes/{id}") && a.Status != http.StatusUnauthorized {
		// The client's own input echoed: the same for a missing sandbox and
		// another tenant's, so it reveals nothing.
		body.Error.SandboxID = r.PathValue("id")
	}
	if ra := edge.Seconds(a.RetryAfterHTTP()); ra != "" {
		w.Header().Set("Retry-After", ra)
	}
	writeJSON(w, a.Status, body)
}

// writeJSON sends v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	if err := enc.Encode(v); err != nil {
		slog.Debug("writing response", "err", err)
	}
}
