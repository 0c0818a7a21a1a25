package netpolicy

import (
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/network"
	"github.com/airlockhq/airlock/internal/pkgcache"
	"github.com/airlockhq/airlock/internal/redact"
	"github.com/airlockhq/airlock/internal/service/sandbox"
)

// ownerRetention is how long a sandbox's tenant, template and secrets'
// redactor are remembered after it stopped being live: network events of
// its last connections (reported when they close, and by the packet
// filter's log reader) arrive a little after its teardown.
const ownerRetention = 2 * time.Minute

// Attribution knows whom each sandbox's events belong to (sandbox id →
// tenant, template, the redactor of its secrets) and is the sink of the
// events the network side reports about sandboxes: egress decisions and
// package downloads become audit events of the sandbox's tenant, a network
// repaired is audited, a network lost is handed to the sandbox service,
// which ends its sandbox.
//
// It is made before the network backend and the services and given to both
// at construction: its methods are the network's sinks (network.Config's
// Audit, PackageAudit, OnRepair, OnLost), and the sandbox service
// (sandbox.Config.Owners) tells it which sandboxes are live and takes the
// networks it reports lost. Template builds attribute their build
// sandboxes' events to the build's tenant (Attribute). Nothing in it
// points at a service. Its methods are safe for concurrent use and only
// queue: they are called from the network's goroutines.
type Attribution struct {
	audit      *audit.Recorder
	registries map[string][]string
	now        func() time.Time
	log        *slog.Logger

	mu     sync.Mutex
	owners map[string]owner
	// lost holds the networks reported lost that the sandbox service has not
	// taken yet; lostReady has a value while it is not empty.
	lost      []sandbox.LostNetwork
	lostReady chan struct{}
}

// AttributionConfig configures an Attribution.
type AttributionConfig struct {
	// Audit receives the events; nil records nothing (a lost network is
	// still handed on).
	Audit *audit.Recorder
	// Registries are the hosts of each package registry set (as the
	// network enforces them): an egress event names the set its domain
	// belongs to.
	Registries map[string][]string
	// Logger receives its logs; default slog.Default().
	Logger *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// NewAttribution returns an Attribution for cfg.
func NewAttribution(cfg AttributionConfig) *Attribution {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Attribution{
		audit: cfg.Audit, registries: cfg.Registries, now: cfg.Now, log: cfg.Logger.With("component", "netpolicy"),
		owners: map[string]owner{}, lostReady: make(chan struct{}, 1),
	}
}

// owner is whom a sandbox's audit events belong to.
type owner struct {
	tenant   string
	template string
	red      *redact.Redactor
	// managed is set for a sandbox of the sandbox service (not a build's).
	managed bool
	// gone is when the sandbox stopped being live (zero while it is, or
	// while an attribution is held).
	gone time.Time
}

func (o owner) redact() audit.Redactor {
	return o.red.Func()
}

// set remembers o for id, pruning entries past their retention.
func (a *Attribution) set(id string, o owner) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	for k, v := range a.owners {
		if !v.gone.IsZero() && now.Sub(v.gone) > ownerRetention {
			delete(a.owners, k)
		}
	}
	a.owners[id] = o
}

// Live records that sandbox sb of the sandbox service is live
// (sandbox.Owners).
func (a *Attribution) Live(sb *sandbox.Live) {
	a.set(sb.ID(), owner{tenant: sb.Tenant(), template: sb.Record().Template, red: sb.Redactor(), managed: true})
}

// Gone records that sandbox sb stopped being live: its events stay
// attributed for ownerRetention (sandbox.Owners).
func (a *Attribution) Gone(sb *sandbox.Live) {
	a.set(sb.ID(), owner{tenant: sb.Tenant(), template: sb.Record().Template, red: sb.Redactor(), managed: true, gone: a.now()})
}

// ownerOf finds whom sandbox id's events belong to: a live sandbox, one
// that recently stopped, or an attributed one (build sandboxes).
func (a *Attribution) ownerOf(id string) (owner, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	o, ok := a.owners[id]
	return o, ok
}

