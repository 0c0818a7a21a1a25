package network

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Mode is a sandbox's network mode.
type Mode string

// The modes. The zero Mode means ModeNone.
const (
	// ModeNone gives the sandbox loopback only.
	ModeNone Mode = "none"
	// ModeAllowlist lets the sandbox reach the names and CIDRs of its allow
	// list: names through airlock's DNS and egress proxy (HTTP and TLS on
	// ports 80 and 443), CIDRs directly.
	ModeAllowlist Mode = "allowlist"
	// ModeOpen lets the sandbox reach any public address; private ranges,
	// link-local, the host and airlock's API stay closed unless a CIDR entry
	// names them.
	ModeOpen Mode = "open"
)

// Limits of a policy, so that one sandbox cannot make rule sets huge.
const (
	maxAllowEntries = 256
	maxDomainLen    = 253
)

// Policy is a sandbox's egress policy as the API gives it.
type Policy struct {
	// Mode is none (the default), allowlist or open.
	Mode Mode `json:"mode,omitempty"`
	// Allow lists what may be reached: "pypi.org" (that name), "*.example.com"
	// (every name below example.com, not example.com itself), "1.2.3.4",
	// "10.0.0.0/8", and either of the last two with ":port" (TCP and UDP).
	// Names only apply in allowlist mode; CIDRs apply in allowlist and open
	// mode, and they are the only way to open private ranges, link-local
	// addresses or the host's addresses.
	Allow []string `json:"allow,omitempty"`
	// Registries names package registry sets ("debian", "pypi", "npm",
	// "goproxy") whose hosts are added to the allow list (allowlist mode).
	Registries []string `json:"registries,omitempty"`
	// Offline denies every package registry's hosts, even in open mode, so
	// that an install fails at once (NXDOMAIN) instead of timing out.
	Offline bool `json:"offline,omitempty"`
	// MaxDownloadMB, when positive, is the sandbox's own download cap
	// (MiB through the package mirror and the egress proxy): it may lower
	// the server's (Config.MaxDownloadBytes), or set one where the server
	// has none, never raise it. Fixed when the network is set up.
	MaxDownloadMB int64 `json:"max_download_mb,omitempty"`
}

// KnownRegistries are the registry set names a Policy may name.
var KnownRegistries = []string{"debian", "goproxy", "npm", "pypi"}

// cidrRule is one CIDR entry of a policy.
type cidrRule struct {
	Prefix netip.Prefix
	Port   uint16 // 0: every port
	// Privileged is true when the prefix lies inside a blocked range: only
	// such an entry (one that names the range explicitly) opens it.
	Privileged bool
}

// compiled is a validated Policy in the form the enforcement points use.
type compiled struct {
	Mode      Mode
	Exact     map[string]bool // names allowed exactly
	Wildcards []string        // suffixes ".example.com" allowed below
	CIDRs     []cidrRule
	// Denied names are refused even when otherwise allowed (offline registries).
	Denied    map[string]bool
	DeniedWcs []string
	// Registries are the sets the policy names, Offline its offline flag
	// (the package mirror serves those sets unless offline).
	Registries []string
	Offline    bool
}

// ParsePolicy validates p and returns it normalized: the mode defaulted,
// entries lowercased, deduplicated and sorted. Errors wrap
// errdefs.ErrInvalidArgument and say which entry is wrong.
func ParsePolicy(p Policy) (Policy, error) {
	out := Policy{Mode: p.Mode, Offline: p.Offline, MaxDownloadMB: p.MaxDownloadMB}
	if p.MaxDownloadMB < 0 {
		return Policy{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "max_download_mb must not be negative")
	}
	if out.Mode == "" {
		out.Mode = ModeNone
	}
	switch out.Mode {
	case ModeNone, ModeAllowlist, ModeOpen:
	default:
		return Policy{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "network mode %q is not one of none, allowlist, open", p.Mode)
	}
	if len(p.Allow) > maxAllowEntries {
		return Policy{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "network allow list has %d entries, at most %d", len(p.Allow), maxAllowEntries)
	}
	seen := map[string]bool{}
	for _, raw := range p.Allow {
		e, isName, err := parseEntry(raw)
		if err != nil {
			return Policy{}, err
		}
		if out.Mode == ModeNone {
			return Policy{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "network allow entries need mode allowlist or open")
		}
		if isName && out.Mode == ModeOpen {
			return Policy{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "allow entry %q: names have no effect in open mode; use CIDR entries", raw)
		}
		if !seen[e] {
			seen[e] = true
			out.Allow = append(out.Allow, e)
		}
	}
	slices.Sort(out.Allow)
	seenReg := map[string]bool{}
	for _, r := range p.Registries {
		r = strings.ToLower(strings.TrimSpace(r))
		if !slices.Contains(KnownRegistries, r) {
			return Policy{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "registry %q is not one of %s", r, strings.Join(KnownRegistries, ", "))
		}
		if out.Mode != ModeAllowlist {
			return Policy{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "registries need mode allowlist")
		}
		if p.Offline {
			return Policy{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "registries cannot be allowed in offline mode")
		}
		if !seenReg[r] {
			seenReg[r] = true
			out.Registries = append(out.Registries, r)
		}
	}
	slices.Sort(out.Registries)
	return out, nil
}

