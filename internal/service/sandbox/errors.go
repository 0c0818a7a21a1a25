package sandbox

import (
	"fmt"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Specific classes, so the planes can tell sandbox_not_found from
// exec_not_found and template_not_found, agent_unavailable and the
// template build refusals from other errors. They are errdefs's: the
// names here are kept for the services' callers.
var (
	ErrSandboxNotFound     = errdefs.ErrSandboxNotFound
	ErrExecNotFound        = errdefs.ErrExecNotFound
	ErrTemplateNotFound    = errdefs.ErrTemplateNotFound
	ErrAgentUnavailable    = errdefs.ErrAgentUnavailable
	ErrTemplateBuilding    = errdefs.ErrTemplateBuilding
	ErrTemplateBuildFailed = errdefs.ErrTemplateBuildFailed
)

// PublicError is the one client-safe error (errdefs.Public): a message
// safe to show to the API client (no host paths, no secrets) apart from
// the error chain that is logged, its class found through Err.
type PublicError = errdefs.Public

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
