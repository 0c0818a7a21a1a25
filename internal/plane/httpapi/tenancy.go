package httpapi

import (
	"net/http"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
)

// registerTenancy adds the tenant quota routes and gives the authenticator
// the configured default per-key rate limit (the manager's settings are
// the daemon's configuration, so the limit follows it wherever a Server is
// made).
func (s *Server) registerTenancy(a, admin func(handlerFunc) http.Handler) {
	cfg := s.sandboxes.Settings()
	s.auth.SetDefaultRateLimit(auth.RateLimit{RPS: cfg.KeyRateLimitRPS, Burst: cfg.KeyRateLimitBurst})

	s.handle("GET /v1/tenants/{tenant}/quotas", a(s.getTenantQuotas))
	s.handle("PUT /v1/tenants/{tenant}/quotas", admin(s.putTenantQuotas))
	s.handle("DELETE /v1/tenants/{tenant}/quotas", admin(s.deleteTenantQuotas))
}

// getTenantQuotas serves GET /v1/tenants/{tenant}/quotas: the tenant's
// quota and its usage now. A tenant key reads its own tenant's only.
func (s *Server) getTenantQuotas(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	out, err := s.accounting.TenantQuotas(r.Context(), p, r.PathValue("tenant"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// putTenantQuotas serves PUT /v1/tenants/{tenant}/quotas (admin): the
// tenant's override of the default quota, effective at once.
func (s *Server) putTenantQuotas(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req api.QuotaOverride
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	out, err := s.accounting.SetTenantQuotas(r.Context(), p, r.PathValue("tenant"), &req)
	if err != nil {
		return err
	}
	logFrom(r.Context()).Info("tenant quota set", "for_tenant", out.Tenant)
	writeJSON(w, http.StatusOK, out)
	return nil
}

// deleteTenantQuotas serves DELETE /v1/tenants/{tenant}/quotas (admin):
// the tenant gets the default quota again.
func (s *Server) deleteTenantQuotas(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	if _, err := s.accounting.SetTenantQuotas(r.Context(), p, r.PathValue("tenant"), nil); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