// parseEntry validates one allow entry and returns its canonical form and
// whether it is a name (as opposed to an address or CIDR).
func parseEntry(raw string) (canon string, isName bool, err error) {
	s := strings.ToLower(strings.TrimSpace(raw))
	bad := func(why string) (string, bool, error) {
		return "", false, errdefs.Wrap(errdefs.ErrInvalidArgument, "allow entry %q: %s", raw, why)
	}
	if s == "" {
		return bad("empty")
	}
	if strings.ContainsAny(s, "[]") || strings.Count(s, ":") > 1 {
		return bad("ipv6 is not supported (sandboxes have ipv4 only)")
	}
	host, port := s, uint16(0)
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		host = s[:i]
		n, err := strconv.ParseUint(s[i+1:], 10, 16)
		if err != nil || n == 0 {
			return bad("port must be 1-65535")
		}
		port = uint16(n)
	}
	if c, ok, err := parseCIDR(host); ok {
		if err != nil {
			return bad(err.Error())
		}
		if port != 0 {
			return c.String() + ":" + strconv.Itoa(int(port)), false, nil
		}
		return c.String(), false, nil
	}
	if port != 0 {
		return bad("ports are only supported on addresses and CIDRs; names cover ports 80 and 443")
	}
	name := strings.TrimSuffix(host, ".")
	wild := strings.HasPrefix(name, "*.")
	if wild {
		name = name[2:]
		if !strings.Contains(name, ".") {
			return bad("a wildcard must name at least a second-level domain, like *.example.com")
		}
	}
	if err := validName(name); err != nil {
		return bad(err.Error())
	}
	if wild {
		return "*." + name, true, nil
	}
	return name, true, nil
}

// parseCIDR parses an IPv4 address or CIDR. ok is false when s does not
// look like one (then it may be a name).
func parseCIDR(s string) (p netip.Prefix, ok bool, err error) {
	if s == "" || !(s[0] >= '0' && s[0] <= '9') {
		return netip.Prefix{}, false, nil
	}
	addrPart, bitsPart, hasBits := strings.Cut(s, "/")
	a, aerr := netip.ParseAddr(addrPart)
	if aerr != nil {
		// "1password.com" starts with a digit but is a name.
		if !hasBits && strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' }) >= 0 {
			return netip.Prefix{}, false, nil
		}
		return netip.Prefix{}, true, fmt.Errorf("not an ipv4 address")
	}
	if !a.Is4() {
		return netip.Prefix{}, true, fmt.Errorf("ipv6 is not supported (sandboxes have ipv4 only)")
	}
	if !hasBits {
		return netip.PrefixFrom(a, 32), true, nil
	}
	bits, berr := strconv.Atoi(bitsPart)
	if berr != nil || bits < 0 || bits > 32 {
		return netip.Prefix{}, true, fmt.Errorf("prefix length must be 0-32")
	}
	pfx := netip.PrefixFrom(a, bits)
	if pfx.Masked() != pfx {
		return netip.Prefix{}, true, fmt.Errorf("host bits are set; did you mean %s", pfx.Masked())
	}
	return pfx, true, nil
}

// validName checks a DNS name (lowercase, without a trailing dot).
func validName(name string) error {
	if len(name) > maxDomainLen {
		return fmt.Errorf("name longer than %d characters", maxDomainLen)
	}
	labels := strings.Split(name, ".")
	if len(labels) < 2 {
		return fmt.Errorf("not a fully qualified name")
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return fmt.Errorf("labels must be 1-63 characters")
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("labels cannot start or end with a hyphen")
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("invalid character %q", c)
			}
		}
	}
	if tld := labels[len(labels)-1]; tld[0] >= '0' && tld[0] <= '9' {
		return fmt.Errorf("not an ipv4 address or a name")
	}
	return nil
}

