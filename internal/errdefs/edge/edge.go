// Package edge is the one error edge of airlock's planes: the table that maps each errdefs class to its HTTP status and API error code (the HTTP API), its status and Connect code (the E2B planes), a default client-safe message and its Retry-After.
//
// Services raise errdefs classes, with an *errdefs.Public when the client
// may read the message; a plane calls Classify and encodes the Answer in
// its own shape (the API's error body, E2B's REST body, a Connect error).
// No plane keeps a table of its own. The Go SDK (client/, a module of its
// own) keeps the inverse, code → class; a test of this package fails when
// the two disagree.
package edge

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"connectrpc.com/connect"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// Retry-After of the retryable answers whose error gives none of its own.
// A 503 is only ever a transient condition (docs/api.md promises
// Retry-After on every 429 and 503); what can never succeed as asked is a
// 4xx.
const (
	// RetryDefault: capacity, rate and quota limits, an agent that did not
	// answer, a store that was busy, a timeout: seconds.
	RetryDefault = 5 * time.Second
	// RetryRuntime: an unhealthy runtime is probed again after the
	// manager's health TTL (30 s); asking sooner gets the same answer.
	RetryRuntime = 30 * time.Second
)

// CodeCancelled is the API code of a request whose client went away (a
// 499 nobody reads; it shows in logs and metrics).
const CodeCancelled = "cancelled"

// StatusClientClosed is the status of a request whose client went away
// (nginx's 499).
const StatusClientClosed = 499

// Class is what one errdefs class becomes on every plane.
type Class struct {
	// Err is the errdefs class (errors.Is matches it and its subclasses).
	Err error
	// Status and Code are the HTTP API's answer.
	Status int
	Code   string
	// E2BStatus and Connect are the E2B planes' answer: the status of
	// their REST routes (control plane, envd's file routes) and the code
	// of their Connect RPCs.
	E2BStatus int
	Connect   connect.Code
	// Message is the client's message when the error carries no public
	// one: the raw error text never reaches a client (it may hold host
	// paths).
	Message string
	// RetryAfter is the Retry-After of an answer of this class whose
	// status is retryable (429, 503) on the plane that sends it and whose
	// error names none.
	RetryAfter time.Duration
}

