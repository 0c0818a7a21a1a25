// Package network gives each sandbox its own network namespace and enforces its egress policy with a veth, nftables, airlock's DNS resolver and an SNI/Host-checking egress proxy, auditing every decision.
//
// A sandbox's namespace is bind-mounted under Config.StateDir, so that the
// driver joins it by path and it outlives a daemon restart. Mode none gives
// it loopback only (no veth: the cheap path). Allowlist and open modes add a
// veth pair (the peer created straight into the namespace) on a /30 of
// Config.Subnet and per-sandbox chains in one nftables table. See
// docs/network.md for the rules and how the daemon wires this package in.
package network

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
	"github.com/airlockhq/airlock/internal/pkgcache"
)

// Defaults of Config.
const (
	DefaultTable    = "airlock"
	DefaultIfPrefix = "alv"
	// DefaultLogGroup is the NFLOG group the filter logs decisions to.
	DefaultLogGroup = 4231
	// sandboxIfName is the sandbox's side of its veth.
	sandboxIfName = "eth0"
	// teardownTimeout bounds a rollback that runs detached from the caller.
	teardownTimeout = 30 * time.Second
	// hostAddrsTTL is how long the list of the host's own addresses is
	// trusted: addresses change rarely (DHCP), checks happen per connection.
	hostAddrsTTL = 5 * time.Second
	// DefaultCheckInterval is Config.CheckInterval's default. A sandbox
	// whose veth or rules something else removed is wired again within it;
	// each pass costs a few netlink dumps, whatever the number of
	// sandboxes.
	DefaultCheckInterval = 5 * time.Second
)

// DefaultSubnet is where sandbox veths get their /30s: 16384 sandboxes.
var DefaultSubnet = netip.MustParsePrefix("10.231.0.0/16")

// BlockedRanges are never reachable from a sandbox unless a CIDR entry that
// lies inside one of them names it: private, shared, loopback, link-local
// (cloud metadata), protocol-assignment, benchmarking, multicast and
// reserved space. The host's own addresses and Config.Subnet are handled
// apart.
var BlockedRanges = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

// Config configures a Manager.
type Config struct {
	// StateDir holds the namespaces' bind mounts (netns/) and each
	// sandbox's state and resolv.conf (sandboxes/). Required.
	StateDir string
	// Subnet is cut into /30s, one per sandbox: .1 is the host side (the
	// sandbox's gateway and resolver), .2 the sandbox. Default DefaultSubnet.
	Subnet netip.Prefix
	// SandboxRanges are the sandbox subnets of every airlock daemon on the
	// host (see internal/hostslot), Subnet included: no sandbox ever
	// reaches an address in them, whatever its policy, other than its own
	// gateway's resolver and proxy. Default: Subnet alone.
	SandboxRanges []netip.Prefix
	// Upstream are the resolvers ("ip:port") airlock's DNS asks for allowed
	// names. Default: the IPv4 nameservers of /etc/resolv.conf.
	Upstream []string
	// APIPorts are the host's TCP ports of airlock's API: closed to
	// sandboxes even when a CIDR entry opens a host address without naming
	// the port.
	APIPorts []uint16
	// Registries maps a registry set name to its host names ("pypi.org",
	// "*.example.org"). Defaults come from DefaultRegistries.
	Registries map[string][]string
	// Blocked replaces BlockedRanges (tests of unusual topologies).
	Blocked []netip.Prefix
	// Audit receives every decision. It is called from the network
	// goroutines and must not block for long.
	Audit func(Event)
	// Logger logs operational problems; default slog.Default().
	Logger *slog.Logger
	// HostNetNS is the path of the network namespace the host side lives
	// in: veths, nftables, the DNS and proxy sockets and their upstream
	// connections. Empty means the daemon's own; tests point it at a
	// namespace they made, so nothing touches the real host network.
	HostNetNS string
	// Table is the nftables table (family inet); default DefaultTable.
	Table string
	// IfPrefix starts the name of every host-side veth; default DefaultIfPrefix.
	IfPrefix string
	// LogGroup is the NFLOG group of the filter's decisions; default DefaultLogGroup.
	LogGroup uint16
	// MTU of the veths; 0 for the kernel's default.
	MTU int
	// CheckInterval is how often every sandbox's network is checked
	// against the kernel (Check): its namespace, veth, chains and map
	// entries, the table's base chains. Default DefaultCheckInterval;
	// negative: never (tests call Check).
	CheckInterval time.Duration
	// OnRepair is told of every sandbox network Check found broken and
	// wired again (what was wrong); OnLost of every one it could not
	// repair (its namespace is gone, or the repair failed). Both are called
	// from the checker's goroutine without any lock of the Manager held.
	OnRepair func(id, what string)
	OnLost   func(id string, err error)
	// Now is the events' clock; default time.Now.
	Now func() time.Time

	// Upstreams are the package mirror's upstream base URLs by registry
	// set (DefaultUpstreams). Without any, there is no mirror: registry
	// sets are reached through the egress proxy only.
	Upstreams map[string]string
	// PackageCache stores the mirror's artifacts; nil passes them through
	// uncached (still audited and counted).
	PackageCache *pkgcache.Store
	// UpstreamTLS configures the mirror's TLS to registries; nil: the
	// system's roots. Tests give their fake CA.
	UpstreamTLS *tls.Config
	// PackageAudit receives every artifact the mirror serves or refuses.
	// It must not block for long.
	PackageAudit func(pkgcache.Event)
	// MaxDownloadBytes caps what each sandbox receives through the mirror
	// and the egress proxy (counted since its network was set up; the
	// count is saved in StateDir, so a daemon restart does not grant the
	// cap afresh); 0 for no cap.
	MaxDownloadBytes int64
}

