package network

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The packet filter is one nftables table (family inet) shared by every
// sandbox: three base chains dispatch on the input interface through
// verdict maps (O(1) per packet however many sandboxes run) to five
// regular chains per sandbox, which Update rewrites in one atomic batch.
//
//	prerouting (nat)  iifname vmap @pre_map  → pre_N: DNS and (allowlist) HTTP/TLS redirected to airlock
//	forward (filter)  iifname vmap @fwd_map  → fwd_N: CIDR entries, blocked ranges, mode
//	input (filter)    iifname vmap @in_map   → in_N: airlock's DNS and proxy ports only
//	postrouting (nat) masquerade what leaves the sandbox subnet
//	allow_N: log new connections (rate limited) and accept
//	deny_N:  log (rate limited) and reject, so a client fails at once
const (
	mapPre = "pre_map"
	mapFwd = "fwd_map"
	mapIn  = "in_map"
)

// Log rate limits per sandbox: enough for an audit trail of real attempts,
// while a sandbox that floods cannot flood the daemon with log messages.
const (
	logAllowRate  = 50
	logAllowBurst = 100
	logDenyRate   = 20
	logDenyBurst  = 40
)

// Log prefixes: "airlock <verdict> <sandbox id>" (see nflog.go).
const (
	logPrefix = "airlock "
	logAllow  = "a"
	logDeny   = "d"
)

// sbxRules is everything the per-sandbox chains depend on.
type sbxRules struct {
	ID      string
	Index   int
	IfName  string
	Addr    netip.Addr // the sandbox's address
	Gateway netip.Addr // the host side of its veth
	DNSUDP  uint16
	DNSTCP  uint16
	Proxy   uint16
	Mirror  uint16 // the package mirror's port on the gateway, 0 for none
	Policy  *compiled
}

type nftRules struct {
	mu     sync.Mutex // a Conn buffers one batch at a time
	conn   *nftables.Conn
	table  *nftables.Table
	subnet netip.Prefix
	// sandboxes are every daemon's sandbox subnets (Config.SandboxRanges).
	sandboxes []netip.Prefix
	ifPrefix  string
	group     uint16
	apiPorts  []uint16
	blocked   []netip.Prefix
	// baseRules is how many rules ensureBase wrote into each base chain,
	// so that inspect notices a flushed one.
	baseRules map[string]int
}

func (n *nftRules) maps() (pre, fwd, in *nftables.Set) {
	mk := func(name string) *nftables.Set {
		return &nftables.Set{Table: n.table, Name: name, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict}
	}
	return mk(mapPre), mk(mapFwd), mk(mapIn)
}

func (n *nftRules) chain(name string) *nftables.Chain {
	return &nftables.Chain{Name: name, Table: n.table}
}