// Table holds the classes, most specific first: Classify takes the first
// row whose Err the error is. Subclasses come before their parents.
var Table = []Class{
	{errdefs.ErrSandboxNotFound, http.StatusNotFound, api.CodeSandboxNotFound, http.StatusNotFound, connect.CodeNotFound, "sandbox not found", 0},
	{errdefs.ErrExecNotFound, http.StatusNotFound, api.CodeExecNotFound, http.StatusNotFound, connect.CodeNotFound, "exec not found", 0},
	{errdefs.ErrTemplateNotFound, http.StatusNotFound, api.CodeTemplateNotFound, http.StatusNotFound, connect.CodeNotFound, "template not found", 0},
	{errdefs.ErrNotFound, http.StatusNotFound, api.CodeNotFound, http.StatusNotFound, connect.CodeNotFound, "not found", 0},
	{errdefs.ErrTemplateUnsupported, http.StatusBadRequest, api.CodeTemplateUnsupported, http.StatusBadRequest, connect.CodeInvalidArgument,
		"the sandbox's template does not support this", 0},
	{errdefs.ErrCapabilityUnsupported, http.StatusBadRequest, api.CodeCapabilityUnsupported, http.StatusBadRequest, connect.CodeInvalidArgument,
		"the sandbox's runtime does not support this", 0},
	// A build that failed is a dependency that failed (424), whose spec
	// must change; asking again does not help.
	{errdefs.ErrTemplateBuildFailed, http.StatusFailedDependency, api.CodeTemplateBuildFailed, http.StatusFailedDependency, connect.CodeFailedPrecondition,
		"template build failed", 0},
	{errdefs.ErrInvalidArgument, http.StatusBadRequest, api.CodeInvalidArgument, http.StatusBadRequest, connect.CodeInvalidArgument, "invalid argument", 0},
	{errdefs.ErrUnauthenticated, http.StatusUnauthorized, api.CodeUnauthenticated, http.StatusUnauthorized, connect.CodeUnauthenticated,
		"missing or invalid api key", 0},
	{errdefs.ErrPermissionDenied, http.StatusForbidden, api.CodePermissionDenied, http.StatusForbidden, connect.CodePermissionDenied, "permission denied", 0},
	{errdefs.ErrAlreadyExists, http.StatusConflict, api.CodeConflict, http.StatusConflict, connect.CodeAlreadyExists, "already exists", 0},
	{errdefs.ErrConflict, http.StatusConflict, api.CodeConflict, http.StatusConflict, connect.CodeAborted, "conflict", 0},
	{errdefs.ErrInvalidState, http.StatusConflict, api.CodeInvalidState, http.StatusConflict, connect.CodeFailedPrecondition, "invalid state", 0},
	{errdefs.ErrTooLarge, http.StatusRequestEntityTooLarge, api.CodePayloadTooLarge, http.StatusRequestEntityTooLarge, connect.CodeResourceExhausted,
		"payload too large", 0},
	// On the E2B planes a quota is a full sandbox disk: envd's 507, which
	// the E2B SDKs turn into NotEnoughSpaceError.
	{errdefs.ErrQuotaExceeded, http.StatusTooManyRequests, api.CodeQuotaExceeded, http.StatusInsufficientStorage, connect.CodeResourceExhausted,
		"quota exceeded", RetryDefault},
	{errdefs.ErrRateLimited, http.StatusTooManyRequests, api.CodeRateLimited, http.StatusTooManyRequests, connect.CodeResourceExhausted,
		"rate limited", RetryDefault},
	{errdefs.ErrCapacityExhausted, http.StatusServiceUnavailable, api.CodeCapacityExhausted, http.StatusServiceUnavailable, connect.CodeUnavailable,
		"host is at capacity", RetryDefault},
	// A runtime the host lacks is permanent; one it has but that fails
	// now (unhealthy) may recover: only that one is retryable.
	{errdefs.ErrRuntimeAbsent, http.StatusBadRequest, api.CodeRuntimeUnavailable, http.StatusBadRequest, connect.CodeFailedPrecondition,
		"runtime not available on this host", 0},
	{errdefs.ErrRuntimeUnavailable, http.StatusServiceUnavailable, api.CodeRuntimeUnavailable, http.StatusServiceUnavailable, connect.CodeUnavailable,
		"runtime unavailable", RetryRuntime},
	{errdefs.ErrAgentUnavailable, http.StatusServiceUnavailable, api.CodeAgentUnavailable, http.StatusServiceUnavailable, connect.CodeUnavailable,
		"sandbox agent is unavailable", RetryDefault},
	{errdefs.ErrTemplateBuilding, http.StatusServiceUnavailable, api.CodeTemplateBuilding, http.StatusServiceUnavailable, connect.CodeUnavailable,
		"template is being built", RetryDefault},
	{errdefs.ErrUnavailable, http.StatusServiceUnavailable, api.CodeUnavailable, http.StatusServiceUnavailable, connect.CodeUnavailable,
		"service unavailable", RetryDefault},
	{errdefs.ErrNotImplemented, http.StatusNotImplemented, api.CodeNotImplemented, http.StatusNotImplemented, connect.CodeUnimplemented, "not implemented", 0},
}

