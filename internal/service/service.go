// Package service wires airlock's services in the one order they can be made: the policies the sandbox
// lifecycle consults first, then the lifecycle (internal/service/sandbox), then the services that work on
// its live sandboxes. The daemon and the tests that need the whole service graph over a driver use it;
// the planes (internal/plane/…) take the services it makes through interfaces of their own.
package service

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/build"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/service/accounting"
	"github.com/airlockhq/airlock/internal/service/code"
	"github.com/airlockhq/airlock/internal/service/exec"
	"github.com/airlockhq/airlock/internal/service/files"
	"github.com/airlockhq/airlock/internal/service/netpolicy"
	"github.com/airlockhq/airlock/internal/service/previews"
	"github.com/airlockhq/airlock/internal/service/sandbox"
	"github.com/airlockhq/airlock/internal/service/templates"
	"github.com/airlockhq/airlock/internal/store"
)

// Config is what the services need: the daemon's settings, the store, the
// drivers, the template catalog and builder, the network backend, and the
// sinks of their events. Settings, Store, Drivers and Templates are
// required.
type Config struct {
	// Settings are the daemon's limits and defaults; PreviewListen is the
	// preview listener as bound ("" when previews are off).
	Settings config.Config
	Store    *store.Store
	// Drivers are the runtimes of this host.
	Drivers []driver.Driver
	// Templates resolves template references without a builder (tests).
	Templates templates.Catalog
	// Builder, when set, builds and catalogs templates.
	Builder *build.Builder
	// Network is the sandbox network backend (sandbox.NetworkOf); nil
	// gives sandboxes loopback only.
	Network sandbox.Network
	// Registries are the package registry sets Network enforces.
	Registries map[string][]string
	// DefaultNetworkMode is the mode of a create that names none.
	DefaultNetworkMode string
	// Audit receives the audit trail; nil records nothing.
	Audit *audit.Recorder
	// Attribution is the sink of the network side's events, made before
	// the network backend (default: one of the services' own).
	Attribution *netpolicy.Attribution
	// Observer is told of creates, execs and agent calls (metrics).
	Observer Observer
	// Logger and Now default to slog.Default() and time.Now.
	Logger *slog.Logger
	Now    func() time.Time
	// SecretsKeyPath is the key sealing secrets at rest (default in the
	// data dir).
	SecretsKeyPath string
	// Timing overrides (tests shorten them); zero keeps the defaults.
	TickInterval, SweepInterval, AgentDialTimeout, CreateTimeout, ExecRetention, SampleInterval time.Duration
}

// Observer is told of creates, execs and agent round trips (metrics).
type Observer interface {
	sandbox.Observer
	exec.Observer
}

// Set is the services of one daemon. The fields are the services the
// planes take; each implements the planes' interfaces of its concern.
type Set struct {
	Sandboxes  *sandbox.Service
	Execs      *exec.Service
	Files      *files.Service
	Networks   *netpolicy.Policy
	Previews   *previews.Service
	Accounting *accounting.Service
	Templates  *templates.Service
	Code       *code.Service

	closers []func()
}

