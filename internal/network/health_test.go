package network_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/hostslot"
	"github.com/airlockhq/airlock/internal/network"
	"github.com/airlockhq/airlock/internal/network/fakenet"
)

// healthLog collects what Check reported.
type healthLog struct {
	mu       sync.Mutex
	repaired []string // "id: what"
	lost     []string // "id: err"
}

func (h *healthLog) repair(id, what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.repaired = append(h.repaired, id+": "+what)
}

func (h *healthLog) lose(id string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lost = append(h.lost, id+": "+err.Error())
}

func (h *healthLog) take() (repaired, lost []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	repaired, lost = h.repaired, h.lost
	h.repaired, h.lost = nil, nil
	return repaired, lost
}

// checkedWorld is a world whose Manager checks only when the test says
// (Check), reporting to the returned log.
func checkedWorld(t *testing.T) (*world, *healthLog) {
	w := newWorld(t)
	if err := w.m.Close(); err != nil {
		t.Fatal(err)
	}
	h := &healthLog{}
	w.cfg.CheckInterval, w.cfg.OnRepair, w.cfg.OnLost = -1, h.repair, h.lose
	w.m = w.newManager(t)
	return w, h
}

func hostLink(t *testing.T, w *world, prefix string) netlink.Link {
	t.Helper()
	h, err := netlink.NewHandleAt(netns.NsHandle(w.host.Fd()), unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, prefix) {
			return l
		}
	}
	t.Fatalf("no host link with prefix %s", prefix)
	return nil
}

