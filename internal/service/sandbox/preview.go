package sandbox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/preview"
	"github.com/airlockhq/airlock/internal/store"
)

// maxPreviewsPerSandbox bounds the exposed ports of one sandbox: a web app
// and its dev tooling need a handful.
const maxPreviewsPerSandbox = 32

// previewForgetTimeout bounds forgetting a gone sandbox's exposed ports in
// the store: one small delete, which only waits for the writer.
const previewForgetTimeout = 10 * time.Second

// previews is a Manager's preview state (its preview field): which ports
// of which sandbox are exposed, and the key tokens are derived from.
// Exposed ports are kept in the store too (and in memory for the preview
// listener's every request), so that a restarted daemon serves them again;
// the tokens survive with the key in the data dir.
type previews struct {
	// wmu serialises changes of the exposed ports (store first, then
	// memory) so that the two agree and a sandbox's limit holds; readers
	// take only mu.
	wmu   sync.Mutex
	mu    sync.Mutex
	key   []byte
	addr  string                  // the preview listener's address (Settings.PreviewListen), "" when off
	ports map[string]map[int]bool // sandbox id → port → public
}

func (m *Service) previews() *previews { return &m.preview }

// forgetPreviews drops a gone sandbox's exposed ports, in memory and in the
// store. The sandbox is marked gone before, so no CreatePreview records a
// port after this.
func (m *Service) forgetPreviews(id string) {
	pv := m.previews()
	pv.wmu.Lock()
	defer pv.wmu.Unlock()
	pv.mu.Lock()
	delete(pv.ports, id)
	pv.mu.Unlock()
	// Not cancellable by whatever stopped the sandbox: a row left behind
	// would only be pruned at the next recovery.
	ctx, cancel := context.WithTimeout(context.Background(), previewForgetTimeout)
	defer cancel()
	if err := m.store.DeletePreviews(ctx, id); err != nil {
		m.log.Warn("forgetting exposed ports", "sandbox_id", id, "err", err)
	}
}

// restorePreviews loads the exposed ports of a sandbox recovered after a
// daemon restart, so that its preview URLs answer again.
func (m *Service) restorePreviews(ctx context.Context, sb *Live) {
	list, err := m.store.Previews(ctx, sb.id)
	if err != nil {
		m.log.Warn("restoring exposed ports", "sandbox_id", sb.id, "err", err)
		return
	}
	if len(list) == 0 {
		return
	}
	pv := m.previews()
	pv.wmu.Lock()
	defer pv.wmu.Unlock()
	if sb.isGone() {
		return
	}
	pv.mu.Lock()
	ports := map[int]bool{}
	for _, p := range list {
		ports[p.Port] = p.Public
	}
	pv.ports[sb.id] = ports
	pv.mu.Unlock()
	m.log.Info("exposed ports restored", "sandbox_id", sb.id, "count", len(list))
}

// prunePreviewRows deletes the stored ports of sandboxes that are not live
// (they stopped while no daemon ran to forget them).
func (m *Service) prunePreviewRows(ctx context.Context) {
	if n, err := m.store.PrunePreviews(ctx, liveStates...); err != nil {
		m.log.Warn("pruning exposed ports", "err", err)
	} else if n > 0 {
		m.log.Info("pruned exposed ports of gone sandboxes", "count", n)
	}
}

