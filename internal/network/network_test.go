package network_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/hostcheck"
	"github.com/airlockhq/airlock/internal/network"
	"github.com/airlockhq/airlock/internal/network/fakenet"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// TestAllowlist: names on the list resolve and flow through the proxy (HTTP
// Host and TLS SNI, wildcards); everything else gets NXDOMAIN or is refused,
// the proxy only ever connects to addresses the name resolves to, and every
// attempt is audited.
func TestAllowlist(t *testing.T) {
	w := newWorld(t)
	const id = "sbx_allow"
	a, s := w.sandbox(t, id, network.Policy{Mode: network.ModeAllowlist, Allow: []string{"allowed.test", "*.wild.test"}})
	ctx := context.Background()

	t.Run("dns_allowed", func(t *testing.T) {
		ips, err := s.LookupA(ctx, resolver(a), "allowed.test")
		if err != nil || !slices.Equal(ips, []string{webA}) {
			t.Fatalf("lookup allowed.test = %v, %v; want [%s]", ips, err, webA)
		}
		w.audit.wait(t, "dns allowed.test allowed", ev(id, network.KindDNS, "allowed.test", webA, 0, true, network.ReasonAllowed))
	})
	t.Run("dns_unlisted_nxdomain", func(t *testing.T) {
		before := w.hits(dnsAddr + ":53")
		_, err := s.LookupA(ctx, resolver(a), "denied.test")
		if !fakenet.IsNXDOMAIN(err) {
			t.Fatalf("lookup denied.test: %v, want NXDOMAIN", err)
		}
		if got := w.hits(dnsAddr + ":53"); got != before {
			t.Errorf("an unlisted name was asked upstream (%d queries)", got-before)
		}
		w.audit.wait(t, "dns denied.test denied", ev(id, network.KindDNS, "denied.test", "", 0, false, network.ReasonNotAllowed))
	})
	t.Run("http_host", func(t *testing.T) {
		body, err := get(s, a, w.ca, "http://allowed.test/")
		if err != nil || body != "web-a host=allowed.test" {
			t.Fatalf("GET http://allowed.test/ = %q, %v", body, err)
		}
		e := w.audit.wait(t, "http allowed.test allowed", ev(id, network.KindHTTP, "allowed.test", webA, 80, true, network.ReasonAllowed))
		if e.BytesIn <= 0 || e.BytesOut <= 0 {
			t.Errorf("event bytes in/out = %d/%d, want both > 0", e.BytesIn, e.BytesOut)
		}
	})
	t.Run("tls_sni", func(t *testing.T) {
		body, err := get(s, a, w.ca, "https://allowed.test/big")
		if err != nil || len(body) != 100000 {
			t.Fatalf("GET https://allowed.test/big = %d bytes, %v", len(body), err)
		}
		e := w.audit.wait(t, "tls allowed.test allowed", ev(id, network.KindTLS, "allowed.test", webA, 443, true, network.ReasonAllowed))
		if e.BytesIn < 100000 {
			t.Errorf("event bytes in = %d, want >= 100000", e.BytesIn)
		}
	})
	t.Run("wildcard", func(t *testing.T) {
		for _, name := range []string{"api.wild.test", "deep.x.wild.test"} {
			body, err := get(s, a, w.ca, "https://"+name+"/")
			if err != nil || body != "web-a host="+name {
				t.Fatalf("GET https://%s/ = %q, %v", name, body, err)
			}
		}
		// The wildcard covers names below wild.test, not wild.test itself.
		if _, err := s.LookupA(ctx, resolver(a), "wild.test"); !fakenet.IsNXDOMAIN(err) {
			t.Fatalf("lookup wild.test: %v, want NXDOMAIN", err)
		}
	})
	t.Run("tls_unlisted_by_ip", func(t *testing.T) {
		before := w.hits(webB + ":443")
		err := tlsHandshake(s, webB+":443", "denied.test", w.ca)
		if err == nil {
			t.Fatal("TLS to denied.test by address succeeded")
		}
		if got := w.hits(webB + ":443"); got != before {
			t.Fatalf("denied server was reached %d times", got-before)
		}
		w.audit.wait(t, "tls denied.test denied", ev(id, network.KindTLS, "denied.test", webB, 443, false, network.ReasonNotAllowed))
	})
	t.Run("direct_ip_dropped", func(t *testing.T) {
		before := w.hits(webB + ":8080")
		if out, err := dialRead(s, webB+":8080"); err == nil {
			t.Fatalf("direct connection to %s:8080 got %q", webB, out)
		}
		if got := w.hits(webB + ":8080"); got != before {
			t.Fatalf("unlisted address was reached %d times", got-before)
		}
		w.audit.wait(t, "connect to webB:8080 denied", ev(id, network.KindConnect, "", webB, 8080, false, network.ReasonNotAllowed))
	})
	t.Run("host_header_pins_address", func(t *testing.T) {
		// A request for an allowed name sent to another address goes to an
		// address the name resolves to, never where the sandbox pointed it.
		before := w.hits(webB + ":80")
		out, err := rawHTTP(s, webB+":80", "allowed.test")
		if err != nil || !strings.Contains(out, "web-a host=allowed.test") {
			t.Fatalf("request = %q, %v; want web-a's answer", out, err)
		}
		if got := w.hits(webB + ":80"); got != before {
			t.Fatalf("the address the sandbox dialled was reached %d times", got-before)
		}
	})
	t.Run("allowed_name_private_address", func(t *testing.T) {
		zoneHits := w.hits(priv + ":443")
		if err := w.m.Update(ctx, id, network.Policy{Mode: network.ModeAllowlist, Allow: []string{"allowed.test", "*.wild.test", "rebind.test"}}); err != nil {
			t.Fatal(err)
		}
		if ips, err := s.LookupA(ctx, resolver(a), "rebind.test"); err == nil {
			t.Fatalf("rebind.test resolved to %v; private answers must be stripped", ips)
		}
		w.audit.wait(t, "dns rebind.test stripped", ev(id, network.KindDNS, "rebind.test", priv, 0, false, network.ReasonRebind))
		if err := tlsHandshake(s, priv+":443", "rebind.test", w.ca); err == nil {
			t.Fatal("TLS to rebind.test at its private address succeeded")
		}
		if got := w.hits(priv + ":443"); got != zoneHits {
			t.Fatalf("private server was reached %d times", got-zoneHits)
		}
		w.audit.wait(t, "tls rebind.test denied", ev(id, network.KindTLS, "rebind.test", "", 443, false, network.ReasonRebind))
	})
	t.Run("dns_to_other_resolver", func(t *testing.T) {
		before := w.hits(rogue + ":53")
		ips, err := s.LookupA(ctx, rogue+":53", "allowed.test")
		if err != nil || !slices.Equal(ips, []string{webA}) {
			t.Fatalf("lookup through %s = %v, %v; want airlock's answer [%s]", rogue, ips, err, webA)
		}
		if _, err := s.LookupA(ctx, rogue+":53", "denied.test"); !fakenet.IsNXDOMAIN(err) {
			t.Fatalf("lookup denied.test through %s: %v, want NXDOMAIN", rogue, err)
		}
		if got := w.hits(rogue + ":53"); got != before {
			t.Fatalf("the other resolver got %d queries", got-before)
		}
	})
	t.Run("dns_tcp_and_other_types", func(t *testing.T) {
		r, err := s.ExchangeOver(ctx, "tcp", resolver(a), "allowed.test", dns.TypeA)
		if err != nil || len(r.Answer) != 1 {
			t.Fatalf("TCP lookup = %v, %v", r, err)
		}
		r, err = s.ExchangeOver(ctx, "tcp", rogue+":53", "denied.test", dns.TypeA)
		if err != nil || r.Rcode != dns.RcodeNameError {
			t.Fatalf("TCP lookup through another resolver = %v, %v; want airlock's NXDOMAIN", r, err)
		}
		// No IPv6 in sandboxes: AAAA of an allowed name is empty, not an error.
		r, err = s.Exchange(ctx, resolver(a), "allowed.test", dns.TypeAAAA)
		if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
			t.Fatalf("AAAA lookup = %v, %v; want an empty answer", r, err)
		}
		w.audit.wait(t, "dns over tcp audited", ev(id, network.KindDNS, "allowed.test", webA, 0, true, network.ReasonAllowed))
		if _, ok := w.audit.find(func(e network.Event) bool { return e.Kind == network.KindDNS && e.Proto == "tcp" && e.SandboxID == id }); !ok {
			t.Error("no dns event with proto tcp")
		}
	})
	t.Run("counters", func(t *testing.T) {
		rx, tx, err := w.m.Counters(id)
		if err != nil || rx < 100000 || tx == 0 {
			t.Fatalf("Counters = %d, %d, %v; want rx >= 100000 and tx > 0", rx, tx, err)
		}
	})
}

