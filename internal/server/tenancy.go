package server

import "net/http"

// registerTenancy adds the tenant quota routes.
func (s *Server) registerTenancy(a, admin func(handlerFunc) http.Handler) {}
