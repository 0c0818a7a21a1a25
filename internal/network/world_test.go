package network_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"go.uber.org/goleak"

	"github.com/airlockhq/airlock/internal/network"
	"github.com/airlockhq/airlock/internal/network/fakenet"
	"github.com/airlockhq/airlock/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The fake internet. Every address below exists only inside namespaces the
// test made: the "host" (where the Manager's host side lives) and "inet"
// (every server), joined by one veth. No test sends a packet anywhere else.
const (
	hostUp  = "198.51.100.1"   // the host's uplink address (a host address, not private)
	inetUp  = "198.51.100.254" // the fake internet's side of the uplink
	webA    = "203.0.113.10"   // allowed.test, *.wild.test, wild.test, pypi.test
	webB    = "203.0.113.11"   // denied.test
	dbHost  = "203.0.113.20"   // a public TCP service for CIDR:port entries
	dnsAddr = "203.0.113.53"   // the upstream resolver airlock uses
	rogue   = "203.0.113.54"   // a resolver the sandbox must not reach
	meta    = "169.254.169.254"
	priv    = "10.1.2.3"    // a private-range server; rebind.test points here
	lan     = "192.168.7.7" // another private-range server
	apiPort = 7070          // "airlock's API" on the host
	sshPort = 2222          // another host service
)

var zone = map[string][]string{
	"allowed.test":  {webA},
	"wild.test":     {webA},
	"*.wild.test":   {webA},
	"pypi.test":     {webA},
	"denied.test":   {webB},
	"rebind.test":   {priv},
	"meta.test":     {meta},
	"hostaddr.test": {hostUp},
	"db.test":       {dbHost},
}

type world struct {
	host, inet *fakenet.NS
	m          *network.Manager
	cfg        network.Config
	audit      *auditLog
	ca         *fakenet.CA
	stateDir   string
	srv        map[string]*fakenet.Server // by "addr:port"
}

// newWorld builds the fake internet and a Manager whose host side lives in
// the test's host namespace.
func newWorld(tb testing.TB) *world {
	tb.Helper()
	testutil.RequiresRoot(tb)
	w := &world{audit: &auditLog{}, ca: fakenet.NewCA(tb), srv: map[string]*fakenet.Server{}}
	w.host = fakenet.New(tb, "host")
	w.inet = fakenet.New(tb, "inet")
	fakenet.Link(tb, w.host, "up0", netip.MustParsePrefix(hostUp+"/24"), w.inet, "eth0", netip.MustParsePrefix(inetUp+"/24"))
	w.host.DefaultRoute(tb, netip.MustParseAddr(inetUp))
	for _, a := range []string{webA, webB, dbHost, dnsAddr, rogue, meta, priv, lan} {
		w.inet.AddAddr(tb, "lo", netip.MustParsePrefix(a+"/32"))
	}
	page := func(name string) http.Handler {
		return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/big" {
				_, _ = rw.Write([]byte(strings.Repeat("x", 100000)))
				return
			}
			fmt.Fprintf(rw, "%s host=%s", name, r.Host)
		})
	}
	w.srv[webA+":80"] = w.inet.ServeHTTP(tb, webA+":80", page("web-a"))
	w.srv[webA+":443"] = w.inet.ServeTLS(tb, webA+":443", w.ca, []string{"allowed.test", "wild.test", "*.wild.test", "*.x.wild.test", "pypi.test"}, page("web-a"))
	w.srv[webB+":80"] = w.inet.ServeHTTP(tb, webB+":80", page("web-b"))
	w.srv[webB+":443"] = w.inet.ServeTLS(tb, webB+":443", w.ca, []string{"denied.test"}, page("web-b"))
	w.srv[webB+":8080"] = w.inet.ServeTCP(tb, webB+":8080", "web-b-8080")
	w.srv[dbHost+":5432"] = w.inet.ServeTCP(tb, dbHost+":5432", "db")
	w.srv[dbHost+":8080"] = w.inet.ServeTCP(tb, dbHost+":8080", "db-8080")
	w.srv[meta+":80"] = w.inet.ServeHTTP(tb, meta+":80", page("metadata"))
	w.srv[priv+":80"] = w.inet.ServeHTTP(tb, priv+":80", page("private"))
	w.srv[priv+":443"] = w.inet.ServeTLS(tb, priv+":443", w.ca, []string{"rebind.test"}, page("private"))
	w.srv[lan+":80"] = w.inet.ServeTCP(tb, lan+":80", "lan")
	w.srv[dnsAddr+":53"] = w.inet.ServeDNS(tb, dnsAddr+":53", zone)
	w.srv[rogue+":53"] = w.inet.ServeDNS(tb, rogue+":53", map[string][]string{"allowed.test": {webB}, "denied.test": {webB}})
	w.srv["api"] = w.host.ServeTCP(tb, fmt.Sprintf("0.0.0.0:%d", apiPort), "api")
	w.srv["ssh"] = w.host.ServeTCP(tb, fmt.Sprintf("0.0.0.0:%d", sshPort), "ssh")

	w.stateDir = tb.TempDir()
	w.cfg = network.Config{
		StateDir:   w.stateDir,
		HostNetNS:  w.host.Path(),
		Upstream:   []string{dnsAddr + ":53"},
		APIPorts:   []uint16{apiPort},
		Registries: map[string][]string{"pypi": {"pypi.test"}},
		Audit:      w.audit.add,
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	w.m = w.newManager(tb)
	tb.Cleanup(func() {
		if err := w.m.Close(); err != nil {
			tb.Errorf("closing manager: %v", err)
		}
	})
	return w
}