// tlsHandshake does a verified TLS handshake from the sandbox to addr for name.
func tlsHandshake(s *fakenet.NS, addr, name string, ca *fakenet.CA) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := s.Dial(ctx, "tcp4", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	tc := tls.Client(c, &tls.Config{ServerName: name, RootCAs: ca.Pool()})
	return tc.HandshakeContext(ctx)
}

// rawHTTP sends a GET with the given Host to addr from the sandbox.
func rawHTTP(s *fakenet.NS, addr, host string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := s.Dial(ctx, "tcp4", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	return string(b), err
}

// TestCIDR: CIDR entries, with and without a port, let traffic out
// directly (not through the proxy); an entry inside a private range opens
// that range only.
func TestCIDR(t *testing.T) {
	w := newWorld(t)
	const id = "sbx_cidr"
	_, s := w.sandbox(t, id, network.Policy{Mode: network.ModeAllowlist, Allow: []string{dbHost + ":5432", "10.1.2.0/24"}})
	tests := []struct {
		name    string
		addr    string
		want    string // banner or body part; "" means must fail
		reason  string
		srvKey  string
		port    int
		allowed bool
	}{
		{"cidr_port_allowed", dbHost + ":5432", "db", network.ReasonAllowed, dbHost + ":5432", 5432, true},
		{"cidr_port_other_port", dbHost + ":8080", "", network.ReasonNotAllowed, dbHost + ":8080", 8080, false},
		{"private_cidr_allowed", priv + ":80", "private host=", network.ReasonAllowed, priv + ":80", 80, true},
		{"other_private_blocked", lan + ":80", "", network.ReasonPrivate, lan + ":80", 80, false},
		{"metadata_blocked", meta + ":80", "", network.ReasonPrivate, meta + ":80", 80, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := w.hits(tc.srvKey)
			var out string
			var err error
			if tc.port == 80 {
				out, err = rawHTTP(s, tc.addr, "x.test")
			} else {
				out, err = dialRead(s, tc.addr)
			}
			ip, _, _ := net.SplitHostPort(tc.addr)
			if tc.want == "" {
				if err == nil && out != "" {
					t.Fatalf("%s answered %q; want it unreachable", tc.addr, out)
				}
				if got := w.hits(tc.srvKey); got != before {
					t.Fatalf("%s was reached %d times", tc.addr, got-before)
				}
				if tc.port == 80 {
					// Port 80 not opened by a CIDR goes to the proxy, which
					// refuses the name.
					w.audit.wait(t, "http denied", ev(id, network.KindHTTP, "x.test", ip, 80, false, network.ReasonNotAllowed))
					return
				}
				w.audit.wait(t, "connect denied", ev(id, network.KindConnect, "", ip, tc.port, false, tc.reason))
				return
			}
			if !strings.Contains(out, tc.want) {
				t.Fatalf("%s answered %q, %v; want %q", tc.addr, out, err, tc.want)
			}
			if got := w.hits(tc.srvKey); got != before+1 {
				t.Fatalf("%s was reached %d times, want 1", tc.addr, got-before)
			}
			// Direct, not proxied: the filter's allow log, not a proxy event.
			w.audit.wait(t, "connect allowed", ev(id, network.KindConnect, "", ip, tc.port, true, network.ReasonAllowed))
		})
	}
}

