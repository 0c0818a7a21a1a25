package httpapi

import (
	"net/http"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// updateNetwork serves PUT /v1/sandboxes/{id}/network: the sandbox's new
// egress policy, effective at once.
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req api.Network
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.Mode == "" {
		// An empty body is not "no network": it is a policy that says nothing.
		return errf(errdefs.ErrInvalidArgument, "network mode is required: none, allowlist or open")
	}
	sb, err := s.sandboxes.UpdateNetwork(r.Context(), p, r.PathValue("id"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sb)
	return nil
}

// getTenantNetwork serves GET /v1/tenants/{tenant}/network.
func (s *Server) getTenantNetwork(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	out, err := s.networks.TenantNetwork(r.Context(), p, r.PathValue("tenant"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// putTenantNetwork serves PUT /v1/tenants/{tenant}/network (admin): the
// policy the tenant's sandboxes get when their create names no mode.
func (s *Server) putTenantNetwork(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req api.Network
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	out, err := s.networks.SetTenantNetwork(r.Context(), p, r.PathValue("tenant"), &req)
	if err != nil {
		return err
	}
	logFrom(r.Context()).Info("tenant default network set", "for_tenant", out.Tenant, "mode", req.Mode)
	writeJSON(w, http.StatusOK, out)
	return nil
}

// deleteTenantNetwork serves DELETE /v1/tenants/{tenant}/network (admin):
// the tenant's sandboxes get the server's default again.
func (s *Server) deleteTenantNetwork(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	if _, err := s.networks.SetTenantNetwork(r.Context(), p, r.PathValue("tenant"), nil); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