// Manager sets up and enforces sandbox networks. It is safe for concurrent
// use; calls for one sandbox are serialised by the Manager itself.
type Manager struct {
	cfg        Config
	log        *slog.Logger
	ns         *nsRunner
	host       *netlink.Handle
	nft        *nftRules
	nflog      *nflogReader
	up         *upstream
	registries map[string][]string
	blocked    []netip.Prefix
	netnsDir   string
	sbxDir     string

	mu     sync.Mutex
	sbx    map[string]*Attachment
	used   map[int]bool
	closed bool

	forwarding atomic.Bool

	// gen counts writes of sandboxes' kernel state (Attachment.touch), so
	// that Check judges only what it saw after; checkStop and checkDone
	// drive the checker goroutine (health.go).
	gen       atomic.Uint64
	checkStop chan struct{}
	checkDone chan struct{}

	mirror      *pkgcache.Mirror // nil: no package mirror
	upTransport *http.Transport

	hostMu    sync.Mutex
	hostAddrs []netip.Addr
	hostAt    time.Time

	// budgetKick, budgetStop and budgetDone drive the goroutine that saves
	// the download counts (packages.go); nil until New finished.
	budgetKick chan struct{}
	budgetStop chan struct{}
	budgetDone chan struct{}
}

// Attachment is one sandbox's network.
type Attachment struct {
	m      *Manager
	id     string
	idx    int
	nsPath string
	addr   netip.Addr
	gw     netip.Addr
	ifName string

	mu     sync.Mutex // serialises Update, Recover and Teardown of the sandbox
	policy Policy
	pol    atomic.Pointer[compiled]
	veth   bool
	dns    *dnsServer
	proxy  *proxy
	mirror *mirrorServer
	ports  ports
	gone   bool
	// activeGen is the Manager's gen when the sandbox's kernel state was
	// last written by Setup, Update, Recover or a repair; 0 until then (a
	// sandbox a previous daemon left is not checked before Recover).
	activeGen uint64
	// lost: Check found it broken beyond repair and said so once.
	lost   bool
	budget *pkgcache.Budget
	// savedUsed is the download count last saved to the budget file.
	savedUsed int64

	namesMu sync.Mutex
	names   map[netip.Addr]string
}

type ports struct{ DNSUDP, DNSTCP, Proxy, Mirror uint16 }

// persisted is a sandbox's state file, read back after a restart.
type persisted struct {
	ID     string `json:"id"`
	Index  int    `json:"index"`
	Policy Policy `json:"policy"`
	Veth   bool   `json:"veth"`
}

var idRE = lazyregexp.New(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)

