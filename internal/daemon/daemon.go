// Package daemon is `airlock serve`: it loads the configuration, opens the store, prepares the base template, starts the drivers, the template builder, the services (internal/service) and the planes (the HTTP API, the E2B planes, the preview listener), and shuts them down gracefully.
//
// Settings come from, highest precedence first: command-line flags,
// AIRLOCK_* environment variables, the JSON file given with --config, and
// built-in defaults (see internal/config). AIRLOCK_ADMIN_KEY sets the admin
// API key; without it a key is generated on the first start and printed
// once to stderr (only its hash is stored).
//
// Shutdown (SIGINT, SIGTERM) stops accepting connections, ends event
// streams (clients re-attach with Last-Event-ID), lets in-flight requests
// finish until the shutdown timeout, and leaves every sandbox running: the
// next start re-adopts them.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/build"
	"github.com/airlockhq/airlock/internal/cgroups"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/hostslot"
	"github.com/airlockhq/airlock/internal/network"
	"github.com/airlockhq/airlock/internal/pkgcache"
	"github.com/airlockhq/airlock/internal/plane/e2b"
	"github.com/airlockhq/airlock/internal/plane/httpapi"
	"github.com/airlockhq/airlock/internal/plane/preview"
	"github.com/airlockhq/airlock/internal/reaper"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/service/netpolicy"
	"github.com/airlockhq/airlock/internal/service/sandbox"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/tracing"
	"github.com/airlockhq/airlock/internal/version"
)

// agentBinary is the agent's file name, looked up beside the running
// executable and on $PATH.
const agentBinary = "airlock-agent"

