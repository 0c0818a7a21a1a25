package gvisor

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/drivertest"
	"github.com/airlockhq/airlock/internal/network"
	"github.com/airlockhq/airlock/internal/network/fakenet"
)

// The fake internet of the network tests. Every address exists only in
// namespaces the test made: "host" (airlock's network side,
// network.Config.HostNetNS) and "inet" (every server), joined by one veth.
const (
	nHostUp   = "198.51.100.1"
	nInetUp   = "198.51.100.254"
	nWebA     = "203.0.113.10" // allowed.test
	nWebB     = "203.0.113.11" // denied.test
	nDNS      = "203.0.113.53" // the resolver airlock asks
	nRogueDNS = "203.0.113.54" // a resolver the sandbox must not reach
	nMetadata = "169.254.169.254"
)

// netWorld is the fake internet and its servers, keyed by name.
type netWorld struct {
	host, inet *fakenet.NS
	srv        map[string]*fakenet.Server
}

func newNetWorld(t *testing.T) *netWorld {
	t.Helper()
	w := &netWorld{srv: map[string]*fakenet.Server{}}
	w.host = fakenet.New(t, "host")
	w.inet = fakenet.New(t, "inet")
	fakenet.Link(t, w.host, "up0", netip.MustParsePrefix(nHostUp+"/24"), w.inet, "eth0", netip.MustParsePrefix(nInetUp+"/24"))
	w.host.DefaultRoute(t, netip.MustParseAddr(nInetUp))
	for _, a := range []string{nWebA, nWebB, nDNS, nRogueDNS, nMetadata} {
		w.inet.AddAddr(t, "lo", netip.MustParsePrefix(a+"/32"))
	}
	page := func(name string) http.Handler {
		return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(rw, "%s host=%s", name, r.Host)
		})
	}
	w.srv["a80"] = w.inet.ServeHTTP(t, nWebA+":80", page("web-a"))
	w.srv["b80"] = w.inet.ServeHTTP(t, nWebB+":80", page("web-b"))
	w.srv["b8080"] = w.inet.ServeTCP(t, nWebB+":8080", "web-b-8080")
	w.srv["meta80"] = w.inet.ServeHTTP(t, nMetadata+":80", page("metadata"))
	w.srv["dns"] = w.inet.ServeDNS(t, nDNS+":53", map[string][]string{"allowed.test": {nWebA}, "denied.test": {nWebB}})
	w.srv["rogue"] = w.inet.ServeDNS(t, nRogueDNS+":53", map[string][]string{"denied.test": {nWebB}})
	return w
}

// fetch prints what the URL served or the exception's name.
func fetch(url string) []string {
	return []string{"python3", "-c", `import sys, urllib.request
try:
    print("OK", urllib.request.urlopen(sys.argv[1], timeout=8).read().decode(), end="")
except Exception as e:
    print("FAIL", type(e).__name__, str(e)[:120], end="")`, url}
}

// connect prints what a TCP connection to host:port read, or the
// exception's name.
func connect(host string, port int) []string {
	return []string{"python3", "-c", `import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
    print("OK", s.recv(100).decode())
except Exception as e:
    print("FAIL", type(e).__name__)`, host, fmt.Sprint(port)}
}

// dnsQuery asks the server (ip) for name's A record over UDP, bypassing
// /etc/resolv.conf, and prints "RCODE n ANSWERS m" or the exception.
func dnsQuery(server, name string) []string {
	return []string{"python3", "-c", `import socket, struct, sys
q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
for part in sys.argv[2].split("."):
    q += bytes([len(part)]) + part.encode()
q += b"\0" + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
try:
    s.sendto(q, (sys.argv[1], 53))
    r = s.recv(512)
    print("RCODE", r[3] & 15, "ANSWERS", struct.unpack(">H", r[6:8])[0])
except Exception as e:
    print("FAIL", type(e).__name__)`, server, name}
}

// execOut runs argv in the sandbox and returns its stdout.
func execOut(t *testing.T, c *agentclient.Client, argv []string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := c.Exec(ctx, agentproto.ExecRequest{ID: fmt.Sprintf("ex_%d", time.Now().UnixNano()), Argv: argv})
	if err != nil {
		t.Fatalf("exec %v: %v", argv[:1], err)
	}
	defer st.Close()
	var out, errOut strings.Builder
	for {
		ev, err := st.Next()
		if err != nil {
			break
		}
		switch {
		case ev.Type == agentproto.EventOutput && ev.Stream == agentproto.StreamStdout:
			out.Write(ev.Data)
		case ev.Type == agentproto.EventOutput:
			errOut.Write(ev.Data)
		}
	}
	if errOut.Len() > 0 {
		t.Logf("stderr of %v: %s", argv[:1], errOut.String())
	}
	return out.String()
}

// startAttached creates and starts a gVisor sandbox in the namespace of
// att and returns a client of its agent; everything is undone at the end.
func startAttached(t *testing.T, d *Driver, tmpl driver.Template, id string, att *network.Attachment) *agentclient.Client {
	t.Helper()
	return drivertest.Started(t, d, driver.Spec{ID: id, Template: tmpl, NetNSPath: att.NetNSPath(), ResolvConfPath: att.ResolvConfPath()})
}

