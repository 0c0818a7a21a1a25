// Package errdefs defines the error classes shared by every layer of airlock.
//
// Code below the HTTP edge wraps one of these sentinels with %w and context;
// only the server turns a class into an HTTP status and an API error code.
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
var (
	// ErrTemplateUnsupported: the sandbox's template lacks what the request
	// needs (code on a template without a kernel). Permanent for that
	// sandbox: use another template. A kind of ErrInvalidArgument.
	ErrTemplateUnsupported = fmt.Errorf("template unsupported: %w", ErrInvalidArgument)
	// ErrRuntimeAbsent: this host has no such runtime (not built in, not
	// installed, or it cannot run here at all). Permanent: ask for another
	// runtime. A kind of ErrRuntimeUnavailable, whose other errors are a
	// runtime that is there but failing now (unhealthy), which may recover.
	ErrRuntimeAbsent = fmt.Errorf("%w: not on this host", ErrRuntimeUnavailable)
)

// Wrap returns an error of class cls with a formatted, client-safe message.
func Wrap(cls error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", cls, fmt.Sprintf(format, args...))
}

// IsNotFound reports whether err is of class ErrNotFound.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsInvalidArgument reports whether err is of class ErrInvalidArgument.
func IsInvalidArgument(err error) bool { return errors.Is(err, ErrInvalidArgument) }