// New prepares the host side: state directories, the nftables table and
// the NFLOG reader. Sandboxes whose state a previous daemon left are known
// (Known) but not enforced by airlock's DNS and proxy until Recover.
func New(cfg Config) (*Manager, error) {
	if cfg.StateDir == "" {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "network state dir is required")
	}
	if !cfg.Subnet.IsValid() {
		cfg.Subnet = DefaultSubnet
	}
	if !cfg.Subnet.Addr().Is4() || cfg.Subnet.Bits() > 30 || cfg.Subnet.Masked() != cfg.Subnet {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "network subnet %s must be an ipv4 prefix of /30 or larger", cfg.Subnet)
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	ranges := slices.Clone(cfg.SandboxRanges)
	if !insideAny(cfg.Subnet, ranges) {
		ranges = append(ranges, cfg.Subnet)
	}
	for _, r := range ranges {
		if !r.IsValid() || !r.Addr().Is4() || r.Masked() != r {
			return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "network sandbox range %s must be an ipv4 prefix", r)
		}
	}
	cfg.SandboxRanges = ranges
	if cfg.CheckInterval == 0 {
		cfg.CheckInterval = DefaultCheckInterval
	}
	if cfg.IfPrefix == "" {
		cfg.IfPrefix = DefaultIfPrefix
	}
	maxIdx := 1 << (30 - cfg.Subnet.Bits())
	if len(cfg.IfPrefix)+len(strconv.Itoa(maxIdx)) > unix.IFNAMSIZ-1 {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "network interface prefix %q is too long", cfg.IfPrefix)
	}
	if cfg.LogGroup == 0 {
		cfg.LogGroup = DefaultLogGroup
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	blocked := cfg.Blocked
	if blocked == nil {
		blocked = BlockedRanges
	}
	if cfg.Upstream == nil {
		servers, err := resolvConfServers("/etc/resolv.conf")
		if err != nil {
			cfg.Logger.Warn("reading the host's resolvers", "err", err)
		}
		cfg.Upstream = servers
	}
	m := &Manager{
		cfg: cfg, log: cfg.Logger, blocked: blocked,
		registries: DefaultRegistries(cfg.Registries),
		netnsDir:   filepath.Join(cfg.StateDir, "netns"),
		sbxDir:     filepath.Join(cfg.StateDir, "sandboxes"),
		sbx:        map[string]*Attachment{}, used: map[int]bool{},
	}
	ok := false
	defer func() {
		if !ok {
			m.closeHost()
		}
	}()
	var err error
	if m.ns, err = openNS(cfg.HostNetNS); err != nil {
		return nil, err
	}
	m.up = &upstream{servers: cfg.Upstream, dial: m.ns.dial, cache: map[string]cached{}}
	m.mirror = m.newMirror()
	if m.ns.f == nil {
		m.host, err = netlink.NewHandle(unix.NETLINK_ROUTE)
	} else {
		m.host, err = netlink.NewHandleAt(netns.NsHandle(m.ns.fd()), unix.NETLINK_ROUTE)
	}
	if err != nil {
		return nil, fmt.Errorf("opening netlink: %w", err)
	}
	conn, err := nftables.New(nftables.WithNetNSFd(m.ns.fd()), nftables.AsLasting())
	if err != nil {
		return nil, fmt.Errorf("opening nftables: %w", err)
	}
	m.nft = &nftRules{
		conn: conn, table: &nftables.Table{Name: cfg.Table, Family: nftables.TableFamilyINet},
		subnet: cfg.Subnet, sandboxes: cfg.SandboxRanges, ifPrefix: cfg.IfPrefix, group: cfg.LogGroup, apiPorts: cfg.APIPorts, blocked: blocked,
	}
	if err := m.nft.ensureBase(); err != nil {
		return nil, err
	}
	if err := makeSharedDir(m.netnsDir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(m.sbxDir, 0o700); err != nil {
		return nil, err
	}
	if err := m.loadState(); err != nil {
		return nil, err
	}
	m.sweep()
	if m.nflog, err = startNFLOG(m.ns.fd(), cfg.LogGroup, m.onPacketLog); err != nil {
		return nil, err
	}
	m.startBudgetFlusher(budgetFlushInterval)
	m.startChecker()
	ok = true
	return m, nil
}

// loadState reads the state files a previous daemon left.
func (m *Manager) loadState() error {
	ents, err := os.ReadDir(m.sbxDir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		id, ok := cutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		b, err := os.ReadFile(filepath.Join(m.sbxDir, e.Name()))
		var st persisted
		if err == nil {
			err = json.Unmarshal(b, &st)
		}
		if err != nil || st.ID != id || st.Index < 0 || st.Index >= m.slots() || m.used[st.Index] {
			m.log.Warn("ignoring unreadable network state", "file", e.Name(), "err", err)
			continue
		}
		a := m.newAttachment(id, st.Index)
		a.policy, a.veth = st.Policy, st.Veth
		a.restoreBudget()
		c, err := compile(st.Policy, m.registries, m.blocked)
		if err != nil {
			c = &compiled{Mode: ModeNone}
		}
		a.pol.Store(c)
		m.used[st.Index] = true
		m.sbx[id] = a
	}
	return nil
}

// sweep removes what a crashed daemon may have left without a state file:
// per-sandbox chains, veths and namespace mounts of no known sandbox. One
// Manager owns its table, interface prefix and state dir.
func (m *Manager) sweep() {
	chains, err := m.nft.chainsOf()
	if err != nil {
		m.log.Warn("listing nftables chains", "err", err)
	}
	stale := map[int]bool{}
	for _, name := range chains {
		if i := strings.LastIndexByte(name, '_'); i > 0 {
			if idx, err := strconv.Atoi(name[i+1:]); err == nil && !m.used[idx] {
				stale[idx] = true
			}
		}
	}
	links, err := m.host.LinkList()
	if err != nil {
		m.log.Warn("listing links", "err", err)
	}
	for _, l := range links {
		rest, ok := strings.CutPrefix(l.Attrs().Name, m.cfg.IfPrefix)
		if idx, err := strconv.Atoi(rest); ok && err == nil && strconv.Itoa(idx) == rest && !m.used[idx] {
			if err := m.host.LinkDel(l); err != nil {
				m.log.Warn("deleting stale veth", "link", l.Attrs().Name, "err", err)
			}
			stale[idx] = true
		}
	}
	for idx := range stale {
		if err := m.nft.remove(idx, m.cfg.IfPrefix+strconv.Itoa(idx)); err != nil {
			m.log.Warn("removing stale nftables chains", "index", idx, "err", err)
		}
	}
	ents, _ := os.ReadDir(m.netnsDir)
	for _, e := range ents {
		if _, ok := m.sbx[e.Name()]; !ok {
			if err := unmountNetNS(filepath.Join(m.netnsDir, e.Name())); err != nil {
				m.log.Warn("removing stale network namespace", "name", e.Name(), "err", err)
			}
		}
	}
	ents, _ = os.ReadDir(m.sbxDir)
	for _, e := range ents {
		id, _, _ := strings.Cut(e.Name(), ".")
		if _, ok := m.sbx[id]; !ok || strings.HasSuffix(e.Name(), ".tmp") {
			_ = os.Remove(filepath.Join(m.sbxDir, e.Name()))
		}
	}
}

func cutSuffix(s, suffix string) (string, bool) {
	if len(s) > len(suffix) && s[len(s)-len(suffix):] == suffix {
		return s[:len(s)-len(suffix)], true
	}
	return "", false
}

func (m *Manager) slots() int { return 1 << (30 - m.cfg.Subnet.Bits()) }

func (m *Manager) newAttachment(id string, idx int) *Attachment {
	base := binary.BigEndian.Uint32(m.cfg.Subnet.Addr().AsSlice()) + uint32(idx)*4
	return &Attachment{
		m: m, id: id, idx: idx,
		nsPath: filepath.Join(m.netnsDir, id),
		gw:     netip.AddrFrom4(be4(base + 1)),
		addr:   netip.AddrFrom4(be4(base + 2)),
		ifName: m.cfg.IfPrefix + strconv.Itoa(idx),
		names:  map[netip.Addr]string{},
		budget: m.newBudget(m.cfg.MaxDownloadBytes, 0),
	}
}

func be4(v uint32) [4]byte {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return b
}

// Close stops airlock's DNS, proxy and log reader. The sandboxes' kernel
// state (namespaces, veths, rules) stays, so that a restarted daemon can
// Recover them; when no sandbox is left, the table and the state
// directory's mount go too.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	list := make([]*Attachment, 0, len(m.sbx))
	for _, a := range m.sbx {
		list = append(list, a)
	}
	empty := len(m.sbx) == 0
	m.mu.Unlock()
	m.stopChecker()
	for _, a := range list {
		a.mu.Lock()
		a.stopListeners()
		a.mu.Unlock()
	}
	// After the listeners: nothing counts any more, so the last save is
	// the final count.
	m.stopBudgetFlusher()
	var errs error
	if empty {
		errs = errors.Join(errs, m.nft.removeBase())
		// The directory is ours (inside StateDir), whichever daemon made
		// it a mount point.
		if err := unix.Unmount(m.netnsDir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = errors.Join(errs, fmt.Errorf("unmounting %s: %w", m.netnsDir, err))
		}
	}
	m.closeHost()
	return errs
}