// NewServeCommand returns the `serve` command.
func NewServeCommand() *cobra.Command {
	var (
		configPath string
		flags      config.Config
	)
	def := config.Default()
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the airlock daemon (HTTP API and sandbox manager)",
		Long: `Run the airlock daemon: the HTTP API that creates sandboxes and runs code in them.

Settings, highest precedence first: flags, AIRLOCK_* environment variables
(` + strings.Join(config.EnvVars, ", ") + `),
the JSON file given with --config, built-in defaults.

AIRLOCK_ADMIN_KEY sets the admin API key. Without it, the first start
generates one and prints it once on stderr; only its hash is stored.
An earlier AIRLOCK_ADMIN_KEY is revoked when a different one is set.

The agent binary is --agent-path when given, else airlock-agent next to
this executable, else airlock-agent on $PATH.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: false,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := resolveConfig(cmd.Flags(), flags, configPath, os.LookupEnv)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return Run(ctx, cfg, Options{
				AdminKey: os.Getenv(auth.EnvAdminKeyName), Stderr: cmd.ErrOrStderr(),
				DefaultNetworkMode: os.Getenv(EnvDefaultNetworkMode),
				NoNetwork:          os.Getenv(EnvNoNetwork) == "1",
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&configPath, "config", "", "JSON config file")
	f.StringVar(&flags.Listen, "listen", def.Listen, "HTTP listen address")
	f.StringVar(&flags.DataDir, "data-dir", def.DataDir, "directory for the store, templates and sandboxes")
	f.StringVar(&flags.AgentPath, "agent-path", "", "path of the airlock-agent binary (default: beside this executable, then $PATH)")
	f.BoolVar(&flags.NoPrepare, "no-prepare", false, "do not build the base template at start")
	f.StringVar(&flags.LogLevel, "log-level", def.LogLevel, "log level: debug, info, warn, error")
	return cmd
}

// resolveConfig layers the settings: defaults < file < environment < the
// flags the user actually set.
func resolveConfig(f *pflag.FlagSet, flags config.Config, configPath string, lookup func(string) (string, bool)) (config.Config, error) {
	cfg, err := config.Load(configPath, lookup)
	if err != nil {
		return cfg, err
	}
	if f.Changed("listen") {
		cfg.Listen = flags.Listen
	}
	if f.Changed("data-dir") {
		cfg.DataDir = flags.DataDir
	}
	if f.Changed("agent-path") {
		cfg.AgentPath = flags.AgentPath
	}
	if f.Changed("no-prepare") {
		cfg.NoPrepare = flags.NoPrepare
	}
	if f.Changed("log-level") {
		cfg.LogLevel = flags.LogLevel
	}
	return cfg, nil
}

// Options are run-time inputs that are not configuration.
type Options struct {
	// AdminKey is AIRLOCK_ADMIN_KEY ("" to generate one on first start).
	AdminKey string
	// Stderr receives logs, the template build's progress and the
	// generated admin key.
	Stderr io.Writer
	// Ready, when set, is called with the listening address once the API
	// serves (tests).
	Ready func(addr net.Addr)
	// DefaultNetworkMode is the network mode of sandboxes whose create names
	// none and whose tenant has no default; "" means none.
	DefaultNetworkMode string
	// NoNetwork runs without sandbox networking: every sandbox gets a
	// loopback-only namespace from its runtime, and only mode none is
	// accepted.
	NoNetwork bool
	// Network, when set, adjusts the sandbox network's configuration
	// before it is made. Tests point HostNetNS at a namespace of their own
	// (and pick Upstream and Registries), so that nothing touches the
	// host's network.
	Network func(*network.Config)
}

// EnvDefaultNetworkMode sets Options.DefaultNetworkMode for `airlock serve`.
const EnvDefaultNetworkMode = "AIRLOCK_DEFAULT_NETWORK_MODE"

// EnvNoNetwork set to 1 runs `airlock serve` with Options.NoNetwork: tests
// that start the real binary must not touch the host's network.
const EnvNoNetwork = "AIRLOCK_NO_NETWORK"

// EnvTestHostNetNS, for tests that start the real binary, is the path of
// a network namespace the test made: the daemon's network side (veths,
// nftables, listeners) lives there instead of in the host's.
const EnvTestHostNetNS = "AIRLOCK_TEST_HOST_NETNS"

// Run runs the daemon until ctx is done, then shuts down gracefully.
func Run(ctx context.Context, cfg config.Config, opts Options) (err error) {
	if opts.Stderr == nil {
		opts.Stderr = os.Stderr
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := newLogger(opts.Stderr, cfg.LogLevel)
	slog.SetDefault(log)

	// Tracing first and its shutdown last, so that the spans of the whole
	// run, shutdown included, are flushed.
	shutdownTracing, err := tracing.Setup(ctx, tracing.Config{
		Endpoint: cfg.OTLPEndpoint, ServiceName: "airlock", Version: version.Version,
	})
	if err != nil {
		return err
	}
	defer func() {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := shutdownTracing(tctx); err != nil {
			log.Warn("flushing traces", "err", err)
		}
	}()

	// Container inits are reparented to us rather than to host PID 1, so
	// that the driver can learn how they ended.
	if err := reaper.Enable(); err != nil {
		log.Warn("cannot become a child subreaper", "err", err)
	}
	// Searchable, not readable: sandbox uids traverse it to the agent
	// binary and their sandbox dirs; nothing else in it is theirs.
	if err := os.MkdirAll(cfg.DataDir, 0o711); err != nil {
		return fmt.Errorf("creating data dir: %w", err)
	}
	if err := os.Chmod(cfg.DataDir, 0o711); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	unlock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return err
	}
	defer unlock()
	// The host slot: every host-wide name this daemon uses (nftables
	// table, veths, subnet, cgroups, uid ranges) derives from it, so that
	// daemons on other data dirs never touch its sandboxes, nor it theirs.
	slot, err := claimSlot(cfg, log)
	if err != nil {
		return err
	}
	defer slot.Release()

	st, err := store.Open(ctx, filepath.Join(cfg.DataDir, "airlock.db"))
	if err != nil {
		return err
	}
	defer st.Close()
	authn := auth.New(st)
	generated, err := authn.Bootstrap(ctx, opts.AdminKey)
	if err != nil {
		return fmt.Errorf("admin key: %w", err)
	}
	if generated != "" {
		// Printed once, here; only the hash is stored.
		fmt.Fprintf(opts.Stderr, "\nairlock: generated an admin API key. It is shown only this once; store it now:\n\n    %s\n\n"+
			"Use it as `Authorization: Bearer <key>` or AIRLOCK_API_KEY; create tenant keys with POST /v1/keys.\n\n", generated)
	}

	agentPath, err := findAgent(cfg.AgentPath)
	if err != nil {
		return err
	}
	log.Info("agent binary", "path", agentPath)

	// Listen now: the sandbox network closes the API's port to sandboxes,
	// and with --listen :0 the port is known only once bound.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("listening on %s: the address is in use (another airlock serve?); give this daemon another --listen: %w", cfg.Listen, err)
		}
		return fmt.Errorf("listening on %s: %w", cfg.Listen, err)
	}
	defer ln.Close()

	rec, err := audit.New(audit.Config{Sink: st, Logger: log})
	if err != nil {
		return err
	}
	defer rec.Close()

	// Previews listen on their own origin. A port already taken disables
	// them with a warning rather than the whole daemon: the API matters
	// more, and GET /v1/info-style errors (501) say why.
	var pln net.Listener
	if cfg.PreviewListen != "" {
		if pln, err = net.Listen("tcp", cfg.PreviewListen); err != nil {
			log.Warn("previews disabled: cannot listen (in use by another airlock serve? set preview_listen / AIRLOCK_PREVIEW_LISTEN to another address, or empty)",
				"addr", cfg.PreviewListen, "err", err)
			pln = nil
		} else {
			defer pln.Close()
		}
	}
	closed := []net.Addr{ln.Addr()}
	if pln != nil {
		closed = append(closed, pln.Addr())
	}
	// Events flow through sinks given at construction: the attribution
	// (sandbox → tenant, template) is made first, its methods are the
	// network's sinks, and the services, made last, are given it too.
	ncfg, regs := networkConfig(cfg, opts, slot.Names, closed, log)
	attr := netpolicy.NewAttribution(netpolicy.AttributionConfig{Audit: rec, Registries: regs, Logger: log})
	nm := newNetwork(ncfg, attr, log)
	if nm != nil {
		defer nm.Close()
	} else {
		regs = nil
	}

	tmpl := template.NewStore(filepath.Join(cfg.DataDir, "templates"))
	if !cfg.NoPrepare {
		log.Info("preparing base template (the first build takes a minute)")
		t, err := tmpl.EnsureBase(ctx, opts.Stderr)
		if err != nil {
			return fmt.Errorf("preparing base template: %w", err)
		}
		log.Info("base template ready", "version", t.Version)
	}

	drivers, closeDrivers := newDrivers(cfg, agentPath, slot.Names, log)
	defer closeDrivers()

	var buildNet build.NetworkFunc
	if nm != nil {
		buildNet = buildNetwork(nm, regs, attr)
	}
	bld, err := newBuilder(ctx, st, tmpl, filepath.Join(cfg.DataDir, "uploads"), drivers, buildNet, log)
	if err != nil {
		return err
	}
	defer bld.Close()

	metrics := httpapi.NewMetrics(nil)
	// The services hand out preview URLs of the listener as bound (a
	// configured port 0 is known only now), or none when it is off.
	mset := cfg
	mset.PreviewListen = ""
	if pln != nil {
		mset.PreviewListen = pln.Addr().String()
	}
	// The services (internal/service wires them in their order), then
	// the planes over them.
	svc, err := service.New(service.Config{
		Settings: mset, Store: st, Drivers: drivers, Templates: bld, Builder: bld, Logger: log,
		Observer: metrics, Audit: rec, Attribution: attr, DefaultNetworkMode: opts.DefaultNetworkMode,
		Network: sandbox.NetworkOf(nm), Registries: regs,
	})
	if err != nil {
		return err
	}
	// Closed after the server's streams end (serve returns).
	defer svc.Close()
	if err := svc.Start(ctx); err != nil {
		return err
	}
	if pln != nil {
		ph := preview.New(preview.Config{Domain: cfg.PreviewDomain, Backend: svc.Previews.PreviewBackend(), Logger: log.With("component", "preview")})
		psrv := &http.Server{Handler: ph, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := psrv.Serve(pln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("preview listener", "err", err)
			}
		}()
		defer func() { psrv.Close(); ph.Close() }()
		log.Info("previews", "listen", pln.Addr().String(), "domain", cfg.PreviewDomain)
	}
	// The E2B-compatible planes on the same listener. E2B access tokens
	// derive from a key kept in the data dir, so they outlive a restart.
	tokenKey, err := e2b.LoadOrCreateKey(filepath.Join(cfg.DataDir, "e2b-token.key"))
	if err != nil {
		return err
	}
	eh := e2b.New(e2b.Config{
		Sandboxes: svc.Sandboxes, Execs: svc.Execs, Files: svc.Files, Ports: svc.Previews, Templates: svc.Templates,
		Auth: authn, Code: svc.Code, Logger: log.With("component", "e2b"), TokenKey: tokenKey, Audit: rec,
		MaxUploadBytes: cfg.MaxUploadBytes, MaxExecTimeout: time.Duration(cfg.MaxExecTimeoutS) * time.Second,
	})
	srv := httpapi.New(httpapi.Config{
		Sandboxes: svc.Sandboxes, Execs: svc.Execs, Files: svc.Files, Networks: svc.Networks,
		Previews: svc.Previews, Accounting: svc.Accounting, Templates: svc.Templates, Code: svc.Code,
		Auth: authn, Metrics: metrics, Logger: log, Version: version.Version,
		MaxUploadBytes: cfg.MaxUploadBytes, Audit: rec, E2B: eh, Host: hostInfo(slot.Names),
	})
	return serve(ctx, cfg, ln, srv, log, opts)
}

// networkConfig is the configuration of the daemon's one network.Manager
// (state in <data>/network, the API's port closed to sandboxes, the host's
// apt mirror as the debian registry set) but its event sinks, with the
// registry sets it enforces; nil with opts.NoNetwork.
func networkConfig(cfg config.Config, opts Options, names hostslot.Names, closed []net.Addr, log *slog.Logger) (*network.Config, map[string][]string) {
	if opts.NoNetwork {
		return nil, nil
	}
	over := map[string][]string{}
	if os.Getenv(network.RegistryEnvPrefix+"DEBIAN") == "" {
		if mirror, err := template.Mirror(); err == nil {
			if u, err := url.Parse(mirror); err == nil && u.Hostname() != "" {
				over["debian"] = []string{strings.ToLower(u.Hostname())}
			}
		} else {
			log.Warn("no debian mirror for the debian registry set", "err", err)
		}
	}
	ncfg := network.Config{
		StateDir:   filepath.Join(cfg.DataDir, "network"),
		Registries: over,
		Logger:     log.With("component", "network"),
		// The slot's names; every daemon's subnets stay closed.
		Table: names.Table, IfPrefix: names.IfPrefix, Subnet: names.Subnet, LogGroup: names.LogGroup,
		SandboxRanges: hostslot.Subnets(),
	}
	for _, a := range closed {
		if ta, ok := a.(*net.TCPAddr); ok {
			ncfg.APIPorts = append(ncfg.APIPorts, uint16(ta.Port))
		}
	}
	// The registry mirror: upstreams over HTTPS (Debian's from the host's
	// apt sources), files kept in a bounded cache, a per-sandbox cap.
	debianMirror := ""
	if mirror, err := template.Mirror(); err == nil {
		debianMirror = mirror
	}
	ncfg.Upstreams = network.DefaultUpstreams(debianMirror)
	ncfg.MaxDownloadBytes = cfg.MaxDownloadMB << 20
	if cfg.PackageCacheMB > 0 {
		if st, err := pkgcache.OpenStore(filepath.Join(cfg.DataDir, "pkgcache"), cfg.PackageCacheMB<<20); err != nil {
			log.Warn("package cache unavailable: packages pass through uncached", "err", err)
		} else {
			ncfg.PackageCache = st
		}
	}
	if opts.Network != nil {
		opts.Network(&ncfg)
	}
	if p := os.Getenv(EnvTestHostNetNS); p != "" && ncfg.HostNetNS == "" {
		ncfg.HostNetNS = p
	}
	regs := network.DefaultRegistries(ncfg.Registries)
	ncfg.Registries = regs
	return &ncfg, regs
}

// newNetwork makes the daemon's one network.Manager from ncfg, its events
// going to attr: egress decisions and package downloads become audit
// events of their sandbox's tenant; a network broken from outside is wired
// again (audited) or, when it cannot be, its sandbox ends in error
// network_lost. Without it (ncfg nil, or a host that cannot: not root, no
// nftables) it returns nil and sandboxes get loopback only.
func newNetwork(ncfg *network.Config, attr *netpolicy.Attribution, log *slog.Logger) *network.Manager {
	if ncfg == nil {
		return nil
	}
	// The sinks an Options.Network hook (tests) did not set itself.
	if ncfg.Audit == nil {
		ncfg.Audit = attr.NetworkEvent
	}
	if ncfg.PackageAudit == nil {
		ncfg.PackageAudit = attr.PackageEvent
	}
	if ncfg.OnRepair == nil {
		ncfg.OnRepair = attr.NetworkRepaired
	}
	if ncfg.OnLost == nil {
		ncfg.OnLost = attr.NetworkLost
	}
	nm, err := network.New(*ncfg)
	if err != nil {
		log.Warn("sandbox networking unavailable: sandboxes get loopback only", "err", err)
		return nil
	}
	// Build sandboxes a dead daemon left are destroyed by the builder's
	// recovery; their networks go here, before any new build starts.
	for _, id := range nm.Known() {
		if strings.HasPrefix(id, build.BuildSandboxPrefix) {
			tctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if err := nm.Teardown(tctx, id); err != nil {
				log.Warn("removing a dead build sandbox's network", "sandbox_id", id, "err", err)
			}
			cancel()
		}
	}
	log.Info("sandbox networking ready", "registries", build.AvailableRegistries(ncfg.Registries))
	return nm
}

// buildNetwork gives RUN steps of template builds the package registries
// (every set that has hosts) through the network's allowlist, and
// attributes their egress to the build's tenant in the audit trail.
func buildNetwork(nm *network.Manager, regs map[string][]string, attr *netpolicy.Attribution) build.NetworkFunc {
	reg := build.RegistryNetwork(nm, build.AvailableRegistries(regs))
	return func(ctx context.Context, id string) (build.Network, func(), error) {
		o, _ := build.OwnerOf(ctx)
		release := attr.Attribute(id, o.Tenant, o.Template)
		n, cleanup, err := reg(ctx, id)
		if err != nil {
			release()
			return n, nil, err
		}
		return n, func() { cleanup(); release() }, nil
	}
}

// newBuilder makes the template builder. Build sandboxes run on the first
// of drivers that captures layers (driver.LayerCapturer) and is healthy,
// else on the first that captures layers at all: runc where it is
// available, gvisor otherwise. Without one, RUN and COPY steps fail with a
// message saying so.
func newBuilder(ctx context.Context, st *store.Store, tmpl *template.Store, uploads string, drivers []driver.Driver, netFn build.NetworkFunc, log *slog.Logger) (*build.Builder, error) {
	bc := build.Config{Store: st, Templates: tmpl, UploadDir: uploads, Logger: log}
	if bd := buildDriver(ctx, drivers); bd != nil {
		log.Info("template builds", "runtime", bd.Name())
		bc.Driver = bd
		// RUN steps reach the package registries (nil without sandbox
		// networking: a RUN that downloads fails with a message saying so).
		bc.Network = netFn
	}
	b, err := build.New(bc)
	if err != nil {
		return nil, err
	}
	if err := b.Recover(ctx); err != nil {
		b.Close()
		return nil, fmt.Errorf("recovering template builds: %w", err)
	}
	return b, nil
}

// buildDriver picks the driver of build sandboxes (see newBuilder), nil if
// no driver captures layers.
func buildDriver(ctx context.Context, drivers []driver.Driver) build.Driver {
	var first build.Driver
	for _, d := range drivers {
		bd, ok := d.(build.Driver)
		if !ok || !d.Capabilities().LayerCapture {
			continue
		}
		if d.Probe(ctx).State == driver.HealthHealthy {
			return bd
		}
		if first == nil {
			first = bd
		}
	}
	return first
}

// serve runs the HTTP server on ln until ctx is done.
func serve(ctx context.Context, cfg config.Config, ln net.Listener, srv *httpapi.Server, log *slog.Logger, opts Options) error {
	hs := &http.Server{
		Handler: srv.Handler(),
		// Slow-header clients cannot hold connections open forever. There is
		// no write timeout: exec waits and event streams last as long as the
		// command.
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		// A client on this host gets TCP without pacing (tuneLocal).
		ConnState: func(c net.Conn, st http.ConnState) {
			if st == http.StateNew {
				tuneLocal(c)
			}
		},
	}
	// Event streams and terminals end when shutdown starts: they would
	// otherwise hold it for the whole timeout. Clients re-attach.
	hs.RegisterOnShutdown(srv.CloseStreams)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	log.Info("airlock serving", "addr", ln.Addr().String(), "version", version.Version, "data_dir", cfg.DataDir)
	// How to use it, for the person who just ran `make run`.
	fmt.Fprintf(opts.Stderr, "\nairlock is ready on http://%s — with AIRLOCK_API_KEY set to your key:\n"+
		"    bin/airlock run -- python3 -c 'print(6*7)'\n"+
		"    curl -H \"Authorization: Bearer $AIRLOCK_API_KEY\" -d '{}' http://%s/v1/sandboxes\n"+
		"    bin/airlock code SANDBOX_ID 'import sys; sys.version'   # the code interpreter\n"+
		"    bin/airlock doctor    # what this host can run\n"+
		"E2B SDKs: E2B_API_URL=http://%s E2B_SANDBOX_URL=http://%s E2B_API_KEY=$AIRLOCK_API_KEY (docs/e2b.md)\n\n",
		ln.Addr(), ln.Addr(), ln.Addr(), ln.Addr())
	if opts.Ready != nil {
		opts.Ready(ln.Addr())
	}
	select {
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down; sandboxes keep running")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(cfg.ShutdownTimeoutS)*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		log.Warn("in-flight requests cut off at the shutdown deadline", "err", err)
		hs.Close()
	}
	<-errc
	return nil
}

// newLogger returns the JSON logger on w.
func newLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l}))
}

// findAgent locates the agent binary: the configured path, else beside the
// running executable (bin/airlock-agent next to bin/airlock), else $PATH.
func findAgent(configured string) (string, error) {
	if configured != "" {
		return checkExecutable(configured)
	}
	if exe, err := os.Executable(); err == nil {
		if real, err := filepath.EvalSymlinks(exe); err == nil {
			exe = real
		}
		if p, err := checkExecutable(filepath.Join(filepath.Dir(exe), agentBinary)); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath(agentBinary); err == nil {
		return checkExecutable(p)
	}
	return "", errors.New("cannot find " + agentBinary + ": not beside this executable nor on $PATH; build it (make build) or pass --agent-path")
}

func checkExecutable(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return "", fmt.Errorf("agent binary: %w", err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("agent binary %s is not an executable file", abs)
	}
	return abs, nil
}

// lockDataDir takes an exclusive lock on the data dir: two daemons on one
// data dir would each think they own every sandbox in it. The lock file
// names the holder's pid, so that a refusal can say who it is.
func lockDataDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, "airlock.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock file: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			b := make([]byte, 32)
			n, _ := f.ReadAt(b, 0)
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n]))); err == nil && pid > 0 {
				return nil, errdefs.Wrap(errdefs.ErrConflict, "another airlock serve (pid %d) is using data dir %s", pid, dir)
			}
			return nil, errdefs.Wrap(errdefs.ErrConflict, "another airlock serve is using data dir %s", dir)
		}
		return nil, fmt.Errorf("locking %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { f.Close() }, nil
}

// hostInfo is what GET /v1/info tells admins of the host slot.
func hostInfo(n hostslot.Names) *api.HostInfo {
	return &api.HostInfo{Slot: n.Slot, NftTable: n.Table, VethPrefix: n.IfPrefix, Subnet: n.Subnet.String(),
		NflogGroup: n.LogGroup, CgroupParent: n.CgroupParent}
}

// claimSlot claims the data dir's host slot (internal/hostslot). The
// default data dir, and one a daemon used before slots existed (it has a
// store but remembers no slot: its sandboxes have slot 0's names), ask for
// slot 0. A daemon that cannot claim one because it is not root cannot
// make host-wide resources either: it runs with slot 0's names, unclaimed.
func claimSlot(cfg config.Config, log *slog.Logger) (*hostslot.Claim, error) {
	_, remembers := hostslot.Remembered(cfg.DataDir)
	_, statErr := os.Stat(filepath.Join(cfg.DataDir, "airlock.db"))
	preferZero := filepath.Clean(cfg.DataDir) == config.Default().DataDir || (statErr == nil && !remembers)
	sandboxDirs := []string{filepath.Join(cfg.DataDir, "sandboxes"), filepath.Join(cfg.DataDir, "gvisor", "sandboxes")}
	c, err := hostslot.Acquire(cfg.DataDir, hostslot.Options{
		Pin: cfg.HostSlot, PreferZero: preferZero,
		Owns: func(id string) bool {
			for _, d := range sandboxDirs {
				if _, err := os.Lstat(filepath.Join(d, id)); err == nil {
					return true
				}
			}
			return false
		},
	})
	if err != nil {
		if errors.Is(err, fs.ErrPermission) && os.Geteuid() != 0 {
			log.Warn("not root: no host slot claimed (sandboxes cannot run here)", "err", err)
			return &hostslot.Claim{Names: hostslot.NamesOf(0), DataDir: cfg.DataDir}, nil
		}
		return nil, err
	}
	n := c.Names
	log.Info("host slot claimed", "slot", n.Slot, "claim", c.Path, "nft_table", n.Table, "veth_prefix", n.IfPrefix,
		"subnet", n.Subnet.String(), "cgroup", n.CgroupParent, "runc_uid_start", n.RuncUIDStart)
	if n.Slot > 0 {
		sharedTaskBudget(log)
	}
	return c, nil
}

// sharedTaskBudget gives the "airlock" cgroup, under which every slot's
// sandboxes live, the task budget the runc driver gives its own parent
// (half of the host's pid space) when it has none yet (no slot-0 daemon
// ran): the sandboxes of every daemon together can never exhaust the
// host's pids.
func sharedTaskBudget(log *slog.Logger) {
	h, err := cgroups.Load()
	if err != nil || !h.Has("pids") {
		return
	}
	top := h.Group(hostslot.NamesOf(0).CgroupParent)
	for _, d := range top.Dirs() {
		if err := os.MkdirAll(d, 0o755); err != nil {
			log.Warn("creating the sandboxes' shared cgroup", "err", err)
			return
		}
	}
	if cur, err := top.PIDsMax(); err == nil && cur >= 0 {
		return
	}
	space := int64(0)
	for _, p := range []string{"/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"} {
		b, err := os.ReadFile(p)
		v, perr := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || perr != nil {
			return
		}
		if space == 0 || v < space {
			space = v
		}
	}
	if err := top.SetPIDsMax(max(space/2, 1)); err != nil {
		log.Warn("limiting the tasks of every daemon's sandboxes together", "err", err)
	}
}