// compile turns a normalized policy into matchers; registries maps a
// registry name to its host patterns.
func compile(p Policy, registries map[string][]string, blocked []netip.Prefix) (*compiled, error) {
	c := &compiled{Mode: p.Mode, Exact: map[string]bool{}, Denied: map[string]bool{}, Registries: p.Registries, Offline: p.Offline}
	addName := func(n string, exact map[string]bool, wcs *[]string) {
		if rest, ok := strings.CutPrefix(n, "*."); ok {
			*wcs = append(*wcs, "."+rest)
		} else {
			exact[n] = true
		}
	}
	for _, e := range p.Allow {
		canon, isName, err := parseEntry(e)
		if err != nil {
			return nil, err
		}
		if isName {
			addName(canon, c.Exact, &c.Wildcards)
			continue
		}
		host, port := canon, uint16(0)
		if i := strings.LastIndexByte(canon, ':'); i >= 0 {
			host = canon[:i]
			n, _ := strconv.ParseUint(canon[i+1:], 10, 16)
			port = uint16(n)
		}
		pfx, _, _ := parseCIDR(host)
		c.CIDRs = append(c.CIDRs, cidrRule{Prefix: pfx, Port: port, Privileged: insideAny(pfx, blocked)})
	}
	for _, r := range p.Registries {
		hosts := registries[r]
		if len(hosts) == 0 {
			return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "registry %q has no hosts configured on this server", r)
		}
		for _, h := range hosts {
			addName(h, c.Exact, &c.Wildcards)
		}
	}
	if p.Offline {
		for _, hosts := range registries {
			for _, h := range hosts {
				addName(h, c.Denied, &c.DeniedWcs)
			}
		}
	}
	return c, nil
}

// LinkLocal is 169.254.0.0/16: the cloud metadata services
// (169.254.169.254, 169.254.170.2) and the host's link-local neighbours.
var LinkLocal = netip.MustParsePrefix("169.254.0.0/16")

// MetadataAddrs are cloud metadata services outside LinkLocal
// (Alibaba Cloud's).
var MetadataAddrs = []netip.Addr{netip.MustParseAddr("100.100.100.200")}

// SensitiveEntry returns the first CIDR entry of p (as given: p need not
// be normalised) that opens link-local
// addresses (cloud metadata), another cloud metadata address or one of
// hostAddrs (the daemon's own host: its API and preview ports), and why;
// "" when there is none. Only entries that can open such an address count
// (see docs/network.md): one inside a blocked range, or naming one host
// address; 0.0.0.0/0 opens none of them. The manager refuses them unless
// an admin key asks.
func SensitiveEntry(p Policy, hostAddrs []netip.Addr) (entry, why string) {
	for _, e := range p.Allow {
		canon, isName, err := parseEntry(e)
		if err != nil || isName {
			continue
		}
		host := canon
		if i := strings.LastIndexByte(canon, ':'); i >= 0 {
			host = canon[:i]
		}
		pfx, _, _ := parseCIDR(host)
		privileged := insideAny(pfx, BlockedRanges)
		if LinkLocal.Bits() <= pfx.Bits() && LinkLocal.Contains(pfx.Addr()) {
			return e, "link-local addresses (169.254.0.0/16, cloud metadata)"
		}
		for _, a := range MetadataAddrs {
			if privileged && pfx.Contains(a) {
				return e, "the cloud metadata address " + a.String()
			}
		}
		for _, a := range hostAddrs {
			if pfx.Contains(a) && (privileged || pfx.Bits() == 32) {
				return e, "the host's own address " + a.String()
			}
		}
	}
	return "", ""
}

// insideAny reports whether p lies entirely inside one of the ranges.
func insideAny(p netip.Prefix, ranges []netip.Prefix) bool {
	for _, r := range ranges {
		if r.Bits() <= p.Bits() && r.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// matchName reports whether name (lowercase, no trailing dot) is in the
// exact set or below one of the wildcard suffixes.
func matchName(name string, exact map[string]bool, wcs []string) bool {
	if exact[name] {
		return true
	}
	for _, w := range wcs {
		if strings.HasSuffix(name, w) {
			return true
		}
	}
	return false
}

// nameVerdict says whether name may be resolved and proxied, and if not why.
func (c *compiled) nameVerdict(name string) (bool, string) {
	if matchName(name, c.Denied, c.DeniedWcs) {
		return false, ReasonOffline
	}
	switch c.Mode {
	case ModeOpen:
		return true, ReasonAllowed
	case ModeAllowlist:
		if matchName(name, c.Exact, c.Wildcards) {
			return true, ReasonAllowed
		}
		return false, ReasonNotAllowed
	}
	return false, ReasonNotAllowed
}

// cidrAllows reports whether a CIDR entry allows a to port (0: any port
// check skipped). privilegedOnly restricts the check to entries that name a
// blocked range explicitly.
func (c *compiled) cidrAllows(a netip.Addr, port uint16, privilegedOnly bool) bool {
	for _, r := range c.CIDRs {
		if privilegedOnly && !r.Privileged {
			continue
		}
		if r.Prefix.Contains(a) && (r.Port == 0 || r.Port == port) {
			return true
		}
	}
	return false
}

// normalizeName lowercases a DNS name and strips its trailing dot.
func normalizeName(n string) string {
	return strings.TrimSuffix(strings.ToLower(n), ".")
}