// Attribute makes the audit events of sandbox id (one the services do not
// run: a template build's) belong to tenant and template until release is
// called (and ownerRetention after).
func (a *Attribution) Attribute(id, tenant, template string) (release func()) {
	a.set(id, owner{tenant: tenant, template: template})
	return func() { a.set(id, owner{tenant: tenant, template: template, gone: a.now()}) }
}

// NetworkEvent records a network decision (network.Config.Audit). The
// domain is masked too: a secret may leave as a DNS name.
func (a *Attribution) NetworkEvent(ev network.Event) {
	if a.audit == nil {
		return
	}
	o, _ := a.ownerOf(ev.SandboxID)
	a.audit.RecordDetail(audit.Event{
		Time: ev.Time, Type: audit.TypeEgress, Tenant: o.tenant, SandboxID: ev.SandboxID, Template: o.template,
	}, api.EgressAuditDetail{
		Kind: ev.Kind, Domain: ev.Domain, IP: ev.IP, Port: ev.Port, Proto: ev.Proto, Allowed: ev.Allowed,
		Reason: ev.Reason, BytesIn: ev.BytesIn, BytesOut: ev.BytesOut, Registry: registryOf(a.registries, ev.Domain),
	}, o.redact())
}

// PackageEvent records a package artifact a sandbox fetched or was refused
// through the mirror (network.Config.PackageAudit) as a package_install
// event.
func (a *Attribution) PackageEvent(ev pkgcache.Event) {
	if a.audit == nil {
		return
	}
	o, _ := a.ownerOf(ev.SandboxID)
	a.audit.RecordDetail(audit.Event{
		Time: ev.Time, Type: audit.TypePackageInstall, Tenant: o.tenant, SandboxID: ev.SandboxID, Template: o.template,
	}, ev, o.redact())
}

// NetworkRepaired is told by the network backend (network.Config.OnRepair)
// that sandbox id's network, broken from outside, was wired again: an
// audit event of the sandbox (network_update, detail "repaired") says so,
// for a live sandbox of the sandbox service.
func (a *Attribution) NetworkRepaired(id, what string) {
	o, ok := a.ownerOf(id)
	if !ok || !o.managed || !o.gone.IsZero() {
		return
	}
	a.log.Warn("sandbox network repaired", "sandbox_id", id, "tenant", o.tenant, "what", what)
	if a.audit == nil {
		return
	}
	a.audit.RecordDetail(audit.Event{Type: audit.TypeNetworkUpdate, Tenant: o.tenant, SandboxID: id, Template: o.template},
		map[string]string{"repaired": what}, o.redact())
}

// NetworkLost is told by the network backend (network.Config.OnLost) that
// sandbox id's network was broken from outside beyond repair. The sandbox service
// takes it from here and ends the sandbox (see sandbox.Service); one
// reported before the service runs waits for it.
func (a *Attribution) NetworkLost(id string, err error) {
	a.mu.Lock()
	a.lost = append(a.lost, sandbox.LostNetwork{ID: id, Err: err})
	a.mu.Unlock()
	select {
	case a.lostReady <- struct{}{}:
	default:
	}
}

// Lost has a value while networks reported lost wait for TakeLost
// (sandbox.Owners).
func (a *Attribution) Lost() <-chan struct{} { return a.lostReady }

// TakeLost returns the networks reported lost since the last call
// (sandbox.Owners).
func (a *Attribution) TakeLost() []sandbox.LostNetwork {
	a.mu.Lock()
	defer a.mu.Unlock()
	l := a.lost
	a.lost = nil
	return l
}

// registryOf returns the registry set of regs whose hosts include host, ""
// if none.
func registryOf(regs map[string][]string, host string) string {
	if host == "" {
		return ""
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	names := make([]string, 0, len(regs))
	for name := range regs {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		for _, h := range regs[name] {
			h = strings.ToLower(h)
			if suffix, ok := strings.CutPrefix(h, "*"); ok {
				if strings.HasSuffix(host, suffix) && len(host) > len(suffix) {
					return name
				}
			} else if h == host {
				return name
			}
		}
	}
	return ""
}
