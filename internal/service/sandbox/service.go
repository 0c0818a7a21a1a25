// Package sandbox is the sandbox service, the lifecycle every other service works on: the state machine,
// create (validation, capacity and quota admission, network, driver, agent) and delete, TTLs, pause and
// resume, liveness, and the re-adoption of sandboxes after a daemon restart.
//
// It owns the sandbox state machine (state.go: legal transitions in one place), keeps the store's records
// in step with what the drivers observe, and talks to each sandbox's agent through one agentclient.Client
// per sandbox, redialled when the connection drops (agent.go). The other services get a live sandbox as a
// *Live (live.go) and use its exported methods. What the lifecycle needs of them is declared in Config as
// interfaces (Templates, Policy, Owners, Quotas, Meter, Previews, Execs), given at construction by
// internal/service: this package imports no other service.
//
// Secrets given at create time are merged into every exec's environment and masked out of everything a
// service returns or records (Live.Env, Live.Redactor). They are kept in memory and, sealed with a key in
// the data dir (secrets.go), in the store, so that a restarted daemon keeps injecting them.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
)

// Templates resolves the template of a create (service/templates).
type Templates interface {
	// Resolve returns template name at version (0: the newest) for
	// tenant, with its config; ref is the reference as the request gave
	// it, for messages. release must be called once the sandbox's record
	// is stored (or the create failed before): until then the template's
	// layers cannot be garbage collected. A template whose build runs is
	// template_building; with wait the build is waited for first.
	Resolve(ctx context.Context, tenant, name string, version int, ref string, wait bool) (_ template.Resolved, release func(), _ error)
}

// Defaults of Config's timing fields.
const (
	// defaultTick is how often expiry is checked: TTLs are whole seconds, so
	// a second of lateness is the most a sandbox overstays.
	defaultTick = time.Second
	// defaultSweep is how often every live sandbox's runtime is inspected, a
	// backstop for the per-sandbox watch on the agent connection (which
	// notices a dead init at once). Inspect spawns `runc state`, so the sweep
	// stays rare.
	defaultSweep = 30 * time.Second
	// defaultDialTimeout bounds connecting to an agent that is starting: it
	// listens within milliseconds of init's start; seconds mean it is broken.
	defaultDialTimeout = 30 * time.Second
	// defaultCreateTimeout bounds one whole create (storage, runtime, agent).
	defaultCreateTimeout = 2 * time.Minute
	// cleanupTimeout bounds teardown that runs detached from any request.
	cleanupTimeout = 2 * time.Minute
	// retryAfterCapacity is the Retry-After of capacity and quota errors:
	// sandboxes live minutes, so a retry in seconds has a fair chance.
	retryAfterCapacity = 5 * time.Second
)

// Config configures a Service.
type Config struct {
	// Settings are the daemon's limits and defaults.
	Settings config.Config
	// Store persists records. Required.
	Store *store.Store
	// Drivers are the runtimes this host offers. The first one whose name is
	// Settings.DefaultRuntime is the default.
	Drivers []driver.Driver
	// Templates resolves the templates of creates. Required.
	Templates Templates
	// SecretsKeyPath is the file of the key that seals secrets at rest;
	// default <Settings.DataDir>/secrets.key.
	SecretsKeyPath string
	// Logger receives the service's logs; default slog.Default().
	Logger *slog.Logger
	// Now is the clock; default time.Now. Tests inject their own.
	Now func() time.Time
	// TickInterval, SweepInterval, AgentDialTimeout, CreateTimeout
	// override the defaults above (tests shorten them).
	TickInterval     time.Duration
	SweepInterval    time.Duration
	AgentDialTimeout time.Duration
	CreateTimeout    time.Duration
	// Network gives every sandbox its network namespace and enforces its
	// egress policy (NetworkOf(network.Manager)). Without it sandboxes get
	// the runtime's loopback-only namespace and only mode none is accepted.
	Network Network
	// Policy decides the network policy of every sandbox. Required.
	Policy Policy
	// Audit receives the audit trail (sandbox lifecycle, execs, file
	// writes); nil records nothing.
	Audit *audit.Recorder
	// Quotas says what a tenant may hold (capacity.go). Required.
	Quotas Quotas
	// Execs runs the template start commands of creates and follows again
	// the execs of sandboxes recovered after a restart. Required.
	Execs Execs
	// Previews forgets the exposed ports of a gone sandbox and restores
	// those of one recovered. Required.
	Previews Previews
	// Meter samples every live sandbox each SampleInterval and before
	// each state change. Required.
	Meter Meter
	// Owners is told which sandboxes are live and hands on the networks
	// the backend reports lost. Required.
	Owners Owners
	// SampleInterval overrides Settings.SampleInterval (tests shorten it).
	SampleInterval time.Duration
	// Observer, when set, is told of creates, execs and agent round trips
	// (metrics).
	Observer Observer
}