func (m *Manager) closeHost() {
	if m.upTransport != nil {
		m.upTransport.CloseIdleConnections()
	}
	if m.nflog != nil {
		m.nflog.close()
	}
	if m.nft != nil {
		_ = m.nft.conn.CloseLasting()
	}
	if m.host != nil {
		m.host.Close()
	}
	if m.ns != nil {
		m.ns.close()
	}
}

// Known returns the ids of every sandbox the Manager has state for,
// including those a previous daemon left that were not recovered yet. The
// daemon tears down those its store does not know.
func (m *Manager) Known() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.sbx))
	for id := range m.sbx {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// Attachment returns the network of sandbox id.
func (m *Manager) Attachment(id string) (*Attachment, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a, ok := m.sbx[id]
	return a, ok
}

// Setup makes sandbox id's network namespace and enforces p in it. The
// returned Attachment's NetNSPath is what the driver joins. On error
// nothing is left.
func (m *Manager) Setup(ctx context.Context, id string, p Policy) (*Attachment, error) {
	if !idRE.MatchString(id) {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "sandbox id %q is not usable as a network name", id)
	}
	p, err := ParsePolicy(p)
	if err != nil {
		return nil, err
	}
	c, err := compile(p, m.registries, m.blocked)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, errdefs.Wrap(errdefs.ErrUnavailable, "network manager is closed")
	}
	if _, ok := m.sbx[id]; ok {
		m.mu.Unlock()
		return nil, errdefs.Wrap(errdefs.ErrAlreadyExists, "sandbox %s already has a network", id)
	}
	idx := -1
	for i := 0; i < m.slots(); i++ {
		if !m.used[i] {
			idx = i
			break
		}
	}
	if idx < 0 {
		m.mu.Unlock()
		return nil, errdefs.Wrap(errdefs.ErrCapacityExhausted, "no free sandbox address in %s", m.cfg.Subnet)
	}
	m.used[idx] = true
	a := m.newAttachment(id, idx)
	a.policy = p
	a.budget = m.newBudget(m.downloadCap(p), 0)
	a.pol.Store(c)
	a.mu.Lock()
	defer a.mu.Unlock()
	m.sbx[id] = a
	m.mu.Unlock()

	if err := a.setup(ctx, c); err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), teardownTimeout)
		defer cancel()
		if terr := a.teardownLocked(cctx); terr != nil {
			m.log.Error("rolling back sandbox network", "sandbox_id", id, "err", terr)
		}
		return nil, err
	}
	a.touch()
	return a, nil
}

