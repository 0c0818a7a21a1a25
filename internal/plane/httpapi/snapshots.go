package httpapi

import "net/http"

// registerSnapshots serves snapshots, fork and reset (issue 15): not yet.
func (s *Server) registerSnapshots(a func(handlerFunc) http.Handler) {}