// ensureBase creates the table, its maps and base chains if missing and
// (re)writes the base chains' rules. Per-sandbox chains are left alone, so
// a restarted daemon keeps enforcing while it recovers them.
func (n *nftRules) ensureBase() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := n.conn
	c.AddTable(n.table)
	pre, fwd, in := n.maps()
	for _, s := range []*nftables.Set{pre, fwd, in} {
		if err := c.AddSet(s, nil); err != nil {
			return err
		}
	}
	accept := nftables.ChainPolicyAccept
	prerouting := c.AddChain(&nftables.Chain{Name: "prerouting", Table: n.table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
	postrouting := c.AddChain(&nftables.Chain{Name: "postrouting", Table: n.table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	forward := c.AddChain(&nftables.Chain{Name: "forward", Table: n.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	input := c.AddChain(&nftables.Chain{Name: "input", Table: n.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	for _, ch := range []*nftables.Chain{prerouting, postrouting, forward, input} {
		c.FlushChain(ch)
	}
	sandboxIf := n.ifPrefix
	counts := map[string]int{}
	addRule := func(r *nftables.Rule) {
		counts[r.Chain.Name]++
		c.AddRule(r)
	}
	// Dispatch to the sandbox's chains; an interface of ours without an
	// entry (being set up or torn down) falls through to the drops below.
	addRule(&nftables.Rule{Table: n.table, Chain: prerouting, Exprs: vmapLookup(expr.MetaKeyIIFNAME, pre)})
	addRule(&nftables.Rule{Table: n.table, Chain: forward, Exprs: vmapLookup(expr.MetaKeyIIFNAME, fwd)})
	addRule(&nftables.Rule{Table: n.table, Chain: forward, Exprs: cat(ifname(expr.MetaKeyIIFNAME, sandboxIf, true, true), verdict(expr.VerdictDrop))})
	// Into a sandbox: only replies to what it started.
	addRule(&nftables.Rule{Table: n.table, Chain: forward, Exprs: cat(ifname(expr.MetaKeyOIFNAME, sandboxIf, true, true),
		ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), verdict(expr.VerdictAccept))})
	addRule(&nftables.Rule{Table: n.table, Chain: forward, Exprs: cat(ifname(expr.MetaKeyOIFNAME, sandboxIf, true, true), verdict(expr.VerdictDrop))})
	addRule(&nftables.Rule{Table: n.table, Chain: input, Exprs: vmapLookup(expr.MetaKeyIIFNAME, in)})
	addRule(&nftables.Rule{Table: n.table, Chain: input, Exprs: cat(ifname(expr.MetaKeyIIFNAME, sandboxIf, true, true), verdict(expr.VerdictDrop))})
	// The gateways and airlock's listeners on them serve sandboxes only,
	// never another interface of the host.
	addRule(&nftables.Rule{Table: n.table, Chain: input, Exprs: cat(ipv4(), daddrIn(n.subnet),
		ifname(expr.MetaKeyIIFNAME, "lo", false, false), verdict(expr.VerdictDrop))})
	// Traffic allowed out (open mode, CIDR entries) leaves with the host's address.
	addRule(&nftables.Rule{Table: n.table, Chain: postrouting, Exprs: cat(ipv4(), saddrIn(n.subnet),
		ifname(expr.MetaKeyOIFNAME, sandboxIf, false, true), []expr.Any{&expr.Masq{}})})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("writing base nftables rules: %w", err)
	}
	n.baseRules = counts
	return nil
}

// removeBase deletes the whole table.
func (n *nftRules) removeBase() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, err := n.conn.ListTableOfFamily(n.table.Name, n.table.Family); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("listing nftables table: %w", err)
	}
	n.conn.DelTable(n.table)
	if err := n.conn.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("deleting nftables table: %w", err)
	}
	return nil
}

func chainNames(idx int) (pre, fwd, in, allow, deny string) {
	s := strconv.Itoa(idx)
	return "pre_" + s, "fwd_" + s, "in_" + s, "allow_" + s, "deny_" + s
}

// apply writes a sandbox's chains in one atomic batch: created (with their
// map entries) when create is set, else flushed and refilled.
func (n *nftRules) apply(r sbxRules, create bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := n.conn
	preN, fwdN, inN, allowN, denyN := chainNames(r.Index)
	pre, fwd, in, allow, deny := n.chain(preN), n.chain(fwdN), n.chain(inN), n.chain(allowN), n.chain(denyN)
	all := []*nftables.Chain{pre, fwd, in, allow, deny}
	for _, ch := range all {
		if create {
			c.AddChain(ch)
		} else {
			c.FlushChain(ch)
		}
	}
	add := func(ch *nftables.Chain, exprs ...[]expr.Any) {
		c.AddRule(&nftables.Rule{Table: n.table, Chain: ch, Exprs: cat(exprs...)})
	}
	p := r.Policy
	toAllow, toDeny := jump(expr.VerdictGoto, allowN), jump(expr.VerdictGoto, denyN)

	// allow_N and deny_N.
	prefix := func(v string) string { return logPrefix + v + " " + r.ID }
	add(allow, ctState(expr.CtStateBitNEW), limit(logAllowRate, logAllowBurst), nflog(n.group, prefix(logAllow)))
	add(allow, verdict(expr.VerdictAccept))
	add(deny, limit(logDenyRate, logDenyBurst), nflog(n.group, prefix(logDeny)))
	add(deny, l4(unix.IPPROTO_TCP), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST, Code: unix.NFT_REJECT_TCP_RST}})
	add(deny, []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}})

	// Common head of the filter chains: ipv4 from the sandbox's own address only.
	for _, ch := range []*nftables.Chain{fwd, in} {
		add(ch, notIPv4(), verdict(expr.VerdictDrop))
		add(ch, saddrNot(r.Addr), verdict(expr.VerdictDrop))
	}
	if p.Mode == ModeNone {
		add(fwd, toDeny)
		add(in, toDeny)
		return n.flush(create, r)
	}

	// pre_N: every DNS query goes to airlock's resolver, whatever server the
	// sandbox asked; in allowlist mode HTTP and TLS go to the egress proxy
	// unless a CIDR entry lets them out directly.
	add(pre, ipv4(), l4(unix.IPPROTO_UDP), dport(53), redirect(r.DNSUDP))
	add(pre, ipv4(), l4(unix.IPPROTO_TCP), dport(53), redirect(r.DNSTCP))
	if p.Mode == ModeAllowlist && r.Mirror != 0 {
		// http://packages.airlock.internal/ (the gateway, port 80) is
		// the package mirror.
		add(pre, ipv4(), daddrIn(netip.PrefixFrom(r.Gateway, 32)), l4(unix.IPPROTO_TCP), dport(80), redirect(r.Mirror))
	}
	if p.Mode == ModeAllowlist {
		for _, cr := range p.CIDRs {
			for _, m := range cidrMatch(cr) {
				add(pre, ipv4(), m, verdict(expr.VerdictReturn))
			}
		}
		add(pre, ipv4(), l4(unix.IPPROTO_TCP), dport(80), redirect(r.Proxy))
		add(pre, ipv4(), l4(unix.IPPROTO_TCP), dport(443), redirect(r.Proxy))
	}

	// in_N: the host. airlock's own listeners, then only what a CIDR entry
	// names explicitly (a blocked range or one address), never the other
	// gateways and, without an explicit port, never the API ports.
	add(in, daddrIn(netip.PrefixFrom(r.Gateway, 32)), l4(unix.IPPROTO_UDP), dport(r.DNSUDP), verdict(expr.VerdictAccept))
	add(in, daddrIn(netip.PrefixFrom(r.Gateway, 32)), l4(unix.IPPROTO_TCP), dport(r.DNSTCP), verdict(expr.VerdictAccept))
	if p.Mode == ModeAllowlist {
		add(in, daddrIn(netip.PrefixFrom(r.Gateway, 32)), l4(unix.IPPROTO_TCP), dport(r.Proxy), verdict(expr.VerdictAccept))
		if r.Mirror != 0 {
			add(in, daddrIn(netip.PrefixFrom(r.Gateway, 32)), l4(unix.IPPROTO_TCP), dport(r.Mirror), verdict(expr.VerdictAccept))
		}
	}
	for _, r := range n.sandboxes {
		add(in, daddrIn(r), toDeny)
	}
	hostEligible := func(cr cidrRule) bool { return cr.Privileged || cr.Prefix.Bits() == 32 }
	for _, cr := range p.CIDRs {
		if hostEligible(cr) && cr.Port != 0 {
			for _, m := range cidrMatch(cr) {
				add(in, m, toAllow)
			}
		}
	}
	for _, port := range n.apiPorts {
		add(in, l4(unix.IPPROTO_TCP), dport(port), toDeny)
	}
	for _, cr := range p.CIDRs {
		if hostEligible(cr) && cr.Port == 0 {
			for _, m := range cidrMatch(cr) {
				add(in, m, toAllow)
			}
		}
	}
	add(in, toDeny)

	// fwd_N: elsewhere. Other sandboxes never; blocked ranges only through
	// an entry inside them; then the other entries, then the mode.
	for _, r := range n.sandboxes {
		add(fwd, daddrIn(r), toDeny)
	}
	for _, cr := range p.CIDRs {
		if cr.Privileged {
			for _, m := range cidrMatch(cr) {
				add(fwd, m, toAllow)
			}
		}
	}
	for _, b := range n.blocked {
		add(fwd, daddrIn(b), toDeny)
	}
	for _, cr := range p.CIDRs {
		if !cr.Privileged {
			for _, m := range cidrMatch(cr) {
				add(fwd, m, toAllow)
			}
		}
	}
	if p.Mode == ModeOpen {
		add(fwd, toAllow)
	} else {
		add(fwd, toDeny)
	}
	return n.flush(create, r)
}