func nftIn(t *testing.T, w *world, fn func(c *nftables.Conn, table *nftables.Table)) {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(w.host.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	fn(c, &nftables.Table{Name: network.DefaultTable, Family: nftables.TableFamilyINet})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestCheckRepairsOrReportsLost: a sandbox network broken from outside
// (veth deleted, table deleted, a base chain flushed) is wired again by
// Check, filtering included; one whose namespace is gone is reported lost,
// once. An intact one is not touched.
func TestCheckRepairsOrReportsLost(t *testing.T) {
	w, h := checkedWorld(t)
	ctx := context.Background()
	const id = "sbx_health"
	_, s := w.sandbox(t, id, network.Policy{Mode: network.ModeAllowlist, Allow: []string{dbHost + ":5432"}})
	reach := func(when string) {
		t.Helper()
		if out, err := dialRead(s, dbHost+":5432"); err != nil || out != "db" {
			t.Fatalf("%s: allowed service: %q %v", when, out, err)
		}
		if out, err := dialRead(s, webB+":8080"); err == nil || out != "" {
			t.Fatalf("%s: unlisted service reached: %q", when, out)
		}
	}
	reach("set up")
	w.m.Check(ctx)
	if r, l := h.take(); len(r)+len(l) != 0 {
		t.Fatalf("an intact network was reported: %v %v", r, l)
	}

	// Someone deletes the veth.
	l := hostLink(t, w, network.DefaultIfPrefix)
	hh, _ := netlink.NewHandleAt(netns.NsHandle(w.host.Fd()), unix.NETLINK_ROUTE)
	if err := hh.LinkDel(l); err != nil {
		t.Fatal(err)
	}
	hh.Close()
	if _, err := dialRead(s, dbHost+":5432"); err == nil {
		t.Fatal("reached the service without a veth")
	}
	w.m.Check(ctx)
	if r, l := h.take(); len(r) != 1 || !strings.Contains(r[0], "veth") || len(l) != 0 {
		t.Fatalf("after deleting the veth: repaired %v, lost %v", r, l)
	}
	reach("veth repaired")

	// A firewall reload deletes airlock's table.
	nftIn(t, w, func(c *nftables.Conn, table *nftables.Table) { c.DelTable(table) })
	w.m.Check(ctx)
	if r, l := h.take(); len(r) != 1 || !strings.Contains(r[0], "nftables") || len(l) != 0 {
		t.Fatalf("after deleting the table: repaired %v, lost %v", r, l)
	}
	reach("table repaired")
	if chains, entries, _ := w.nftChains(t); len(chains) != len(baseChains)+5 || entries != 3 {
		t.Fatalf("chains %v, map entries %d after the repair", chains, entries)
	}

	// Someone flushes the forward chain: the sandbox's packets would pass
	// unfiltered.
	nftIn(t, w, func(c *nftables.Conn, table *nftables.Table) {
		c.FlushChain(&nftables.Chain{Name: "forward", Table: table})
	})
	w.m.Check(ctx)
	if r, l := h.take(); len(r) != 1 || len(l) != 0 {
		t.Fatalf("after flushing forward: repaired %v, lost %v", r, l)
	}
	reach("forward chain repaired")

	// The namespace mount is gone: nothing to wire into. Reported once.
	a, _ := w.m.Attachment(id)
	if err := unmountForTest(a.NetNSPath()); err != nil {
		t.Fatal(err)
	}
	w.m.Check(ctx)
	if r, l := h.take(); len(r) != 0 || len(l) != 1 || !strings.HasPrefix(l[0], id+": ") || !strings.Contains(l[0], "namespace") {
		t.Fatalf("namespace gone: repaired %v, lost %v", r, l)
	}
	w.m.Check(ctx)
	if r, l := h.take(); len(r)+len(l) != 0 {
		t.Fatalf("reported again: %v %v", r, l)
	}
	// Teardown (the sandbox's cleanup) still removes the rest.
}

// TestTwoManagersCoexist: two Managers in one host namespace with the
// names of two host slots (two daemons on one host) keep each other's
// sandboxes intact, also across a restart of one of them, and a sandbox of
// one can never reach the other's, even with a CIDR entry naming it.
func TestTwoManagersCoexist(t *testing.T) {
	w, _ := checkedWorld(t)
	ctx := context.Background()
	if err := w.m.Close(); err != nil {
		t.Fatal(err)
	}
	n0, n1 := hostslot.NamesOf(0), hostslot.NamesOf(1)
	w.cfg.SandboxRanges = hostslot.Subnets()
	w.m = w.newManager(t)
	bcfg := w.cfg
	bcfg.StateDir = t.TempDir()
	bcfg.Table, bcfg.IfPrefix, bcfg.Subnet, bcfg.LogGroup = n1.Table, n1.IfPrefix, n1.Subnet, n1.LogGroup
	b, err := network.New(bcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { b.Close() }()

	p := network.Policy{Mode: network.ModeAllowlist, Allow: []string{dbHost + ":5432", "10.0.0.0/8"}}
	aa, as := w.sandbox(t, "sbx_a", p)
	ba, err := b.Setup(ctx, "sbx_b", p)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { b.Teardown(ctx, "sbx_b") }()
	bs := fakenet.Open(t, "sbx_b", ba.NetNSPath())
	if !n0.Subnet.Contains(aa.Address()) || !n1.Subnet.Contains(ba.Address()) {
		t.Fatalf("addresses %s %s", aa.Address(), ba.Address())
	}
	bsrv := bs.ServeTCP(t, ba.Address().String()+":9000", "b's service")
	asrv := as.ServeTCP(t, aa.Address().String()+":9000", "a's service")
	both := func(when string) {
		t.Helper()
		for name, s := range map[string]*fakenet.NS{"a": as, "b": bs} {
			if out, err := dialRead(s, dbHost+":5432"); err != nil || out != "db" {
				t.Fatalf("%s: sandbox %s: egress %q %v", when, name, out, err)
			}
		}
		// 10.0.0.0/8 names both subnets: neither sandbox reaches the other.
		if out, err := dialRead(as, ba.Address().String()+":9000"); err == nil || out != "" {
			t.Fatalf("%s: a reached b: %q", when, out)
		}
		if out, err := dialRead(bs, aa.Address().String()+":9000"); err == nil || out != "" {
			t.Fatalf("%s: b reached a: %q", when, out)
		}
	}
	both("both set up")

	// b restarts (its sweep and base rules run again); a is untouched.
	aLink := hostLink(t, w, n0.IfPrefix).Attrs().Name
	chainsBefore, _, _ := w.nftChains(t)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if b, err = network.New(bcfg); err != nil {
		t.Fatal(err)
	}
	if err := b.Recover(ctx, "sbx_b", p); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(w.host.Links(t), aLink) {
		t.Fatalf("a's veth %s is gone after b restarted", aLink)
	}
	if chains, entries, _ := w.nftChains(t); !slices.Equal(chains, chainsBefore) || entries != 3 {
		t.Fatalf("a's chains %v (entries %d) after b restarted, were %v", chains, entries, chainsBefore)
	}
	both("b restarted")
	if bsrv.Hits() != 0 || asrv.Hits() != 0 {
		t.Fatalf("a sandbox reached another's service: %d %d", asrv.Hits(), bsrv.Hits())
	}
}
