// Package previews is the preview service: a running sandbox's ports exposed at preview URLs (token or
// public), kept in the store so that a restarted daemon serves them again, the preview listener's backend
// (internal/plane/preview), and connections into a sandbox's ports (DialSandbox) for previews and the SDKs.
// Ports, given to the sandbox lifecycle, forgets the ports of a gone sandbox and restores those of one
// recovered; Service is the planes' side.
package previews

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/sandbox"
	"github.com/airlockhq/airlock/internal/store"
)

// maxPreviewsPerSandbox bounds the exposed ports of one sandbox: a web app
// and its dev tooling need a handful.
const maxPreviewsPerSandbox = 32

// previewForgetTimeout bounds forgetting a gone sandbox's exposed ports in
// the store: one small delete, which only waits for the writer.
const previewForgetTimeout = 10 * time.Second

// Ports is the preview state: which ports of which sandbox are exposed,
// and the key tokens are derived from. Exposed ports are kept in the store
// too (and in memory for the preview listener's every request), so that a
// restarted daemon serves them again; the tokens survive with the key in
// the data dir.
type Ports struct {
	store   *store.Store
	dataDir string
	domain  string
	log     *slog.Logger
	now     func() time.Time

	// wmu serialises changes of the exposed ports (store first, then
	// memory) so that the two agree and a sandbox's limit holds; readers
	// take only mu.
	wmu   sync.Mutex
	mu    sync.Mutex
	key   []byte
	addr  string                  // the preview listener's address (Settings.PreviewListen), "" when off
	ports map[string]map[int]bool // sandbox id → port → public
}

// PortsConfig configures Ports.
type PortsConfig struct {
	// Store keeps the exposed ports. Required.
	Store *store.Store
	// DataDir holds preview.key ("" keeps a key in memory only).
	DataDir string
	// Domain is the preview hosts' domain (default localhost); Listen is
	// the preview listener as bound, "" when previews are off.
	Domain, Listen string
	// Logger and Now default to slog.Default() and time.Now.
	Logger *slog.Logger
	Now    func() time.Time
}

// NewPorts returns the Ports of cfg.
func NewPorts(cfg PortsConfig) *Ports {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Ports{store: cfg.Store, dataDir: cfg.DataDir, domain: cfg.Domain, addr: cfg.Listen,
		log: cfg.Logger.With("component", "previews"), now: cfg.Now, ports: map[string]map[int]bool{}}
}

// Forget drops a gone sandbox's exposed ports, in memory and in the store
// (sandbox.Previews). The sandbox is marked gone before, so no
// CreatePreview records a port after this.
func (pv *Ports) Forget(id string) {
	pv.wmu.Lock()
	defer pv.wmu.Unlock()
	pv.mu.Lock()
	delete(pv.ports, id)
	pv.mu.Unlock()
	// Not cancellable by whatever stopped the sandbox: a row left behind
	// would only be pruned at the next recovery.
	ctx, cancel := context.WithTimeout(context.Background(), previewForgetTimeout)
	defer cancel()
	if err := pv.store.DeletePreviews(ctx, id); err != nil {
		pv.log.Warn("forgetting exposed ports", "sandbox_id", id, "err", err)
	}
}

// Restore loads the exposed ports of a sandbox recovered after a daemon
// restart, so that its preview URLs answer again (sandbox.Previews).
func (pv *Ports) Restore(ctx context.Context, sb *sandbox.Live) {
	list, err := pv.store.Previews(ctx, sb.ID())
	if err != nil {
		pv.log.Warn("restoring exposed ports", "sandbox_id", sb.ID(), "err", err)
		return
	}
	if len(list) == 0 {
		return
	}
	pv.wmu.Lock()
	defer pv.wmu.Unlock()
	if sb.IsGone() {
		return
	}
	pv.mu.Lock()
	ports := map[int]bool{}
	for _, p := range list {
		ports[p.Port] = p.Public
	}
	pv.ports[sb.ID()] = ports
	pv.mu.Unlock()
	pv.log.Info("exposed ports restored", "sandbox_id", sb.ID(), "count", len(list))
}