// TestOpen: open mode reaches public addresses directly, but never the
// metadata endpoint, private ranges, the host, its API port or another
// sandbox, unless a CIDR entry names them.
func TestOpen(t *testing.T) {
	w := newWorld(t)
	const id, other = "sbx_open", "sbx_other"
	a, s := w.sandbox(t, id, network.Policy{Mode: network.ModeOpen})
	b, _ := w.sandbox(t, other, network.Policy{Mode: network.ModeOpen})

	t.Run("public_direct", func(t *testing.T) {
		if out, err := dialRead(s, webB+":8080"); err != nil || out != "web-b-8080" {
			t.Fatalf("public service = %q, %v", out, err)
		}
		w.audit.wait(t, "connect allowed", ev(id, network.KindConnect, "", webB, 8080, true, network.ReasonAllowed))
	})
	t.Run("any_name_resolves", func(t *testing.T) {
		body, err := get(s, a, w.ca, "https://denied.test/")
		if err != nil || body != "web-b host=denied.test" {
			t.Fatalf("GET https://denied.test/ = %q, %v", body, err)
		}
		// Direct, so the filter's event names the host the sandbox resolved.
		w.audit.wait(t, "connect allowed with domain", ev(id, network.KindConnect, "denied.test", webB, 443, true, network.ReasonAllowed))
	})
	blocked := []struct {
		name, addr, key, reason string
	}{
		{"metadata", meta + ":80", meta + ":80", network.ReasonPrivate},
		{"private_10", priv + ":80", priv + ":80", network.ReasonPrivate},
		{"private_192_168", lan + ":80", lan + ":80", network.ReasonPrivate},
		{"host_api_port", fmt.Sprintf("%s:%d", hostUp, apiPort), "api", network.ReasonHost},
		{"host_other_port", fmt.Sprintf("%s:%d", hostUp, sshPort), "ssh", network.ReasonHost},
		{"gateway_api_port", fmt.Sprintf("%s:%d", a.Gateway(), apiPort), "api", network.ReasonHost},
		{"gateway_other_port", fmt.Sprintf("%s:%d", a.Gateway(), sshPort), "ssh", network.ReasonHost},
		{"other_gateway", fmt.Sprintf("%s:%d", b.Gateway(), sshPort), "ssh", network.ReasonHost},
		{"other_sandbox", b.Address().String() + ":9000", "", network.ReasonOtherSandbox},
	}
	for _, tc := range blocked {
		t.Run("blocked_"+tc.name, func(t *testing.T) {
			var before int64
			if tc.key != "" {
				before = w.hits(tc.key)
			}
			if out, err := dialRead(s, tc.addr); err == nil || out != "" {
				t.Fatalf("%s answered %q, %v; want it unreachable", tc.addr, out, err)
			}
			if tc.key != "" {
				if got := w.hits(tc.key); got != before {
					t.Fatalf("%s was reached %d times", tc.addr, got-before)
				}
			}
			ip, port, _ := net.SplitHostPort(tc.addr)
			var p int
			fmt.Sscan(port, &p)
			w.audit.wait(t, "connect denied", ev(id, network.KindConnect, "", ip, p, false, tc.reason))
		})
	}
	t.Run("metadata_by_name_stripped", func(t *testing.T) {
		if ips, err := s.LookupA(context.Background(), resolver(a), "meta.test"); err == nil {
			t.Fatalf("meta.test resolved to %v in open mode", ips)
		}
	})
	t.Run("cidr_opens_metadata_only", func(t *testing.T) {
		if err := w.m.Update(context.Background(), id, network.Policy{Mode: network.ModeOpen, Allow: []string{meta}}); err != nil {
			t.Fatal(err)
		}
		if out, err := rawHTTP(s, meta+":80", "x"); err != nil || !strings.Contains(out, "metadata host=") {
			t.Fatalf("metadata after allowing it = %q, %v", out, err)
		}
		if out, err := dialRead(s, priv+":80"); err == nil || out != "" {
			t.Fatalf("private range answered %q after allowing only %s", out, meta)
		}
	})
	t.Run("broad_cidr_does_not_open_private", func(t *testing.T) {
		if err := w.m.Update(context.Background(), id, network.Policy{Mode: network.ModeOpen, Allow: []string{"0.0.0.0/0"}}); err != nil {
			t.Fatal(err)
		}
		before := w.hits(meta + ":80")
		if out, err := dialRead(s, meta+":80"); err == nil || out != "" {
			t.Fatalf("metadata answered %q with 0.0.0.0/0 allowed", out)
		}
		if w.hits(meta+":80") != before {
			t.Fatal("metadata reached")
		}
	})
}