// Observer receives latencies for metrics. Calls are on hot paths: they
// must not block.
type Observer interface {
	// CreateDone is told how long a create took on runtime and whether it
	// succeeded.
	CreateDone(runtime string, d time.Duration, ok bool)
	// AgentCall is told the duration of one daemon-to-agent call.
	AgentCall(d time.Duration)
}

// SandboxErrorObserver is an optional part of an Observer: it is told the
// code of every sandbox that ended in state error.
type SandboxErrorObserver interface {
	SandboxError(code string)
}

// Service runs sandboxes. Create one with New, call Start, and Close it to
// stop managing (sandboxes keep running for the next daemon to re-adopt).
type Service struct {
	cfg      Config
	previews Previews
	execs    Execs
	settings config.Config
	store    *store.Store
	drivers  map[string]driver.Driver
	tmpl     Templates
	sealer   *sealer
	log      *slog.Logger
	now      func() time.Time
	net      Network
	audit    *audit.Recorder
	policy   Policy
	// owners says whom each sandbox's events belong to, for the network
	// side's events, and hands on the networks it reports lost.
	owners Owners

	// health caches each driver's probe (refreshed by refreshHealth).
	healthMu sync.Mutex
	health   map[string]driver.Health
	probedAt time.Time

	// quotas says what a tenant may hold; meter samples every sandbox.
	quotas Quotas
	meter  Meter

	// mu guards live. Capacity checks and reservations happen under it so
	// that two creates cannot both take the last slot.
	mu   sync.Mutex
	live map[string]*Live

	// activityFlushed is when activity was last written to the store (the
	// loop's own).
	activityFlushed time.Time

	ctx      context.Context // lifetime of background work; cancelled by Close
	cancel   context.CancelFunc
	shutdown chan struct{} // closed by Close: trackers stop without recording
	wg       sync.WaitGroup
	closed   sync.Once
	started  bool
}

// New returns a Service for cfg. Call Start before use.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil || cfg.Templates == nil || cfg.Policy == nil || cfg.Owners == nil || cfg.Quotas == nil || cfg.Meter == nil || cfg.Previews == nil || cfg.Execs == nil {
		return nil, errors.New("sandbox: store, templates, policy, owners, quotas, meter, previews and execs are required")
	}
	if err := cfg.Settings.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.TickInterval <= 0 {
		cfg.TickInterval = defaultTick
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = defaultSweep
	}
	if cfg.AgentDialTimeout <= 0 {
		cfg.AgentDialTimeout = defaultDialTimeout
	}
	if cfg.CreateTimeout <= 0 {
		cfg.CreateTimeout = defaultCreateTimeout
	}
	if cfg.SampleInterval <= 0 {
		cfg.SampleInterval = cfg.Settings.SampleInterval()
	}
	if cfg.SecretsKeyPath == "" {
		cfg.SecretsKeyPath = filepath.Join(cfg.Settings.DataDir, "secrets.key")
	}
	s, err := loadSealer(cfg.SecretsKeyPath)
	if err != nil {
		return nil, err
	}
	m := &Service{
		previews: cfg.Previews,
		execs:    cfg.Execs,
		cfg:      cfg,
		settings: cfg.Settings,
		store:    cfg.Store,
		drivers:  map[string]driver.Driver{},
		tmpl:     cfg.Templates,
		sealer:   s,
		log:      cfg.Logger.With("component", "sandbox"),
		now:      cfg.Now,
		health:   map[string]driver.Health{},
		live:     map[string]*Live{},
		shutdown: make(chan struct{}),
		net:      cfg.Network,
		audit:    cfg.Audit,
		policy:   cfg.Policy,
		owners:   cfg.Owners,
		quotas:   cfg.Quotas,
		meter:    cfg.Meter,
	}
	for _, d := range cfg.Drivers {
		if _, dup := m.drivers[d.Name()]; dup {
			return nil, fmt.Errorf("sandbox: driver %q registered twice", d.Name())
		}
		m.drivers[d.Name()] = d
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	return m, nil
}

