package sandbox

import (
	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
)

// Lifecycle rules (issue 15): on_timeout, auto_resume, idle_timeout_s.

// checkLifecycleFields checks a create's lifecycle rules: only the
// default (on_timeout kill) is served yet.
func checkLifecycleFields(l *api.Lifecycle) error {
	if l != nil && (l.OnTimeout != "" && l.OnTimeout != api.OnTimeoutKill ||
		l.AutoResume != nil && *l.AutoResume || l.IdleTimeoutS != nil) {
		return public(errdefs.ErrCapabilityUnsupported, "lifecycle rules other than on_timeout kill are not available on this server yet")
	}
	return nil
}

// applyLifecycle records a create's lifecycle rules in its record.
func applyLifecycle(rec *store.Sandbox, l *api.Lifecycle) {}