// TestHostAccess: the host's addresses open only to an entry naming one
// address (or a private range containing it), and the API port only to an
// entry naming that port too.
func TestHostAccess(t *testing.T) {
	w := newWorld(t)
	tests := []struct {
		name     string
		allow    []string
		ssh, api bool
	}{
		{"none", nil, false, false},
		{"broad_public_cidr", []string{"198.51.100.0/24"}, false, false},
		{"explicit_address", []string{hostUp}, true, false},
		{"explicit_api_port", []string{fmt.Sprintf("%s:%d", hostUp, apiPort)}, false, true},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, s := w.sandbox(t, fmt.Sprintf("sbx_host%d", i), network.Policy{Mode: network.ModeOpen, Allow: tc.allow})
			for _, x := range []struct {
				port int
				key  string
				want bool
			}{{sshPort, "ssh", tc.ssh}, {apiPort, "api", tc.api}} {
				before := w.hits(x.key)
				out, err := dialRead(s, fmt.Sprintf("%s:%d", hostUp, x.port))
				if got := err == nil && out == x.key; got != x.want {
					t.Errorf("host port %d reachable = %v (%q, %v), want %v", x.port, got, out, err, x.want)
				}
				if reached := w.hits(x.key) != before; reached != x.want {
					t.Errorf("host port %d server reached = %v, want %v", x.port, reached, x.want)
				}
			}
		})
	}
}

// TestModeNone: loopback only, no veth, no rules, nothing listening.
func TestModeNone(t *testing.T) {
	w := newWorld(t)
	hostLinks := w.host.Links(t)
	a, s := w.sandbox(t, "sbx_none", network.Policy{})
	if links := s.Links(t); !slices.Equal(links, []string{"lo"}) {
		t.Fatalf("sandbox links = %v, want [lo]", links)
	}
	if got := w.host.Links(t); !slices.Equal(got, hostLinks) {
		t.Fatalf("host links changed: %v -> %v", hostLinks, got)
	}
	chains, entries, _ := w.nftChains(t)
	if !slices.Equal(chains, baseChains) || entries != 0 {
		t.Fatalf("nft chains = %v, map entries %d; want only the base chains", chains, entries)
	}
	if _, err := dialRead(s, webA+":80"); err == nil {
		t.Fatal("mode none reached the fake internet")
	}
	b, err := os.ReadFile(a.ResolvConfPath())
	if err != nil || !strings.Contains(string(b), "nameserver "+a.Gateway().String()) {
		t.Fatalf("resolv.conf = %q, %v", b, err)
	}
	if rx, tx, err := w.m.Counters("sbx_none"); err != nil || rx != 0 || tx != 0 {
		t.Fatalf("Counters = %d, %d, %v", rx, tx, err)
	}
}

