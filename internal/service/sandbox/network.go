package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
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

// Policy decides the network policies of sandboxes (service/netpolicy).
type Policy interface {
	// For returns the network of a create for p on drv: the request's
	// (req, nil for none) when it names a mode, else the tenant's default,
	// else the daemon's, checked and normalised.
	For(ctx context.Context, p auth.Principal, req *api.Network, drv driver.Driver) (api.Network, error)
	// CheckEntries refuses the allow entries of n that only an admin may
	// give (link-local, cloud metadata, the host's own addresses).
	CheckEntries(p auth.Principal, n api.Network) error
	// Check validates n for a sandbox on drv and returns it normalised.
	Check(n api.Network, drv driver.Driver) (api.Network, error)
	// PackageEnv is the environment that points a sandbox's package
	// managers at airlock's mirror under network n (nil for none).
	PackageEnv(n api.Network) map[string]string
}

// Owners is told which sandboxes are live, so that the network side's
// events (egress, package downloads, repairs) are attributed to their
// tenants, and hands on the networks the backend reports lost
// (service/netpolicy's Attribution, made before the backend, whose sinks
// are its methods).
type Owners interface {
	// Live records that sb is live; Gone that it stopped being live.
	Live(sb *Live)
	Gone(sb *Live)
	// Lost has a value while networks reported lost wait; TakeLost
	// returns them.
	Lost() <-chan struct{}
	TakeLost() []LostNetwork
}

// LostNetwork is a sandbox's network the backend reported lost.
type LostNetwork struct {
	ID  string
	Err error
}

// toPolicy converts the API's network to the network package's policy.
func toPolicy(n api.Network) network.Policy {
	return network.Policy{Mode: network.Mode(n.Mode), Allow: n.Allow, Registries: n.Registries, Offline: n.Offline, MaxDownloadMB: n.MaxDownloadMB}
}

// NetNSPathOf is the bind-mounted namespace of sandbox id, if it has one
// (service/previews dials into it).
func (n netManager) NetNSPathOf(id string) (string, bool) {
	a, ok := n.Manager.Attachment(id)
	if !ok {
		return "", false
	}
	return a.NetNSPath(), true
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
	if err := m.policy.CheckEntries(p, req); err != nil {
		return api.Sandbox{}, err
	}
	n, err := m.policy.Check(req, sb.drv)
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