// flush adds the map entries of a new sandbox and sends the batch.
func (n *nftRules) flush(create bool, r sbxRules) error {
	c := n.conn
	if create {
		preN, fwdN, inN, _, _ := chainNames(r.Index)
		pre, fwd, in := n.maps()
		key := ifKey(r.IfName)
		for _, x := range []struct {
			set   *nftables.Set
			chain string
		}{{pre, preN}, {fwd, fwdN}, {in, inN}} {
			if err := c.SetAddElements(x.set, []nftables.SetElement{{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: x.chain}}}); err != nil {
				return err
			}
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("writing nftables rules: %w", err)
	}
	return nil
}

// remove deletes a sandbox's map entries and chains. Missing ones are fine.
func (n *nftRules) remove(idx int, ifName string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := n.conn
	batch := func(ops ...func()) error {
		for _, op := range ops {
			op()
		}
		return c.Flush()
	}
	pre, fwd, in := n.maps()
	key := []nftables.SetElement{{Key: ifKey(ifName)}}
	var ops []func()
	for _, s := range []*nftables.Set{pre, fwd, in} {
		ops = append(ops, func() { _ = c.SetDeleteElements(s, key) })
	}
	names := []string{}
	a, b, d, e, f := chainNames(idx)
	names = append(names, a, b, d, e, f)
	for _, name := range names {
		ops = append(ops, func() { c.FlushChain(n.chain(name)) })
	}
	for _, name := range names {
		ops = append(ops, func() { c.DelChain(n.chain(name)) })
	}
	if err := batch(ops...); err == nil {
		return nil
	}
	// Something was already gone (a torn-down or half set up sandbox): do
	// each step alone and ignore what is missing.
	var errs error
	for _, op := range ops {
		if err := batch(op); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = errors.Join(errs, err)
		}
	}
	if errs != nil {
		return fmt.Errorf("removing nftables rules: %w", errs)
	}
	return nil
}

