package e2b

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// executeRequest is the body of POST /execute.
type executeRequest struct {
	Code      string            `json:"code"`
	ContextID *string           `json:"context_id,omitempty"`
	Language  string            `json:"language,omitempty"`
	EnvVars   map[string]string `json:"env_vars,omitempty"`
}

// contextInfo is the code interpreter's Context.
type contextInfo struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func contextOf(c api.CodeContext) contextInfo {
	return contextInfo{ID: c.ID, Language: c.Language, Cwd: c.Cwd}
}

func (h *Handler) codeMux() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /execute", h.execute)
	mux.HandleFunc("POST /contexts", h.createContext)
	mux.HandleFunc("GET /contexts", h.listContexts)
	mux.HandleFunc("DELETE /contexts/{cid}", h.deleteContext)
	mux.HandleFunc("POST /contexts/{cid}/restart", h.restartContext)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h.writeError(w, r, errf(errdefs.ErrNotFound, "airlock does not serve %s %s of the code interpreter", r.Method, r.URL.Path))
	})
	return mux
}

// noCode answers when the daemon has no code interpreter.
func (h *Handler) noCode(w http.ResponseWriter, r *http.Request) bool {
	if h.cfg.Code != nil {
		return false
	}
	h.writeError(w, r, errf(errdefs.ErrNotImplemented, "this airlock has no code interpreter"))
	return true
}

// execute runs a cell and streams its events as the code interpreter's
// NDJSON lines, which the SDK reads until the body ends.
func (h *Handler) execute(w http.ResponseWriter, r *http.Request) {
	if h.noCode(w, r) {
		return
	}
	t := targetFrom(r.Context())
	var body executeRequest
	if err := decodeJSON(r, &body); err != nil {
		h.writeError(w, r, err)
		return
	}
	// env_vars are the cell's own (the code service sets them for the
	// cell and restores the context's afterwards); they are validated
	// there like airlock's own /code env.
	req := api.CodeRequest{Code: body.Code, Language: body.Language, ContextID: body.ContextID, Env: body.EnvVars}
	started := false
	enc := json.NewEncoder(w)
	rc := http.NewResponseController(w)
	emit := func(ev api.CodeEvent) error {
		if !started {
			started = true
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
		}
		for _, line := range codeLines(ev) {
			if err := enc.Encode(line); err != nil {
				return err
			}
		}
		return rc.Flush()
	}
	err := h.cfg.Code.Run(r.Context(), t.p, t.id, req, emit)
	if err != nil && !started {
		h.writeError(w, r, err)
		return
	}
	if err != nil {
		// Mid-stream: the status is sent; say it as an error line.
		a := classify(err)
		h.logError(r.Context(), a.E2BStatus, err)
		enc.Encode(map[string]any{"type": "error", "name": "AirlockError", "value": a.Message, "traceback": ""})
	}
}

// codeLines turns one airlock code event into the code interpreter's lines.
func codeLines(ev api.CodeEvent) []map[string]any {
	now := time.Now().UnixMicro()
	switch ev.Type {
	case api.CodeEventStdout, api.CodeEventStderr:
		return []map[string]any{{"type": ev.Type, "text": ev.Text, "timestamp": now}}
	case api.CodeEventError:
		return []map[string]any{{"type": "error", "name": ev.Name, "value": ev.Value, "traceback": ev.Traceback}}
	case api.CodeEventEnd:
		return []map[string]any{
			{"type": "number_of_executions", "execution_count": ev.ExecutionCount},
			{"type": "end_of_execution"},
		}
	case api.CodeEventResult:
		m := map[string]any{"type": "result", "is_main_result": ev.IsMainResult}
		for k, v := range map[string]string{"text": ev.Text, "html": ev.HTML, "markdown": ev.Markdown, "svg": ev.SVG,
			"png": ev.PNG, "jpeg": ev.JPEG, "latex": ev.LaTeX, "javascript": ev.JavaScript} {
			if v != "" {
				m[k] = v
			}
		}
		if len(ev.JSON) > 0 {
			m["json"] = ev.JSON
		}
		if len(ev.Chart) > 0 {
			m["chart"] = ev.Chart
		}
		if len(ev.Data) > 0 {
			m["data"] = ev.Data
		}
		return []map[string]any{m}
	}
	return nil
}

func (h *Handler) createContext(w http.ResponseWriter, r *http.Request) {
	if h.noCode(w, r) {
		return
	}
	t := targetFrom(r.Context())
	var body api.CodeContextRequest
	if err := decodeJSON(r, &body); err != nil {
		h.writeError(w, r, err)
		return
	}
	c, err := h.cfg.Code.CreateContext(r.Context(), t.p, t.id, body)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, contextOf(c))
}

func (h *Handler) listContexts(w http.ResponseWriter, r *http.Request) {
	if h.noCode(w, r) {
		return
	}
	t := targetFrom(r.Context())
	cl, err := h.cfg.Code.ListContexts(r.Context(), t.p, t.id)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	out := make([]contextInfo, 0, len(cl))
	for _, c := range cl {
		out = append(out, contextOf(c))
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) deleteContext(w http.ResponseWriter, r *http.Request) {
	if h.noCode(w, r) {
		return
	}
	t := targetFrom(r.Context())
	if err := h.cfg.Code.DeleteContext(r.Context(), t.p, t.id, r.PathValue("cid")); err != nil {
		h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *Handler) restartContext(w http.ResponseWriter, r *http.Request) {
	if h.noCode(w, r) {
		return
	}
	t := targetFrom(r.Context())
	if _, err := h.cfg.Code.RestartContext(r.Context(), t.p, t.id, r.PathValue("cid")); err != nil {
		h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
