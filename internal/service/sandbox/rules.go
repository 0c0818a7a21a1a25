package sandbox

import (
	"context"
	"maps"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
)

// Lifecycle rules (issue 15): on_timeout, auto_resume, idle_timeout_s
// (docs/lifecycle.md, "Lifecycle rules").

// maxIdleTimeoutS bounds idle_timeout_s: a week.
const maxIdleTimeoutS = 7 * 24 * 3600

// checkLifecycleFields checks lifecycle rules as a create or a PATCH
// gives them.
func checkLifecycleFields(l *api.Lifecycle) error {
	if l == nil {
		return nil
	}
	switch l.OnTimeout {
	case "", api.OnTimeoutKill, api.OnTimeoutPause:
	default:
		return public(errInvalid, "lifecycle.on_timeout must be kill or pause")
	}
	if l.IdleTimeoutS != nil && (*l.IdleTimeoutS < 0 || *l.IdleTimeoutS > maxIdleTimeoutS) {
		return public(errInvalid, "lifecycle.idle_timeout_s must be between 0 and %d", maxIdleTimeoutS)
	}
	return nil
}

// checkLifecycleRuntime refuses rules that d cannot keep: an idle pause
// (memory keep) where it cannot pause.
func checkLifecycleRuntime(l store.Lifecycle, d driver.Driver) error {
	if _, ok := d.(driver.Pauser); l.IdleTimeoutS > 0 && (!ok || !d.Capabilities().Pause) {
		return public(errdefs.ErrCapabilityUnsupported, "runtime %s cannot pause: no idle timeout", d.Name())
	}
	return nil
}

// normalizeLifecycle is a create's lifecycle rules with auto_pause (the
// E2B SDKs' name of on_timeout pause) folded in.
func normalizeLifecycle(req api.CreateSandboxRequest) *api.Lifecycle {
	if !req.AutoPause {
		return req.Lifecycle
	}
	l := api.Lifecycle{}
	if req.Lifecycle != nil {
		l = *req.Lifecycle
	}
	l.OnTimeout = api.OnTimeoutPause
	return &l
}

// applyLifecycle records a create's lifecycle rules in its record.
func applyLifecycle(rec *store.Sandbox, l *api.Lifecycle) {
	rec.Lifecycle = mergeLifecycle(storeLifecycle(rec.Lifecycle), l)
}

// mergeLifecycle is cur with the fields l gives replaced.
func mergeLifecycle(cur store.Lifecycle, l *api.Lifecycle) store.Lifecycle {
	if l == nil {
		return cur
	}
	if l.OnTimeout != "" {
		cur.OnTimeout = l.OnTimeout
	}
	if l.AutoResume != nil {
		cur.AutoResume = *l.AutoResume
	}
	if l.IdleTimeoutS != nil {
		cur.IdleTimeoutS = *l.IdleTimeoutS
	}
	return storeLifecycle(cur)
}

// lifecycleView is the API's lifecycle, every field set.
func lifecycleView(l store.Lifecycle) *api.Lifecycle {
	l = storeLifecycle(l)
	ar, idle := l.AutoResume, l.IdleTimeoutS
	return &api.Lifecycle{OnTimeout: l.OnTimeout, AutoResume: &ar, IdleTimeoutS: &idle}
}

// Patch changes sandbox id's lifecycle rules (field by field) and
// metadata (as a whole) as req gives them. The sandbox must be live. It is
// not activity.
func (m *Service) Patch(ctx context.Context, p auth.Principal, id string, req api.PatchSandboxRequest) (api.Sandbox, error) {
	if req.Lifecycle == nil && req.Metadata == nil {
		return api.Sandbox{}, public(errInvalid, "nothing to change: give lifecycle or metadata")
	}
	if err := checkLifecycleFields(req.Lifecycle); err != nil {
		return api.Sandbox{}, err
	}
	if req.Metadata != nil {
		if err := m.checkMetadata(req.Metadata); err != nil {
			return api.Sandbox{}, err
		}
	}
	sb, err := m.LiveSandbox(ctx, p, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	sb.opMu.Lock()
	defer sb.opMu.Unlock()
	if st := sb.state(); st == api.StateStopping || st == api.StateStarting {
		return api.Sandbox{}, public(errdefs.ErrInvalidState, "sandbox is %s", st)
	}
	l := mergeLifecycle(sb.snapshot().Lifecycle, req.Lifecycle)
	if err := checkLifecycleRuntime(l, sb.drv); err != nil {
		return api.Sandbox{}, err
	}
	err = sb.update(ctx, func(r *store.Sandbox) {
		r.Lifecycle = l
		if req.Metadata != nil {
			r.Metadata = maps.Clone(req.Metadata)
		}
	})
	if err != nil {
		return api.Sandbox{}, err
	}
	return m.view(sb.snapshot()), nil
}

// checkMetadata applies a create's rules on metadata to a PATCH's.
func (m *Service) checkMetadata(md map[string]string) error {
	if len(md) > maxMetadataKeys {
		return public(errInvalid, "at most %d metadata keys", maxMetadataKeys)
	}
	size := 0
	for k, v := range md {
		if !metaKeyRE.MatchString(k) {
			return public(errInvalid, "metadata key %q must match %s", truncate(k, 64), metaKeyRE)
		}
		if len(v) > maxMetaValueLen {
			return public(errInvalid, "metadata value of %q exceeds %d bytes", k, maxMetaValueLen)
		}
		size += len(k) + len(v)
	}
	if size > m.settings.MaxMetadataBytes {
		return public(errInvalid, "metadata exceeds %d bytes", m.settings.MaxMetadataBytes)
	}
	return nil
}