func (a *Attachment) setup(ctx context.Context, c *compiled) error {
	if err := a.writeResolvConf(); err != nil {
		return err
	}
	// The state file first: a crash after this point leaves something
	// Teardown can find.
	a.veth = c.Mode != ModeNone
	if err := a.save(); err != nil {
		return err
	}
	if err := a.m.makeNetNS(a, a.veth); err != nil {
		return err
	}
	if !a.veth {
		return nil
	}
	return a.enforce(ctx, c, true)
}

// enforce starts the sandbox's DNS and proxy if they are not running and
// writes its rules (creating its chains when create is set).
func (a *Attachment) enforce(ctx context.Context, c *compiled, create bool) error {
	if err := a.startListeners(ctx); err != nil {
		return err
	}
	if needsForwarding(c) {
		if err := a.m.enableForwarding(); err != nil {
			return err
		}
	}
	return a.m.nft.apply(a.rules(c), create)
}

func needsForwarding(c *compiled) bool { return c.Mode == ModeOpen || len(c.CIDRs) > 0 }

func (a *Attachment) rules(c *compiled) sbxRules {
	return sbxRules{ID: a.id, Index: a.idx, IfName: a.ifName, Addr: a.addr, Gateway: a.gw,
		DNSUDP: a.ports.DNSUDP, DNSTCP: a.ports.DNSTCP, Proxy: a.ports.Proxy, Mirror: a.ports.Mirror, Policy: c}
}

// startListeners opens the sandbox's resolver and proxy on its gateway.
func (a *Attachment) startListeners(ctx context.Context) (err error) {
	if a.dns != nil {
		return nil
	}
	m := a.m
	var closers []func()
	defer func() {
		if err != nil {
			for _, c := range closers {
				c()
			}
		}
	}()
	gw := a.gw.String() + ":0"
	pc, err := m.ns.listenPacket(ctx, gw)
	if err != nil {
		return fmt.Errorf("opening sandbox resolver: %w", err)
	}
	closers = append(closers, func() { pc.Close() })
	dnsLn, err := m.ns.listen(ctx, gw)
	if err != nil {
		return fmt.Errorf("opening sandbox resolver: %w", err)
	}
	closers = append(closers, func() { dnsLn.Close() })
	pln, err := m.ns.listen(ctx, gw)
	if err != nil {
		return fmt.Errorf("opening sandbox proxy: %w", err)
	}
	closers = append(closers, func() { pln.Close() })
	var mln net.Listener
	if m.mirror != nil {
		if mln, err = m.ns.listen(ctx, gw); err != nil {
			return fmt.Errorf("opening sandbox package mirror: %w", err)
		}
	}
	a.ports = ports{
		DNSUDP: uint16(pc.LocalAddr().(*net.UDPAddr).Port),
		DNSTCP: uint16(dnsLn.Addr().(*net.TCPAddr).Port),
		Proxy:  uint16(pln.Addr().(*net.TCPAddr).Port),
	}
	a.dns = newDNSServer(a, pc, dnsLn)
	a.proxy = newProxy(a, pln)
	if mln != nil {
		a.ports.Mirror = uint16(mln.Addr().(*net.TCPAddr).Port)
		a.mirror = a.startMirror(mln)
	}
	return nil
}

func (a *Attachment) stopListeners() {
	if a.dns != nil {
		a.dns.close()
		a.dns = nil
	}
	if a.proxy != nil {
		a.proxy.close()
		a.proxy = nil
	}
	if a.mirror != nil {
		a.mirror.close()
		a.mirror = nil
	}
}

// NetNSPath is the bind-mounted network namespace the sandbox must join.
func (a *Attachment) NetNSPath() string { return a.nsPath }

// Address is the sandbox's IPv4 address on its veth (present in modes
// allowlist and open).
func (a *Attachment) Address() netip.Addr { return a.addr }

// Gateway is the host side of the sandbox's veth: its default route and
// its resolver.
func (a *Attachment) Gateway() netip.Addr { return a.gw }

// ResolvConfPath is a resolv.conf naming the sandbox's resolver, for the
// driver to bind-mount read-only at /etc/resolv.conf. (DNS to any other
// server is redirected to airlock's resolver anyway; this makes the
// default one work, e.g. where a template copied the host's 127.0.0.53.)
func (a *Attachment) ResolvConfPath() string {
	return filepath.Join(a.m.sbxDir, a.id+".resolv.conf")
}

// Policy returns the policy in force.
func (a *Attachment) Policy() Policy {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.policy
}

// current is the compiled policy the DNS and proxy check against.
func (a *Attachment) current() *compiled { return a.pol.Load() }

func (a *Attachment) writeResolvConf() error {
	body := "# written by airlock: DNS goes to airlock's resolver\nnameserver " + a.gw.String() + "\noptions edns0\n"
	return writeFileAtomic(a.ResolvConfPath(), []byte(body), 0o644)
}

func (a *Attachment) save() error {
	b, err := json.Marshal(persisted{ID: a.id, Index: a.idx, Policy: a.policy, Veth: a.veth})
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(a.m.sbxDir, a.id+".json"), b, 0o600)
}

