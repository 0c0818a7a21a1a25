package accounting

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/quota"
	"github.com/airlockhq/airlock/internal/store"
)

// execWindow is the span of the exec rate quota (execs per minute).
const execWindow = time.Minute

// Quotas holds the tenants' quota overrides and exec windows: what a
// tenant may hold (the sandbox lifecycle admits creates with it) and how
// many execs it may start. The overrides are read through from the store
// once per tenant and kept: only this daemon writes them (SetOverride), so
// the cache cannot go stale, and admission (every create, every exec)
// costs no store read.
type Quotas struct {
	store    *store.Store
	settings config.Config
	log      *slog.Logger

	mu        sync.Mutex
	overrides map[string]*api.QuotaOverride // nil value: the tenant has none
	execs     *quota.Windows
}

// QuotasConfig configures Quotas.
type QuotasConfig struct {
	// Store keeps the overrides. Required.
	Store *store.Store
	// Settings hold the default quota (max_sandboxes_per_tenant,
	// tenant_quota).
	Settings config.Config
	// Logger and Now default to slog.Default() and time.Now.
	Logger *slog.Logger
	Now    func() time.Time
}

// NewQuotas returns the Quotas of cfg.
func NewQuotas(cfg QuotasConfig) *Quotas {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Quotas{store: cfg.Store, settings: cfg.Settings, log: cfg.Logger.With("component", "accounting"),
		overrides: map[string]*api.QuotaOverride{}, execs: quota.NewWindows(execWindow, cfg.Now)}
}

// defaultQuota is the server's quota for tenants without an override.
func (m *Quotas) defaultQuota() api.Quota {
	s := m.settings
	return api.Quota{
		Sandboxes: s.MaxSandboxesPerTenant, CPU: s.TenantQuota.CPU, MemoryMB: s.TenantQuota.MemoryMB,
		DiskMB: s.TenantQuota.DiskMB, ExecsPerMinute: s.TenantQuota.ExecsPerMinute,
	}
}

// override returns tenant's quota override, nil if it has none.
func (m *Quotas) override(ctx context.Context, tenant string) (*api.QuotaOverride, error) {
	q := m
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

// Quota returns the quota that applies to tenant (sandbox.Quotas).
func (m *Quotas) Quota(ctx context.Context, tenant string) (api.Quota, error) {
	q, _, err := m.quotaOf(ctx, tenant)
	return q, err
}

// quotaOf returns the quota that applies to tenant, and its override.
func (m *Quotas) quotaOf(ctx context.Context, tenant string) (api.Quota, *api.QuotaOverride, error) {
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

// AdmitExec takes one exec of tenant's exec rate quota (sandbox.Quotas).
func (m *Quotas) AdmitExec(ctx context.Context, tenant string) error {
	q, _, err := m.quotaOf(ctx, tenant)
	if err != nil {
		return err
	}
	if ok, wait := m.execs.Allow(tenant, q.ExecsPerMinute); !ok {
		return &errdefs.Public{
			Msg: fmt.Sprintf("exec rate quota exceeded: the tenant started %d execs in the last minute, its quota is %d",
				m.execs.Count(tenant), q.ExecsPerMinute),
			RetryAfter: wait, Err: errdefs.ErrQuotaExceeded,
		}
	}
	return nil
}

// TenantQuotas returns tenant's quota, the default and override it comes
// from, and its usage now. A tenant sees its own; an admin any.
func (s *Service) TenantQuotas(ctx context.Context, p auth.Principal, tenant string) (api.TenantQuotas, error) {
	m := s.quotas
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
	u := s.sandboxes.TenantUsage(tenant)
	u.ExecsLastMinute = m.execs.Count(tenant)
	return api.TenantQuotas{Tenant: tenant, Quota: q, Default: m.defaultQuota(), Override: o, Usage: u}, nil
}

// SetTenantQuotas replaces (nil: removes) tenant's quota override; admins
// only. It applies to the next create and exec; sandboxes already over a
// lowered quota keep running.
func (s *Service) SetTenantQuotas(ctx context.Context, p auth.Principal, tenant string, o *api.QuotaOverride) (api.TenantQuotas, error) {
	m := s.quotas
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
	m.mu.Lock()
	err := m.store.SetTenantQuota(ctx, tenant, raw)
	if err == nil {
		m.overrides[tenant] = o
	} else {
		delete(m.overrides, tenant) // unknown now: read it again
	}
	m.mu.Unlock()
	if err != nil {
		return api.TenantQuotas{}, err
	}
	m.log.Info("tenant quota set", "for_tenant", tenant, "cleared", o == nil)
	return s.TenantQuotas(ctx, p, tenant)
}

// validOverride checks an override's values: none negative, the exec rate
// within what the exec windows keep track of.
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
