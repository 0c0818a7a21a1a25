package server

import "net/http"

// registerPreview adds the preview URL routes of the API.
func (s *Server) registerPreview(a func(handlerFunc) http.Handler) {}
