package httpapi

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// CodeService runs code-interpreter cells in a sandbox's contexts
// (*interp.Service implements it).
type CodeService interface {
	// Run runs a cell and calls emit with each event, the end event last.
	// An error returned before anything was emitted is the request's
	// error; after, the stream just ends.
	Run(ctx context.Context, p auth.Principal, sandboxID string, req api.CodeRequest, emit func(api.CodeEvent) error) error
	// CreateContext makes a context and starts its kernel.
	CreateContext(ctx context.Context, p auth.Principal, sandboxID string, req api.CodeContextRequest) (api.CodeContext, error)
	// ListContexts returns the sandbox's contexts, oldest first.
	ListContexts(ctx context.Context, p auth.Principal, sandboxID string) ([]api.CodeContext, error)
	// DeleteContext kills a context's kernel and forgets the context.
	DeleteContext(ctx context.Context, p auth.Principal, sandboxID, contextID string) error
	// RestartContext replaces a context's kernel with a fresh one.
	RestartContext(ctx context.Context, p auth.Principal, sandboxID, contextID string) (api.CodeContext, error)
}

// registerCode adds the code-interpreter routes.
func (s *Server) registerCode(a func(handlerFunc) http.Handler) {
	s.handle("POST /v1/sandboxes/{id}/code", a(s.runCode))
	s.handle("POST /v1/sandboxes/{id}/contexts", a(s.createContext))
	s.handle("GET /v1/sandboxes/{id}/contexts", a(s.listContexts))
	s.handle("DELETE /v1/sandboxes/{id}/contexts/{cid}", a(s.deleteContext))
	s.handle("POST /v1/sandboxes/{id}/contexts/{cid}/restart", a(s.restartContext))
}

func (s *Server) codeService() (CodeService, error) {
	if s.cfg.Code == nil {
		return nil, errf(errdefs.ErrNotImplemented, "the code interpreter is not enabled on this server")
	}
	return s.cfg.Code, nil
}

// runCode streams a cell's events as NDJSON, one flushed line per event.
// The status line waits for the first event, so that a request refused
// before the cell ran gets a proper error status and body.
func (s *Server) runCode(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	cs, err := s.codeService()
	if err != nil {
		return err
	}
	var req api.CodeRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	ctx, cancel := s.streamContext(r)
	defer cancel()
	rc := http.NewResponseController(w)
	started := false
	var line []byte
	err = cs.Run(ctx, p, r.PathValue("id"), req, func(ev api.CodeEvent) error {
		if !started {
			started = true
			h := w.Header()
			h.Set("Content-Type", ndjsonType)
			h.Set("Cache-Control", "no-cache")
			h.Set("X-Accel-Buffering", "no")
			w.WriteHeader(http.StatusOK)
		}
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		line = append(append(line[:0], b...), '\n')
		if _, err := w.Write(line); err != nil {
			return err
		}
		return rc.Flush()
	})
	if started {
		if err != nil {
			s.log.Debug("code stream ended early", "sandbox_id", r.PathValue("id"), "err", err)
		}
		return nil
	}
	return err
}

func (s *Server) createContext(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	cs, err := s.codeService()
	if err != nil {
		return err
	}
	var req api.CodeContextRequest
	if err := decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	c, err := cs.CreateContext(r.Context(), p, r.PathValue("id"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, c)
	return nil
}

func (s *Server) listContexts(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	cs, err := s.codeService()
	if err != nil {
		return err
	}
	list, err := cs.ListContexts(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	if list == nil {
		list = []api.CodeContext{}
	}
	writeJSON(w, http.StatusOK, api.CodeContextList{Contexts: list})
	return nil
}

func (s *Server) deleteContext(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	cs, err := s.codeService()
	if err != nil {
		return err
	}
	if err := cs.DeleteContext(r.Context(), p, r.PathValue("id"), r.PathValue("cid")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) restartContext(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	cs, err := s.codeService()
	if err != nil {
		return err
	}
	c, err := cs.RestartContext(r.Context(), p, r.PathValue("id"), r.PathValue("cid"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, c)
	return nil
}