// newNetManager is a network manager whose host side is w's host
// namespace, closed at the end.
func newNetManager(t *testing.T, w *netWorld) *network.Manager {
	t.Helper()
	nm, err := network.New(network.Config{
		StateDir:  filepath.Join(drivertest.DataDir(t, Name), "network"),
		HostNetNS: w.host.Path(),
		Upstream:  []string{nDNS + ":53"},
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nm.Close() })
	return nm
}

// attach sets up sandbox id's network with p, torn down at the end (after
// the sandbox is destroyed: cleanups run last first).
func attach(t *testing.T, nm *network.Manager, id string, p network.Policy) *network.Attachment {
	t.Helper()
	att, err := nm.Setup(context.Background(), id, p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := nm.Teardown(context.Background(), id); err != nil {
			t.Errorf("network teardown: %v", err)
		}
	})
	return att
}

// TestNetworkAllowlist: a gVisor sandbox in allowlist mode, on gVisor's own
// network stack in the namespace airlock prepared, reaches the listed name
// and nothing else (an unlisted name, an unlisted address, the metadata
// address, a resolver of its choosing), also after a restart of the
// sandbox.
func TestNetworkAllowlist(t *testing.T) {
	requireHost(t)
	tmpl := drivertest.BaseTemplate(t)
	w := newNetWorld(t)
	nm := newNetManager(t, w)
	d := newDriver(t, newHost(t))
	const id = "sbx_gnetallow"
	att := attach(t, nm, id, network.Policy{Mode: network.ModeAllowlist, Allow: []string{"allowed.test"}})
	c := startAttached(t, d, tmpl, id, att)

	if out := execOut(t, c, []string{"cat", "/etc/resolv.conf"}); !strings.Contains(out, "nameserver "+att.Gateway().String()) {
		t.Fatalf("resolv.conf does not name airlock's resolver %s: %q", att.Gateway(), out)
	}
	checks := []struct {
		name   string
		argv   []string
		server string // whose hits must grow by one (want OK) or stay
		want   string // stdout prefix
	}{
		{"allowed_name", fetch("http://allowed.test/"), "a80", "OK web-a host=allowed.test"},
		{"unlisted_name", fetch("http://denied.test/"), "b80", "FAIL"},
		{"unlisted_address", connect(nWebB, 8080), "b8080", "FAIL"},
		{"unlisted_address_by_ip", fetch("http://" + nWebB + "/"), "b80", "FAIL"},
		{"metadata_address", fetch("http://" + nMetadata + "/"), "meta80", "FAIL"},
		// Port 53 anywhere is airlock's resolver, which does not know the
		// name: the rogue resolver never sees the query.
		{"dns_elsewhere", dnsQuery(nRogueDNS, "denied.test"), "rogue", "RCODE 3 ANSWERS 0"},
		{"dns_unlisted_name", dnsQuery(att.Gateway().String(), "denied.test"), "dns", "RCODE 3 ANSWERS 0"},
	}
	run := func(t *testing.T, c *agentclient.Client) {
		for _, tc := range checks {
			t.Run(tc.name, func(t *testing.T) {
				before := w.srv[tc.server].Hits()
				out := execOut(t, c, tc.argv)
				if !strings.HasPrefix(out, tc.want) {
					t.Fatalf("got %q, want %q…", out, tc.want)
				}
				want := before
				if strings.HasPrefix(tc.want, "OK") {
					want++
				}
				if got := w.srv[tc.server].Hits(); got != want {
					t.Fatalf("server %s hits %d → %d, want %d", tc.server, before, got, want)
				}
			})
		}
	}
	run(t, c)
	t.Run("after_restart", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c.Close()
		if err := d.Stop(ctx, id, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		run(t, drivertest.StartAndDial(t, d, id))
	})
}

// TestNetworkNoneInNamespace: a gVisor sandbox that joins a namespace in
// mode none has loopback (its own listener answers) and nothing else.
func TestNetworkNoneInNamespace(t *testing.T) {
	requireHost(t)
	tmpl := drivertest.BaseTemplate(t)
	w := newNetWorld(t)
	nm := newNetManager(t, w)
	d := newDriver(t, newHost(t))
	const id = "sbx_gnetnone"
	att := attach(t, nm, id, network.Policy{Mode: network.ModeNone})
	c := startAttached(t, d, tmpl, id, att)

	before := w.srv["a80"].Hits()
	if out := execOut(t, c, connect(nWebA, 80)); !strings.HasPrefix(out, "FAIL") {
		t.Fatalf("mode none reached %s: %q", nWebA, out)
	}
	if w.srv["a80"].Hits() != before {
		t.Fatal("the server was reached")
	}
	loop := []string{"python3", "-c", `import socket
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(1)
c = socket.create_connection(l.getsockname(), timeout=5)
a, _ = l.accept(); a.sendall(b"hi")
print("OK", c.recv(2).decode())`}
	if out := execOut(t, c, loop); out != "OK hi\n" {
		t.Fatalf("loopback: %q", out)
	}
	if out := execOut(t, c, []string{"cat", "/proc/net/dev"}); strings.Contains(out, "eth0") {
		t.Fatalf("mode none shows an interface: %q", out)
	}
	// Loopback only: runsc ran without its netstack and without entering
	// the namespace, and its commands reach it from the daemon's.
	st, err := d.LoadState(id)
	if err != nil || !slices.Equal(st.RunArgs, []string{flagNoNet}) {
		t.Errorf("run args of a sandbox whose namespace has loopback only: %v (%v), want [%s]", st.RunArgs, err, flagNoNet)
	}
	if ss, err := d.Inspect(context.Background(), id); err != nil || ss.State != driver.StateRunning {
		t.Errorf("Inspect = %+v, %v; want running", ss, err)
	}
}