// Start probes the drivers, re-adopts the sandboxes an earlier daemon left
// running (or marks them crashed and cleans them), and starts the TTL and
// liveness loops. It returns once recovery is done.
func (m *Service) Start(ctx context.Context) error {
	m.refreshHealth(ctx, true)
	if err := m.recoverAll(ctx); err != nil {
		return err
	}
	m.startSnapshots(ctx) // snapshot.go
	m.started = true
	m.wg.Add(2)
	go m.loop()
	go m.sampleLoop()
	return nil
}

// Close stops background work and releases agent connections. Sandboxes and
// their running execs keep running: the next daemon re-adopts them. It
// waits for in-flight background work.
func (m *Service) Close() error {
	m.closed.Do(func() {
		close(m.shutdown)
		m.cancel()
		m.mu.Lock()
		live := make([]*Live, 0, len(m.live))
		for _, sb := range m.live {
			live = append(live, sb)
		}
		m.mu.Unlock()
		for _, sb := range live {
			sb.closeClient()
		}
		m.wg.Wait()
	})
	return nil
}

// isShutdown reports whether Close was called.
func (m *Service) isShutdown() bool {
	select {
	case <-m.shutdown:
		return true
	default:
		return false
	}
}

// Execs follows the execs of sandboxes (service/exec's Engine).
type Execs interface {
	// StartTemplate runs the template's start command in sb as an exec
	// (its output can be followed like any exec's) and waits for its
	// ready command to pass; it fails if the start command ends first or
	// ctx ends.
	StartTemplate(ctx context.Context, sb *Live, cfg template.Config) error
	// Reattach follows again the execs of sb, recovered after a restart,
	// that the store says are still running.
	Reattach(ctx context.Context, sb *Live) error
	// Forget drops what is kept of sandbox id, which is gone.
	Forget(id string)
}

// Previews keeps the exposed ports of sandboxes (service/previews' Ports).
type Previews interface {
	// Restore serves again the ports sb exposed before a restart.
	Restore(ctx context.Context, sb *Live)
	// Forget drops the ports of sandbox id, which is gone.
	Forget(id string)
	// Prune drops the stored ports of sandboxes that are not live (once
	// recovery is done).
	Prune(ctx context.Context)
}

// Meter samples sandboxes' resource use and accounts their usage
// (service/accounting's Meter).
type Meter interface {
	// Sample takes one sample of sb and accounts its usage since the
	// last one.
	Sample(ctx context.Context, sb *Live)
	// Forget drops what the meter keeps of sandbox id, which is gone.
	Forget(id string)
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
				m.meter.Sample(m.ctx, sb)
			}
		}
	}
}

// go runs fn as tracked background work.
func (m *Service) goBackground(fn func()) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		fn()
	}()
}

// loop enforces TTLs every tick, sweeps liveness and purges old records.
func (m *Service) loop() {
	defer m.wg.Done()
	tick := time.NewTicker(m.cfg.TickInterval)
	defer tick.Stop()
	sweep := time.NewTicker(m.cfg.SweepInterval)
	defer sweep.Stop()
	// Purging hourly is plenty for a retention counted in days.
	purge := time.NewTicker(time.Hour)
	defer purge.Stop()
	m.purge()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-tick.C:
			m.expire()
			m.idle()
			m.boundPaused()
			m.flushActivity()
		case <-sweep.C:
			m.sweep()
		case <-purge.C:
			m.purge()
		case <-m.owners.Lost():
			for _, l := range m.owners.TakeLost() {
				m.goBackground(func() { m.networkLost(l.ID, l.Err) })
			}
		}
	}
}

// purge drops records older than the retention.
func (m *Service) purge() {
	ctx, cancel := context.WithTimeout(m.ctx, time.Minute)
	defer cancel()
	n, err := m.store.Purge(ctx, m.now().Add(-m.settings.RecordRetention()))
	if err != nil {
		m.log.Warn("purging old records", "err", err)
		return
	}
	if n > 0 {
		m.log.Info("purged old sandbox records", "count", n)
	}
}

