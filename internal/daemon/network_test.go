package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/network"
	"github.com/airlockhq/airlock/internal/network/fakenet"
	"github.com/airlockhq/airlock/internal/testutil"
)

// The fake internet of the daemon's network tests: a "host" namespace for
// airlock's network side and an "inet" namespace with a fake Debian
// registry (deb.test), an unlisted server (denied.test) and the resolver.
// Nothing leaves these namespaces.
const (
	fHostUp = "198.51.100.1"
	fInetUp = "198.51.100.254"
	fDeb    = "203.0.113.30"
	fDenied = "203.0.113.11"
	fDNS    = "203.0.113.53"
)

const fakeDeb = "!<arch>\nfake hello 1.0 package\n"

type fakeWorld struct {
	host, inet   *fakenet.NS
	deb, denied  *fakenet.Server
	debRequested chan string
}

func newFakeWorld(t *testing.T) *fakeWorld {
	t.Helper()
	testutil.RequiresRoot(t)
	w := &fakeWorld{debRequested: make(chan string, 16)}
	w.host = fakenet.New(t, "host")
	w.inet = fakenet.New(t, "inet")
	fakenet.Link(t, w.host, "up0", netip.MustParsePrefix(fHostUp+"/24"), w.inet, "eth0", netip.MustParsePrefix(fInetUp+"/24"))
	w.host.DefaultRoute(t, netip.MustParseAddr(fInetUp))
	for _, a := range []string{fDeb, fDenied, fDNS} {
		w.inet.AddAddr(t, "lo", netip.MustParsePrefix(a+"/32"))
	}
	w.deb = w.inet.ServeHTTP(t, fDeb+":80", http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		select {
		case w.debRequested <- r.Host + r.URL.Path:
		default:
		}
		if !strings.HasPrefix(r.URL.Path, "/debian/pool/") {
			http.NotFound(rw, r)
			return
		}
		rw.Write([]byte(fakeDeb))
	}))
	w.denied = w.inet.ServeHTTP(t, fDenied+":80", http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Write([]byte("unlisted"))
	}))
	w.inet.ServeDNS(t, fDNS+":53", map[string][]string{"deb.test": {fDeb}, "denied.test": {fDenied}})
	return w
}

// options makes the daemon's network live in the world.
func (w *fakeWorld) options() Options {
	return Options{Network: func(c *network.Config) {
		c.HostNetNS = w.host.Path()
		c.Upstream = []string{fDNS + ":53"}
		c.Registries = map[string][]string{"debian": {"deb.test"}, "pypi": {"pypi.test"}, "npm": {"npm.test"}, "goproxy": {"go.test"}}
	}}
}

// fetchPy runs in a RUN step: it fetches a package from the debian
// registry set and proves an unlisted host unreachable. Until the runc
// driver mounts the build sandbox's resolv.conf, it names the resolver
// (the sandbox's gateway) itself.
const fetchPy = `import socket, struct, sys, urllib.request
if "nameserver" not in open("/etc/resolv.conf").read():
    for line in open("/proc/net/route").read().splitlines()[1:]:
        f = line.split()
        if f[1] == "00000000":
            gw = socket.inet_ntoa(struct.pack("<L", int(f[2], 16)))
            open("/etc/resolv.conf", "w").write("nameserver %s\n" % gw)
            print("wrote resolv.conf naming", gw)
data = urllib.request.urlopen("http://deb.test/debian/pool/main/h/hello/hello_1.0_amd64.deb", timeout=10).read()
open("/opt/hello.deb", "wb").write(data)
print("fetched", len(data), "bytes")
try:
    urllib.request.urlopen("http://denied.test/", timeout=5).read()
    sys.exit("reached an unlisted host")
except Exception as e:
    print("unlisted host blocked:", type(e).__name__)
`

// TestBuildReachesRegistriesOnly: through the daemon, a template build's
// RUN step reaches the package registry sets (here a fake Debian mirror)
// and nothing else, and its egress is in the tenant's audit trail.
func TestBuildReachesRegistriesOnly(t *testing.T) {
	w := newFakeWorld(t)
	admin, tc, _, _, _ := templateDaemonWith(t, w.options())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	spec := "FROM base\nCOPY fetch.py /tmp/\nRUN python3 /tmp/fetch.py\n"
	st, err := tc.BuildTemplate(ctx, api.TemplateBuildRequest{Name: "withpkg", Dockerfile: spec},
		client.BuildUploads{Context: bytes.NewReader(tarOf(t, map[string]string{"fetch.py": fetchPy}))})
	if err != nil {
		t.Fatal(err)
	}
	var logBuf bytes.Buffer
	b, err := tc.FollowTemplateBuild(ctx, st.BuildID, &logBuf)
	if err != nil {
		t.Fatal(err)
	}
	if b.Status != api.BuildReady {
		t.Fatalf("build %+v:\n%s", b, logBuf.String())
	}
	if !strings.Contains(logBuf.String(), fmt.Sprintf("fetched %d bytes", len(fakeDeb))) || !strings.Contains(logBuf.String(), "unlisted host blocked") {
		t.Fatalf("build log:\n%s", logBuf.String())
	}
	if w.deb.Hits() != 1 || w.denied.Hits() != 0 {
		t.Fatalf("registry hits %d (want 1), unlisted hits %d (want 0)", w.deb.Hits(), w.denied.Hits())
	}
	if got := <-w.debRequested; got != "deb.test/debian/pool/main/h/hello/hello_1.0_amd64.deb" {
		t.Fatalf("registry saw %q", got)
	}

	// The fetched package is in the template.
	sbx, err := tc.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "withpkg"})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.DeleteSandbox(ctx, sbx.ID)
	res, err := tc.Exec(ctx, sbx.ID, api.ExecRequest{Cmd: []string{"cat", "/opt/hello.deb"}})
	if err != nil || deref(res.Stdout) != fakeDeb {
		t.Fatalf("package in the template: %+v %v", res, err)
	}
	// Sandboxes default to mode none on this daemon.
	if sbx.Network.Mode != "none" {
		t.Fatalf("sandbox network %+v", sbx.Network)
	}

	// The build's egress is the tenant's, named by registry.
	var found, blocked bool
	for e, err := range tc.AuditEvents(ctx, client.AuditOptions{Types: []string{api.AuditEgress}}) {
		if err != nil {
			t.Fatal(err)
		}
		var d api.EgressAuditDetail
		json.Unmarshal(e.Detail, &d)
		if e.Tenant != "acme" || e.Template != "withpkg" {
			t.Errorf("egress event %+v", e)
		}
		found = found || (d.Kind == "http" && d.Domain == "deb.test" && d.Allowed && d.Registry == "debian")
		blocked = blocked || (d.Kind == "dns" && d.Domain == "denied.test" && !d.Allowed)
	}
	if !found || !blocked {
		t.Fatalf("audit: registry fetch %v, blocked lookup %v", found, blocked)
	}
	// The daemon exports the audit writer's counters: nothing dropped.
	req, _ := http.NewRequestWithContext(ctx, "GET", admin.BaseURL()+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer admin-key-for-the-template-tests-0123")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	body.ReadFrom(resp.Body)
	if !strings.Contains(body.String(), "airlock_audit_events_dropped_total 0") || strings.Contains(body.String(), "airlock_audit_events_written_total 0\n") {
		t.Fatalf("audit metrics:\n%s", grepLines(body.String(), "airlock_audit"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
