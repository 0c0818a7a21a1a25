package httpapi_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/network"
	"github.com/airlockhq/airlock/internal/network/fakenet"
	"github.com/airlockhq/airlock/internal/testutil"
)

// The fake internet of the end-to-end network tests. Every address exists
// only in namespaces the test made: "host" (where airlock's network side
// lives, Config.HostNetNS) and "inet" (every server), joined by one veth.
// No packet goes anywhere else.
const (
	wHostUp  = "198.51.100.1"
	wInetUp  = "198.51.100.254"
	wWebA    = "203.0.113.10" // allowed.test
	wWebB    = "203.0.113.11" // denied.test
	wDNS     = "203.0.113.53" // the resolver airlock asks
	wAPIPort = 7070
)

type world struct {
	host, inet *fakenet.NS
	srv        map[string]*fakenet.Server
}

func newWorld(t testing.TB) *world {
	t.Helper()
	testutil.RequiresRoot(t)
	w := &world{srv: map[string]*fakenet.Server{}}
	w.host = fakenet.New(t, "host")
	w.inet = fakenet.New(t, "inet")
	fakenet.Link(t, w.host, "up0", netip.MustParsePrefix(wHostUp+"/24"), w.inet, "eth0", netip.MustParsePrefix(wInetUp+"/24"))
	w.host.DefaultRoute(t, netip.MustParseAddr(wInetUp))
	for _, a := range []string{wWebA, wWebB, wDNS} {
		w.inet.AddAddr(t, "lo", netip.MustParsePrefix(a+"/32"))
	}
	page := func(name string) http.Handler {
		return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(rw, "%s host=%s", name, r.Host)
		})
	}
	w.srv["a80"] = w.inet.ServeHTTP(t, wWebA+":80", page("web-a"))
	w.srv["b80"] = w.inet.ServeHTTP(t, wWebB+":80", page("web-b"))
	w.srv["b8080"] = w.inet.ServeTCP(t, wWebB+":8080", "web-b-8080")
	w.srv["dns"] = w.inet.ServeDNS(t, wDNS+":53", map[string][]string{"allowed.test": {wWebA}, "denied.test": {wWebB}})
	return w
}

