// Package errdefs defines the error classes shared by every layer of airlock, and Public, the one error that carries a message safe to show to a client.
//
// Code below the HTTP edge wraps one of these sentinels with %w and context;
// only the planes turn a class into an HTTP status, an API error code or a
// Connect code, through the one table in errdefs/edge.
package errdefs

import (
	"errors"
	"fmt"
)

// The classes. Each maps to one API error code family (see ../../api/openapi.yaml).
var (
	ErrNotFound           = errors.New("not found")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrAlreadyExists      = errors.New("already exists")
	ErrConflict           = errors.New("conflict")
	ErrInvalidState       = errors.New("invalid state")
	ErrUnauthenticated    = errors.New("unauthenticated")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrTooLarge           = errors.New("payload too large")
	ErrQuotaExceeded      = errors.New("quota exceeded")
	ErrRateLimited        = errors.New("rate limited")
	ErrCapacityExhausted  = errors.New("capacity exhausted")
	ErrRuntimeUnavailable = errors.New("runtime unavailable")
	ErrUnavailable        = errors.New("unavailable")
	ErrNotImplemented     = errors.New("not implemented")
	ErrInternal           = errors.New("internal error")
)

// Subclasses: each is also its parent class (errors.Is), and says more
// precisely what the client must change. Retryable (503) errors are only the
// transient ones: a request that can never succeed as it is gets a 4xx.
// Every subclass has exactly one parent among the classes above: it is the
// class a client that does not know the subclass sees (the Go SDK's).
var (
	// ErrSandboxNotFound, ErrExecNotFound, ErrTemplateNotFound: what is
	// not found, so that the API can say sandbox_not_found, exec_not_found
	// or template_not_found. Kinds of ErrNotFound.
	ErrSandboxNotFound  = fmt.Errorf("%w: sandbox", ErrNotFound)
	ErrExecNotFound     = fmt.Errorf("%w: exec", ErrNotFound)
	ErrTemplateNotFound = fmt.Errorf("%w: template", ErrNotFound)
	// ErrTemplateUnsupported: the sandbox's template lacks what the request
	// needs (code on a template without a kernel). Permanent for that
	// sandbox: use another template. A kind of ErrInvalidArgument.
	ErrTemplateUnsupported = fmt.Errorf("template unsupported: %w", ErrInvalidArgument)
	// ErrCapabilityUnsupported: the sandbox's runtime cannot do what the
	// request asks (a memory snapshot, a pause to disk or a fork where its
	// Capabilities say no). Permanent for that runtime: ask for less or
	// use another runtime; never answered by silently doing less. A kind
	// of ErrInvalidArgument.
	ErrCapabilityUnsupported = fmt.Errorf("capability unsupported: %w", ErrInvalidArgument)
	// ErrTemplateBuildFailed: a create waited for its template's build,
	// which failed. Asking again does not help: the template's spec (or
	// the host) must change, as the build's log says. A kind of
	// ErrInvalidArgument.
	ErrTemplateBuildFailed = fmt.Errorf("template build failed: %w", ErrInvalidArgument)
	// ErrRuntimeAbsent: this host has no such runtime (not built in, not
	// installed, or it cannot run here at all). Permanent: ask for another
	// runtime. A kind of ErrRuntimeUnavailable, whose other errors are a
	// runtime that is there but failing now (unhealthy), which may recover.
	ErrRuntimeAbsent = fmt.Errorf("%w: not on this host", ErrRuntimeUnavailable)
	// ErrAgentUnavailable: a running sandbox's agent did not answer. A
	// kind of ErrUnavailable.
	ErrAgentUnavailable = fmt.Errorf("%w: sandbox agent", ErrUnavailable)
	// ErrTemplateBuilding: a create whose template has no ready version
	// while a build of it runs. A kind of ErrUnavailable: it succeeds once
	// the build is done.
	ErrTemplateBuilding = fmt.Errorf("%w: template is being built", ErrUnavailable)
)

// Wrap returns an error of class cls with a formatted, client-safe message.
func Wrap(cls error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", cls, fmt.Sprintf(format, args...))
}

// IsNotFound reports whether err is of class ErrNotFound.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsInvalidArgument reports whether err is of class ErrInvalidArgument.
func IsInvalidArgument(err error) bool { return errors.Is(err, ErrInvalidArgument) }
