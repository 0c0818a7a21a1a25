package httpapi

import (
	"context"
	"net/http"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/sandbox"
)

// lifecycleService is what the lifecycle routes need of the sandbox service
// beyond Sandboxes (sandbox.Service implements it).
type lifecycleService interface {
	PauseWith(ctx context.Context, p auth.Principal, id string, o sandbox.PauseOptions) (api.Sandbox, error)
	Patch(ctx context.Context, p auth.Principal, id string, req api.PatchSandboxRequest) (api.Sandbox, error)
	Keepalive(ctx context.Context, p auth.Principal, id string) (api.Sandbox, error)
}

// registerLifecycle serves a sandbox's TTL, pause (memory keep or disk) and
// resume, its lifecycle rules and metadata (PATCH) and keepalive.
func (s *Server) registerLifecycle(a func(handlerFunc) http.Handler) {
	s.handle("POST /v1/sandboxes/{id}/timeout", a(s.setTimeout))
	s.handle("POST /v1/sandboxes/{id}/pause", a(s.pause))
	s.handle("POST /v1/sandboxes/{id}/resume", a(s.resume))
	if _, ok := s.sandboxes.(lifecycleService); ok {
		s.handle("PATCH /v1/sandboxes/{id}", a(s.patchSandbox))
		s.handle("POST /v1/sandboxes/{id}/keepalive", a(s.keepalive))
	}
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
	case "", api.PauseMemoryKeep, api.PauseMemoryDisk:
	default:
		return errf(errdefs.ErrInvalidArgument, "memory must be keep or disk")
	}
	var (
		sb  api.Sandbox
		err error
	)
	if ls, ok := s.sandboxes.(lifecycleService); ok {
		sb, err = ls.PauseWith(r.Context(), p, r.PathValue("id"), sandbox.PauseOptions{Memory: req.Memory})
	} else if req.Memory == api.PauseMemoryDisk {
		// Never a silent freeze in RAM when the caller asked to release it.
		return errf(errdefs.ErrCapabilityUnsupported, "pause to disk is not available on this server")
	} else {
		sb, err = s.sandboxes.Pause(r.Context(), p, r.PathValue("id"))
	}
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

func (s *Server) patchSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req api.PatchSandboxRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	sb, err := s.sandboxes.(lifecycleService).Patch(r.Context(), p, r.PathValue("id"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sb)
	return nil
}

func (s *Server) keepalive(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	sb, err := s.sandboxes.(lifecycleService).Keepalive(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sb)
	return nil
}