// New makes the services of cfg. Call Start before use and Close after.
func New(cfg Config) (*Set, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Templates == nil && cfg.Builder != nil {
		cfg.Templates = cfg.Builder
	}
	if cfg.Templates == nil {
		return nil, errors.New("service: a template catalog or builder is required")
	}
	// The policies the lifecycle consults.
	policy, err := netpolicy.New(netpolicy.Config{Backend: cfg.Network, Store: cfg.Store, Registries: cfg.Registries,
		DefaultNetworkMode: cfg.DefaultNetworkMode, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	if cfg.Attribution == nil {
		cfg.Attribution = netpolicy.NewAttribution(netpolicy.AttributionConfig{Audit: cfg.Audit, Registries: cfg.Registries, Logger: cfg.Logger, Now: cfg.Now})
	}
	tmpl := templates.New(templates.Config{Builder: cfg.Builder, Catalog: cfg.Templates, Logger: cfg.Logger})
	quotas := accounting.NewQuotas(accounting.QuotasConfig{Store: cfg.Store, Settings: cfg.Settings, Logger: cfg.Logger, Now: cfg.Now})
	var counters accounting.Counters
	if cfg.Network != nil {
		counters = cfg.Network
	}
	ports := previews.NewPorts(previews.PortsConfig{Store: cfg.Store, DataDir: cfg.Settings.DataDir,
		Domain: cfg.Settings.PreviewDomain, Listen: cfg.Settings.PreviewListen, Logger: cfg.Logger, Now: cfg.Now})
	var execObs exec.Observer
	if cfg.Observer != nil {
		execObs = cfg.Observer
	}
	engine := exec.NewEngine(exec.EngineConfig{Settings: cfg.Settings, Store: cfg.Store, Audit: cfg.Audit, Observer: execObs,
		Logger: cfg.Logger, Now: cfg.Now, ExecRetention: cfg.ExecRetention, AgentDialTimeout: cfg.AgentDialTimeout})
	meter := accounting.NewMeter(accounting.MeterConfig{Store: cfg.Store, Network: counters, Logger: cfg.Logger, Now: cfg.Now})
	m, err := sandbox.New(sandbox.Config{
		Settings: cfg.Settings, Store: cfg.Store, Drivers: cfg.Drivers, Templates: tmpl,
		SecretsKeyPath: cfg.SecretsKeyPath, Logger: cfg.Logger, Now: cfg.Now,
		TickInterval: cfg.TickInterval, SweepInterval: cfg.SweepInterval, AgentDialTimeout: cfg.AgentDialTimeout,
		CreateTimeout: cfg.CreateTimeout, SampleInterval: cfg.SampleInterval,
		Network: cfg.Network, Policy: policy, Owners: cfg.Attribution, Quotas: quotas, Meter: meter, Previews: ports, Execs: engine,
		Audit: cfg.Audit, Observer: cfg.Observer,
	})
	if err != nil {
		tmpl.Close()
		engine.Close()
		return nil, err
	}
	var netns previews.NetNS
	if n, ok := cfg.Network.(previews.NetNS); ok {
		netns = n
	}
	// The code interpreter is one per daemon: it kills the kernels it
	// does not know.
	cb := code.NewBackend(m, cfg.Logger)
	c := code.New(code.Config{Backend: cb, Logger: cfg.Logger.With("component", "code"), Now: cfg.Now})
	s := &Set{
		Sandboxes: m,
		Execs:     exec.New(exec.Config{Engine: engine, Sandboxes: m, Quotas: quotas}),
		Files:     files.New(files.Config{Sandboxes: m, MaxUploadBytes: cfg.Settings.MaxUploadBytes}),
		Networks:  policy,
		Previews:  previews.New(previews.Config{Sandboxes: m, Ports: ports, NetNS: netns, Logger: cfg.Logger}),
		Accounting: accounting.New(accounting.Config{Sandboxes: m, Quotas: quotas, Meter: meter, Store: cfg.Store,
			Audit: cfg.Audit, Settings: cfg.Settings, SampleInterval: m.SampleInterval()}),
		Templates: tmpl,
		Code:      c,
	}
	// Closed in reverse: the code interpreter's kernels before the
	// sandboxes' agent connections.
	s.closers = []func(){tmpl.Close, func() { m.Close() }, engine.Close, cb.Close, c.Close}
	return s, nil
}

// Start re-adopts the sandboxes an earlier daemon left and starts the
// background work (TTLs, liveness, sampling). It returns once recovery is
// done.
func (s *Set) Start(ctx context.Context) error {
	if err := s.Sandboxes.Start(ctx); err != nil {
		return err
	}
	// Warm pools refill once the members an earlier daemon made are back.
	s.Sandboxes.StartPools()
	return nil
}

// Close stops the services; sandboxes keep running for the next daemon.
func (s *Set) Close() error {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
	return nil
}
