package httpapi

import (
	"net/http"
	"strconv"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// registerPreview adds the preview URL routes of the API. The previews
// themselves are served on a listener of their own (internal/preview).
func (s *Server) registerPreview(a func(handlerFunc) http.Handler) {
	s.handle("POST /v1/sandboxes/{id}/previews", a(s.createPreview))
	s.handle("GET /v1/sandboxes/{id}/previews", a(s.listPreviews))
	s.handle("DELETE /v1/sandboxes/{id}/previews/{port}", a(s.deletePreview))
}

// createPreview serves POST /v1/sandboxes/{id}/previews: a port of the
// sandbox at a preview URL.
func (s *Server) createPreview(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req api.PreviewRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	out, err := s.previews.CreatePreview(r.Context(), p, r.PathValue("id"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// listPreviews serves GET /v1/sandboxes/{id}/previews.
func (s *Server) listPreviews(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	out, err := s.previews.ListPreviews(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// deletePreview serves DELETE /v1/sandboxes/{id}/previews/{port}.
func (s *Server) deletePreview(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		return errf(errdefs.ErrInvalidArgument, "port must be 1-65535")
	}
	if err := s.previews.DeletePreview(r.Context(), p, r.PathValue("id"), port); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