// refreshHealth re-probes the drivers when force is set or the cache is
// older than healthTTL.
func (m *Service) refreshHealth(ctx context.Context, force bool) map[string]driver.Health {
	// healthTTL keeps /v1/info and /readyz cheap: a probe spawns processes.
	const healthTTL = 30 * time.Second
	m.healthMu.Lock()
	defer m.healthMu.Unlock()
	if force || m.now().Sub(m.probedAt) > healthTTL {
		for name, d := range m.drivers {
			h := d.Probe(ctx)
			if old, ok := m.health[name]; !ok || old.State != h.State {
				m.log.Info("driver health", "driver", name, "state", h.State, "description", h.Description)
			}
			m.health[name] = h
		}
		m.probedAt = m.now()
	}
	out := make(map[string]driver.Health, len(m.health))
	for k, v := range m.health {
		out[k] = v
	}
	return out
}

// Info describes the runtimes and limits (GET /v1/info).
func (m *Service) Info(ctx context.Context, version string) api.Info {
	health := m.refreshHealth(ctx, false)
	info := api.Info{Version: version, Limits: m.limits()}
	for _, name := range knownRuntimes {
		di := api.DriverInfo{Name: name, Health: string(driver.HealthUndetected), Default: name == m.settings.DefaultRuntime}
		if d, ok := m.drivers[name]; ok {
			h := health[name]
			di.Health, di.Description = string(h.State), h.Description
			di.Capabilities = mustJSON(d.Capabilities())
			di.Durability = durabilityOf(d)
		} else {
			di.Description = "not available in this build or on this host"
		}
		info.Drivers = append(info.Drivers, di)
	}
	return info
}

func (m *Service) limits() api.Limits {
	s := m.settings
	res := func(r config.Resources) api.Resources {
		return api.Resources{CPU: r.CPU, MemoryMB: r.MemoryMB, DiskMB: r.DiskMB, PIDs: r.PIDs}
	}
	return api.Limits{
		MaxSandboxes: s.MaxSandboxes, MaxSandboxesPerTenant: s.MaxSandboxesPerTenant,
		DefaultTimeoutS: s.DefaultTimeoutS, MaxTimeoutS: s.MaxTimeoutS,
		DefaultResources: res(s.DefaultResources), MaxResources: res(s.MaxResources),
		MaxUploadBytes: s.MaxUploadBytes,
	}
}

// Ready reports whether the service can serve: store open, default runtime
// healthy.
func (m *Service) Ready(ctx context.Context) error {
	if err := m.store.Ping(ctx); err != nil {
		return err
	}
	h := m.refreshHealth(ctx, false)
	def, ok := h[m.settings.DefaultRuntime]
	if !ok || def.State != driver.HealthHealthy {
		return public(errUnavailable, "default runtime %s is not healthy", m.settings.DefaultRuntime)
	}
	return nil
}

// StateCounts returns how many live sandboxes are in each state (metrics).
func (m *Service) StateCounts() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]int{}
	for _, st := range liveStates {
		out[st] = 0
	}
	for _, sb := range m.live {
		sb.mu.Lock()
		out[sb.rec.State]++
		sb.mu.Unlock()
	}
	return out
}

// cleanupCtx returns a context for teardown that a cancelled request cannot
// cut short, bounded by cleanupTimeout.
func cleanupCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
}

// SandboxCount is how many live sandboxes share a state, runtime and
// template (name only, so label values stay few).
type SandboxCount struct {
	State, Runtime, Template string
	N                        int
}

// SandboxCounts groups the live sandboxes by state, runtime and template
// (metrics).
func (m *Service) SandboxCounts() []SandboxCount {
	type key struct{ st, rt, tp string }
	counts := map[key]int{}
	for _, sb := range m.Lives() {
		sb.mu.Lock()
		counts[key{sb.rec.State, sb.rec.Runtime, sb.rec.Template}]++
		sb.mu.Unlock()
	}
	out := make([]SandboxCount, 0, len(counts))
	for k, n := range counts {
		out = append(out, SandboxCount{State: k.st, Runtime: k.rt, Template: k.tp, N: n})
	}
	return out
}

// Capacity returns the host's sandbox capacity and how much of it is used.
func (m *Service) Capacity() (max, used int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.settings.MaxSandboxes, len(m.live)
}

// Settings returns the daemon's settings the service runs with.
func (m *Service) Settings() config.Config { return m.settings }

// SampleInterval is how often every live sandbox is sampled.
func (m *Service) SampleInterval() time.Duration { return m.cfg.SampleInterval }
