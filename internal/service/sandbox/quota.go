package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/quota"
)

// execWindow is the span of the exec rate quota (execs per minute).
const execWindow = time.Minute

// tenantQuotas holds the tenants' quota overrides and exec windows. The
// overrides are read through from the store once per tenant and kept: only
// this manager writes them (SetTenantQuotas), so the cache cannot go stale,
// and admission (every create, every exec) costs no store read.
type tenantQuotas struct {
	mu        sync.Mutex
	overrides map[string]*api.QuotaOverride // nil value: the tenant has none
	execs     *quota.Windows
}

func newTenantQuotas(now func() time.Time) *tenantQuotas {
	return &tenantQuotas{overrides: map[string]*api.QuotaOverride{}, execs: quota.NewWindows(execWindow, now)}
}

// defaultQuota is the server's quota for tenants without an override.
func (m *Service) defaultQuota() api.Quota {
	s := m.settings
	return api.Quota{
		Sandboxes: s.MaxSandboxesPerTenant, CPU: s.TenantQuota.CPU, MemoryMB: s.TenantQuota.MemoryMB,
		DiskMB: s.TenantQuota.DiskMB, ExecsPerMinute: s.TenantQuota.ExecsPerMinute,
	}
}

// override returns tenant's quota override, nil if it has none.
func (m *Service) override(ctx context.Context, tenant string) (*api.QuotaOverride, error) {
	q := m.quotas
	q.mu.Lock()
	o, ok := q.overrides[tenant]
	q.mu.Unlock()
	if ok {
		return o, nil
	}
	raw, err := m.store.TenantQuota(ctx, tenant)
	if err != nil {
		return nil, err
	}
	if len(raw) > 0 {
		o = &api.QuotaOverride{}
		if err := json.Unmarshal(raw, o); err != nil {
			// Written by this code, so unreadable means damaged: the
			// defaults are safer than no limit at all.
			m.log.Error("tenant quota override is unreadable, using the defaults", "tenant", tenant, "err", err)
			o = nil
		}
	}
	q.mu.Lock()
	if cur, ok := q.overrides[tenant]; ok {
		o = cur // a concurrent SetTenantQuotas won
	} else {
		q.overrides[tenant] = o
	}
	q.mu.Unlock()
	return o, nil
}

// quotaOf returns the quota that applies to tenant.
func (m *Service) quotaOf(ctx context.Context, tenant string) (api.Quota, *api.QuotaOverride, error) {
	o, err := m.override(ctx, tenant)
	if err != nil {
		return api.Quota{}, nil, err
	}
	return applyOverride(m.defaultQuota(), o), o, nil
}

func applyOverride(q api.Quota, o *api.QuotaOverride) api.Quota {
	if o == nil {
		return q
	}
	if o.Sandboxes != nil {
		q.Sandboxes = *o.Sandboxes
	}
	if o.CPU != nil {
		q.CPU = *o.CPU
	}
	if o.MemoryMB != nil {
		q.MemoryMB = *o.MemoryMB
	}
	if o.DiskMB != nil {
		q.DiskMB = *o.DiskMB
	}
	if o.ExecsPerMinute != nil {
		q.ExecsPerMinute = *o.ExecsPerMinute
	}
	return q
}

// resources returns the resources the sandbox was created with (parsed
// from its stored spec once: a recovered sandbox has only that).
func (sb *Live) resources() api.Resources {
	sb.resOnce.Do(func() {
		sb.mu.Lock()
		raw := sb.rec.Spec
		sb.mu.Unlock()
		var sp Spec
		if err := json.Unmarshal(raw, &sp); err != nil {
			sb.m.log.Warn("reading sandbox spec for quotas", "sandbox_id", sb.id, "err", err)
		}
		sb.res = sp.Resources
	})
	return sb.res
}

// usageLocked sums what tenant's live sandboxes hold. m.mu must be held.
func (m *Service) usageLocked(tenant string) api.QuotaUsage {
	var u api.QuotaUsage
	for _, sb := range m.live {
		if sb.tenant != tenant {
			continue
		}
		r := sb.resources()
		u.Sandboxes++
		u.CPU += r.CPU
		u.MemoryMB += r.MemoryMB
		u.DiskMB += r.DiskMB
	}
	// Sums of decimal fractions drift (0.1+0.2): round to what a request
	// can express, so that a quota filled exactly is not "exceeded".
	u.CPU = math.Round(u.CPU*1e6) / 1e6
	return u
}

// admitLocked checks that a sandbox of res fits tenant's quota q next to
// its live sandboxes. m.mu must be held, so that concurrent creates cannot
// both take what is left.
func (m *Service) admitLocked(tenant string, q api.Quota, res api.Resources) error {
	u := m.usageLocked(tenant)
	exceeded := func(format string, args ...any) error {
		return &PublicError{Msg: fmt.Sprintf(format, args...), RetryAfter: retryAfterCapacity, Err: errdefs.ErrQuotaExceeded}
	}
	switch {
	case q.Sandboxes > 0 && u.Sandboxes >= q.Sandboxes:
		return exceeded("sandboxes quota exceeded: the tenant has %d live sandboxes, its quota is %d", u.Sandboxes, q.Sandboxes)
	case q.CPU > 0 && u.CPU+res.CPU > q.CPU+1e-9:
		return exceeded("cpu quota exceeded: live sandboxes hold %g cpu, this one asks for %g, the quota is %g", u.CPU, res.CPU, q.CPU)
	case q.MemoryMB > 0 && u.MemoryMB+res.MemoryMB > q.MemoryMB:
		return exceeded("memory quota exceeded: live sandboxes hold %d MiB, this one asks for %d, the quota is %d", u.MemoryMB, res.MemoryMB, q.MemoryMB)
	case q.DiskMB > 0 && u.DiskMB+res.DiskMB > q.DiskMB:
		return exceeded("disk quota exceeded: live sandboxes hold %d MiB, this one asks for %d, the quota is %d", u.DiskMB, res.DiskMB, q.DiskMB)
	}
	return nil
}

