// Package netpolicy is the network policy service: what a sandbox may reach (a create's network, checked
// and normalised: the request's, its tenant's default, the daemon's), the tenants' defaults, the package
// mirror's environment, and whom the network side's events belong to (Attribution, the network backend's
// sinks). The sandbox lifecycle applies a policy through the network backend; this package decides it.
package netpolicy

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/network"
	"github.com/airlockhq/airlock/internal/service/sandbox"
	"github.com/airlockhq/airlock/internal/store"
)

// Config configures a Policy.
type Config struct {
	// Backend is the sandbox network backend (sandbox.NetworkOf); nil:
	// sandboxes get loopback only and only mode none is accepted.
	Backend sandbox.Network
	// Store keeps the tenants' defaults. Required.
	Store *store.Store
	// Registries are the hosts of each package registry set, as Backend
	// enforces them: a policy may only name sets that have hosts.
	Registries map[string][]string
	// DefaultNetworkMode is the mode of a create that names none when its
	// tenant has no default of its own; "" means none.
	DefaultNetworkMode string
	// Logger receives the policy's logs; default slog.Default().
	Logger *slog.Logger
}

// Policy decides sandboxes' network policies. Its methods are safe for
// concurrent use.
type Policy struct {
	net         sandbox.Network
	store       *store.Store
	registries  map[string][]string
	defaultMode string
	log         *slog.Logger
}

// New returns the policy of cfg; a default mode other than none needs a
// backend.
func New(cfg Config) (*Policy, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.DefaultNetworkMode == "" {
		cfg.DefaultNetworkMode = string(network.ModeNone)
	}
	switch network.Mode(cfg.DefaultNetworkMode) {
	case network.ModeNone:
	case network.ModeAllowlist, network.ModeOpen:
		if cfg.Backend == nil {
			return nil, fmt.Errorf("netpolicy: default network mode %s needs sandbox networking, which is not available", cfg.DefaultNetworkMode)
		}
	default:
		return nil, fmt.Errorf("netpolicy: default network mode %q is not none, allowlist or open", cfg.DefaultNetworkMode)
	}
	return &Policy{net: cfg.Backend, store: cfg.Store, registries: cfg.Registries, defaultMode: cfg.DefaultNetworkMode,
		log: cfg.Logger.With("component", "netpolicy")}, nil
}

// ToPolicy converts the API's network to the network package's policy.
func ToPolicy(n api.Network) network.Policy {
	return network.Policy{Mode: network.Mode(n.Mode), Allow: n.Allow, Registries: n.Registries, Offline: n.Offline, MaxDownloadMB: n.MaxDownloadMB}
}

func fromPolicy(p network.Policy) api.Network {
	return api.Network{Mode: string(p.Mode), Allow: p.Allow, Registries: p.Registries, Offline: p.Offline, MaxDownloadMB: p.MaxDownloadMB}
}

// Check validates n and returns it normalised (network.ParsePolicy):
// the mode must be one drv supports and, without a network backend, none;
// registry sets must have hosts on this server.
func (m *Policy) Check(n api.Network, drv driver.Driver) (api.Network, error) {
	p, err := network.ParsePolicy(ToPolicy(n))
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
		if len(m.registries[r]) == 0 {
			return api.Network{}, public(errInvalid, "network: registry set %s has no hosts on this server", r)
		}
	}
	out := fromPolicy(p)
	if out.Mode == "" {
		out.Mode = string(network.ModeNone)
	}
	return out, nil
}

// For returns the network of a create: the request's when it names
// a mode, else its tenant's default, else the server's; entries given
// without a mode go with the default mode. Entries the request gives are
// checked with CheckEntries; a tenant default's were set by an admin.
func (m *Policy) For(ctx context.Context, p auth.Principal, req *api.Network, drv driver.Driver) (api.Network, error) {
	if req != nil {
		if err := m.CheckEntries(p, *req); err != nil {
			return api.Network{}, err
		}
	}
	if req != nil && req.Mode != "" {
		return m.Check(*req, drv)
	}
	def, err := m.defaultNetwork(ctx, p.Tenant)
	if err != nil {
		return api.Network{}, err
	}
	if req != nil && (len(req.Allow) > 0 || len(req.Registries) > 0 || req.Offline) {
		def = api.Network{Mode: def.Mode, Allow: req.Allow, Registries: req.Registries, Offline: req.Offline}
	}
	return m.Check(def, drv)
}

// hostAddrser is the optional part of a Network that knows the host's own
// addresses (network.Manager does).
type hostAddrser interface {
	HostAddrs() []netip.Addr
}

// CheckEntries refuses, unless p is an admin, allow entries that open
// link-local addresses (cloud metadata), another cloud metadata address or
// one of the host's own addresses (where the daemon's API and previews
// listen): a tenant's sandbox reaches those only when an admin said so.
func (m *Policy) CheckEntries(p auth.Principal, n api.Network) error {
	if p.Admin || len(n.Allow) == 0 {
		return nil
	}
	var host []netip.Addr
	if ha, ok := m.net.(hostAddrser); ok {
		host = ha.HostAddrs()
	}
	if entry, why := network.SensitiveEntry(ToPolicy(n), host); entry != "" {
		return public(errInvalid, "network: allow entry %q opens %s: only an admin key may allow it", truncate(entry, 64), why)
	}
	return nil
}

// defaultNetwork is tenant's stored default, else the server's.
func (m *Policy) defaultNetwork(ctx context.Context, tenant string) (api.Network, error) {
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
	return api.Network{Mode: m.defaultMode}, nil
}

// packageEnver is the optional part of a Network that points package
// managers at airlock's mirror (network.Manager.PackageEnv).
type packageEnver interface {
	PackageEnv(p network.Policy) map[string]string
}

// PackageEnv is the environment a sandbox with network n gets so that its
// package managers use the mirror (PIP_INDEX_URL, NPM_CONFIG_REGISTRY,
// GOPROXY…); nil without a mirror or registry sets. The create request's
// and template's own variables win over it.
func (m *Policy) PackageEnv(n api.Network) map[string]string {
	pe, ok := m.net.(packageEnver)
	if !ok {
		return nil
	}
	return pe.PackageEnv(ToPolicy(n))
}

// TenantNetwork returns tenant's default network policy. A tenant sees its
// own; an admin any.
func (m *Policy) TenantNetwork(ctx context.Context, p auth.Principal, tenant string) (api.TenantNetwork, error) {
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
func (m *Policy) SetTenantNetwork(ctx context.Context, p auth.Principal, tenant string, n *api.Network) (api.TenantNetwork, error) {
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
		norm, err := m.Check(*n, nil)
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

var errInvalid = errdefs.ErrInvalidArgument

// public returns a client-safe error of class cls (errdefs.Public).
func public(cls error, format string, args ...any) error {
	return errdefs.Publicf(cls, format, args...)
}

// publicText strips the class prefix errdefs.Wrap puts on a message.
func publicText(err error) string {
	s := err.Error()
	if p := errdefs.ErrInvalidArgument.Error() + ": "; len(s) > len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