// TestSandboxNamespace: IPv6 is off in the sandbox; its address and route
// are as the Attachment says.
func TestSandboxNamespace(t *testing.T) {
	w := newWorld(t)
	a, s := w.sandbox(t, "sbx_ns", network.Policy{Mode: network.ModeOpen})
	if links := s.Links(t); !slices.Equal(links, []string{"lo", "eth0"}) {
		t.Fatalf("sandbox links = %v, want [lo eth0]", links)
	}
	var v6 string
	if err := s.Do(func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv6/conf/eth0/disable_ipv6")
		v6 = strings.TrimSpace(string(b))
		return err
	}); err != nil || v6 != "1" {
		t.Fatalf("eth0 disable_ipv6 = %q, %v; want 1", v6, err)
	}
	if !network.DefaultSubnet.Contains(a.Address()) || a.Gateway().Next() != a.Address() {
		t.Fatalf("address %v, gateway %v; want consecutive addresses in %v", a.Address(), a.Gateway(), network.DefaultSubnet)
	}
	if out, err := dialRead(s, webB+":8080"); err != nil || out != "web-b-8080" {
		t.Fatalf("route out = %q, %v", out, err)
	}
	// A spoofed source address gets nowhere. (A real sandbox cannot even
	// add one: its root has no privilege over the namespace. The test can.)
	s.AddAddr(t, "eth0", netip.MustParsePrefix("10.231.200.9/32"))
	before := w.hits(webB + ":8080")
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if c, err := s.DialFrom(ctx, "tcp4", "10.231.200.9:0", webB+":8080"); err == nil {
		c.Close()
		t.Fatal("connection from a spoofed source address succeeded")
	}
	if w.hits(webB+":8080") != before {
		t.Fatal("spoofed packets reached the server")
	}
}

// TestUpdate: a policy change applies at once, to new connections and to
// proxied ones already open; none→allowlist wires a veth into a running
// sandbox and allowlist→none cuts it off.
func TestUpdate(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	const id = "sbx_upd"
	a, s := w.sandbox(t, id, network.Policy{Mode: network.ModeNone})
	if _, err := dialRead(s, webA+":80"); err == nil {
		t.Fatal("mode none reached the fake internet")
	}

	t.Run("none_to_allowlist", func(t *testing.T) {
		if err := w.m.Update(ctx, id, network.Policy{Mode: network.ModeAllowlist, Allow: []string{"allowed.test"}}); err != nil {
			t.Fatal(err)
		}
		if body, err := get(s, a, w.ca, "https://allowed.test/"); err != nil || body != "web-a host=allowed.test" {
			t.Fatalf("GET after update = %q, %v", body, err)
		}
	})
	t.Run("narrowing_cuts_open_connection", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		c, err := s.Dial(ctx, "tcp4", webA+":443")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		tc := tls.Client(c, &tls.Config{ServerName: "allowed.test", RootCAs: w.ca.Pool()})
		if err := tc.HandshakeContext(ctx); err != nil {
			t.Fatal(err)
		}
		if err := w.m.Update(ctx, id, network.Policy{Mode: network.ModeAllowlist, Allow: []string{"pypi.test"}}); err != nil {
			t.Fatal(err)
		}
		_ = tc.SetReadDeadline(time.Now().Add(3 * time.Second))
		_, err = tc.Read(make([]byte, 1))
		var ne net.Error
		if err == nil || errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("read on a connection the update disallowed = %v; want it cut", err)
		}
		if _, err := s.LookupA(ctx, resolver(a), "allowed.test"); !fakenet.IsNXDOMAIN(err) {
			t.Fatalf("lookup after narrowing: %v, want NXDOMAIN", err)
		}
		if err := tlsHandshake(s, webA+":443", "allowed.test", w.ca); err == nil {
			t.Fatal("new TLS connection to a name no longer allowed succeeded")
		}
		if body, err := get(s, a, w.ca, "https://pypi.test/"); err != nil || body != "web-a host=pypi.test" {
			t.Fatalf("GET newly allowed name = %q, %v", body, err)
		}
	})
	t.Run("cidr_removed_stops_direct_flow", func(t *testing.T) {
		if err := w.m.Update(ctx, id, network.Policy{Mode: network.ModeAllowlist, Allow: []string{dbHost}}); err != nil {
			t.Fatal(err)
		}
		if out, err := dialRead(s, dbHost+":5432"); err != nil || out != "db" {
			t.Fatalf("CIDR-allowed service = %q, %v", out, err)
		}
		if err := w.m.Update(ctx, id, network.Policy{Mode: network.ModeAllowlist}); err != nil {
			t.Fatal(err)
		}
		if out, err := dialRead(s, dbHost+":5432"); err == nil || out != "" {
			t.Fatalf("service answered %q after its CIDR was removed", out)
		}
	})
	t.Run("back_to_none", func(t *testing.T) {
		if err := w.m.Update(ctx, id, network.Policy{Mode: network.ModeOpen}); err != nil {
			t.Fatal(err)
		}
		if out, err := dialRead(s, webB+":8080"); err != nil || out != "web-b-8080" {
			t.Fatalf("open mode = %q, %v", out, err)
		}
		if err := w.m.Update(ctx, id, network.Policy{Mode: network.ModeNone}); err != nil {
			t.Fatal(err)
		}
		if out, err := dialRead(s, webB+":8080"); err == nil || out != "" {
			t.Fatalf("mode none answered %q", out)
		}
		if _, err := s.LookupA(ctx, resolver(a), "allowed.test"); err == nil {
			t.Fatal("DNS works in mode none")
		}
		w.audit.wait(t, "mode none denial", ev(id, network.KindConnect, "", webB, 8080, false, network.ReasonModeNone))
		if p := a.Policy(); p.Mode != network.ModeNone {
			t.Fatalf("Policy() = %+v", p)
		}
	})
	t.Run("invalid_keeps_policy", func(t *testing.T) {
		err := w.m.Update(ctx, id, network.Policy{Mode: "bogus"})
		if !errdefs.IsInvalidArgument(err) {
			t.Fatalf("Update(bogus) = %v, want invalid argument", err)
		}
		if err := w.m.Update(ctx, "sbx_missing", network.Policy{}); !errdefs.IsNotFound(err) {
			t.Fatalf("Update(unknown) = %v, want not found", err)
		}
	})
}