func writeFileAtomic(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// makeNetNS creates the sandbox's namespace, bind-mounts it at its path
// and, with veth, wires the veth pair, all from one thread that lives in
// the new namespace and then ends.
func (m *Manager) makeNetNS(a *Attachment, veth bool) error {
	if err := os.WriteFile(a.nsPath, nil, 0o444); err != nil {
		return fmt.Errorf("creating network namespace mount point: %w", err)
	}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with the goroutine rather than
		// go back to the pool in the sandbox's namespace.
		runtime.LockOSThread()
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("creating network namespace: %w", err)
			}
			for _, k := range []string{"net/ipv6/conf/all/disable_ipv6", "net/ipv6/conf/default/disable_ipv6"} {
				if err := writeProcSys(k, "1"); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return fmt.Errorf("disabling ipv6 in the sandbox: %w", err)
				}
			}
			local, err := netlink.NewHandle(unix.NETLINK_ROUTE)
			if err != nil {
				return fmt.Errorf("opening netlink in the sandbox: %w", err)
			}
			defer local.Close()
			lo, err := local.LinkByName("lo")
			if err == nil {
				err = local.LinkSetUp(lo)
			}
			if err != nil {
				return fmt.Errorf("bringing up loopback: %w", err)
			}
			self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
			if err := unix.Mount(self, a.nsPath, "none", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("bind-mounting network namespace: %w", err)
			}
			if !veth {
				return nil
			}
			return m.wireVeth(a, local)
		}()
	}()
	return <-errc
}

// addVeth wires a veth into an existing sandbox namespace (Update from
// mode none, or Recover of a sandbox whose veth is gone).
func (m *Manager) addVeth(a *Attachment) error {
	f, err := os.Open(a.nsPath)
	if err != nil {
		return fmt.Errorf("opening network namespace: %w", err)
	}
	defer f.Close()
	return inNetNS(int(f.Fd()), func() error {
		local, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return fmt.Errorf("opening netlink in the sandbox: %w", err)
		}
		defer local.Close()
		if old, err := local.LinkByName(sandboxIfName); err == nil {
			_ = local.LinkDel(old) // a half-made pair from a crash
		}
		return m.wireVeth(a, local)
	})
}

// wireVeth creates the pair from the host side with the peer straight in
// the namespace of the calling thread (local is a handle there), and gives
// both ends their addresses and the sandbox its default route.
func (m *Manager) wireVeth(a *Attachment, local *netlink.Handle) error {
	nsf, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		return err
	}
	defer nsf.Close()
	if old, err := m.host.LinkByName(a.ifName); err == nil {
		_ = m.host.LinkDel(old) // left by a crash; the name is ours
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU, attrs.Flags = a.ifName, m.cfg.MTU, net.FlagUp
	v := &netlink.Veth{LinkAttrs: attrs, PeerName: sandboxIfName, PeerNamespace: netlink.NsFd(nsf.Fd())}
	if err := m.host.LinkAdd(v); err != nil {
		return fmt.Errorf("creating veth: %w", err)
	}
	hostLink, err := m.host.LinkByName(a.ifName)
	if err != nil {
		return fmt.Errorf("finding veth: %w", err)
	}
	if err := m.host.AddrAdd(hostLink, &netlink.Addr{IPNet: ipnet(a.gw, 30)}); err != nil {
		return fmt.Errorf("addressing veth: %w", err)
	}
	// Forwarding on for what arrives from the sandbox, so that every packet
	// it sends elsewhere reaches the forward chain (to be logged and
	// refused at once) even while the host does not forward in general.
	if err := m.ns.writeSysctl("net/ipv4/conf/"+a.ifName+"/forwarding", "1"); err != nil {
		return fmt.Errorf("enabling forwarding from the veth: %w", err)
	}
	peer, err := local.LinkByName(sandboxIfName)
	if err != nil {
		return fmt.Errorf("finding sandbox veth: %w", err)
	}
	if err := local.AddrAdd(peer, &netlink.Addr{IPNet: ipnet(a.addr, 30)}); err != nil {
		return fmt.Errorf("addressing sandbox veth: %w", err)
	}
	if err := local.LinkSetUp(peer); err != nil {
		return fmt.Errorf("bringing up sandbox veth: %w", err)
	}
	if err := local.RouteAdd(&netlink.Route{LinkIndex: peer.Attrs().Index, Gw: a.gw.AsSlice()}); err != nil {
		return fmt.Errorf("adding sandbox default route: %w", err)
	}
	return nil
}

func ipnet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}
}

// enableForwarding turns on IPv4 forwarding in the host namespace, which
// direct egress (open mode, CIDR entries) needs: the replies arrive on the
// host's uplink and are forwarded from there. It is left on: other
// software on the host may rely on it as well.
func (m *Manager) enableForwarding() error {
	if m.forwarding.Load() {
		return nil
	}
	if err := m.ns.writeSysctl("net/ipv4/ip_forward", "1"); err != nil {
		return fmt.Errorf("enabling ip forwarding: %w", err)
	}
	m.forwarding.Store(true)
	return nil
}

