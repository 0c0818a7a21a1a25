package network

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/pkgcache"
)

// PackageHost is the name a sandbox reaches airlock's package mirror by:
// airlock's resolver answers it with the sandbox's gateway, where port 80
// leads to the mirror. It is answered only in allowlist mode (the only
// mode with registry sets) and only when the daemon has a mirror.
const PackageHost = "packages.airlock.internal"

// ReasonDownloadCap refuses or cuts a transfer once the sandbox's download
// cap is used up.
const ReasonDownloadCap = "download_cap"

// Mirror timing.
const (
	// mirrorReadHeaderTimeout bounds a request head from a sandbox: package
	// managers send it at once.
	mirrorReadHeaderTimeout = 10 * time.Second
	// upstreamIdleTimeout keeps connections to registries for the next
	// artifact of an install.
	upstreamIdleTimeout = 90 * time.Second
)

// UpstreamEnvPrefix, followed by a registry set's name in upper case
// (PYPI, PYPI_FILES, NPM, GOPROXY, DEBIAN), names an environment variable
// that replaces the mirror's upstream base URL for the set.
const UpstreamEnvPrefix = "AIRLOCK_UPSTREAM_"

// DefaultUpstreams returns the package mirror's upstream base URLs: PyPI's
// fixed ones, the npm registry and Go proxy the daemon's environment
// configures ($NPM_CONFIG_REGISTRY, $GOPROXY: their first URL), and
// debianMirror (the host's apt mirror, read at run time: none is ever
// written into airlock), each replaced by its AIRLOCK_UPSTREAM_<NAME>
// variable. A set without an upstream is not mirrored (its hosts may still
// be allowed and reached through the egress proxy).
func DefaultUpstreams(debianMirror string) map[string]string {
	out := map[string]string{
		pkgcache.RegPyPI:      "https://pypi.org",
		pkgcache.RegPyPIFiles: "https://files.pythonhosted.org",
	}
	first := func(list string) string {
		for _, f := range strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == '|' }) {
			if f = strings.TrimSpace(f); strings.HasPrefix(f, "http://") || strings.HasPrefix(f, "https://") {
				return f
			}
		}
		return ""
	}
	for _, v := range []string{"NPM_CONFIG_REGISTRY", "npm_config_registry"} {
		if u := first(os.Getenv(v)); u != "" {
			out[pkgcache.RegNPM] = u
			break
		}
	}
	if u := first(os.Getenv("GOPROXY")); u != "" {
		out[pkgcache.RegGoProxy] = u
	}
	if debianMirror != "" {
		out[pkgcache.RegDebian] = debianMirror
	}
	for _, name := range []string{pkgcache.RegPyPI, pkgcache.RegPyPIFiles, pkgcache.RegNPM, pkgcache.RegGoProxy, pkgcache.RegDebian} {
		env := UpstreamEnvPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
		if v := os.Getenv(env); v != "" {
			out[name] = v
		}
	}
	for k, v := range out {
		out[k] = strings.TrimRight(v, "/")
	}
	return out
}

