package e2b

import (
	"net/http"
)

// registerTemplates serves E2B's templates API (v3 builds, status and
// logs, aliases, tags) over airlock's template builds: not yet.
func (h *Handler) registerTemplates(mux *http.ServeMux, a func(controlFunc) http.Handler) {}
