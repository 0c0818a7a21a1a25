package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"math"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// Quotas says what a tenant may hold (service/accounting's Quotas).
type Quotas interface {
	// Quota is the quota that applies to tenant now.
	Quota(ctx context.Context, tenant string) (api.Quota, error)
	// AdmitExec takes one exec of tenant's exec rate quota, or refuses it
	// (errdefs.ErrQuotaExceeded with a Retry-After).
	AdmitExec(ctx context.Context, tenant string) error
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
		u.DiskMB += r.DiskMB
		if !sb.diskOnly.Load() {
			u.CPU += r.CPU
			u.MemoryMB += r.MemoryMB
		}
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
	case overCPU(u, q, res):
		return exceeded("cpu quota exceeded: live sandboxes hold %g cpu, this one asks for %g, the quota is %g", u.CPU, res.CPU, q.CPU)
	case overMemory(u, q, res):
		return exceeded("memory quota exceeded: live sandboxes hold %d MiB, this one asks for %d, the quota is %d", u.MemoryMB, res.MemoryMB, q.MemoryMB)
	case q.DiskMB > 0 && u.DiskMB+res.DiskMB > q.DiskMB:
		return exceeded("disk quota exceeded: live sandboxes hold %d MiB, this one asks for %d, the quota is %d", u.DiskMB, res.DiskMB, q.DiskMB)
	}
	return nil
}

// overCPU and overMemory report whether res does not fit quota q beside
// usage u (0 in q: no limit). The cpu sums are rounded (usageLocked); the
// epsilon absorbs the rest.
func overCPU(u api.QuotaUsage, q api.Quota, res api.Resources) bool {
	return q.CPU > 0 && u.CPU+res.CPU > q.CPU+1e-9
}

func overMemory(u api.QuotaUsage, q api.Quota, res api.Resources) bool {
	return q.MemoryMB > 0 && u.MemoryMB+res.MemoryMB > q.MemoryMB
}

// readmit takes the cpu and memory of sb, paused to disk, back into its
// tenant's quota before a resume (or a reset) runs it again: refused with
// a quota error (it stays paused) when what the tenant made meanwhile
// leaves no room.
func (m *Service) readmit(ctx context.Context, sb *Live) error {
	if !sb.diskOnly.Load() {
		return nil
	}
	q, err := m.quotas.Quota(ctx, sb.tenant)
	if err != nil {
		return err
	}
	res := sb.resources()
	m.mu.Lock()
	defer m.mu.Unlock()
	u := m.usageLocked(sb.tenant)
	exceeded := func(format string, args ...any) error {
		return &PublicError{Msg: fmt.Sprintf(format, args...) + "; it stays paused", RetryAfter: retryAfterCapacity, Err: errdefs.ErrQuotaExceeded}
	}
	switch {
	case overCPU(u, q, res):
		return exceeded("cpu quota exceeded: running sandboxes hold %g cpu, this one needs %g to resume, the quota is %g", u.CPU, res.CPU, q.CPU)
	case overMemory(u, q, res):
		return exceeded("memory quota exceeded: running sandboxes hold %d MiB, this one needs %d to resume, the quota is %d", u.MemoryMB, res.MemoryMB, q.MemoryMB)
	}
	sb.diskOnly.Store(false)
	return nil
}

// TenantUsage sums what tenant's live sandboxes hold now.
func (m *Service) TenantUsage(tenant string) api.QuotaUsage {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.usageLocked(tenant)
}