// TestRegistries: registry sets allow their hosts; offline denies them at
// once even in open mode.
func TestRegistries(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	a, s := w.sandbox(t, "sbx_reg", network.Policy{Mode: network.ModeAllowlist, Registries: []string{"pypi"}})
	if body, err := get(s, a, w.ca, "https://pypi.test/"); err != nil || body != "web-a host=pypi.test" {
		t.Fatalf("registry host = %q, %v", body, err)
	}
	b, s2 := w.sandbox(t, "sbx_off", network.Policy{Mode: network.ModeOpen, Offline: true})
	if _, err := s2.LookupA(ctx, resolver(b), "pypi.test"); !fakenet.IsNXDOMAIN(err) {
		t.Fatalf("offline lookup: %v, want NXDOMAIN", err)
	}
	w.audit.wait(t, "offline denial", ev("sbx_off", network.KindDNS, "pypi.test", "", 0, false, network.ReasonOffline))
	if _, err := s2.LookupA(ctx, resolver(b), "allowed.test"); err != nil {
		t.Fatalf("offline open mode lookup of another name: %v", err)
	}
	if _, err := w.m.Setup(ctx, "sbx_npm", network.Policy{Mode: network.ModeAllowlist, Registries: []string{"npm"}}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Setup with an unconfigured registry = %v, want invalid argument", err)
	}
}

// TestSetupErrors: bad ids and duplicates are refused and leave nothing.
func TestSetupErrors(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	snap := hostcheck.Take(t, w.stateDir)
	for _, id := range []string{"", "../x", "a b", "a.json", strings.Repeat("x", 65)} {
		if _, err := w.m.Setup(ctx, id, network.Policy{}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Setup(%q) = %v, want invalid argument", id, err)
		}
	}
	w.sandbox(t, "sbx_dup", network.Policy{})
	if _, err := w.m.Setup(ctx, "sbx_dup", network.Policy{}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("duplicate Setup = %v, want already exists", err)
	}
	if err := w.m.Teardown(ctx, "sbx_dup"); err != nil {
		t.Fatal(err)
	}
	if err := w.m.Teardown(ctx, "sbx_dup"); err != nil {
		t.Fatalf("second Teardown = %v, want nil", err)
	}
	snap.AssertNoLeaks(t)
}

