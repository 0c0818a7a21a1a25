package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/api"
)

// Error classes. An *APIError matches exactly one of them with errors.Is
// (invalid_state also matches ErrConflict: both are 409). They are this
// SDK's own values: the server's classes stay inside the server, and what
// crosses the wire is the stable API code (api.Code*), which codeClass maps
// back to a class.
var (
	ErrInvalidArgument    = errors.New("invalid argument")    // 400 invalid_argument
	ErrUnauthenticated    = errors.New("unauthenticated")     // 401 unauthenticated
	ErrPermissionDenied   = errors.New("permission denied")   // 403 permission_denied
	ErrNotFound           = errors.New("not found")           // 404 *_not_found
	ErrConflict           = errors.New("conflict")            // 409 conflict
	ErrInvalidState       = errors.New("invalid state")       // 409 invalid_state
	ErrAlreadyExists      = errors.New("already exists")      // 409 already_exists
	ErrTooLarge           = errors.New("payload too large")   // 413 payload_too_large
	ErrQuotaExceeded      = errors.New("quota exceeded")      // 429 quota_exceeded
	ErrRateLimited        = errors.New("rate limited")        // 429 rate_limited
	ErrInternal           = errors.New("internal error")      // 500 internal
	ErrNotImplemented     = errors.New("not implemented")     // 501 not_implemented
	ErrCapacityExhausted  = errors.New("capacity exhausted")  // 503 capacity_exhausted
	ErrRuntimeUnavailable = errors.New("runtime unavailable") // runtime_unavailable: 400 absent, 503 unhealthy
	ErrUnavailable        = errors.New("unavailable")         // server unreachable, 502/504, other 503
)

// Finer errors of one API code each: an *APIError of that code matches
// both its class above and this (errors.Is(err, ErrSandboxNotFound) and
// errors.Is(err, ErrNotFound) for sandbox_not_found).
var (
	ErrSandboxNotFound  = errors.New("sandbox not found")  // 404 sandbox_not_found
	ErrExecNotFound     = errors.New("exec not found")     // 404 exec_not_found
	ErrTemplateNotFound = errors.New("template not found") // 404 template_not_found
	// ErrTemplateBuilding is a create refused while its template is being
	// built (503 template_building, with Retry-After and the build's id,
	// BuildOf); it is also ErrUnavailable.
	ErrTemplateBuilding = errors.New("template building")
)

// codeErrors are the finer errors by API code.
var codeErrors = map[string]error{
	api.CodeSandboxNotFound:  ErrSandboxNotFound,
	api.CodeExecNotFound:     ErrExecNotFound,
	api.CodeTemplateNotFound: ErrTemplateNotFound,
	api.CodeTemplateBuilding: ErrTemplateBuilding,
}

// How a command ended when it did not succeed: an *ExecError matches one
// of them (Sandbox.Run and Command.Wait return one for a timeout,
// CommandResult.Err for every end but a zero exit). They are exec outcomes
// (the result's status), not API errors: the call itself succeeded.
var (
	ErrExecTimeout = errors.New("command timed out")                     // status timeout, error_code exec_timeout
	ErrExecKilled  = errors.New("command killed")                        // status killed (a signal, or its sandbox stopped)
	ErrOutOfMemory = errors.New("command ran out of memory")             // status oom
	ErrExecFailed  = errors.New("command could not start")               // status error, error_code exec_failed (exit 126/127)
	ErrExitStatus  = errors.New("command exited with a non-zero status") // status exited, exit code not 0
)

// codeAlreadyExists is a code the server may add for ErrAlreadyExists
// (it answers conflict today); the SDK knows it ahead.
const codeAlreadyExists = "already_exists"

// codeClass maps the API's stable error codes to classes: the inverse of
// the server's one table (internal/errdefs/edge, which this module cannot
// import). A test there (TestSDKAgrees) fails when the two disagree on any
// code the server sends.
var codeClass = map[string]error{
	api.CodeInvalidArgument:    ErrInvalidArgument,
	api.CodeUnauthenticated:    ErrUnauthenticated,
	api.CodePermissionDenied:   ErrPermissionDenied,
	api.CodeSandboxNotFound:    ErrNotFound,
	api.CodeExecNotFound:       ErrNotFound,
	api.CodeTemplateNotFound:   ErrNotFound,
	api.CodeNotFound:           ErrNotFound,
	api.CodeConflict:           ErrConflict,
	api.CodeInvalidState:       ErrInvalidState,
	codeAlreadyExists:          ErrAlreadyExists,
	api.CodePayloadTooLarge:    ErrTooLarge,
	api.CodeQuotaExceeded:      ErrQuotaExceeded,
	api.CodeRateLimited:        ErrRateLimited,
	api.CodeCapacityExhausted:  ErrCapacityExhausted,
	api.CodeRuntimeUnavailable: ErrRuntimeUnavailable,
	api.CodeAgentUnavailable:   ErrUnavailable, // the sandbox runs but its agent does not answer
	api.CodeTemplateBuilding:   ErrUnavailable, // retry after Retry-After, or create with WaitForTemplate
	// A build that failed is not retried by asking again: its spec or the
	// host must change (the build's log says which).
	api.CodeTemplateBuildFailed: ErrInvalidArgument,
	api.CodeInternal:            ErrInternal,
	api.CodeNotImplemented:      ErrNotImplemented,
	api.CodeUnavailable:         ErrUnavailable,
	// The sandbox's template lacks what the request needs: change it.
	api.CodeTemplateUnsupported: ErrInvalidArgument,
	// The sandbox's runtime cannot do what is asked (a memory snapshot on
	// runc): ask for less, or use another runtime.
	api.CodeCapabilityUnsupported: ErrInvalidArgument,
}

