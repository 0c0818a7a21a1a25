package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/build"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/network"
	"github.com/airlockhq/airlock/internal/store"
)

// Network is the sandbox network backend: network.Manager, through
// NetworkOf. Tests substitute fakes.
type Network interface {
	// Setup makes sandbox id's network namespace and enforces p in it.
	// On error nothing is left.
	Setup(ctx context.Context, id string, p network.Policy) (NetAttachment, error)
	// Update replaces the policy of sandbox id, effective at once.
	Update(ctx context.Context, id string, p network.Policy) error
	// Recover re-adopts sandbox id's network after a daemon restart; an
	// error wrapping errdefs.ErrNotFound means it is gone.
	Recover(ctx context.Context, id string, p network.Policy) error
	// Teardown removes everything of sandbox id's network. Idempotent.
	Teardown(ctx context.Context, id string) error
	// Known lists every sandbox id with network state.
	Known() []string
	// Counters returns the bytes sandbox id received and sent.
	Counters(id string) (rx, tx uint64, err error)
}

// NetAttachment is what the driver needs of a sandbox's network.
type NetAttachment struct {
	// NetNSPath is the namespace the sandbox joins (driver.Spec.NetNSPath).
	NetNSPath string
	// ResolvConfPath names the sandbox's resolver (driver.Spec.ResolvConfPath).
	ResolvConfPath string
}

// NetworkOf adapts nm to Network; nil gives nil.
func NetworkOf(nm *network.Manager) Network {
	if nm == nil {
		return nil
	}
	return netManager{nm}
}

type netManager struct{ *network.Manager }

func (n netManager) Setup(ctx context.Context, id string, p network.Policy) (NetAttachment, error) {
	a, err := n.Manager.Setup(ctx, id, p)
	if err != nil {
		return NetAttachment{}, err
	}
	return NetAttachment{NetNSPath: a.NetNSPath(), ResolvConfPath: a.ResolvConfPath()}, nil
}

// toPolicy converts the API's network to the network package's policy.
func toPolicy(n api.Network) network.Policy {
	return network.Policy{Mode: network.Mode(n.Mode), Allow: n.Allow, Registries: n.Registries, Offline: n.Offline, MaxDownloadMB: n.MaxDownloadMB}
}

func fromPolicy(p network.Policy) api.Network {
	return api.Network{Mode: string(p.Mode), Allow: p.Allow, Registries: p.Registries, Offline: p.Offline, MaxDownloadMB: p.MaxDownloadMB}
}

// checkNetwork validates n and returns it normalised (network.ParsePolicy):
// the mode must be one drv supports and, without a network backend, none;
// registry sets must have hosts on this server.
func (m *Service) checkNetwork(n api.Network, drv driver.Driver) (api.Network, error) {
	p, err := network.ParsePolicy(toPolicy(n))
	if err != nil {
		return api.Network{}, public(errInvalid, "network: %s", publicText(err))
	}
	if m.net == nil && p.Mode != network.ModeNone {
		return api.Network{}, public(errInvalid, "network mode %s is not available on this server (no sandbox networking)", p.Mode)
	}
	if drv != nil && !drv.Capabilities().HasNetworkMode(driver.NetworkMode(p.Mode)) {
		return api.Network{}, public(errInvalid, "runtime %s does not support network mode %s", drv.Name(), p.Mode)
	}
	for _, r := range p.Registries {
		if len(m.cfg.Registries[r]) == 0 {
			return api.Network{}, public(errInvalid, "network: registry set %s has no hosts on this server", r)
		}
	}
	out := fromPolicy(p)
	if out.Mode == "" {
		out.Mode = string(network.ModeNone)
	}
	return out, nil
}

// networkFor returns the network of a create: the request's when it names
// a mode, else its tenant's default, else the server's; entries given
// without a mode go with the default mode. Entries the request gives are
// checked with checkEntries; a tenant default's were set by an admin.
func (m *Service) networkFor(ctx context.Context, p auth.Principal, req *api.Network, drv driver.Driver) (api.Network, error) {
	if req != nil {
		if err := m.checkEntries(p, *req); err != nil {
			return api.Network{}, err
		}
	}
	if req != nil && req.Mode != "" {
		return m.checkNetwork(*req, drv)
	}
	def, err := m.defaultNetwork(ctx, p.Tenant)
	if err != nil {
		return api.Network{}, err
	}
	if req != nil && (len(req.Allow) > 0 || len(req.Registries) > 0 || req.Offline) {
		def = api.Network{Mode: def.Mode, Allow: req.Allow, Registries: req.Registries, Offline: req.Offline}
	}
	return m.checkNetwork(def, drv)
}

// hostAddrser is the optional part of a Network that knows the host's own
// addresses (network.Manager does).
type hostAddrser interface {
	HostAddrs() []netip.Addr
}