// netConfig is the sandbox network's configuration in this world.
func (w *world) netConfig(stateDir string) network.Config {
	return network.Config{
		StateDir:   stateDir,
		HostNetNS:  w.host.Path(),
		Upstream:   []string{wDNS + ":53"},
		APIPorts:   []uint16{wAPIPort},
		Registries: map[string][]string{"pypi": {"pypi.test"}, "debian": {"deb.test"}, "npm": {"npm.test"}, "goproxy": {"go.test"}},
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

func (w *world) hits(key string) int64 { return w.srv[key].Hits() }

// fetch is a python program that prints what it got from its URL or the
// name of the exception, and how long it took.
func fetch(url string) []string {
	return []string{"python3", "-c", `import sys, time, urllib.request
t = time.time()
try:
    print("OK", urllib.request.urlopen(sys.argv[1], timeout=8).read().decode(), end="")
except Exception as e:
    print("FAIL", type(e).__name__, str(e)[:120], end="")
print(" secs=%.1f" % (time.time() - t))`, url}
}

// connect is a python program that connects to addr and prints what it read.
func connect(host string, port int) []string {
	return []string{"python3", "-c", `import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
    print("OK", s.recv(100).decode())
except Exception as e:
    print("FAIL", type(e).__name__)`, host, fmt.Sprint(port)}
}

// useResolver checks that the sandbox's /etc/resolv.conf names its
// resolver: the runc driver mounts Spec.ResolvConfPath there.
func (e *e2e) useResolver(t *testing.T, id string) {
	t.Helper()
	res := e.h.exec("acme", id, api.ExecRequest{Cmd: []string{"cat", "/etc/resolv.conf"}})
	if !strings.Contains(strp(res.Stdout), "nameserver") {
		t.Fatalf("the sandbox's resolv.conf names no resolver: %q", strp(res.Stdout))
	}
}

// egress returns the sandbox's egress events as acme sees them.
func (e *e2e) egress(t *testing.T, id string) []api.EgressAuditDetail {
	t.Helper()
	var out []api.EgressAuditDetail
	for _, ev := range e.h.auditAll(e.h.key("acme"), "type=egress&sandbox_id="+id, 0) {
		var d api.EgressAuditDetail
		if err := json.Unmarshal(ev.Detail, &d); err != nil {
			t.Fatal(err)
		}
		if ev.Tenant != "acme" {
			t.Fatalf("egress event of tenant %q", ev.Tenant)
		}
		out = append(out, d)
	}
	return out
}

// waitEgress waits for an egress event matching pred.
func (e *e2e) waitEgress(t *testing.T, id, what string, pred func(api.EgressAuditDetail) bool) api.EgressAuditDetail {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		evs := e.egress(t, id)
		for _, d := range evs {
			if pred(d) {
				return d
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no egress event %s; have %+v", what, evs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// hostNetState lists the veths and nftables chains of airlock in the
// world's host namespace.
func (w *world) hostNetState(t *testing.T) (links, chains []string) {
	t.Helper()
	for _, l := range w.host.Links(t) {
		if strings.HasPrefix(l, network.DefaultIfPrefix) {
			links = append(links, l)
		}
	}
	c, err := nftables.New(nftables.WithNetNSFd(w.host.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	all, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range all {
		if ch.Table.Name == network.DefaultTable {
			chains = append(chains, ch.Name)
		}
	}
	slices.Sort(chains)
	return links, chains
}

// TestE2ENetworkAllowlist: through the real HTTP server and runc, a
// sandbox with an allowlist reaches the listed name and nothing else, every
// attempt is audited, a policy change to none blocks at once, a restart
// re-adopts the sandbox with its network, and deleting it leaves no
// namespace, veth or rule behind.
func TestE2ENetworkAllowlist(t *testing.T) {
	w := newWorld(t)
	e := newE2E(t, e2eWorld(w))
	h := e.h
	_, baseChains := w.hostNetState(t)
	sb := h.create("acme", api.CreateSandboxRequest{Network: &api.Network{Mode: "allowlist", Allow: []string{"allowed.test"}}})
	if sb.Network.Mode != "allowlist" || !slices.Equal(sb.Network.Allow, []string{"allowed.test"}) {
		t.Fatalf("created %+v", sb.Network)
	}
	e.useResolver(t, sb.ID)

	t.Run("allowed_name", func(t *testing.T) {
		before := w.hits("a80")
		res := h.exec("acme", sb.ID, api.ExecRequest{Cmd: fetch("http://allowed.test/")})
		if !strings.HasPrefix(strp(res.Stdout), "OK web-a host=allowed.test") {
			t.Fatalf("fetch allowed.test: %q %q", strp(res.Stdout), strp(res.Stderr))
		}
		if w.hits("a80") != before+1 {
			t.Fatalf("allowed server hits %d → %d", before, w.hits("a80"))
		}
		e.waitEgress(t, sb.ID, "dns allowed.test allowed", func(d api.EgressAuditDetail) bool {
			return d.Kind == "dns" && d.Domain == "allowed.test" && d.Allowed && d.IP == wWebA
		})
		d := e.waitEgress(t, sb.ID, "http allowed.test allowed", func(d api.EgressAuditDetail) bool {
			return d.Kind == "http" && d.Domain == "allowed.test" && d.Allowed && d.IP == wWebA && d.Port == 80
		})
		if d.BytesIn <= 0 || d.BytesOut <= 0 || d.Reason != "allowed" {
			t.Errorf("allowed connection event %+v", d)
		}
	})
	t.Run("unlisted_name", func(t *testing.T) {
		before := w.hits("b80")
		res := h.exec("acme", sb.ID, api.ExecRequest{Cmd: fetch("http://denied.test/")})
		if !strings.HasPrefix(strp(res.Stdout), "FAIL") {
			t.Fatalf("fetch denied.test: %q", strp(res.Stdout))
		}
		if w.hits("b80") != before {
			t.Fatal("the unlisted server was reached")
		}
		e.waitEgress(t, sb.ID, "dns denied.test denied", func(d api.EgressAuditDetail) bool {
			return d.Kind == "dns" && d.Domain == "denied.test" && !d.Allowed && d.Reason == "not_allowed"
		})
	})
	t.Run("unlisted_address", func(t *testing.T) {
		before := w.hits("b8080")
		res := h.exec("acme", sb.ID, api.ExecRequest{Cmd: connect(wWebB, 8080)})
		if !strings.HasPrefix(strp(res.Stdout), "FAIL") || w.hits("b8080") != before {
			t.Fatalf("direct connection: %q, hits %d → %d", strp(res.Stdout), before, w.hits("b8080"))
		}
		e.waitEgress(t, sb.ID, "connect webB:8080 denied", func(d api.EgressAuditDetail) bool {
			return d.Kind == "connect" && d.IP == wWebB && d.Port == 8080 && !d.Allowed && d.Reason == "not_allowed"
		})
	})
	t.Run("restart_readopts_the_network", func(t *testing.T) {
		e.stop()
		e.start()
		if got := h.state("acme", sb.ID); got.State != api.StateRunning || got.Network.Mode != "allowlist" {
			t.Fatalf("after restart: %+v", got)
		}
		res := h.exec("acme", sb.ID, api.ExecRequest{Cmd: fetch("http://allowed.test/")})
		if !strings.HasPrefix(strp(res.Stdout), "OK web-a") {
			t.Fatalf("fetch after restart: %q %q", strp(res.Stdout), strp(res.Stderr))
		}
		res = h.exec("acme", sb.ID, api.ExecRequest{Cmd: fetch("http://denied.test/")})
		if !strings.HasPrefix(strp(res.Stdout), "FAIL") {
			t.Fatalf("denied after restart: %q", strp(res.Stdout))
		}
	})
	t.Run("switch_to_none_blocks_at_once", func(t *testing.T) {
		r := h.req("PUT", "/v1/sandboxes/"+sb.ID+"/network", h.key("acme"), api.Network{Mode: "none"})
		h.expect(r, http.StatusOK, "")
		before := w.hits("a80")
		res := h.exec("acme", sb.ID, api.ExecRequest{Cmd: fetch("http://allowed.test/")})
		out := strp(res.Stdout)
		if !strings.HasPrefix(out, "FAIL") || w.hits("a80") != before {
			t.Fatalf("fetch after switching to none: %q (hits %d → %d)", out, before, w.hits("a80"))
		}
		if strings.Contains(out, "timed out") || strings.Contains(out, "secs=8") {
			t.Fatalf("blocked only by a timeout: %q", out)
		}
		res = h.exec("acme", sb.ID, api.ExecRequest{Cmd: connect(wWebA, 80)})
		if !strings.HasPrefix(strp(res.Stdout), "FAIL") || w.hits("a80") != before {
			t.Fatalf("direct connection after switching to none: %q", strp(res.Stdout))
		}
		evs := h.auditAll(h.key("acme"), "type=network_update&sandbox_id="+sb.ID, 0)
		if len(evs) != 1 || evs[0].RequestID != r.Header.Get("X-Request-Id") {
			t.Fatalf("network_update events %+v", evs)
		}
	})
	t.Run("delete_leaves_nothing", func(t *testing.T) {
		h.expect(h.req("DELETE", "/v1/sandboxes/"+sb.ID, h.key("acme"), nil), http.StatusNoContent, "")
		if k := e.networks(); len(k) != 0 {
			t.Fatalf("network state left: %v", k)
		}
		links, chains := w.hostNetState(t)
		if len(links) != 0 || !slices.Equal(chains, baseChains) {
			t.Fatalf("left in the host namespace: links %v, chains %v (base %v)", links, chains, baseChains)
		}
		// Mounts and files under the data dir: newE2E's leak check.
	})
}
