package manager

import (
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Specific not-found errors, so the HTTP edge can tell sandbox_not_found
// from exec_not_found and template_not_found. Each wraps errdefs.ErrNotFound.
var (
	ErrSandboxNotFound  = fmt.Errorf("%w: sandbox", errdefs.ErrNotFound)
	ErrExecNotFound     = fmt.Errorf("%w: exec", errdefs.ErrNotFound)
	ErrTemplateNotFound = fmt.Errorf("%w: template", errdefs.ErrNotFound)
)

// PublicError carries a message that is safe to show to the API client
// (no host paths, no secrets) apart from the error chain that is logged.
// Its class (errdefs) is found through Err.
type PublicError struct {
	// Msg is the client-facing message: short, lowercase.
	Msg string
	// RetryAfter, when set, is sent as the Retry-After header.
	RetryAfter time.Duration
	// Err is the classified cause.
	Err error
}

// Error returns the full message for logs.
func (e *PublicError) Error() string {
	if e.Err == nil {
		return e.Msg
	}
	return e.Msg + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *PublicError) Unwrap() error { return e.Err }

// public returns a PublicError of class cls whose message is the formatted
// text.
func public(cls error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	return &PublicError{Msg: msg, Err: cls}
}

// sandboxNotFound is the one error for a sandbox that does not exist or
// belongs to another tenant: same message, same class, nothing that tells
// the two apart.
func sandboxNotFound() error {
	return &PublicError{Msg: "sandbox not found", Err: ErrSandboxNotFound}
}

func execNotFound() error {
	return &PublicError{Msg: "exec not found", Err: ErrExecNotFound}
}