// admitExec takes one exec of tenant's exec rate quota.
func (m *Service) admitExec(ctx context.Context, tenant string) error {
	q, _, err := m.quotaOf(ctx, tenant)
	if err != nil {
		return err
	}
	if ok, wait := m.quotas.execs.Allow(tenant, q.ExecsPerMinute); !ok {
		return &PublicError{
			Msg: fmt.Sprintf("exec rate quota exceeded: the tenant started %d execs in the last minute, its quota is %d",
				m.quotas.execs.Count(tenant), q.ExecsPerMinute),
			RetryAfter: wait, Err: errdefs.ErrQuotaExceeded,
		}
	}
	return nil
}

// TenantQuotas returns tenant's quota, the default and override it comes
// from, and its usage now. A tenant sees its own; an admin any.
func (m *Service) TenantQuotas(ctx context.Context, p auth.Principal, tenant string) (api.TenantQuotas, error) {
	if !p.CanSee(tenant) {
		return api.TenantQuotas{}, public(errdefs.ErrPermissionDenied, "only an admin key may read another tenant's settings")
	}
	if !auth.ValidTenant(tenant) {
		return api.TenantQuotas{}, public(errInvalid, "tenant %q is not a valid tenant name", truncate(tenant, 64))
	}
	q, o, err := m.quotaOf(ctx, tenant)
	if err != nil {
		return api.TenantQuotas{}, err
	}
	m.mu.Lock()
	u := m.usageLocked(tenant)
	m.mu.Unlock()
	u.ExecsLastMinute = m.quotas.execs.Count(tenant)
	return api.TenantQuotas{Tenant: tenant, Quota: q, Default: m.defaultQuota(), Override: o, Usage: u}, nil
}

// SetTenantQuotas replaces (nil: removes) tenant's quota override; admins
// only. It applies to the next create and exec; sandboxes already over a
// lowered quota keep running.
func (m *Service) SetTenantQuotas(ctx context.Context, p auth.Principal, tenant string, o *api.QuotaOverride) (api.TenantQuotas, error) {
	if !p.Admin {
		return api.TenantQuotas{}, public(errdefs.ErrPermissionDenied, "this needs an admin key")
	}
	if !auth.ValidTenant(tenant) {
		return api.TenantQuotas{}, public(errInvalid, "tenant %q is not a valid tenant name", truncate(tenant, 64))
	}
	var raw json.RawMessage
	if o != nil {
		if err := validOverride(*o); err != nil {
			return api.TenantQuotas{}, err
		}
		if *o == (api.QuotaOverride{}) {
			o = nil // an empty override is no override
		} else {
			var err error
			if raw, err = json.Marshal(o); err != nil {
				return api.TenantQuotas{}, err
			}
		}
	}
	// The store first, then the cache, under the cache's lock: a reader
	// that loads from the store meanwhile cannot put back the old value.
	m.quotas.mu.Lock()
	err := m.store.SetTenantQuota(ctx, tenant, raw)
	if err == nil {
		m.quotas.overrides[tenant] = o
	} else {
		delete(m.quotas.overrides, tenant) // unknown now: read it again
	}
	m.quotas.mu.Unlock()
	if err != nil {
		return api.TenantQuotas{}, err
	}
	m.log.Info("tenant quota set", "for_tenant", tenant, "cleared", o == nil)
	return m.TenantQuotas(ctx, p, tenant)
}

// validOverride checks an override's values: none negative, the exec rate
// within what the manager keeps track of.
func validOverride(o api.QuotaOverride) error {
	switch {
	case o.Sandboxes != nil && *o.Sandboxes < 0:
		return public(errInvalid, "sandboxes must not be negative (0: no limit)")
	case o.CPU != nil && (*o.CPU < 0 || math.IsNaN(*o.CPU) || math.IsInf(*o.CPU, 0)):
		return public(errInvalid, "cpu must not be negative (0: no limit)")
	case o.MemoryMB != nil && *o.MemoryMB < 0:
		return public(errInvalid, "memory_mb must not be negative (0: no limit)")
	case o.DiskMB != nil && *o.DiskMB < 0:
		return public(errInvalid, "disk_mb must not be negative (0: no limit)")
	case o.ExecsPerMinute != nil && (*o.ExecsPerMinute < 0 || *o.ExecsPerMinute > config.MaxExecsPerMinute):
		return public(errInvalid, "execs_per_minute must be between 0 (no limit) and %d", config.MaxExecsPerMinute)
	}
	return nil
}