// PackageEnv returns the environment that points a sandbox's package
// managers at airlock's mirror for the registry sets policy p allows (and
// the mirror serves): pip and uv, npm, and the go command. Empty when p
// allows none. The manager adds it to a sandbox's environment at create;
// variables the create request sets itself win. Debian needs no variable:
// apt's plain-HTTP requests to the mirror host are cached by the egress
// proxy transparently.
func (m *Manager) PackageEnv(p Policy) map[string]string {
	if m.mirror == nil || p.Mode != ModeAllowlist || p.Offline {
		return nil
	}
	base := "http://" + PackageHost
	out := map[string]string{}
	for _, r := range p.Registries {
		if !m.mirror.Serves(r) {
			continue
		}
		switch r {
		case pkgcache.RegPyPI:
			out["PIP_INDEX_URL"] = base + "/pypi/simple/"
			out["PIP_TRUSTED_HOST"] = PackageHost
			out["UV_DEFAULT_INDEX"] = base + "/pypi/simple/"
			out["UV_INSECURE_HOST"] = PackageHost
		case pkgcache.RegNPM:
			out["NPM_CONFIG_REGISTRY"] = base + "/npm/"
		case pkgcache.RegGoProxy:
			// The go command reaches the checksum database through the
			// proxy too (<proxy>/sumdb/…), which the mirror passes on.
			out["GOPROXY"] = base + "/goproxy"
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// newMirror makes the package mirror of the Manager: nil when no registry
// set has an upstream.
func (m *Manager) newMirror() *pkgcache.Mirror {
	if len(m.cfg.Upstreams) == 0 {
		return nil
	}
	m.upTransport = &http.Transport{
		DialContext:         m.dialUpstream,
		TLSClientConfig:     m.cfg.UpstreamTLS,
		ForceAttemptHTTP2:   true,
		IdleConnTimeout:     upstreamIdleTimeout,
		MaxIdleConnsPerHost: 8,
		TLSHandshakeTimeout: upstreamDialTimeout,
	}
	audit := m.cfg.PackageAudit
	return pkgcache.NewMirror(pkgcache.Config{
		Store: m.cfg.PackageCache, Upstreams: m.cfg.Upstreams,
		Client: &http.Client{Transport: m.upTransport},
		Logger: m.log, Now: m.cfg.Now,
		Audit: func(ev pkgcache.Event) {
			if audit != nil {
				audit(ev)
			}
		},
	})
}

// publicOnly is the policy the mirror's upstream connections are held to:
// a registry name must not lead to a private range, the host or a sandbox.
var publicOnly = &compiled{Mode: ModeAllowlist}

// dialUpstream connects to a registry from the host's namespace, resolving
// with airlock's upstream resolvers and refusing addresses no sandbox may
// reach.
func (m *Manager) dialUpstream(ctx context.Context, _, addr string) (net.Conn, error) {
	host, portS, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(portS, 10, 16)
	if err != nil {
		return nil, err
	}
	var addrs []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{ip}
	} else if addrs, err = m.up.lookupA(ctx, strings.ToLower(host)); err != nil {
		return nil, err
	}
	var errs error
	for _, ip := range addrs {
		if ok, reason := m.addrVerdict(publicOnly, ip, uint16(port)); !ok {
			errs = errors.Join(errs, fmt.Errorf("%s resolves to %s: %s", host, ip, reason))
			continue
		}
		c, err := m.ns.dial(ctx, "tcp4", netip.AddrPortFrom(ip, uint16(port)).String())
		if err == nil {
			return c, nil
		}
		errs = errors.Join(errs, err)
	}
	if errs == nil {
		errs = fmt.Errorf("%s has no ipv4 address", host)
	}
	return nil, errs
}

// registryAllowed reports whether the sandbox may use registry set reg
// through the mirror now.
func (a *Attachment) registryAllowed(reg string) bool {
	c := a.current()
	return c.Mode == ModeAllowlist && !c.Offline && slices.Contains(c.Registries, reg)
}

// downloadCap is the download cap in bytes of a sandbox with policy p: the
// server's, lowered (or, without one, set) by the policy's own.
func (m *Manager) downloadCap(p Policy) int64 {
	server, own := m.cfg.MaxDownloadBytes, p.MaxDownloadMB<<20
	if own > 0 && (server <= 0 || own < server) {
		return own
	}
	return server
}

// Budget is the sandbox's download cap and what it used so far.
func (a *Attachment) Budget() *pkgcache.Budget { return a.budget }

// Saving download counts. Each sandbox's count is kept in
// <StateDir>/sandboxes/<id>.budget, so that a restarted daemon goes on
// from it instead of granting the whole cap again.
const (
	// budgetFlushInterval is how often changed counts are saved: a daemon
	// killed outright forgets what arrived since the last save.
	budgetFlushInterval = 2 * time.Second
	// budgetFlushStep saves a count at once each time it grows by this
	// much, so that a fast download (hundreds of MiB/s through the cache)
	// loses at most a few MiB of counting to a kill, not an interval's worth.
	budgetFlushStep = 4 << 20
)

// budgetFile is the content of a sandbox's budget file.
type budgetFile struct {
	Used int64 `json:"used"`
}

// newBudget makes a budget of limit bytes, used already, that asks the
// flusher to save it whenever it grew by budgetFlushStep.
func (m *Manager) newBudget(limit, used int64) *pkgcache.Budget {
	return pkgcache.NewBudgetWith(pkgcache.BudgetConfig{Limit: limit, Used: used, Step: budgetFlushStep, OnStep: m.kickBudgetFlush})
}

func (a *Attachment) budgetPath() string { return filepath.Join(a.m.sbxDir, a.id+".budget") }

// restoreBudget gives an attachment a previous daemon left the count it
// saved (none: nothing counted). Called from New, before anything counts.
func (a *Attachment) restoreBudget() {
	var used int64
	b, err := os.ReadFile(a.budgetPath())
	if err == nil {
		var bf budgetFile
		if err = json.Unmarshal(b, &bf); err == nil {
			used = bf.Used
		}
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		// Counted from zero rather than refuse the sandbox its network.
		a.m.log.Warn("reading download count", "sandbox_id", a.id, "err", err)
	}
	a.budget = a.m.newBudget(a.m.downloadCap(a.policy), used)
	a.savedUsed = a.budget.Used()
}

// saveBudgetLocked writes the sandbox's count if it changed since the last
// save. a.mu must be held (a torn-down sandbox's file is not re-created).
func (a *Attachment) saveBudgetLocked() error {
	if a.gone || a.budget == nil {
		return nil
	}
	used := a.budget.Used()
	if used == a.savedUsed {
		return nil
	}
	b, err := json.Marshal(budgetFile{Used: used})
	if err != nil {
		return err
	}
	if err := writeFileAtomic(a.budgetPath(), b, 0o600); err != nil {
		return fmt.Errorf("saving download count: %w", err)
	}
	a.savedUsed = used
	return nil
}

// kickBudgetFlush asks the flusher to save now; it never blocks (it runs
// on the goroutines that count).
func (m *Manager) kickBudgetFlush() {
	if m.budgetKick == nil {
		return
	}
	select {
	case m.budgetKick <- struct{}{}:
	default:
	}
}

// startBudgetFlusher starts the goroutine that saves changed download
// counts every interval (budgetFlushInterval), when kicked, and once more
// when stopped.
func (m *Manager) startBudgetFlusher(interval time.Duration) {
	m.budgetKick = make(chan struct{}, 1)
	m.budgetStop = make(chan struct{})
	m.budgetDone = make(chan struct{})
	go func() {
		defer close(m.budgetDone)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-m.budgetStop:
				m.flushBudgets()
				return
			case <-t.C:
			case <-m.budgetKick:
			}
			m.flushBudgets()
		}
	}()
}

