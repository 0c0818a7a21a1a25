package server

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/manager"
)

// Codes this server adds to API.md's list (add codes, never rename).
const (
	codeUnavailable    = api.CodeUnavailable    // 503: a dependency (an agent, the store) does not answer
	codeNotImplemented = api.CodeNotImplemented // 501
	codeMethodNotAllow = api.CodeMethodNotAllowed
)

// classified is what an error becomes at the edge.
type classified struct {
	status     int
	code       string
	message    string
	retryAfter time.Duration
}

// classes maps error classes to status and code, most specific first. Only
// this table turns errdefs classes into HTTP (containerd's errhttp).
var classes = []struct {
	err    error
	status int
	code   string
	msg    string // the message when the error carries no public one
}{
	{manager.ErrSandboxNotFound, http.StatusNotFound, api.CodeSandboxNotFound, "sandbox not found"},
	{manager.ErrExecNotFound, http.StatusNotFound, api.CodeExecNotFound, "exec not found"},
	{manager.ErrTemplateNotFound, http.StatusNotFound, api.CodeTemplateNotFound, "template not found"},
	{errdefs.ErrNotFound, http.StatusNotFound, api.CodeNotFound, "not found"},
	{errdefs.ErrTemplateUnsupported, http.StatusBadRequest, api.CodeTemplateUnsupported, "the sandbox's template does not support this"},
	{errdefs.ErrInvalidArgument, http.StatusBadRequest, api.CodeInvalidArgument, "invalid argument"},
	{errdefs.ErrUnauthenticated, http.StatusUnauthorized, api.CodeUnauthenticated, "missing or invalid api key"},
	{errdefs.ErrPermissionDenied, http.StatusForbidden, api.CodePermissionDenied, "permission denied"},
	{errdefs.ErrAlreadyExists, http.StatusConflict, api.CodeConflict, "already exists"},
	{errdefs.ErrConflict, http.StatusConflict, api.CodeConflict, "conflict"},
	{errdefs.ErrInvalidState, http.StatusConflict, api.CodeInvalidState, "invalid state"},
	{errdefs.ErrTooLarge, http.StatusRequestEntityTooLarge, api.CodePayloadTooLarge, "payload too large"},
	{errdefs.ErrQuotaExceeded, http.StatusTooManyRequests, api.CodeQuotaExceeded, "quota exceeded"},
	{errdefs.ErrRateLimited, http.StatusTooManyRequests, api.CodeRateLimited, "rate limited"},
	{errdefs.ErrCapacityExhausted, http.StatusServiceUnavailable, api.CodeCapacityExhausted, "host is at capacity"},
	// A runtime the host lacks is permanent; one it has but that fails
	// now (unhealthy) may recover: only that one is retryable.
	{errdefs.ErrRuntimeAbsent, http.StatusBadRequest, api.CodeRuntimeUnavailable, "runtime not available on this host"},
	{errdefs.ErrRuntimeUnavailable, http.StatusServiceUnavailable, api.CodeRuntimeUnavailable, "runtime unavailable"},
	{manager.ErrAgentUnavailable, http.StatusServiceUnavailable, api.CodeAgentUnavailable, "sandbox agent is unavailable"},
	{manager.ErrTemplateBuilding, http.StatusServiceUnavailable, api.CodeTemplateBuilding, "template is being built"},
	{manager.ErrTemplateBuildFailed, http.StatusFailedDependency, api.CodeTemplateBuildFailed, "template build failed"},
	{errdefs.ErrUnavailable, http.StatusServiceUnavailable, codeUnavailable, "service unavailable"},
	{errdefs.ErrNotImplemented, http.StatusNotImplemented, codeNotImplemented, "not implemented"},
}