func (w *world) newManager(tb testing.TB) *network.Manager {
	tb.Helper()
	if w.cfg.HostNetNS == "" {
		tb.Fatal("refusing to run the manager in the real host namespace")
	}
	m, err := network.New(w.cfg)
	if err != nil {
		tb.Fatalf("network.New: %v", err)
	}
	return m
}

// sandbox sets up a network for id and opens its namespace as the sandbox's
// view. Both go away at cleanup.
func (w *world) sandbox(tb testing.TB, id string, p network.Policy) (*network.Attachment, *fakenet.NS) {
	tb.Helper()
	a, err := w.m.Setup(context.Background(), id, p)
	if err != nil {
		tb.Fatalf("Setup %s: %v", id, err)
	}
	tb.Cleanup(func() {
		if err := w.m.Teardown(context.Background(), id); err != nil {
			tb.Errorf("Teardown %s: %v", id, err)
		}
	})
	return a, fakenet.Open(tb, id, a.NetNSPath())
}

// resolver is the sandbox's resolver as its resolv.conf names it.
func resolver(a *network.Attachment) string { return a.Gateway().String() + ":53" }

// get fetches url from inside the sandbox and returns the body.
func get(s *fakenet.NS, a *network.Attachment, ca *fakenet.CA, url string) (string, error) {
	c := s.HTTPClient(resolver(a), ca)
	defer c.CloseIdleConnections()
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// dialRead connects from the sandbox and reads what the server sends.
func dialRead(s *fakenet.NS, addr string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := s.Dial(ctx, "tcp4", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	b, err := io.ReadAll(c)
	if len(b) == 0 && err == nil {
		err = io.EOF
	}
	return string(b), err
}

// hits is how many connections or queries reached a fake server.
func (w *world) hits(key string) int64 { return w.srv[key].Hits() }

// nftChains lists the chains of the airlock table in the host namespace
// and the entries of its fwd map; ok is false when there is no table.
func (w *world) nftChains(tb testing.TB) (chains []string, mapEntries int, ok bool) {
	tb.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(w.host.Fd()))
	if err != nil {
		tb.Fatal(err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		tb.Fatal(err)
	}
	var table *nftables.Table
	for _, t := range tables {
		if t.Name == network.DefaultTable {
			table = t
		}
	}
	if table == nil {
		return nil, 0, false
	}
	all, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		tb.Fatal(err)
	}
	for _, ch := range all {
		if ch.Table.Name == table.Name {
			chains = append(chains, ch.Name)
		}
	}
	slices.Sort(chains)
	for _, name := range []string{"pre_map", "fwd_map", "in_map"} {
		set, err := c.GetSetByName(table, name)
		if err != nil {
			tb.Fatalf("map %s: %v", name, err)
		}
		els, err := c.GetSetElements(set)
		if err != nil {
			tb.Fatal(err)
		}
		mapEntries += len(els)
	}
	return chains, mapEntries, true
}

var baseChains = []string{"forward", "input", "postrouting", "prerouting"}

// auditLog collects the Manager's events.
type auditLog struct {
	mu  sync.Mutex
	evs []network.Event
}

func (l *auditLog) add(e network.Event) {
	l.mu.Lock()
	l.evs = append(l.evs, e)
	l.mu.Unlock()
}

func (l *auditLog) find(pred func(network.Event) bool) (network.Event, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.evs {
		if pred(e) {
			return e, true
		}
	}
	return network.Event{}, false
}

// wait returns the first event matching pred, waiting for the asynchronous
// ones (filter logs, proxied connections reported at close).
func (l *auditLog) wait(tb testing.TB, what string, pred func(network.Event) bool) network.Event {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if e, ok := l.find(pred); ok {
			return e
		}
		if time.Now().After(deadline) {
			l.mu.Lock()
			defer l.mu.Unlock()
			var b strings.Builder
			for _, e := range l.evs {
				fmt.Fprintf(&b, "\n  %+v", e)
			}
			tb.Fatalf("no audit event: %s; have:%s", what, b.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ev matches an event by sandbox, kind, domain/ip/port (zero: any) and verdict.
func ev(id, kind, domain, ip string, port int, allowed bool, reason string) func(network.Event) bool {
	return func(e network.Event) bool {
		return e.SandboxID == id && e.Kind == kind && (domain == "" || e.Domain == domain) &&
			(ip == "" || e.IP == ip) && (port == 0 || e.Port == port) && e.Allowed == allowed &&
			(reason == "" || e.Reason == reason) && !e.Time.IsZero()
	}
}

// countFDs counts the process's open descriptors but pipes: the proxy's
// relay splices, and Go keeps a pool of splice pipes that only a garbage
// collection empties.
func countFDs(tb testing.TB) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		tb.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); !strings.HasPrefix(l, "pipe:") {
			n++
		}
	}
	return n
}

func fdList(tb testing.TB) []string {
	ents, _ := os.ReadDir("/proc/self/fd")
	var out []string
	for _, e := range ents {
		l, _ := os.Readlink("/proc/self/fd/" + e.Name())
		out = append(out, e.Name()+"="+l)
	}
	return out
}