// statusClass is the fallback for a code this SDK does not know (a newer
// server may add codes; it never renames them).
func statusClass(status int) error {
	switch {
	case status == http.StatusBadRequest:
		return ErrInvalidArgument
	case status == http.StatusUnauthorized:
		return ErrUnauthenticated
	case status == http.StatusForbidden:
		return ErrPermissionDenied
	case status == http.StatusNotFound:
		return ErrNotFound
	case status == http.StatusConflict:
		return ErrConflict
	case status == http.StatusRequestEntityTooLarge:
		return ErrTooLarge
	case status == http.StatusTooManyRequests:
		return ErrRateLimited
	case status == http.StatusNotImplemented:
		return ErrNotImplemented
	case status == http.StatusBadGateway, status == http.StatusServiceUnavailable, status == http.StatusGatewayTimeout:
		return ErrUnavailable
	case status >= 400 && status < 500:
		return ErrInvalidArgument
	default:
		return ErrInternal
	}
}

// APIError is a non-2xx answer of the server.
type APIError struct {
	StatusCode int    // HTTP status; 0 for an error event inside a stream
	Code       string // stable API error code, e.g. "sandbox_not_found"
	Message    string // client-safe message from the server
	RequestID  string // req_…, quote it when reporting a problem
	SandboxID  string // the sandbox concerned, when there is one
	// BuildID is the template build a create was refused for
	// (template_building, template_build_failed).
	BuildID string
	// RetryAfter is the server's Retry-After (429 and 503), 0 when absent.
	RetryAfter time.Duration
}

// Error implements error: "message (code)".
func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = strings.ToLower(http.StatusText(e.StatusCode))
	}
	if msg == "" {
		msg = "request failed"
	}
	return fmt.Sprintf("%s (%s)", msg, e.Code)
}

// Class returns the sentinel class of the error (ErrNotFound, …).
func (e *APIError) Class() error {
	if cls, ok := codeClass[e.Code]; ok {
		return cls
	}
	return statusClass(e.StatusCode)
}

// Is makes errors.Is(err, client.ErrNotFound) and friends work, and the
// finer errors of one code (ErrSandboxNotFound…).
func (e *APIError) Is(target error) bool {
	cls := e.Class()
	if target == cls {
		return true
	}
	if fine, ok := codeErrors[e.Code]; ok && target == fine {
		return true
	}
	// invalid_state is a kind of conflict (both 409).
	return cls == ErrInvalidState && target == ErrConflict
}

// RetryAfter returns how long the server asked the caller to wait, and
// whether err is an answer that may succeed later (429 rate/quota with
// Retry-After, 503 capacity_exhausted, or an unreachable server).
func RetryAfter(err error) (time.Duration, bool) {
	var ae *APIError
	if errors.As(err, &ae) {
		switch {
		case ae.RetryAfter > 0:
			return ae.RetryAfter, true
		case errors.Is(ae, ErrCapacityExhausted), errors.Is(ae, ErrRateLimited), errors.Is(ae, ErrUnavailable):
			return 0, true
		}
		return 0, false
	}
	var te *TransportError
	return 0, errors.As(err, &te)
}

// TemplateBuilding reports whether err is a create refused because its
// template is being built (a shipped template's first use starts that
// build): code template_building, 503 with Retry-After. A retry after the
// build succeeds; CreateSandboxRequest.WaitForTemplate makes the server
// wait instead. BuildOf names the build.
func TemplateBuilding(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Code == api.CodeTemplateBuilding
}

// BuildOf returns the id of the template build err is about (a create
// refused with template_building or template_build_failed), or "".
func BuildOf(err error) string {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.BuildID
	}
	return ""
}

// decodeError builds the *APIError of a non-2xx response.
func decodeError(resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	e := &APIError{
		StatusCode: resp.StatusCode,
		RequestID:  resp.Header.Get("X-Request-Id"),
		RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()),
	}
	var body api.ErrorBody
	if json.Unmarshal(raw, &body) == nil && body.Error.Code != "" {
		e.Code = body.Error.Code
		e.Message = body.Error.Message
		e.SandboxID = body.Error.SandboxID
		e.BuildID = body.Error.BuildID
		if body.Error.RequestID != "" {
			e.RequestID = body.Error.RequestID
		}
		return e
	}
	// Not our error body (a proxy in between, or an old server): keep a
	// short, single-line excerpt so the caller still learns something.
	e.Code = codeForStatus(resp.StatusCode)
	e.Message = excerpt(raw)
	return e
}

// codeForStatus names the class of a status for errors without a body.
func codeForStatus(status int) string {
	switch statusClass(status) {
	case ErrInvalidArgument:
		return api.CodeInvalidArgument
	case ErrUnauthenticated:
		return api.CodeUnauthenticated
	case ErrPermissionDenied:
		return api.CodePermissionDenied
	case ErrNotFound:
		return api.CodeNotFound
	case ErrConflict:
		return api.CodeConflict
	case ErrTooLarge:
		return api.CodePayloadTooLarge
	case ErrRateLimited:
		return api.CodeRateLimited
	case ErrNotImplemented:
		return api.CodeNotImplemented
	case ErrUnavailable:
		return api.CodeUnavailable
	default:
		return api.CodeInternal
	}
}

// excerpt returns the first line of b, at most 200 bytes, or "".
func excerpt(b []byte) string {
	s := strings.TrimSpace(string(b))
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		s = s[:i]
	}
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// parseRetryAfter reads a Retry-After header: delay-seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}