// The answers that no errdefs class names.
var (
	// Internal is every error without a class (and errdefs.ErrInternal).
	Internal = Class{errdefs.ErrInternal, http.StatusInternalServerError, api.CodeInternal, http.StatusInternalServerError, connect.CodeInternal,
		"internal error", 0}
	// Timeout is a deadline that passed (context.DeadlineExceeded), which
	// outranks the class of the error it ended: on the HTTP API a 503 to
	// retry, on the E2B planes the 504 and DeadlineExceeded their SDKs
	// expect. Err is the class an SDK sees (unavailable).
	Timeout = Class{errdefs.ErrUnavailable, http.StatusServiceUnavailable, api.CodeUnavailable, http.StatusGatewayTimeout, connect.CodeDeadlineExceeded,
		"timed out", RetryDefault}
	// Cancelled is a request whose client went away (context.Canceled).
	// A plane answers it only when its client has gone; nobody reads it.
	Cancelled = Class{context.Canceled, StatusClientClosed, CodeCancelled, StatusClientClosed, connect.CodeCanceled, "request cancelled", 0}
	// MethodNotAllowed is the HTTP API's answer to a route asked with a
	// method it does not serve (its router's, not a service's). An SDK
	// sees the client's mistake: invalid argument.
	MethodNotAllowed = Class{errdefs.ErrInvalidArgument, http.StatusMethodNotAllowed, api.CodeMethodNotAllowed, http.StatusMethodNotAllowed,
		connect.CodeUnimplemented, "method not allowed", 0}
)

// Answer is what one error becomes: its class's row, the client-safe
// message and what the error adds.
type Answer struct {
	Class
	// Message is the error's public message (the outermost
	// *errdefs.Public's), else the class's.
	Message string
	// RetryAfter is the error's own Retry-After, else the class's.
	RetryAfter time.Duration
	// BuildID and SandboxID are the Public's (empty when none).
	BuildID, SandboxID string
}

// Classify returns what err becomes at the edge. A deadline that passed
// is Timeout and a request body over its bound payload_too_large,
// whatever their class; then the first row of Table that err is; else
// Internal. context.Canceled is not special here: a plane whose client
// has gone answers Cancelled itself (a cancellation inside, while the
// client waits, is what its class says).
func Classify(err error) Answer {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		c := classOf(errdefs.ErrTooLarge)
		return Answer{Class: c, Message: "request body exceeds " + strconv.FormatInt(mbe.Limit, 10) + " bytes"}
	case errors.Is(err, context.DeadlineExceeded):
		return Answer{Class: Timeout, Message: Timeout.Message, RetryAfter: Timeout.RetryAfter}
	}
	a := Answer{Class: Internal}
	for _, c := range Table {
		if errors.Is(err, c.Err) {
			a.Class = c
			break
		}
	}
	a.Message, a.RetryAfter = a.Class.Message, a.Class.RetryAfter
	if pe := (*errdefs.Public)(nil); errors.As(err, &pe) {
		a.Message, a.BuildID, a.SandboxID = pe.Msg, pe.BuildID, pe.SandboxID
		if pe.RetryAfter > 0 {
			a.RetryAfter = pe.RetryAfter
		}
	}
	return a
}

// classOf returns the row of class cls.
func classOf(cls error) Class {
	for _, c := range Table {
		if c.Err == cls {
			return c
		}
	}
	return Internal
}

// Retryable reports whether status is one a client retries after
// Retry-After (429, 503).
func Retryable(status int) bool {
	return status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable
}

// RetryAfterHTTP is the answer's Retry-After on the HTTP API: set on every
// 429 and 503, never on another status.
func (a Answer) RetryAfterHTTP() time.Duration { return a.retryAfter(a.Status) }

// RetryAfterE2B is the answer's Retry-After on the E2B planes, REST and
// Connect alike: set when its E2B status is 429 or 503.
func (a Answer) RetryAfterE2B() time.Duration { return a.retryAfter(a.E2BStatus) }

func (a Answer) retryAfter(status int) time.Duration {
	if !Retryable(status) {
		return 0
	}
	if a.RetryAfter > 0 {
		return a.RetryAfter
	}
	return RetryDefault
}

// Seconds formats d as a Retry-After header value: whole seconds, rounded
// up, "" for none.
func Seconds(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return strconv.Itoa(int((d + time.Second - 1) / time.Second))
}