// previewKey loads (creating on first use) the key preview tokens are
// derived from, <data dir>/preview.key.
func (m *Service) previewKey() ([]byte, error) {
	pv := m.previews()
	pv.mu.Lock()
	defer pv.mu.Unlock()
	if pv.key != nil {
		return pv.key, nil
	}
	if m.settings.DataDir == "" {
		pv.key = make([]byte, 32)
		rand.Read(pv.key)
		return pv.key, nil
	}
	path := filepath.Join(m.settings.DataDir, "preview.key")
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

func (m *Service) previewOf(id string, port int, public bool) (api.Preview, error) {
	key, err := m.previewKey()
	if err != nil {
		return api.Preview{}, err
	}
	pv := m.previews()
	pv.mu.Lock()
	addr := pv.addr
	pv.mu.Unlock()
	return api.Preview{
		URL:   preview.URL(m.settings.PreviewDomain, addr, id, port),
		Token: preview.TokenFor(key, id), Port: port, Public: public,
	}, nil
}

func (m *Service) previewsEnabled() error {
	pv := m.previews()
	pv.mu.Lock()
	defer pv.mu.Unlock()
	if pv.addr == "" {
		return public(errdefs.ErrNotImplemented, "preview urls are disabled on this server (preview_listen is empty)")
	}
	return nil
}

// CreatePreview exposes a port of running sandbox id at a preview URL (POST
// /v1/sandboxes/{id}/previews). Exposing a port again changes only
// whether it is public.
func (m *Service) CreatePreview(ctx context.Context, p auth.Principal, id string, req api.PreviewRequest) (api.Preview, error) {
	if err := m.previewsEnabled(); err != nil {
		return api.Preview{}, err
	}
	if req.Port < 1 || req.Port > 65535 {
		return api.Preview{}, public(errInvalid, "port must be 1-65535")
	}
	sb, err := m.Running(ctx, p, id)
	if err != nil {
		return api.Preview{}, err
	}
	pv := m.previews()
	pv.wmu.Lock()
	if sb.isGone() {
		// forgetPreviews ran or is waiting: recording now would outlive it.
		pv.wmu.Unlock()
		return api.Preview{}, public(errdefs.ErrInvalidState, "sandbox is no longer running")
	}
	pv.mu.Lock()
	m.prunePreviewsLocked(pv)
	_, had := pv.ports[sb.id][req.Port]
	n := len(pv.ports[sb.id])
	pv.mu.Unlock()
	if !had && n >= maxPreviewsPerSandbox {
		pv.wmu.Unlock()
		return api.Preview{}, public(errdefs.ErrQuotaExceeded, "a sandbox may expose at most %d ports", maxPreviewsPerSandbox)
	}
	if err := m.store.PutPreview(ctx, store.Preview{SandboxID: sb.id, Port: req.Port, Public: req.Public, CreatedAt: m.now().UTC()}); err != nil {
		pv.wmu.Unlock()
		return api.Preview{}, err
	}
	pv.mu.Lock()
	ports := pv.ports[sb.id]
	if ports == nil {
		ports = map[int]bool{}
		pv.ports[sb.id] = ports
	}
	ports[req.Port] = req.Public
	pv.mu.Unlock()
	pv.wmu.Unlock()
	out, err := m.previewOf(sb.id, req.Port, req.Public)
	if err != nil {
		return api.Preview{}, err
	}
	m.recordEvent(ctx, sb, api.AuditPreview, api.PreviewAuditDetail{Action: "expose", Port: req.Port, Public: req.Public})
	m.log.Info("preview exposed", "sandbox_id", sb.id, "tenant", sb.tenant, "port", req.Port, "public", req.Public)
	return out, nil
}

// ListPreviews lists the exposed ports of sandbox id, by port.
func (m *Service) ListPreviews(ctx context.Context, p auth.Principal, id string) (api.PreviewList, error) {
	sb, err := m.LiveSandbox(ctx, p, id)
	if err != nil {
		return api.PreviewList{}, err
	}
	pv := m.previews()
	pv.mu.Lock()
	ports := make([]int, 0, len(pv.ports[sb.id]))
	pub := map[int]bool{}
	for port, public := range pv.ports[sb.id] {
		ports = append(ports, port)
		pub[port] = public
	}
	pv.mu.Unlock()
	slices.Sort(ports)
	out := api.PreviewList{Previews: []api.Preview{}}
	for _, port := range ports {
		v, err := m.previewOf(sb.id, port, pub[port])
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
	sb, err := m.LiveSandbox(ctx, p, id)
	if err != nil {
		return err
	}
	pv := m.previews()
	pv.wmu.Lock()
	pv.mu.Lock()
	public, ok := pv.ports[sb.id][port]
	pv.mu.Unlock()
	if !ok {
		pv.wmu.Unlock()
		return &PublicError{Msg: "preview not found", Err: errdefs.ErrNotFound}
	}
	// The store first: if it fails the port stays exposed, as the client
	// is told, rather than come back at the next restart.
	if err := m.store.DeletePreview(ctx, sb.id, port); err != nil {
		pv.wmu.Unlock()
		return err
	}
	pv.mu.Lock()
	delete(pv.ports[sb.id], port)
	pv.mu.Unlock()
	pv.wmu.Unlock()
	m.recordEvent(ctx, sb, api.AuditPreview, api.PreviewAuditDetail{Action: "unexpose", Port: port, Public: public})
	return nil
}

// prunePreviewsLocked forgets the previews of sandboxes that are gone.
func (m *Service) prunePreviewsLocked(pv *previews) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id := range pv.ports {
		if _, ok := m.live[id]; !ok {
			delete(pv.ports, id)
		}
	}
}

// PreviewBackend is the manager as the preview listener's backend.
func (m *Service) PreviewBackend() preview.Backend { return previewBackend{m} }

type previewBackend struct{ m *Service }

// sandboxFor finds live sandbox id and a principal of its tenant.
func (b previewBackend) sandboxFor(id string) (*Live, auth.Principal, bool) {
	b.m.mu.Lock()
	sb := b.m.live[id]
	b.m.mu.Unlock()
	if sb == nil {
		return nil, auth.Principal{}, false
	}
	return sb, auth.Principal{Tenant: sb.tenant}, true
}

func (b previewBackend) PreviewTarget(ctx context.Context, id string, port int) (preview.Target, error) {
	key, err := b.m.previewKey()
	if err != nil {
		return preview.Target{}, err
	}
	sb, _, ok := b.sandboxFor(id)
	if !ok || sb.state() != api.StateRunning {
		// The token of any id is known here: the listener answers a
		// holder of it "not found", everyone else as for a private port.
		return preview.Target{Token: preview.TokenFor(key, id)}, errdefs.ErrNotFound
	}
	pv := b.m.previews()
	pv.mu.Lock()
	public, exposed := pv.ports[id][port]
	pv.mu.Unlock()
	return preview.Target{Token: preview.TokenFor(key, id), Exposed: exposed, Public: public}, nil
}

func (b previewBackend) PreviewDial(ctx context.Context, id string, port int) (net.Conn, error) {
	_, p, ok := b.sandboxFor(id)
	if !ok {
		return nil, errdefs.ErrNotFound
	}
	return b.m.DialSandbox(ctx, p, id, port)
}

func (b previewBackend) PreviewOpened(ctx context.Context, id string, port int, remote, via string) {
	sb, _, ok := b.sandboxFor(id)
	if !ok {
		return
	}
	pv := b.m.previews()
	pv.mu.Lock()
	public := pv.ports[id][port]
	pv.mu.Unlock()
	b.m.recordEvent(ctx, sb, api.AuditPreview, api.PreviewAuditDetail{Action: "open", Port: port, Public: public, Remote: remote, Via: via})
}