// checkEntries refuses, unless p is an admin, allow entries that open
// link-local addresses (cloud metadata), another cloud metadata address or
// one of the host's own addresses (where the daemon's API and previews
// listen): a tenant's sandbox reaches those only when an admin said so.
func (m *Service) checkEntries(p auth.Principal, n api.Network) error {
	if p.Admin || len(n.Allow) == 0 {
		return nil
	}
	var host []netip.Addr
	if ha, ok := m.net.(hostAddrser); ok {
		host = ha.HostAddrs()
	}
	if entry, why := network.SensitiveEntry(toPolicy(n), host); entry != "" {
		return public(errInvalid, "network: allow entry %q opens %s: only an admin key may allow it", truncate(entry, 64), why)
	}
	return nil
}

// defaultNetwork is tenant's stored default, else the server's.
func (m *Service) defaultNetwork(ctx context.Context, tenant string) (api.Network, error) {
	raw, err := m.store.TenantNetwork(ctx, tenant)
	if err != nil {
		return api.Network{}, err
	}
	if len(raw) > 0 {
		var n api.Network
		if err := json.Unmarshal(raw, &n); err == nil && n.Mode != "" {
			return n, nil
		}
	}
	return api.Network{Mode: m.cfg.DefaultNetworkMode}, nil
}

// setupNetwork gives a sandbox its namespace before the driver creates it.
func (m *Service) setupNetwork(ctx context.Context, sb *Live, n api.Network, spec *driver.Spec) error {
	if m.net == nil {
		return nil
	}
	att, err := m.net.Setup(ctx, sb.id, toPolicy(n))
	if err != nil {
		if errdefs.IsInvalidArgument(err) {
			return public(errInvalid, "network: %s", publicText(err))
		}
		return fmt.Errorf("network setup: %w", err)
	}
	spec.NetNSPath, spec.ResolvConfPath = att.NetNSPath, att.ResolvConfPath
	return nil
}

// teardownNetwork removes sandbox id's network (after the driver destroyed
// the sandbox: nothing may still use the namespace).
func (m *Service) teardownNetwork(ctx context.Context, id string) error {
	if m.net == nil {
		return nil
	}
	if err := m.net.Teardown(ctx, id); err != nil {
		return fmt.Errorf("tearing down sandbox network: %w", err)
	}
	return nil
}

// recoverNetwork re-adopts a recovered sandbox's network. A sandbox made
// by a daemon without a network backend keeps the loopback-only namespace
// its runtime gave it.
func (m *Service) recoverNetwork(ctx context.Context, id string, sp Spec) error {
	if m.net == nil || !sp.NetNS {
		return nil
	}
	return m.net.Recover(ctx, id, toPolicy(sp.Network))
}

// sweepNetworks tears down the networks a previous daemon left for
// sandboxes that are not live (deleted while it was down, or lost between
// steps). Build sandboxes' networks are the builder's.
func (m *Service) sweepNetworks(ctx context.Context) {
	if m.net == nil {
		return
	}
	for _, id := range m.net.Known() {
		if strings.HasPrefix(id, build.BuildSandboxPrefix) {
			continue
		}
		m.mu.Lock()
		_, live := m.live[id]
		m.mu.Unlock()
		if live {
			continue
		}
		if err := m.net.Teardown(ctx, id); err != nil {
			m.log.Warn("removing the network of a gone sandbox", "sandbox_id", id, "err", err)
		} else {
			m.log.Info("removed the network of a gone sandbox", "sandbox_id", id)
		}
	}
}

// networkLost ends sandbox id, whose network the backend reported broken
// from outside beyond repair (its namespace is gone, or wiring it again
// failed; Attribution.NetworkLost hands it on). A running or paused
// sandbox is then ended like a crashed one, with state error and code
// network_lost: it is never reported running without the network its
// policy says. The detail goes to the log; the sandbox's record says what
// happened without it.
func (m *Service) networkLost(id string, err error) {
	m.mu.Lock()
	sb := m.live[id]
	m.mu.Unlock()
	if sb == nil || m.ctx == nil || m.ctx.Err() != nil {
		return
	}
	if st := sb.state(); st != api.StateRunning && st != api.StatePaused {
		return
	}
	m.log.Error("sandbox network lost", "sandbox_id", id, "tenant", sb.tenant, "err", err)
	m.crashedCode(m.ctx, sb, api.SandboxCodeNetworkLost, "the sandbox's network was removed from outside airlock and could not be restored")
}