// Prune deletes the stored ports of sandboxes that are not live (they
// stopped while no daemon ran to forget them): the lifecycle calls it once
// its recovery is done (sandbox.Previews).
func (pv *Ports) Prune(ctx context.Context) {
	if n, err := pv.store.PrunePreviews(ctx, sandbox.LiveStates()...); err != nil {
		pv.log.Warn("pruning exposed ports", "err", err)
	} else if n > 0 {
		pv.log.Info("pruned exposed ports of gone sandboxes", "count", n)
	}
}

// previewKey loads (creating on first use) the key preview tokens are
// derived from, <data dir>/preview.key.
func (pv *Ports) previewKey() ([]byte, error) {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	if pv.key != nil {
		return pv.key, nil
	}
	if pv.dataDir == "" {
		pv.key = make([]byte, 32)
		rand.Read(pv.key)
		return pv.key, nil
	}
	path := filepath.Join(pv.dataDir, "preview.key")
	for range 2 {
		key, err := os.ReadFile(path)
		if err == nil && len(key) == 32 {
			pv.key = key
			return key, nil
		}
		if err == nil {
			return nil, fmt.Errorf("preview key %s: want 32 bytes, have %d", path, len(key))
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("reading preview key: %w", err)
		}
		key = make([]byte, 32)
		rand.Read(key)
		// O_EXCL: of two daemons racing on one data dir, the loser reads
		// the winner's key on the second round.
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("creating preview key: %w", err)
		}
		_, werr := f.Write(key)
		if cerr := f.Close(); werr != nil || cerr != nil {
			os.Remove(path)
			return nil, fmt.Errorf("writing preview key: %w", errors.Join(werr, cerr))
		}
		pv.key = key
		return key, nil
	}
	return nil, fmt.Errorf("preview key %s: unreadable", path)
}

func (pv *Ports) previewOf(id string, port int, public bool) (api.Preview, error) {
	key, err := pv.previewKey()
	if err != nil {
		return api.Preview{}, err
	}
	pv.mu.Lock()
	addr := pv.addr
	pv.mu.Unlock()
	return api.Preview{
		URL:   URL(pv.domain, addr, id, port),
		Token: TokenFor(key, id), Port: port, Public: public,
	}, nil
}

func (pv *Ports) previewsEnabled() error {
	pv.mu.Lock()
	defer pv.mu.Unlock()
	if pv.addr == "" {
		return public(errdefs.ErrNotImplemented, "preview urls are disabled on this server (preview_listen is empty)")
	}
	return nil
}

// Sandboxes is what the preview service needs of the sandbox lifecycle.
type Sandboxes interface {
	// Running returns sandbox id if p may see it and it is running.
	Running(ctx context.Context, p auth.Principal, id string) (*sandbox.Live, error)
	// LiveSandbox returns sandbox id if p may see it and it is live.
	LiveSandbox(ctx context.Context, p auth.Principal, id string) (*sandbox.Live, error)
	// Lookup returns live sandbox id, nil if it is not live.
	Lookup(id string) *sandbox.Live
}