// chainsOf lists the per-sandbox chain names present in the table (for
// tests and orphan checks).
func (n *nftRules) chainsOf() ([]string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	chains, err := n.conn.ListChainsOfTableFamily(n.table.Family)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, ch := range chains {
		if ch.Table.Name == n.table.Name && ch.Hooknum == nil {
			out = append(out, ch.Name)
		}
	}
	return out, nil
}

// nftState is what inspect found of the table.
type nftState struct {
	// base: the table, its maps and base chains with all their rules.
	base bool
	// chains are the per-sandbox chains present.
	chains map[string]bool
	// entries are the interface names with an entry in all three maps.
	entries map[string]bool
}

// inspect reads the table back from the kernel: a few dumps, whatever
// the number of sandboxes.
func (n *nftRules) inspect() (nftState, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := nftState{chains: map[string]bool{}, entries: map[string]bool{}}
	c := n.conn
	if _, err := c.ListTableOfFamily(n.table.Name, n.table.Family); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return st, nil
		}
		return st, fmt.Errorf("listing nftables table: %w", err)
	}
	chains, err := c.ListChainsOfTableFamily(n.table.Family)
	if err != nil {
		return st, fmt.Errorf("listing nftables chains: %w", err)
	}
	st.base = true
	base := map[string]*nftables.Chain{}
	for _, ch := range chains {
		if ch.Table.Name != n.table.Name {
			continue
		}
		if ch.Hooknum != nil {
			base[ch.Name] = ch
		} else {
			st.chains[ch.Name] = true
		}
	}
	for name, want := range n.baseRules {
		ch, ok := base[name]
		if !ok {
			st.base = false
			continue
		}
		rules, err := c.GetRules(n.table, ch)
		if err != nil {
			return st, fmt.Errorf("listing nftables rules: %w", err)
		}
		if len(rules) != want {
			st.base = false
		}
	}
	count := map[string]int{}
	pre, fwd, in := n.maps()
	for _, m := range []*nftables.Set{pre, fwd, in} {
		set, err := c.GetSetByName(n.table, m.Name)
		if err != nil {
			st.base = false
			continue
		}
		els, err := c.GetSetElements(set)
		if err != nil {
			return st, fmt.Errorf("listing nftables map %s: %w", m.Name, err)
		}
		for _, e := range els {
			count[string(bytes.TrimRight(e.Key, "\x00"))]++
		}
	}
	for name, k := range count {
		if k == 3 {
			st.entries[name] = true
		}
	}
	return st, nil
}

