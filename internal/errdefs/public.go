package errdefs

import (
	"fmt"
	"time"
)

// Public is an error whose message is safe to show to an API client (no
// host paths, no secrets, nothing another tenant could learn from), apart
// from the error chain that is logged. Every service and plane raises its
// client-facing errors as a Public; the planes send Msg and read the class
// from Err. The outermost Public of a chain is the one the client sees.
type Public struct {
	// Msg is the client-facing message: short, lowercase.
	Msg string
	// RetryAfter, when set, is the Retry-After of a retryable answer
	// (429, 503) instead of the class's default.
	RetryAfter time.Duration
	// BuildID names the template build the error is about (a create
	// refused with template_building or template_build_failed).
	BuildID string
	// SandboxID names the sandbox the error is about when the request's
	// path does not (the planes fill it from the path otherwise).
	SandboxID string
	// Err is the classified cause: a class of this package, wrapped or
	// not, and whatever is worth logging.
	Err error
}

// Error returns the full message for logs.
func (e *Public) Error() string {
	if e.Err == nil {
		return e.Msg
	}
	return e.Msg + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *Public) Unwrap() error { return e.Err }

// Publicf returns a Public of class cls whose message is the formatted text.
func Publicf(cls error, format string, args ...any) error {
	return &Public{Msg: fmt.Sprintf(format, args...), Err: cls}
}
