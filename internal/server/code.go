package server

import "net/http"

// CodeService runs code-interpreter cells in a sandbox's contexts.
type CodeService interface{}

// registerCode adds the code-interpreter routes.
func (s *Server) registerCode(a func(handlerFunc) http.Handler) {}