// Update replaces sandbox id's policy. It takes effect at once: new
// connections are checked against it, direct flows it no longer allows
// stop passing, and proxied connections to names it no longer allows are cut.
func (m *Manager) Update(ctx context.Context, id string, p Policy) error {
	p, err := ParsePolicy(p)
	if err != nil {
		return err
	}
	c, err := compile(p, m.registries, m.blocked)
	if err != nil {
		return err
	}
	a, ok := m.Attachment(id)
	if !ok {
		return errdefs.Wrap(errdefs.ErrNotFound, "sandbox %s has no network", id)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.gone {
		return errdefs.Wrap(errdefs.ErrNotFound, "sandbox %s has no network", id)
	}
	create := false
	if !a.veth && c.Mode != ModeNone {
		// Recorded first, so that Teardown looks for the veth even if
		// wiring it fails half way.
		a.veth, create = true, true
		if err := a.save(); err != nil {
			return err
		}
		if err := m.addVeth(a); err != nil {
			return err
		}
	}
	old := a.policy
	a.policy = p
	a.pol.Store(c)
	if a.veth {
		if err := a.enforce(ctx, c, create); err != nil {
			// Keep the old policy in force where it still is.
			a.policy = old
			if oc, cerr := compile(old, m.registries, m.blocked); cerr == nil {
				a.pol.Store(oc)
			}
			return err
		}
	}
	if a.proxy != nil {
		a.proxy.recheck(c)
	}
	a.touch()
	return a.save()
}

// Recover re-adopts sandbox id after a daemon restart: its namespace must
// still be mounted (else an error wrapping errdefs.ErrNotFound). It restarts
// the sandbox's resolver and proxy and rewrites its rules for p; its
// download count goes on from the one the last daemon saved.
func (m *Manager) Recover(ctx context.Context, id string, p Policy) error {
	p, err := ParsePolicy(p)
	if err != nil {
		return err
	}
	c, err := compile(p, m.registries, m.blocked)
	if err != nil {
		return err
	}
	a, ok := m.Attachment(id)
	if !ok {
		return errdefs.Wrap(errdefs.ErrNotFound, "sandbox %s has no network state", id)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.gone || !isNetNSMount(a.nsPath) {
		return errdefs.Wrap(errdefs.ErrNotFound, "network namespace of sandbox %s is gone", id)
	}
	a.policy = p
	if a.mirror == nil && a.proxy == nil {
		// Nothing counts yet: take the cap of p, keeping what the sandbox
		// received before the restart (restored from its budget file).
		a.budget = m.newBudget(m.downloadCap(p), a.budget.Used())
	}
	a.pol.Store(c)
	if err := a.writeResolvConf(); err != nil {
		return err
	}
	if c.Mode != ModeNone || a.veth {
		if _, err := m.host.LinkByName(a.ifName); err != nil {
			if err := m.addVeth(a); err != nil {
				return err
			}
		}
		a.veth = true
		// Fresh listeners have fresh ports: rewrite the chains from scratch.
		if err := m.nft.remove(a.idx, a.ifName); err != nil {
			return err
		}
		if err := a.enforce(ctx, c, true); err != nil {
			return err
		}
	}
	a.touch()
	a.lost = false
	return a.save()
}

// Teardown removes everything of sandbox id's network: its resolver and
// proxy, rules, veth, namespace mount and state. Idempotent: an unknown id
// is nil.
func (m *Manager) Teardown(ctx context.Context, id string) error {
	a, ok := m.Attachment(id)
	if !ok {
		// Maybe a namespace whose state file was lost.
		return unmountNetNS(filepath.Join(m.netnsDir, id))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.teardownLocked(ctx)
}

func (a *Attachment) teardownLocked(ctx context.Context) error {
	m := a.m
	a.stopListeners()
	var errs error
	if a.veth {
		if err := m.nft.remove(a.idx, a.ifName); err != nil {
			errs = errors.Join(errs, err)
		}
		if l, err := m.host.LinkByName(a.ifName); err == nil {
			// Deleting one end deletes the pair.
			if err := m.host.LinkDel(l); err != nil {
				errs = errors.Join(errs, fmt.Errorf("deleting veth: %w", err))
			}
		}
	}
	if err := unmountNetNS(a.nsPath); err != nil {
		errs = errors.Join(errs, err)
	}
	for _, f := range []string{filepath.Join(m.sbxDir, a.id+".json"), a.ResolvConfPath(), a.budgetPath()} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = errors.Join(errs, err)
		}
	}
	if errs != nil {
		return fmt.Errorf("tearing down network of sandbox %s: %w", a.id, errs)
	}
	a.gone = true
	m.mu.Lock()
	if m.sbx[a.id] == a {
		delete(m.sbx, a.id)
		delete(m.used, a.idx)
	}
	m.mu.Unlock()
	return nil
}

// Counters returns the bytes sandbox id received (rx) and sent (tx) over
// its veth, proxied traffic included; zero without a veth.
func (m *Manager) Counters(id string) (rx, tx uint64, err error) {
	a, ok := m.Attachment(id)
	if !ok {
		return 0, 0, errdefs.Wrap(errdefs.ErrNotFound, "sandbox %s has no network", id)
	}
	a.mu.Lock()
	veth := a.veth
	a.mu.Unlock()
	if !veth {
		return 0, 0, nil
	}
	l, err := m.host.LinkByName(a.ifName)
	if err != nil {
		return 0, 0, fmt.Errorf("reading veth counters: %w", err)
	}
	s := l.Attrs().Statistics
	if s == nil {
		return 0, 0, nil
	}
	// The host side transmits what the sandbox receives.
	return s.TxBytes, s.RxBytes, nil
}

// emit completes ev and hands it to the audit hook.
func (m *Manager) emit(id string, ev Event) {
	if m.cfg.Audit == nil {
		return
	}
	ev.SandboxID = id
	ev.Time = m.cfg.Now()
	m.cfg.Audit(ev)
}

// onPacketLog turns a packet the filter logged into an Event.
func (m *Manager) onPacketLog(pl packetLog) {
	a, ok := m.Attachment(pl.SandboxID)
	if !ok {
		return
	}
	ev := Event{Kind: KindConnect, IP: pl.Dst.String(), Port: int(pl.DstPort), Proto: pl.Proto, Allowed: pl.Allowed, Reason: ReasonAllowed}
	ev.Domain = a.nameOf(pl.Dst)
	if !pl.Allowed {
		ev.Reason = m.denyReason(a, pl.Dst)
	}
	m.emit(a.id, ev)
}

// denyReason explains a drop by the filter from its destination.
func (m *Manager) denyReason(a *Attachment, dst netip.Addr) string {
	switch {
	case a.current().Mode == ModeNone:
		return ReasonModeNone
	case dst == a.gw || m.isHostAddr(dst):
		return ReasonHost
	case m.isSandboxAddr(dst):
		return ReasonOtherSandbox
	case insideAny(netip.PrefixFrom(dst, 32), m.blocked):
		return ReasonPrivate
	}
	return ReasonNotAllowed
}

// addrVerdict says whether a sandbox with policy pol may reach ip (on port,
// 0 for any) through airlock's DNS answers and proxy.
func (m *Manager) addrVerdict(pol *compiled, ip netip.Addr, port uint16) (bool, string) {
	if !ip.Is4() {
		return false, ReasonPrivate
	}
	if m.isSandboxAddr(ip) {
		return false, ReasonOtherSandbox
	}
	explicit := func(apiToo bool) bool {
		for _, r := range pol.CIDRs {
			if !(r.Privileged || r.Prefix.Bits() == 32) || !r.Prefix.Contains(ip) {
				continue
			}
			if r.Port != 0 && port != 0 && r.Port != port {
				continue
			}
			if r.Port == 0 && !apiToo && port != 0 && slices.Contains(m.cfg.APIPorts, port) {
				continue
			}
			return true
		}
		return false
	}
	if m.isHostAddr(ip) {
		if explicit(false) {
			return true, ReasonAllowed
		}
		return false, ReasonHost
	}
	if insideAny(netip.PrefixFrom(ip, 32), m.blocked) {
		if pol.cidrAllows(ip, port, true) {
			return true, ReasonAllowed
		}
		return false, ReasonPrivate
	}
	return true, ReasonAllowed
}

// isSandboxAddr reports whether ip is in a sandbox subnet of any daemon.
func (m *Manager) isSandboxAddr(ip netip.Addr) bool {
	if m.cfg.Subnet.Contains(ip) {
		return true
	}
	for _, r := range m.cfg.SandboxRanges {
		if r.Contains(ip) {
			return true
		}
	}
	return false
}

// HostAddrs returns the host namespace's IPv4 addresses (refreshed every
// few seconds): the daemon's own, which CIDR entries can open.
func (m *Manager) HostAddrs() []netip.Addr {
	m.hostMu.Lock()
	defer m.hostMu.Unlock()
	m.refreshHostAddrsLocked()
	return slices.Clone(m.hostAddrs)
}

// isHostAddr reports whether ip is one of the host namespace's addresses.
func (m *Manager) isHostAddr(ip netip.Addr) bool {
	m.hostMu.Lock()
	defer m.hostMu.Unlock()
	m.refreshHostAddrsLocked()
	return slices.Contains(m.hostAddrs, ip)
}

func (m *Manager) refreshHostAddrsLocked() {
	if time.Since(m.hostAt) > hostAddrsTTL {
		addrs, err := m.host.AddrList(nil, netlink.FAMILY_V4)
		if err == nil {
			m.hostAddrs = m.hostAddrs[:0]
			for _, a := range addrs {
				if x, ok := netip.AddrFromSlice(a.IP.To4()); ok {
					m.hostAddrs = append(m.hostAddrs, x)
				}
			}
			m.hostAt = time.Now()
		}
	}
}

// rememberNames records which name the sandbox resolved to which address,
// so that filter events for that address can name it.
func (a *Attachment) rememberNames(name string, addrs []netip.Addr) {
	a.namesMu.Lock()
	defer a.namesMu.Unlock()
	if len(a.names)+len(addrs) > maxNamesPerSandbox {
		clear(a.names)
	}
	for _, ip := range addrs {
		a.names[ip] = name
	}
}

func (a *Attachment) nameOf(ip netip.Addr) string {
	a.namesMu.Lock()
	defer a.namesMu.Unlock()
	return a.names[ip]
}