// classify turns err into status, code and a client-safe message. The
// message is the error's public message when it has one (manager's
// PublicError, or an agent's message, which by protocol is safe for the
// sandbox's user), else a fixed text per class: raw error text never
// reaches the client, since it may hold host paths.
func classify(err error) classified {
	c := classified{status: http.StatusInternalServerError, code: api.CodeInternal, message: "internal error"}
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return classified{status: http.StatusRequestEntityTooLarge, code: api.CodePayloadTooLarge,
			message: "request body exceeds " + strconv.FormatInt(mbe.Limit, 10) + " bytes"}
	case errors.Is(err, context.DeadlineExceeded):
		return classified{status: http.StatusServiceUnavailable, code: codeUnavailable, message: "timed out", retryAfter: retryAfterDefault}
	}
	for _, cl := range classes {
		if errors.Is(err, cl.err) {
			c = classified{status: cl.status, code: cl.code, message: cl.msg}
			break
		}
	}
	var (
		pe  *manager.PublicError
		ae  *agentproto.Error
		pm  *publicMsg
		rle *auth.RateLimitError
	)
	switch {
	case errors.As(err, &pe):
		c.message, c.retryAfter = pe.Msg, pe.RetryAfter
	case errors.As(err, &rle):
		c.message, c.retryAfter = rle.Error(), rle.RetryAfter
	case errors.As(err, &pm):
		c.message = pm.msg
	case errors.As(err, &ae) && c.status != http.StatusInternalServerError:
		c.message = ae.Message
	}
	if c.retryAfter == 0 && (c.status == http.StatusServiceUnavailable || c.status == http.StatusTooManyRequests) {
		c.retryAfter = retryAfterOf(c.code)
	}
	return c
}

// Retry-After of the retryable answers that give none of their own. A 503
// is only ever a transient condition (docs/api.md promises Retry-After on
// every one); what can never succeed as asked is a 4xx.
const (
	// retryAfterDefault: capacity, rate and quota limits, an agent that
	// did not answer, a store that was busy, a timeout: seconds.
	retryAfterDefault = 5 * time.Second
	// retryAfterRuntime: an unhealthy runtime is probed again after the
	// manager's health TTL (30 s); asking sooner gets the same answer.
	retryAfterRuntime = 30 * time.Second
)

func retryAfterOf(code string) time.Duration {
	if code == api.CodeRuntimeUnavailable {
		return retryAfterRuntime
	}
	return retryAfterDefault
}

// publicMsg is an error the server itself raises with a client-safe text.
type publicMsg struct {
	msg string
	cls error
}

func (p *publicMsg) Error() string { return p.msg }
func (p *publicMsg) Unwrap() error { return p.cls }

// errf returns a server error of class cls with a client-safe message.
func errf(cls error, msg string) error { return &publicMsg{msg: msg, cls: cls} }

// writeError sends err as the API's error body. The full error goes to the
// log (at error level for 5xx), never to the client.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	c := classify(err)
	log := logFrom(r.Context())
	switch {
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The client went away; nobody reads the answer.
		log.Debug("request cancelled by client", "err", err)
		c.status, c.code, c.message = 499, "cancelled", "request cancelled"
	case c.status >= 500:
		log.Error("request failed", "status", c.status, "code", c.code, "err", err)
	default:
		log.Debug("request refused", "status", c.status, "code", c.code, "err", err)
	}
	s.metrics.observeError(c.code)
	body := api.ErrorBody{Error: api.ErrorDetail{
		Code: c.code, Message: c.message, RequestID: requestIDFrom(r.Context()),
	}}
	if strings.Contains(r.Pattern, " /v1/sandboxes/{id}") && c.status != http.StatusUnauthorized {
		// The client's own input echoed: the same for a missing sandbox and
		// another tenant's, so it reveals nothing.
		body.Error.SandboxID = r.PathValue("id")
	}
	if be := (*manager.TemplateBuildError)(nil); errors.As(err, &be) {
		body.Error.BuildID = be.BuildID
	}
	if c.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((c.retryAfter+time.Second-1)/time.Second)))
	}
	writeJSON(w, c.status, body)
}

// writeJSON sends v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	if err := enc.Encode(v); err != nil {
		slog.Debug("writing response", "err", err)
	}
}
