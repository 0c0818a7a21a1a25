package sandbox

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/usage"
)

// maxSeries bounds each sandbox's in-memory series: an hour at the default
// 5 s interval, about 40 KiB per sandbox.
const maxSeries = 720

// meter is one sandbox's sampled series and usage cursor.
type meter struct {
	// mu serialises sampling (the loop, and the final sample of a pause,
	// resume or stop), so that one interval is never accounted twice.
	mu sync.Mutex
	// series is a ring of at most maxSeries samples; head is the next slot.
	series []api.MetricsSample
	head   int
	// cursor mirrors the stored usage cursor; loaded on first use.
	cursor       store.UsageCursor
	cursorLoaded bool
	// last is the latest Stats sample (for `airlock top` and Prometheus).
	last    driver.Stats
	hasLast bool
}

// sampleLoop samples every live sandbox each SampleInterval.
func (m *Service) sampleLoop() {
	defer m.wg.Done()
	tick := time.NewTicker(m.cfg.SampleInterval)
	defer tick.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-tick.C:
			for _, sb := range m.Lives() {
				if m.ctx.Err() != nil {
					return
				}
				m.sample(m.ctx, sb)
			}
		}
	}
}

// sample takes one Stats sample of sb, appends it to the series and
// accounts its usage since the last sample. Errors are logged: a missed
// sample is folded into the next one.
func (m *Service) sample(ctx context.Context, sb *Live) {
	rec := sb.snapshot()
	running := rec.State == api.StateRunning || rec.State == api.StateStopping
	paused := rec.State == api.StatePaused
	if !running && !paused {
		// Starting: not billed until it runs; the cursor starts at
		// creation, so the start-up time is billed then, once.
		return
	}
	sb.meter.mu.Lock()
	defer sb.meter.mu.Unlock()
	now := m.now().UTC()
	st, ok := m.stats(ctx, sb)
	mt := &sb.meter
	if ok {
		mt.last, mt.hasLast = st, true
		s := api.MetricsSample{Time: now, CPUSeconds: st.CPUSeconds, MemoryBytes: st.MemoryBytes, PIDs: st.PIDs,
			DiskBytes: st.DiskBytes, NetRxBytes: st.NetRxBytes, NetTxBytes: st.NetTxBytes}
		if len(mt.series) < maxSeries {
			mt.series = append(mt.series, s)
		} else {
			mt.series[mt.head] = s
			mt.head = (mt.head + 1) % maxSeries
		}
	} else if mt.hasLast {
		// No fresh counters (a frozen or dying sandbox): time still
		// counts, counters do not move.
		st = mt.last
	}
	if !mt.cursorLoaded {
		c, found, err := m.store.GetUsageCursor(ctx, sb.id)
		if err != nil {
			m.log.Warn("loading usage cursor", "sandbox_id", sb.id, "err", err)
			return
		}
		if !found {
			// Billing starts at creation, from zeroed counters (a new cgroup
			// and interface).
			c = store.UsageCursor{SandboxID: sb.id, AccountedAt: rec.CreatedAt.UTC()}
		}
		mt.cursor, mt.cursorLoaded = c, true
	}
	if !now.After(mt.cursor.AccountedAt) {
		return
	}
	var sp Spec
	_ = json.Unmarshal(rec.Spec, &sp)
	lim := usage.Limits{CPU: sp.Resources.CPU, MemoryMB: sp.Resources.MemoryMB, DiskMB: sp.Resources.DiskMB}
	cpu, tx := mt.cursor.CPUSeconds, mt.cursor.TxBytes
	if ok || mt.hasLast {
		cpu, tx = st.CPUSeconds, st.NetTxBytes
	}
	a := store.UsageAccrual{
		SandboxID: sb.id, Tenant: sb.tenant, Template: sb.Template(), From: mt.cursor.AccountedAt, To: now,
		Q: usage.Interval(running, paused, lim, now.Sub(mt.cursor.AccountedAt),
			usage.Delta(mt.cursor.CPUSeconds, cpu), usage.Delta(mt.cursor.TxBytes, tx)),
		CPUSeconds: cpu, TxBytes: tx,
	}
	applied, err := m.store.AccrueUsage(context.WithoutCancel(ctx), a)
	if err != nil {
		m.log.Warn("accruing usage", "sandbox_id", sb.id, "err", err)
		return
	}
	if !applied {
		// Someone else moved the stored cursor (another daemon on the same
		// data dir should not exist, but never count twice): reload.
		mt.cursorLoaded = false
		return
	}
	mt.cursor = store.UsageCursor{SandboxID: sb.id, AccountedAt: now, CPUSeconds: cpu, TxBytes: tx}
}