// UpdateNetwork replaces sandbox id's egress policy (PUT
// /v1/sandboxes/{id}/network). It takes effect at once and is kept across
// daemon restarts.
func (m *Service) UpdateNetwork(ctx context.Context, p auth.Principal, id string, req api.Network) (api.Sandbox, error) {
	sb, err := m.LiveSandbox(ctx, p, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	if err := m.checkEntries(p, req); err != nil {
		return api.Sandbox{}, err
	}
	n, err := m.checkNetwork(req, sb.drv)
	if err != nil {
		return api.Sandbox{}, err
	}
	sb.opMu.Lock()
	defer sb.opMu.Unlock()
	if st := sb.state(); st != api.StateRunning && st != api.StatePaused {
		return api.Sandbox{}, public(errdefs.ErrInvalidState, "sandbox is %s", st)
	}
	var old Spec
	_ = json.Unmarshal(sb.snapshot().Spec, &old)
	if m.net != nil && !old.NetNS && n.Mode != string(network.ModeNone) {
		return api.Sandbox{}, public(errdefs.ErrInvalidState, "sandbox was created without a managed network; its network cannot change")
	}
	// A runtime that takes its interfaces at start would stay loopback-only
	// while the record said otherwise: refuse rather than pretend.
	if old.Network.Mode == string(network.ModeNone) && n.Mode != string(network.ModeNone) && sb.drv.Capabilities().InterfacesAtStart {
		return api.Sandbox{}, public(errdefs.ErrInvalidState,
			"the %s runtime sees network interfaces only as they were at start: create the sandbox with network mode %s instead", sb.drv.Name(), n.Mode)
	}
	if m.net != nil && old.NetNS {
		if err := m.net.Update(ctx, sb.id, toPolicy(n)); err != nil {
			if errdefs.IsInvalidArgument(err) {
				return api.Sandbox{}, public(errInvalid, "network: %s", publicText(err))
			}
			return api.Sandbox{}, fmt.Errorf("updating sandbox network: %w", err)
		}
	}
	err = sb.update(ctx, func(r *store.Sandbox) {
		var sp Spec
		_ = json.Unmarshal(r.Spec, &sp)
		sp.Network = n
		if b, err := json.Marshal(sp); err == nil {
			r.Spec = b
		}
	})
	if err != nil {
		// The kernel has the new policy, the record the old one: put the
		// old one back so that a restart does not change it again.
		if m.net != nil && old.NetNS {
			cctx, cancel := cleanupCtx(ctx)
			if rerr := m.net.Update(cctx, sb.id, toPolicy(old.Network)); rerr != nil {
				m.log.Error("restoring sandbox network", "sandbox_id", sb.id, "err", rerr)
			}
			cancel()
		}
		return api.Sandbox{}, err
	}
	m.recordEvent(ctx, sb, audit.TypeNetworkUpdate, map[string]any{"from": old.Network, "to": n})
	m.log.Info("sandbox network updated", "sandbox_id", sb.id, "tenant", sb.tenant, "mode", n.Mode)
	return m.view(sb.snapshot()), nil
}

// TenantNetwork returns tenant's default network policy. A tenant sees its
// own; an admin any.
func (m *Service) TenantNetwork(ctx context.Context, p auth.Principal, tenant string) (api.TenantNetwork, error) {
	if !p.CanSee(tenant) {
		return api.TenantNetwork{}, public(errdefs.ErrPermissionDenied, "only an admin key may read another tenant's settings")
	}
	raw, err := m.store.TenantNetwork(ctx, tenant)
	if err != nil {
		return api.TenantNetwork{}, err
	}
	out := api.TenantNetwork{Tenant: tenant}
	if len(raw) > 0 {
		var n api.Network
		if err := json.Unmarshal(raw, &n); err == nil {
			out.Network = &n
		}
	}
	return out, nil
}

// SetTenantNetwork sets (nil: clears) tenant's default network policy;
// admins only. Existing sandboxes keep theirs.
func (m *Service) SetTenantNetwork(ctx context.Context, p auth.Principal, tenant string, n *api.Network) (api.TenantNetwork, error) {
	if !p.Admin {
		return api.TenantNetwork{}, public(errdefs.ErrPermissionDenied, "this needs an admin key")
	}
	if !auth.ValidTenant(tenant) {
		return api.TenantNetwork{}, public(errInvalid, "tenant %q is not a valid tenant name", truncate(tenant, 64))
	}
	var raw json.RawMessage
	if n != nil {
		if n.Mode == "" {
			return api.TenantNetwork{}, public(errInvalid, "network.mode is required (null clears the default)")
		}
		norm, err := m.checkNetwork(*n, nil)
		if err != nil {
			return api.TenantNetwork{}, err
		}
		n = &norm
		if raw, err = json.Marshal(norm); err != nil {
			return api.TenantNetwork{}, err
		}
	}
	if err := m.store.SetTenantNetwork(ctx, tenant, raw); err != nil {
		return api.TenantNetwork{}, err
	}
	m.log.Info("tenant default network set", "for_tenant", tenant, "cleared", n == nil)
	return api.TenantNetwork{Tenant: tenant, Network: n}, nil
}
