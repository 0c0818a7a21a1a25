package build

import (
	"context"
	"slices"
	"time"

	"github.com/airlockhq/airlock/internal/network"
)

// networkTeardownTimeout bounds removing a build sandbox's network; a veth
// deletion waits for an RCU grace period, tens of milliseconds.
const networkTeardownTimeout = 30 * time.Second

// RegistryNetwork returns the NetworkFunc that gives each RUN sandbox a
// network that reaches only the package registries named (of those nm
// knows hosts for): an allowlist policy of registry sets, enforced by the
// network package's resolver, proxy and nftables rules.
func RegistryNetwork(nm *network.Manager, registries []string) NetworkFunc {
	regs := slices.Clone(registries)
	return func(ctx context.Context, id string) (Network, func(), error) {
		a, err := nm.Setup(ctx, id, network.Policy{Mode: network.ModeAllowlist, Registries: regs})
		if err != nil {
			return Network{}, nil, err
		}
		cleanup := func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), networkTeardownTimeout)
			defer cancel()
			_ = nm.Teardown(cctx, id)
		}
		return Network{NetNSPath: a.NetNSPath(), ResolvConfPath: a.ResolvConfPath()}, cleanup, nil
	}
}

// AvailableRegistries returns the registry sets of regs that have hosts,
// in network.KnownRegistries order: an allowlist naming a set without
// hosts is refused.
func AvailableRegistries(regs map[string][]string) []string {
	var out []string
	for _, name := range network.KnownRegistries {
		if len(regs[name]) > 0 {
			out = append(out, name)
		}
	}
	return out
}

// Owner is whom a build's sandboxes act for: the tenant, template and
// build. The Network hook finds it in its context (OwnerOf), so that the
// audit trail can attribute a build sandbox's egress.
type Owner struct {
	Tenant   string
	Template string
	BuildID  string
}

type ownerKey struct{}

func withOwner(ctx context.Context, o Owner) context.Context {
	return context.WithValue(ctx, ownerKey{}, o)
}

// OwnerOf returns the build a context handed to the Network hook belongs to.
func OwnerOf(ctx context.Context) (Owner, bool) {
	o, ok := ctx.Value(ownerKey{}).(Owner)
	return o, ok
}