// Config configures a Service.
type Config struct {
	Sandboxes Sandboxes
	Ports     *Ports
	// NetNS finds the network namespace a sandbox joined (the network
	// backend; nil: its init's, through a pidfd).
	NetNS NetNS
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Service is the preview service's side of the planes.
type Service struct {
	sandboxes Sandboxes
	ports     *Ports
	netns     NetNS
	log       *slog.Logger
}

// New returns the preview service of cfg.
func New(cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Service{sandboxes: cfg.Sandboxes, ports: cfg.Ports, netns: cfg.NetNS, log: cfg.Logger.With("component", "previews")}
}

// CreatePreview exposes a port of running sandbox id at a preview URL (POST
// /v1/sandboxes/{id}/previews). Exposing a port again changes only
// whether it is public.
func (m *Service) CreatePreview(ctx context.Context, p auth.Principal, id string, req api.PreviewRequest) (api.Preview, error) {
	if err := m.ports.previewsEnabled(); err != nil {
		return api.Preview{}, err
	}
	if req.Port < 1 || req.Port > 65535 {
		return api.Preview{}, public(errInvalid, "port must be 1-65535")
	}
	sb, err := m.sandboxes.Running(ctx, p, id)
	if err != nil {
		return api.Preview{}, err
	}
	pv := m.ports
	pv.wmu.Lock()
	if sb.IsGone() {
		// forgetPreviews ran or is waiting: recording now would outlive it.
		pv.wmu.Unlock()
		return api.Preview{}, public(errdefs.ErrInvalidState, "sandbox is no longer running")
	}
	pv.mu.Lock()
	m.prunePreviewsLocked(pv)
	_, had := pv.ports[sb.ID()][req.Port]
	n := len(pv.ports[sb.ID()])
	pv.mu.Unlock()
	if !had && n >= maxPreviewsPerSandbox {
		pv.wmu.Unlock()
		return api.Preview{}, public(errdefs.ErrQuotaExceeded, "a sandbox may expose at most %d ports", maxPreviewsPerSandbox)
	}
	if err := pv.store.PutPreview(ctx, store.Preview{SandboxID: sb.ID(), Port: req.Port, Public: req.Public, CreatedAt: pv.now().UTC()}); err != nil {
		pv.wmu.Unlock()
		return api.Preview{}, err
	}
	pv.mu.Lock()
	ports := pv.ports[sb.ID()]
	if ports == nil {
		ports = map[int]bool{}
		pv.ports[sb.ID()] = ports
	}
	ports[req.Port] = req.Public
	pv.mu.Unlock()
	pv.wmu.Unlock()
	out, err := pv.previewOf(sb.ID(), req.Port, req.Public)
	if err != nil {
		return api.Preview{}, err
	}
	sb.Audit(ctx, api.AuditPreview, api.PreviewAuditDetail{Action: "expose", Port: req.Port, Public: req.Public})
	m.log.Info("preview exposed", "sandbox_id", sb.ID(), "tenant", sb.Tenant(), "port", req.Port, "public", req.Public)
	return out, nil
}

// ListPreviews lists the exposed ports of sandbox id, by port.
func (m *Service) ListPreviews(ctx context.Context, p auth.Principal, id string) (api.PreviewList, error) {
	sb, err := m.sandboxes.LiveSandbox(ctx, p, id)
	if err != nil {
		return api.PreviewList{}, err
	}
	pv := m.ports
	pv.mu.Lock()
	ports := make([]int, 0, len(pv.ports[sb.ID()]))
	pub := map[int]bool{}
	for port, public := range pv.ports[sb.ID()] {
		ports = append(ports, port)
		pub[port] = public
	}
	pv.mu.Unlock()
	slices.Sort(ports)
	out := api.PreviewList{Previews: []api.Preview{}}
	for _, port := range ports {
		v, err := pv.previewOf(sb.ID(), port, pub[port])
		if err != nil {
			return api.PreviewList{}, err
		}
		out.Previews = append(out.Previews, v)
	}
	return out, nil
}

// DeletePreview stops exposing port of sandbox id; connections already
// open are not cut.
func (m *Service) DeletePreview(ctx context.Context, p auth.Principal, id string, port int) error {
	sb, err := m.sandboxes.LiveSandbox(ctx, p, id)
	if err != nil {
		return err
	}
	pv := m.ports
	pv.wmu.Lock()
	pv.mu.Lock()
	public, ok := pv.ports[sb.ID()][port]
	pv.mu.Unlock()
	if !ok {
		pv.wmu.Unlock()
		return &errdefs.Public{Msg: "preview not found", Err: errdefs.ErrNotFound}
	}
	// The store first: if it fails the port stays exposed, as the client
	// is told, rather than come back at the next restart.
	if err := pv.store.DeletePreview(ctx, sb.ID(), port); err != nil {
		pv.wmu.Unlock()
		return err
	}
	pv.mu.Lock()
	delete(pv.ports[sb.ID()], port)
	pv.mu.Unlock()
	pv.wmu.Unlock()
	sb.Audit(ctx, api.AuditPreview, api.PreviewAuditDetail{Action: "unexpose", Port: port, Public: public})
	return nil
}

// prunePreviewsLocked forgets the previews of sandboxes that are gone.
func (m *Service) prunePreviewsLocked(pv *Ports) {
	for id := range pv.ports {
		if m.sandboxes.Lookup(id) == nil {
			delete(pv.ports, id)
		}
	}
}

// PreviewBackend is the preview listener's backend
// (internal/plane/preview's Backend).
func (m *Service) PreviewBackend() Backend { return Backend{m} }

// Backend is the service as the preview listener's backend.
type Backend struct{ m *Service }

// sandboxFor finds live sandbox id and a principal of its tenant.
func (b Backend) sandboxFor(id string) (*sandbox.Live, auth.Principal, bool) {
	sb := b.m.sandboxes.Lookup(id)
	if sb == nil {
		return nil, auth.Principal{}, false
	}
	return sb, auth.Principal{Tenant: sb.Tenant()}, true
}

// PreviewTarget returns port of running sandbox id (see plane/preview).
func (b Backend) PreviewTarget(ctx context.Context, id string, port int) (Target, error) {
	key, err := b.m.ports.previewKey()
	if err != nil {
		return Target{}, err
	}
	sb, _, ok := b.sandboxFor(id)
	// A paused sandbox is a target too: its dial resumes it when its
	// lifecycle has auto_resume, and answers "sandbox is paused" when not
	// (to those the token or a public port lets through).
	if !ok || (sb.State() != api.StateRunning && sb.State() != api.StatePaused) {
		// The token of any id is known here: the listener answers a
		// holder of it "not found", everyone else as for a private port.
		return Target{Token: TokenFor(key, id)}, errdefs.ErrNotFound
	}
	pv := b.m.ports
	pv.mu.Lock()
	public, exposed := pv.ports[id][port]
	pv.mu.Unlock()
	return Target{Token: TokenFor(key, id), Exposed: exposed, Public: public}, nil
}

// PreviewDial connects to port inside sandbox id.
func (b Backend) PreviewDial(ctx context.Context, id string, port int) (net.Conn, error) {
	_, p, ok := b.sandboxFor(id)
	if !ok {
		return nil, errdefs.ErrNotFound
	}
	return b.m.DialSandbox(ctx, p, id, port)
}

// PreviewActive marks a preview request (an upgraded one, a WebSocket,
// until its connection ends) as activity of sandbox id (docs/lifecycle.md):
// the idle timeout does not pause a sandbox while one is in flight. done
// ends it.
func (b Backend) PreviewActive(id string) (done func()) {
	sb, _, ok := b.sandboxFor(id)
	if !ok {
		return func() {}
	}
	return sb.Active()
}

// PreviewOpened audits a client opening a preview.
func (b Backend) PreviewOpened(ctx context.Context, id string, port int, remote, via string) {
	sb, _, ok := b.sandboxFor(id)
	if !ok {
		return
	}
	pv := b.m.ports
	pv.mu.Lock()
	public := pv.ports[id][port]
	pv.mu.Unlock()
	sb.Audit(ctx, api.AuditPreview, api.PreviewAuditDetail{Action: "open", Port: port, Public: public, Remote: remote, Via: via})
}

var errInvalid = errdefs.ErrInvalidArgument

// public returns a client-safe error of class cls (errdefs.Public).
func public(cls error, format string, args ...any) error {
	return errdefs.Publicf(cls, format, args...)
}
