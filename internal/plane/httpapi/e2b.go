package httpapi

import (
	"net/http"

	"github.com/airlockhq/airlock/internal/plane/e2b"
)

// e2bPlane sends the requests of the E2B-compatible planes to cfg.E2B and
// everything else to next: any request that names a sandbox in the
// E2b-Sandbox-Id header (the SDKs' sandbox plane: envd, the code
// interpreter, sandbox ports), and the E2B control-plane paths (/sandboxes,
// /v2/sandboxes…), none of which collide with /v1/ or the service routes.
func (s *Server) e2bPlane(next http.Handler) http.Handler {
	if s.cfg.E2B == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		plane := ""
		switch {
		case e2b.IsSandboxPlane(r), e2b.IsSignedFiles(r):
			plane = "e2b sandbox plane"
		case e2b.IsControlPlane(r):
			plane = "e2b control plane"
		}
		if plane != "" {
			if rs := stateFrom(r.Context()); rs != nil {
				rs.route = plane
			}
			s.cfg.E2B.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}