// TestRestoreAddrs: what runsc strips from a namespace's interfaces is put
// back from the record of the first run, and the record follows the
// interfaces when they have their addresses.
func TestRestoreAddrs(t *testing.T) {
	requireHost(t)
	sbx := fakenet.New(t, "sbx")
	peer := fakenet.New(t, "peer")
	fakenet.Link(t, sbx, "eth0", netip.MustParsePrefix("10.99.0.2/30"), peer, "eth0", netip.MustParsePrefix("10.99.0.1/30"))
	sbx.DefaultRoute(t, netip.MustParseAddr("10.99.0.1"))
	path := filepath.Join(t.TempDir(), netConfigName)
	show := func() string {
		var out string
		if err := sbx.Do(func() error {
			var err error
			out, err = describeNS()
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	want := show()
	if !strings.Contains(want, "10.99.0.2/30") || !strings.Contains(want, "via 10.99.0.1") {
		t.Fatalf("test namespace: %s", want)
	}
	steps := []struct {
		name  string
		strip bool // remove eth0's addresses first, as runsc does
	}{
		{"record", false},
		{"restore", true},
		{"restore_again", true},
		{"unchanged", false},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if err := sbx.Do(func() error {
				if st.strip {
					if err := stripAddrs("eth0"); err != nil {
						return err
					}
				}
				n, err := restoreAddrs(sbx.Path(), path)
				if err == nil && n != 1 {
					err = fmt.Errorf("restoreAddrs found %d interfaces with addresses, want 1", n)
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if got := show(); got != want {
				t.Fatalf("namespace after %s:\n%s\nwant:\n%s", st.name, got, want)
			}
			if _, err := os.Stat(path); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// describeNS lists, in the calling thread's namespace, the IPv4 addresses
// and routes of every link, sorted: what restoreAddrs must keep.
func describeNS() (string, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return "", err
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return "", err
	}
	var lines []string
	for _, l := range links {
		addrs, err := h.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			return "", err
		}
		for _, a := range addrs {
			lines = append(lines, l.Attrs().Name+" addr "+a.IPNet.String())
		}
		routes, err := h.RouteList(l, netlink.FAMILY_V4)
		if err != nil {
			return "", err
		}
		for _, r := range routes {
			lines = append(lines, fmt.Sprintf("%s route %v via %v", l.Attrs().Name, r.Dst, r.Gw))
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n"), nil
}

// stripAddrs removes the IPv4 addresses of link name in the calling
// thread's namespace (and with them its routes), as runsc does.
func stripAddrs(name string) error {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		return err
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		if err := h.AddrDel(l, &a); err != nil {
			return err
		}
	}
	return nil
}

// TestRunArgs: gVisor's netstack, started inside the namespace, for a
// sandbox whose namespace has an interface; loopback only, from the
// daemon's namespaces, for one without a namespace or whose namespace has
// loopback only.
func TestRunArgs(t *testing.T) {
	requireHost(t)
	d := newDriver(t, newHost(t))
	bare := fakenet.New(t, "bare")
	wired := fakenet.New(t, "wired")
	peer := fakenet.New(t, "peer")
	fakenet.Link(t, wired, "eth0", netip.MustParsePrefix("10.99.1.2/30"), peer, "eth0", netip.MustParsePrefix("10.99.1.1/30"))
	tests := []struct {
		name  string
		netns string
		want  string
	}{
		{"fresh_namespace", "", flagNoNet},
		{"loopback_only_namespace", bare.Path(), flagNoNet},
		{"namespace_with_an_interface", wired.Path(), flagNetstack},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := &State{ID: "sbx_a", Dir: t.TempDir(), NetNS: tc.netns}
			got, err := d.RunArgs(st)
			if err != nil || !slices.Equal(got, []string{tc.want}) {
				t.Fatalf("RunArgs = %v, %v; want [%s]", got, err, tc.want)
			}
			st.RunArgs = got
			if netstack(st) != (tc.want == flagNetstack) {
				t.Errorf("netstack(%v) = %v", got, netstack(st))
			}
		})
	}
}
