package httpapi

import (
	"net/http"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// registerLifecycle serves a sandbox's TTL, pause and resume (and, as
// issue 15 lands them, its lifecycle rules and keepalive).
func (s *Server) registerLifecycle(a func(handlerFunc) http.Handler) {
	s.handle("POST /v1/sandboxes/{id}/timeout", a(s.setTimeout))
	s.handle("POST /v1/sandboxes/{id}/pause", a(s.pause))
	s.handle("POST /v1/sandboxes/{id}/resume", a(s.resume))
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req api.TimeoutRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	sb, err := s.sandboxes.SetTimeout(r.Context(), p, r.PathValue("id"), req.TimeoutS)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sb)
	return nil
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req api.PauseRequest
	if err := decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	switch req.Memory {
	case "", api.PauseMemoryKeep:
	case api.PauseMemoryDisk:
		// Never a silent freeze in RAM when the caller asked to release it.
		return errf(errdefs.ErrCapabilityUnsupported, "pause to disk is not available on this server yet; pause keeps memory")
	default:
		return errf(errdefs.ErrInvalidArgument, "memory must be keep or disk")
	}
	sb, err := s.sandboxes.Pause(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sb)
	return nil
}

func (s *Server) resume(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	sb, err := s.sandboxes.Resume(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sb)
	return nil
}