// stats samples sb's driver counters and its network counters.
func (m *Service) stats(ctx context.Context, sb *Live) (driver.Stats, bool) {
	stater, ok := sb.drv.(driver.Stater)
	if !ok {
		return driver.Stats{}, false
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := stater.Stats(sctx, sb.id)
	if err != nil {
		m.log.Debug("sampling sandbox stats", "sandbox_id", sb.id, "err", err)
		return driver.Stats{}, false
	}
	if m.net != nil {
		// The host side of the sandbox's veth counts everything, proxied
		// traffic included.
		if rx, tx, err := m.net.Counters(sb.id); err == nil {
			s.NetRxBytes, s.NetTxBytes = rx, tx
		}
	}
	return s, true
}

// series returns sb's samples taken after since, oldest first.
func (sb *Live) series(since time.Time) []api.MetricsSample {
	mt := &sb.meter
	mt.mu.Lock()
	defer mt.mu.Unlock()
	out := make([]api.MetricsSample, 0, len(mt.series))
	for i := range mt.series {
		s := mt.series[(mt.head+i)%len(mt.series)]
		if s.Time.After(since) {
			out = append(out, s)
		}
	}
	return out
}

// MetricsSeries returns sandbox id's current metrics and its series since
// since (zero: all of it).
func (m *Service) MetricsSeries(ctx context.Context, p auth.Principal, id string, since time.Time) (api.SandboxMetrics, error) {
	cur, err := m.Metrics(ctx, p, id)
	if err != nil {
		return api.SandboxMetrics{}, err
	}
	sb, err := m.LiveSandbox(ctx, p, id)
	if err != nil {
		return api.SandboxMetrics{}, err
	}
	return api.SandboxMetrics{Metrics: cur, SampleIntervalS: m.cfg.SampleInterval.Seconds(), Series: sb.series(since)}, nil
}

// Usage returns the usage report of what p may see: its own tenant, or for
// an admin tenant (or every tenant when "").
func (m *Service) Usage(ctx context.Context, p auth.Principal, tenant string, from, to time.Time, groupBy string) (api.UsageReport, error) {
	switch groupBy {
	case "", api.UsageBySandbox, api.UsageByTemplate, api.UsageByDay:
	default:
		return api.UsageReport{}, public(errInvalid, "group_by must be sandbox, template or day")
	}
	if !from.IsZero() && !to.IsZero() && !to.After(from) {
		return api.UsageReport{}, public(errInvalid, "to must be after from")
	}
	if !p.Admin {
		if tenant != "" && tenant != p.Tenant {
			return api.UsageReport{}, public(errdefs.ErrPermissionDenied, "only admin keys can read other tenants' usage")
		}
		tenant = p.Tenant
	}
	// Fold the live sandboxes' latest seconds in, so a report is current to
	// the call rather than to the last tick.
	for _, sb := range m.Lives() {
		if p.CanSee(sb.tenant) && (tenant == "" || sb.tenant == tenant) {
			m.sample(ctx, sb)
		}
	}
	rows, err := m.store.ListUsage(ctx, store.UsageFilter{Tenant: tenant, From: from, To: to})
	if err != nil {
		return api.UsageReport{}, err
	}
	rep := usage.Report(rows, groupBy, m.settings.Prices)
	if !from.IsZero() {
		f := from.UTC()
		rep.From = &f
	}
	if !to.IsZero() {
		t := to.UTC()
		rep.To = &t
	}
	return rep, nil
}
