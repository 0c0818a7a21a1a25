package accounting

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/sandbox"
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

// Counters reads the network counters of a sandbox (the network
// backend's): the host side of its veth counts everything, proxied
// traffic included.
type Counters interface {
	Counters(id string) (rx, tx uint64, err error)
}

// MeterConfig configures a Meter.
type MeterConfig struct {
	// Store keeps the usage cursors and accruals. Required.
	Store *store.Store
	// Network reads sandboxes' network counters; nil: the driver's.
	Network Counters
	// Logger and Now default to slog.Default() and time.Now.
	Logger *slog.Logger
	Now    func() time.Time
}

// Meter samples live sandboxes' resource use into their metrics series
// and accounts their usage (store.AccrueUsage): the sandbox lifecycle
// calls Sample every sample interval and before each state change, while
// the counters can still be read, and Forget once a sandbox is gone.
type Meter struct {
	store *store.Store
	net   Counters
	log   *slog.Logger
	now   func() time.Time

	mu     sync.Mutex
	meters map[string]*meter
}

// NewMeter returns the Meter of cfg.
func NewMeter(cfg MeterConfig) *Meter {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Meter{store: cfg.Store, net: cfg.Network, log: cfg.Logger.With("component", "accounting"), now: cfg.Now,
		meters: map[string]*meter{}}
}

// meterOf returns sandbox id's meter, made on first use.
func (m *Meter) meterOf(id string) *meter {
	m.mu.Lock()
	defer m.mu.Unlock()
	mt := m.meters[id]
	if mt == nil {
		mt = &meter{}
		m.meters[id] = mt
	}
	return mt
}

// Forget drops sandbox id's series and cursor (sandbox.Meter): it is gone.
func (m *Meter) Forget(id string) {
	m.mu.Lock()
	delete(m.meters, id)
	m.mu.Unlock()
}

// Sample takes one Stats sample of sb, appends it to the series and
// accounts its usage since the last sample. Errors are logged: a missed
// sample is folded into the next one.
func (m *Meter) Sample(ctx context.Context, sb *sandbox.Live) {
	rec := sb.Record()
	running := rec.State == api.StateRunning || rec.State == api.StateStopping
	paused := rec.State == api.StatePaused
	if !running && !paused {
		// Starting: not billed until it runs; the cursor starts at
		// creation, so the start-up time is billed then, once.
		return
	}
	mt := m.meterOf(sb.ID())
	mt.mu.Lock()
	defer mt.mu.Unlock()
	now := m.now().UTC()
	st, ok := m.stats(ctx, sb)
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
		c, found, err := m.store.GetUsageCursor(ctx, sb.ID())
		if err != nil {
			m.log.Warn("loading usage cursor", "sandbox_id", sb.ID(), "err", err)
			return
		}
		if !found {
			// Billing starts at creation, from zeroed counters (a new cgroup
			// and interface).
			c = store.UsageCursor{SandboxID: sb.ID(), AccountedAt: rec.CreatedAt.UTC()}
		}
		mt.cursor, mt.cursorLoaded = c, true
	}
	if !now.After(mt.cursor.AccountedAt) {
		return
	}
	sp := sb.Spec()
	lim := usage.Limits{CPU: sp.Resources.CPU, MemoryMB: sp.Resources.MemoryMB, DiskMB: sp.Resources.DiskMB}
	cpu, tx := mt.cursor.CPUSeconds, mt.cursor.TxBytes
	if ok || mt.hasLast {
		cpu, tx = st.CPUSeconds, st.NetTxBytes
	}
	a := store.UsageAccrual{
		SandboxID: sb.ID(), Tenant: sb.Tenant(), Template: sb.Template(), From: mt.cursor.AccountedAt, To: now,
		Q: usage.Interval(running, paused, lim, now.Sub(mt.cursor.AccountedAt),
			usage.Delta(mt.cursor.CPUSeconds, cpu), usage.Delta(mt.cursor.TxBytes, tx)),
		CPUSeconds: cpu, TxBytes: tx,
	}
	if paused && rec.PauseMemory == api.PauseMemoryDisk {
		// Of the paused seconds, those with the RAM released.
		a.Q.PausedDiskS = a.Q.PausedS
	}
	applied, err := m.store.AccrueUsage(context.WithoutCancel(ctx), a)
	if err != nil {
		m.log.Warn("accruing usage", "sandbox_id", sb.ID(), "err", err)
		return
	}
	if !applied {
		// Someone else moved the stored cursor (another daemon on the same
		// data dir should not exist, but never count twice): reload.
		mt.cursorLoaded = false
		return
	}
	mt.cursor = store.UsageCursor{SandboxID: sb.ID(), AccountedAt: now, CPUSeconds: cpu, TxBytes: tx}
}

// stats samples sb's driver counters and its network counters.
func (m *Meter) stats(ctx context.Context, sb *sandbox.Live) (driver.Stats, bool) {
	stater, ok := sb.Driver().(driver.Stater)
	if !ok {
		return driver.Stats{}, false
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := stater.Stats(sctx, sb.ID())
	if err != nil {
		m.log.Debug("sampling sandbox stats", "sandbox_id", sb.ID(), "err", err)
		return driver.Stats{}, false
	}
	if m.net != nil {
		// The host side of the sandbox's veth counts everything, proxied
		// traffic included.
		if rx, tx, err := m.net.Counters(sb.ID()); err == nil {
			s.NetRxBytes, s.NetTxBytes = rx, tx
		}
	}
	return s, true
}

// Series returns sandbox id's samples taken after since, oldest first.
func (m *Meter) Series(id string, since time.Time) []api.MetricsSample {
	mt := m.meterOf(id)
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
func (s *Service) MetricsSeries(ctx context.Context, p auth.Principal, id string, since time.Time) (api.SandboxMetrics, error) {
	cur, err := s.sandboxes.Metrics(ctx, p, id)
	if err != nil {
		return api.SandboxMetrics{}, err
	}
	sb, err := s.sandboxes.LiveSandbox(ctx, p, id)
	if err != nil {
		return api.SandboxMetrics{}, err
	}
	return api.SandboxMetrics{Metrics: cur, SampleIntervalS: s.sampleInterval.Seconds(), Series: s.meter.Series(sb.ID(), since)}, nil
}

// Usage returns the usage report of what p may see: its own tenant, or for
// an admin tenant (or every tenant when "").
func (s *Service) Usage(ctx context.Context, p auth.Principal, tenant string, from, to time.Time, groupBy string) (api.UsageReport, error) {
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
	for _, sb := range s.sandboxes.Lives() {
		if p.CanSee(sb.Tenant()) && (tenant == "" || sb.Tenant() == tenant) {
			s.meter.Sample(ctx, sb)
		}
	}
	rows, err := s.store.ListUsage(ctx, store.UsageFilter{Tenant: tenant, From: from, To: to})
	if err != nil {
		return api.UsageReport{}, err
	}
	rep := usage.Report(rows, groupBy, s.settings.Prices)
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