// has reports whether sandbox idx's chains and map entries are all there.
func (st nftState) has(idx int, ifName string) bool {
	a, b, c, d, e := chainNames(idx)
	for _, name := range []string{a, b, c, d, e} {
		if !st.chains[name] {
			return false
		}
	}
	return st.entries[ifName]
}

// Expression helpers. Register 1 is the scratch register throughout.

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

func jump(k expr.VerdictKind, chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: k, Chain: chain}}
}

func ipv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

func notIPv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

// addrIn matches the IPv4 address at offset (12 source, 16 destination) against p.
func addrIn(offset uint32, p netip.Prefix, eq bool) []expr.Any {
	a := p.Addr().As4()
	mask := binary.BigEndian.AppendUint32(nil, ^uint32(0)<<(32-p.Bits()))
	if p.Bits() == 0 {
		mask = []byte{0, 0, 0, 0}
	}
	op := expr.CmpOpEq
	if !eq {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: op, Register: 1, Data: a[:]},
	}
}

func daddrIn(p netip.Prefix) []expr.Any { return addrIn(16, p, true) }
func saddrIn(p netip.Prefix) []expr.Any { return addrIn(12, p, true) }
func saddrNot(a netip.Addr) []expr.Any  { return addrIn(12, netip.PrefixFrom(a, 32), false) }

func l4(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

func dport(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(p)},
	}
}

// cidrMatch is the match of a CIDR entry: one rule's worth, or two (TCP
// and UDP) when it has a port.
func cidrMatch(cr cidrRule) [][]expr.Any {
	if cr.Port == 0 {
		return [][]expr.Any{daddrIn(cr.Prefix)}
	}
	return [][]expr.Any{
		cat(daddrIn(cr.Prefix), l4(unix.IPPROTO_TCP), dport(cr.Port)),
		cat(daddrIn(cr.Prefix), l4(unix.IPPROTO_UDP), dport(cr.Port)),
	}
}

// ifname matches an interface name: exactly (NUL-padded, so "lo" does not
// match "lo0"), or as a prefix (the kernel compares len(data) bytes).
func ifname(key expr.MetaKey, name string, eq, isPrefix bool) []expr.Any {
	data := ifKey(name)
	if isPrefix {
		data = []byte(name)
	}
	op := expr.CmpOpEq
	if !eq {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: data},
	}
}

// ifKey is an interface name as the kernel stores it: NUL-padded to IFNAMSIZ.
func ifKey(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

func ctState(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
	}
}

func limit(rate uint64, burst uint32) []expr.Any {
	return []expr.Any{&expr.Limit{Type: expr.LimitTypePkts, Rate: rate, Unit: expr.LimitTimeSecond, Burst: burst}}
}

func nflog(group uint16, prefix string) []expr.Any {
	return []expr.Any{&expr.Log{
		Key:   1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX,
		Group: group, Data: []byte(prefix),
	}}
}

func redirect(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED},
	}
}

func vmapLookup(key expr.MetaKey, m *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: m.Name, SetID: m.ID, DestRegister: 0, IsDestRegSet: true},
	}
}
