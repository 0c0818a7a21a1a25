// Package fakenet builds a fake internet for network tests: network namespaces owned by the test, linked by veths, with servers on any address, so that no packet ever leaves the machine.
//
// Every namespace is anonymous (held by a file descriptor, never named in
// /run/netns) and every object is removed in t.Cleanup, also when the test
// fails: closing the last descriptor destroys the namespace and with it its
// veths, addresses, routes and nftables tables.
package fakenet

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NS is a network namespace a test made or opened.
type NS struct {
	Name string
	f    *os.File
	h    *netlink.Handle
}

// New makes an empty network namespace with loopback up. It is destroyed
// when the test ends (unless something else still holds it).
func New(t testing.TB, name string) *NS {
	t.Helper()
	type res struct {
		f   *os.File
		err error
	}
	ch := make(chan res, 1)
	go func() {
		// Never unlocked: the thread ends with the goroutine instead of
		// returning to the pool inside the test namespace.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- res{err: fmt.Errorf("unshare: %w", err)}
			return
		}
		f, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		ch <- res{f, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("fakenet: new namespace %s: %v", name, r.err)
	}
	n := &NS{Name: name, f: r.f}
	t.Cleanup(n.close)
	n.handle(t)
	lo, err := n.h.LinkByName("lo")
	if err == nil {
		err = n.h.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatalf("fakenet: %s: loopback up: %v", name, err)
	}
	return n
}

// Open opens the namespace at path (a sandbox's, made by the code under
// test). The descriptor is closed by Close or when the test ends.
func Open(t testing.TB, name, path string) *NS {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("fakenet: open %s: %v", path, err)
	}
	n := &NS{Name: name, f: f}
	t.Cleanup(n.close)
	return n
}

// Close releases the namespace's descriptor and netlink handle now.
func (n *NS) Close() { n.close() }

func (n *NS) close() {
	if n.h != nil {
		n.h.Close()
		n.h = nil
	}
	if n.f != nil {
		n.f.Close()
		n.f = nil
	}
}

// Path is a path that opens the namespace, for code that takes one.
func (n *NS) Path() string {
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), n.f.Fd())
}

// Fd is the namespace's descriptor.
func (n *NS) Fd() int { return int(n.f.Fd()) }

func (n *NS) handle(t testing.TB) *netlink.Handle {
	t.Helper()
	if n.h == nil {
		h, err := netlink.NewHandleAt(netns.NsHandle(n.Fd()), unix.NETLINK_ROUTE)
		if err != nil {
			t.Fatalf("fakenet: %s: netlink: %v", n.Name, err)
		}
		n.h = h
	}
	return n.h
}

// Do runs fn on a thread inside the namespace. Sockets it creates stay in
// the namespace whichever thread uses them later.
func (n *NS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see New
		if err := unix.Setns(n.Fd(), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", n.Name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Dial connects from inside the namespace.
func (n *NS) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// DialFrom connects from inside the namespace from a given local address.
func (n *NS) DialFrom(ctx context.Context, network, laddr, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() error {
		la, err := net.ResolveTCPAddr(network, laddr)
		if err != nil {
			return err
		}
		d := net.Dialer{LocalAddr: la}
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen opens a TCP listener inside the namespace, closed at cleanup.
func (n *NS) Listen(t testing.TB, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := n.Do(func() error {
		var err error
		ln, err = net.Listen("tcp4", addr)
		return err
	}); err != nil {
		t.Fatalf("fakenet: %s: listen %s: %v", n.Name, addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// ListenPacket opens a UDP socket inside the namespace, closed at cleanup.
func (n *NS) ListenPacket(t testing.TB, addr string) net.PacketConn {
	t.Helper()
	var pc net.PacketConn
	if err := n.Do(func() error {
		var err error
		pc, err = net.ListenPacket("udp4", addr)
		return err
	}); err != nil {
		t.Fatalf("fakenet: %s: listen udp %s: %v", n.Name, addr, err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc
}

// Link connects a and b with a veth pair named aIf in a and bIf in b, with
// the given addresses (zero prefix: none), both ends up.
func Link(t testing.TB, a *NS, aIf string, aAddr netip.Prefix, b *NS, bIf string, bAddr netip.Prefix) {
	t.Helper()
	ha := a.handle(t)
	attrs := netlink.NewLinkAttrs()
	attrs.Name = aIf
	if err := ha.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: bIf, PeerNamespace: netlink.NsFd(b.Fd())}); err != nil {
		t.Fatalf("fakenet: veth %s/%s: %v", aIf, bIf, err)
	}
	for _, x := range []struct {
		ns   *NS
		name string
		addr netip.Prefix
	}{{a, aIf, aAddr}, {b, bIf, bAddr}} {
		h := x.ns.handle(t)
		l, err := h.LinkByName(x.name)
		if err != nil {
			t.Fatalf("fakenet: %s: %v", x.name, err)
		}
		if x.addr.IsValid() {
			if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipnet(x.addr)}); err != nil {
				t.Fatalf("fakenet: %s: address %s: %v", x.name, x.addr, err)
			}
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatalf("fakenet: %s: up: %v", x.name, err)
		}
	}
}

// AddAddr adds an address to an interface of the namespace (on "lo" it
// makes a host reachable at that address through the namespace's links).
func (n *NS) AddAddr(t testing.TB, ifName string, p netip.Prefix) {
	t.Helper()
	h := n.handle(t)
	l, err := h.LinkByName(ifName)
	if err != nil {
		t.Fatalf("fakenet: %s: %s: %v", n.Name, ifName, err)
	}
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipnet(p)}); err != nil {
		t.Fatalf("fakenet: %s: address %s: %v", n.Name, p, err)
	}
}

// DefaultRoute routes everything not on a link through gw.
func (n *NS) DefaultRoute(t testing.TB, gw netip.Addr) {
	t.Helper()
	if err := n.handle(t).RouteAdd(&netlink.Route{Gw: gw.AsSlice()}); err != nil {
		t.Fatalf("fakenet: %s: default route via %s: %v", n.Name, gw, err)
	}
}

// Sysctl writes a /proc/sys value (e.g. "net/ipv4/ip_forward") in the namespace.
func (n *NS) Sysctl(t testing.TB, name, value string) {
	t.Helper()
	if err := n.Do(func() error { return os.WriteFile(filepath.Join("/proc/sys", name), []byte(value), 0) }); err != nil {
		t.Fatalf("fakenet: %s: sysctl %s: %v", n.Name, name, err)
	}
}

// Links lists the namespace's interface names.
func (n *NS) Links(t testing.TB) []string {
	t.Helper()
	ls, err := n.handle(t).LinkList()
	if err != nil {
		t.Fatalf("fakenet: %s: links: %v", n.Name, err)
	}
	var out []string
	for _, l := range ls {
		out = append(out, l.Attrs().Name)
	}
	return out
}

func ipnet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