// TestTeardownLeavesNothing: after Teardown no veth, chain, map entry,
// namespace mount or file is left, and after Close not even the table.
func TestTeardownLeavesNothing(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	snap := hostcheck.Take(t, w.stateDir)
	hostLinks := w.host.Links(t)
	fds := countFDs(t)
	policies := []network.Policy{
		{Mode: network.ModeNone},
		{Mode: network.ModeAllowlist, Allow: []string{"allowed.test", dbHost + ":5432"}},
		{Mode: network.ModeOpen, Allow: []string{meta}},
	}
	for i, p := range policies {
		id := fmt.Sprintf("sbx_td%d", i)
		a, err := w.m.Setup(ctx, id, p)
		if err != nil {
			t.Fatal(err)
		}
		s := fakenet.Open(t, id, a.NetNSPath())
		if p.Mode != network.ModeNone {
			if _, err := s.LookupA(ctx, resolver(a), "allowed.test"); err != nil {
				t.Fatalf("%s: lookup: %v", id, err)
			}
		}
		s.Close()
	}
	if got := len(w.m.Known()); got != len(policies) {
		t.Fatalf("Known() has %d sandboxes, want %d", got, len(policies))
	}
	for i := range policies {
		if err := w.m.Teardown(ctx, fmt.Sprintf("sbx_td%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := w.host.Links(t); !slices.Equal(got, hostLinks) {
		t.Errorf("host links after teardown = %v, want %v", got, hostLinks)
	}
	chains, entries, ok := w.nftChains(t)
	if !ok || !slices.Equal(chains, baseChains) || entries != 0 {
		t.Errorf("nft after teardown: chains %v, map entries %d, table %v", chains, entries, ok)
	}
	if got := w.m.Known(); len(got) != 0 {
		t.Errorf("Known() after teardown = %v", got)
	}
	snap.AssertNoLeaks(t)
	if got := countFDs(t); got > fds {
		t.Errorf("open descriptors %d -> %d", fds, got)
	}
	if err := w.m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := w.nftChains(t); ok {
		t.Error("nft table left after Close with no sandboxes")
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), w.stateDir) {
		t.Errorf("mounts under the state dir left after Close")
	}
}

// TestSetupTeardownLoop: 20 setups and teardowns in every mode leak nothing.
func TestSetupTeardownLoop(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	snap := hostcheck.Take(t, w.stateDir)
	hostLinks := w.host.Links(t)
	fds := countFDs(t)
	modes := []network.Mode{network.ModeNone, network.ModeAllowlist, network.ModeOpen}
	for i := 0; i < 20; i++ {
		id := fmt.Sprintf("sbx_loop%d", i)
		p := network.Policy{Mode: modes[i%len(modes)]}
		if p.Mode == network.ModeAllowlist {
			p.Allow = []string{"allowed.test"}
		}
		a, err := w.m.Setup(ctx, id, p)
		if err != nil {
			t.Fatalf("iteration %d: %v", i, err)
		}
		if p.Mode == network.ModeAllowlist {
			s := fakenet.Open(t, id, a.NetNSPath())
			if body, err := get(s, a, w.ca, "http://allowed.test/"); err != nil || body != "web-a host=allowed.test" {
				t.Fatalf("iteration %d: GET = %q, %v", i, body, err)
			}
			s.Close()
		}
		if err := w.m.Teardown(ctx, id); err != nil {
			t.Fatalf("iteration %d: teardown: %v", i, err)
		}
	}
	if got := w.host.Links(t); !slices.Equal(got, hostLinks) {
		t.Errorf("host links = %v, want %v", got, hostLinks)
	}
	if chains, entries, _ := w.nftChains(t); !slices.Equal(chains, baseChains) || entries != 0 {
		t.Errorf("nft chains %v, map entries %d", chains, entries)
	}
	snap.AssertNoLeaks(t)
	if got := countFDs(t); got > fds {
		t.Errorf("open descriptors %d -> %d: %v", fds, got, fdList(t))
	}
}

// TestRecover: a restarted Manager knows the sandboxes a previous one left,
// keeps their namespaces, and after Recover enforces their policy again.
func TestRecover(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	const id = "sbx_rec"
	p := network.Policy{Mode: network.ModeAllowlist, Allow: []string{"allowed.test"}}
	a, err := w.m.Setup(ctx, id, p)
	if err != nil {
		t.Fatal(err)
	}
	gone, err := w.m.Setup(ctx, "sbx_gone", network.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	s := fakenet.Open(t, id, a.NetNSPath())
	if body, err := get(s, a, w.ca, "https://allowed.test/"); err != nil || body != "web-a host=allowed.test" {
		t.Fatalf("before restart: %q, %v", body, err)
	}
	if err := w.m.Close(); err != nil {
		t.Fatal(err)
	}
	// The daemon is down: DNS and proxy are gone, the filter still holds.
	if _, err := s.LookupA(ctx, resolver(a), "allowed.test"); err == nil {
		t.Fatal("DNS answered with the daemon down")
	}
	if out, err := dialRead(s, webB+":8080"); err == nil || out != "" {
		t.Fatalf("filter let %q through with the daemon down", out)
	}
	// A namespace that vanished meanwhile (e.g. a reboot).
	if err := unmountForTest(gone.NetNSPath()); err != nil {
		t.Fatal(err)
	}

	w.m = w.newManager(t)
	if got := w.m.Known(); !slices.Equal(got, []string{"sbx_gone", id}) {
		t.Fatalf("Known() = %v", got)
	}
	if err := w.m.Recover(ctx, "sbx_gone", network.Policy{}); !errdefs.IsNotFound(err) {
		t.Fatalf("Recover of a vanished namespace = %v, want not found", err)
	}
	if err := w.m.Teardown(ctx, "sbx_gone"); err != nil {
		t.Fatal(err)
	}
	if err := w.m.Recover(ctx, "sbx_never", network.Policy{}); !errdefs.IsNotFound(err) {
		t.Fatalf("Recover of an unknown sandbox = %v, want not found", err)
	}
	if err := w.m.Recover(ctx, id, p); err != nil {
		t.Fatal(err)
	}
	a2, _ := w.m.Attachment(id)
	if body, err := get(s, a2, w.ca, "https://allowed.test/"); err != nil || body != "web-a host=allowed.test" {
		t.Fatalf("after recover: %q, %v", body, err)
	}
	if _, err := s.LookupA(ctx, resolver(a2), "denied.test"); !fakenet.IsNXDOMAIN(err) {
		t.Fatalf("after recover, unlisted lookup: %v", err)
	}
	s.Close()
	if err := w.m.Teardown(ctx, id); err != nil {
		t.Fatal(err)
	}
	if chains, entries, _ := w.nftChains(t); !slices.Equal(chains, baseChains) || entries != 0 {
		t.Errorf("nft chains %v, map entries %d", chains, entries)
	}
}

func unmountForTest(path string) error {
	return unix.Unmount(path, unix.MNT_DETACH)
}

// TestSetupRollback: a Setup that fails half way leaves nothing behind.
func TestSetupRollback(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	hostLinks := w.host.Links(t)
	w.cfg.MTU = 1 << 20 // no veth can have it: wiring fails after the namespace exists
	if err := w.m.Close(); err != nil {
		t.Fatal(err)
	}
	w.m = w.newManager(t)
	// After the new manager made its state dir's mount point: what the
	// failed Setup leaves is the question, not a remount by New.
	snap := hostcheck.Take(t, w.stateDir)
	if _, err := w.m.Setup(ctx, "sbx_fail", network.Policy{Mode: network.ModeOpen}); err == nil {
		t.Fatal("Setup with an impossible MTU succeeded")
	}
	if got := w.m.Known(); len(got) != 0 {
		t.Errorf("Known() after a failed Setup = %v", got)
	}
	if got := w.host.Links(t); !slices.Equal(got, hostLinks) {
		t.Errorf("host links = %v, want %v", got, hostLinks)
	}
	if chains, entries, _ := w.nftChains(t); !slices.Equal(chains, baseChains) || entries != 0 {
		t.Errorf("nft chains %v, map entries %d", chains, entries)
	}
	snap.AssertNoLeaks(t)
	// Mode none needs no veth and still works.
	w.sandbox(t, "sbx_ok", network.Policy{})
}

// TestSweep: a Manager started over state a crashed daemon left without
// state files removes the orphans.
func TestSweep(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	hostLinks := w.host.Links(t)
	if _, err := w.m.Setup(ctx, "sbx_orphan", network.Policy{Mode: network.ModeOpen}); err != nil {
		t.Fatal(err)
	}
	if err := w.m.Close(); err != nil {
		t.Fatal(err)
	}
	// The crash lost the state file.
	if err := os.Remove(w.stateDir + "/sandboxes/sbx_orphan.json"); err != nil {
		t.Fatal(err)
	}
	w.m = w.newManager(t)
	if got := w.m.Known(); len(got) != 0 {
		t.Fatalf("Known() = %v", got)
	}
	if got := w.host.Links(t); !slices.Equal(got, hostLinks) {
		t.Errorf("host links = %v, want %v", got, hostLinks)
	}
	if chains, entries, _ := w.nftChains(t); !slices.Equal(chains, baseChains) || entries != 0 {
		t.Errorf("nft chains %v, map entries %d", chains, entries)
	}
	if _, err := os.Stat(w.stateDir + "/netns/sbx_orphan"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("orphan namespace mount point: %v", err)
	}
	if _, err := os.Stat(w.stateDir + "/sandboxes/sbx_orphan.resolv.conf"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("orphan resolv.conf: %v", err)
	}
}
