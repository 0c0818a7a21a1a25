package httpapi

import (
	"context"
	"net/http"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// poolService is the warm pools' side of the sandbox service
// (sandbox.Service implements it). tenant is "" for the caller's own; an
// admin key may name another.
type poolService interface {
	PutPool(ctx context.Context, p auth.Principal, tenant, name string, req api.PutPoolRequest) (api.Pool, bool, error)
	GetPool(ctx context.Context, p auth.Principal, tenant, name string) (api.Pool, error)
	ListPools(ctx context.Context, p auth.Principal, tenant string) (api.PoolList, error)
	DeletePool(ctx context.Context, p auth.Principal, tenant, name string) error
}

// registerPools serves warm pools (issue 15, docs/pools.md).
func (s *Server) registerPools(a func(handlerFunc) http.Handler) {
	s.handle("GET /v1/pools", a(s.listPools))
	s.handle("PUT /v1/pools/{name}", a(s.putPool))
	s.handle("GET /v1/pools/{name}", a(s.getPool))
	s.handle("DELETE /v1/pools/{name}", a(s.deletePool))
}

func (s *Server) pools() (poolService, error) {
	ps, ok := s.sandboxes.(poolService)
	if !ok {
		return nil, errf(errdefs.ErrCapabilityUnsupported, "warm pools are not available on this server")
	}
	return ps, nil
}

func (s *Server) putPool(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	ps, err := s.pools()
	if err != nil {
		return err
	}
	var req api.PutPoolRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	out, _, err := ps.PutPool(r.Context(), p, r.URL.Query().Get("tenant"), r.PathValue("name"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getPool(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	ps, err := s.pools()
	if err != nil {
		return err
	}
	out, err := ps.GetPool(r.Context(), p, r.URL.Query().Get("tenant"), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) listPools(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	ps, err := s.pools()
	if err != nil {
		return err
	}
	out, err := ps.ListPools(r.Context(), p, r.URL.Query().Get("tenant"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) deletePool(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	ps, err := s.pools()
	if err != nil {
		return err
	}
	if err := ps.DeletePool(r.Context(), p, r.URL.Query().Get("tenant"), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
