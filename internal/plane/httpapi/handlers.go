package httpapi

import (
	"net/http"
	"strings"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/sandbox"
)

// errorBody builds an error body for r outside writeError.
func errorBody(r *http.Request, code, msg string) api.ErrorBody {
	return api.ErrorBody{Error: api.ErrorDetail{Code: code, Message: msg, RequestID: requestIDFrom(r.Context())}}
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) error {
	if err := s.sandboxes.Ready(r.Context()); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	return nil
}

func (s *Server) info(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	info := s.sandboxes.Info(r.Context(), s.cfg.Version)
	if p.Admin {
		info.Host = s.cfg.Host
	}
	writeJSON(w, http.StatusOK, info)
	return nil
}

// Keys.

func keyView(k auth.Key) api.Key {
	return api.Key{ID: k.ID, Tenant: k.Tenant, Name: k.Name, Admin: k.Admin, Prefix: k.Prefix,
		CreatedAt: k.CreatedAt, RevokedAt: k.RevokedAt, RateLimitRPS: k.RateLimitRPS, RateLimitBurst: k.RateLimitBurst}
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req api.CreateKeyRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	c, err := s.auth.CreateKey(r.Context(), req.Tenant, req.Name, req.Admin, auth.KeyRateLimit(req.RateLimitRPS, req.RateLimitBurst))
	if err != nil {
		if errdefs.IsInvalidArgument(err) {
			return errf(errdefs.ErrInvalidArgument, strings.TrimPrefix(err.Error(), errdefs.ErrInvalidArgument.Error()+": "))
		}
		return err
	}
	logFrom(r.Context()).Info("api key created", "key_id", c.ID, "for_tenant", c.Tenant, "admin", c.Admin)
	out := keyView(c.Key)
	out.Key = c.Secret
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusCreated, out)
	return nil
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	keys, err := s.auth.List(r.Context(), p)
	if err != nil {
		return err
	}
	out := api.KeyList{Keys: make([]api.Key, 0, len(keys))}
	for _, k := range keys {
		out.Keys = append(out.Keys, keyView(k))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) deleteKey(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	id := r.PathValue("kid")
	if err := s.auth.Revoke(r.Context(), p, id); err != nil {
		if errdefs.IsNotFound(err) {
			return errf(errdefs.ErrNotFound, "key not found")
		}
		return err
	}
	logFrom(r.Context()).Info("api key revoked", "key_id", id)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// Sandboxes.

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req api.CreateSandboxRequest
	if err := decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	res, err := s.sandboxes.Create(r.Context(), p, req, r.Header.Get("Idempotency-Key"))
	if err != nil {
		return err
	}
	if res.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.Header().Set("Location", "/v1/sandboxes/"+res.Sandbox.ID)
	writeJSON(w, http.StatusCreated, res.Sandbox)
	return nil
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	q := r.URL.Query()
	f := sandbox.ListFilter{Cursor: q.Get("cursor")}
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			if st = strings.TrimSpace(st); st != "" {
				f.States = append(f.States, st)
			}
		}
	}
	for k, vs := range q {
		if name, ok := strings.CutPrefix(k, "metadata."); ok && len(vs) > 0 {
			if f.Metadata == nil {
				f.Metadata = map[string]string{}
			}
			f.Metadata[name] = vs[0]
		}
	}
	var err error
	if f.Limit, err = queryInt(r, "limit", 0); err != nil {
		return err
	}
	out, err := s.sandboxes.List(r.Context(), p, f)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	sb, err := s.sandboxes.Get(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sb)
	return nil
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	if err := s.sandboxes.Delete(r.Context(), p, r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) sandboxMetrics(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	since, err := queryTime(r, "since")
	if err != nil {
		return err
	}
	mt, err := s.accounting.MetricsSeries(r.Context(), p, r.PathValue("id"), since)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, mt)
	return nil
}

// usage serves GET /v1/usage: the caller's tenant's metered usage, or for
// an admin key a tenant's (tenant=) or everyone's.
func (s *Server) usage(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	from, err := queryTime(r, "from")
	if err != nil {
		return err
	}
	to, err := queryTime(r, "to")
	if err != nil {
		return err
	}
	q := r.URL.Query()
	rep, err := s.accounting.Usage(r.Context(), p, q.Get("tenant"), from, to, q.Get("group_by"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, rep)
	return nil
}