// stopBudgetFlusher saves the counts a last time and stops the flusher.
func (m *Manager) stopBudgetFlusher() {
	if m.budgetStop == nil {
		return
	}
	close(m.budgetStop)
	<-m.budgetDone
	m.budgetStop = nil
}

// flushBudgets saves every changed download count.
func (m *Manager) flushBudgets() {
	m.mu.Lock()
	list := make([]*Attachment, 0, len(m.sbx))
	for _, a := range m.sbx {
		list = append(list, a)
	}
	m.mu.Unlock()
	for _, a := range list {
		a.mu.Lock()
		err := a.saveBudgetLocked()
		a.mu.Unlock()
		if err != nil {
			m.log.Warn("saving download count", "sandbox_id", a.id, "err", err)
		}
	}
}

// mirrorServer serves one sandbox's view of the mirror on its gateway.
type mirrorServer struct {
	srv *http.Server
	wg  sync.WaitGroup
}

func (a *Attachment) startMirror(ln net.Listener) *mirrorServer {
	ms := &mirrorServer{srv: &http.Server{
		Handler: a.m.mirror.Handler(pkgcache.Sandbox{ID: a.id, Allowed: a.registryAllowed, Budget: a.budget}),
		// The gateway is reachable from the sandbox alone: no other
		// client can hold the slots.
		ReadHeaderTimeout: mirrorReadHeaderTimeout,
		ErrorLog:          nil,
	}}
	ms.wg.Add(1)
	go func() {
		defer ms.wg.Done()
		_ = ms.srv.Serve(ln)
	}()
	return ms
}

func (ms *mirrorServer) close() {
	_ = ms.srv.Close()
	ms.wg.Wait()
}

// serveTransparent answers a plain-HTTP connection to name, a Debian
// mirror host, from the package mirror: apt's requests go through the
// cache without any configuration in the sandbox. br replays what was read
// of the request.
func (a *Attachment) serveTransparent(c net.Conn, br interface{ Read([]byte) (int, error) }, name string) {
	h := a.m.mirror.Transparent(pkgcache.Sandbox{ID: a.id, Allowed: a.registryAllowed, Budget: a.budget}, pkgcache.RegDebian, name)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: mirrorReadHeaderTimeout}
	ln := &oneConnListener{c: &replayConn{Conn: c, r: br}, done: make(chan struct{})}
	_ = srv.Serve(ln)
	// Serve returned when the listener ran dry; the connection is served
	// until it closes.
	<-ln.done
	_ = srv.Close()
}

// oneConnListener hands out one connection, then blocks Accept until that
// connection is closed.
type oneConnListener struct {
	c    net.Conn
	once sync.Once
	mu   sync.Mutex
	used bool
	done chan struct{}
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if !l.used {
		l.used = true
		l.mu.Unlock()
		return &notifyConn{Conn: l.c, closed: func() { l.once.Do(func() { close(l.done) }) }}, nil
	}
	l.mu.Unlock()
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *oneConnListener) Addr() net.Addr { return l.c.LocalAddr() }

type notifyConn struct {
	net.Conn
	closeOnce sync.Once
	closed    func()
}

func (c *notifyConn) Close() error {
	err := c.Conn.Close()
	c.closeOnce.Do(c.closed)
	return err
}

// replayConn reads what the proxy already buffered before the socket.
type replayConn struct {
	net.Conn
	r interface{ Read([]byte) (int, error) }
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// isRegistryHost reports whether name is one of registry set reg's hosts.
func (m *Manager) isRegistryHost(reg, name string) bool {
	for _, h := range m.registries[reg] {
		if suffix, ok := strings.CutPrefix(h, "*"); ok {
			if strings.HasSuffix(name, suffix) && len(name) > len(suffix) {
				return true
			}
		} else if h == name {
			return true
		}
	}
	return false
}
