package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
)

// A sandbox's network can be broken from outside while the sandbox runs:
// another program deletes its veth, flushes the ruleset (a firewall
// reload) or deletes airlock's table. Nothing in the sandbox can do it (its
// namespace belongs to the host's user namespace). Check finds it and wires
// the sandbox again from the state the Manager holds, so that a sandbox is
// never silently left without the network (or the filtering) its policy
// says; what it cannot repair it reports lost.

// Check compares every set-up sandbox network with the kernel: the
// namespace mount, the host side of the veth (present, up, addressed), the
// sandbox's chains and map entries, and the table with its base chains. A
// broken one is repaired (veth wired again, chains rewritten) and reported
// to Config.OnRepair; one it cannot repair (its namespace is gone, or the
// repair failed) to Config.OnLost. It runs every Config.CheckInterval, and
// tests call it directly.
func (m *Manager) Check(ctx context.Context) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	// Only sandboxes whose kernel state was written before this pass
	// looked at the kernel are judged by what it saw.
	gen := m.gen.Load()
	list := make([]*Attachment, 0, len(m.sbx))
	for _, a := range m.sbx {
		list = append(list, a)
	}
	m.mu.Unlock()

	st, err := m.nft.inspect()
	if err != nil {
		m.log.Warn("checking sandbox networks: reading nftables", "err", err)
		return
	}
	links, err := m.host.LinkList()
	if err != nil {
		m.log.Warn("checking sandbox networks: listing links", "err", err)
		return
	}
	byName := map[string]netlink.Link{}
	for _, l := range links {
		byName[l.Attrs().Name] = l
	}
	addrs, err := m.host.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		m.log.Warn("checking sandbox networks: listing addresses", "err", err)
		return
	}
	addrOf := map[int][]net.IP{}
	for _, a := range addrs {
		addrOf[a.LinkIndex] = append(addrOf[a.LinkIndex], a.IP)
	}

	baseFixed := false
	if !st.base {
		m.log.Warn("nftables table of the sandbox networks was changed from outside; writing it again", "table", m.cfg.Table)
		if err := m.nft.ensureBase(); err != nil {
			m.log.Error("writing the sandbox networks' nftables table again", "err", err)
		} else {
			baseFixed = true
		}
	}
	if m.forwarding.Load() {
		if v, err := m.ns.readSysctl("net/ipv4/ip_forward"); err == nil && v != "1" {
			m.log.Warn("ip forwarding was turned off from outside; turning it on again")
			if err := m.ns.writeSysctl("net/ipv4/ip_forward", "1"); err != nil {
				m.log.Error("enabling ip forwarding", "err", err)
			}
		}
	}

	type report struct {
		id, what string
		lost     error
	}
	var reports []report
	for _, a := range list {
		what, lost := a.check(ctx, gen, st, byName, addrOf, baseFixed)
		if what != "" || lost != nil {
			reports = append(reports, report{a.id, what, lost})
		}
	}
	for _, r := range reports {
		if r.lost != nil {
			m.log.Error("sandbox network lost", "sandbox_id", r.id, "err", r.lost)
			if m.cfg.OnLost != nil {
				m.cfg.OnLost(r.id, r.lost)
			}
			continue
		}
		m.log.Warn("sandbox network repaired", "sandbox_id", r.id, "what", r.what)
		if m.cfg.OnRepair != nil {
			m.cfg.OnRepair(r.id, r.what)
		}
	}
}

// check judges one sandbox against the kernel state st and repairs it:
// what was repaired, or why it is lost.
func (a *Attachment) check(ctx context.Context, gen uint64, st nftState, links map[string]netlink.Link, addrs map[int][]net.IP, baseFixed bool) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.gone || a.lost || a.activeGen == 0 || a.activeGen > gen {
		return "", nil
	}
	if !isNetNSMount(a.nsPath) {
		a.lost = true
		return "", errors.New("its network namespace is no longer mounted")
	}
	if !a.veth {
		return "", nil
	}
	var broken []string
	vethBad := false
	if l, ok := links[a.ifName]; !ok {
		broken, vethBad = append(broken, "veth "+a.ifName+" missing"), true
	} else if l.Type() != "veth" || l.Attrs().Flags&net.FlagUp == 0 || !hasIP(addrs[l.Attrs().Index], a.gw) {
		broken, vethBad = append(broken, "veth "+a.ifName+" down or without its address"), true
	}
	chainsBad := baseFixed || !st.has(a.idx, a.ifName)
	if chainsBad {
		broken = append(broken, "nftables rules missing")
	}
	if len(broken) == 0 {
		return "", nil
	}
	if err := a.repair(ctx, vethBad, chainsBad); err != nil {
		a.lost = true
		return "", fmt.Errorf("%s, and wiring it again failed: %w", strings.Join(broken, ", "), err)
	}
	a.touch()
	return strings.Join(broken, ", "), nil
}

// repair wires the veth again (the sandbox's end included: deleting one
// end of a pair deletes both) and rewrites the sandbox's chains.
func (a *Attachment) repair(ctx context.Context, veth, chains bool) error {
	m := a.m
	if veth {
		if err := m.addVeth(a); err != nil {
			return err
		}
	}
	if chains {
		if err := m.nft.remove(a.idx, a.ifName); err != nil {
			return err
		}
		if err := a.enforce(ctx, a.current(), true); err != nil {
			return err
		}
	}
	return nil
}

func hasIP(ips []net.IP, want netip.Addr) bool {
	w := net.IP(want.AsSlice())
	for _, ip := range ips {
		if ip.Equal(w) {
			return true
		}
	}
	return false
}

// touch records that the sandbox's kernel state was just written, so that
// a Check that looked at the kernel before does not judge it.
func (a *Attachment) touch() { a.activeGen = a.m.gen.Add(1) }

// startChecker runs Check every Config.CheckInterval until Close.
func (m *Manager) startChecker() {
	if m.cfg.CheckInterval < 0 {
		return
	}
	m.checkStop, m.checkDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(m.checkDone)
		t := time.NewTicker(m.cfg.CheckInterval)
		defer t.Stop()
		for {
			select {
			case <-m.checkStop:
				return
			case <-t.C:
				ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
				m.Check(ctx)
				cancel()
			}
		}
	}()
}

func (m *Manager) stopChecker() {
	if m.checkStop == nil {
		return
	}
	close(m.checkStop)
	<-m.checkDone
	m.checkStop = nil
}

// readSysctl reads a /proc/sys/net value in the namespace.
func (n *nsRunner) readSysctl(name string) (string, error) {
	var v string
	err := n.run(func() error {
		b, err := os.ReadFile(filepath.Join("/proc/sys", name))
		v = strings.TrimSpace(string(b))
		return err
	})
	return v, err
}
