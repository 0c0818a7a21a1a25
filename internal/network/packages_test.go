package network_test

import (
	"archive/zip"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/network"
	"github.com/airlockhq/airlock/internal/network/fakenet"
	"github.com/airlockhq/airlock/internal/pkgcache"
)

// The fake registries: a PyPI-shaped one over TLS (index and files) and a
// Debian mirror over plain HTTP, both on pkgAddr of the fake internet.
const pkgAddr = "203.0.113.30"

func init() {
	zone["reg.test"] = []string{pkgAddr}
	zone["deb.test"] = []string{pkgAddr}
}

var (
	// wheelBody is a real wheel of demo-pkg 1.0.0 (a 20000-byte data file,
	// stored uncompressed, so that it weighs on the download cap).
	wheelBody = makeWheel()
	debBody   = strings.Repeat("D", 8000)
)

// makeWheel builds demo_pkg-1.0.0-py3-none-any.whl.
func makeWheel() string {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	files := []struct{ name, body string }{
		{"demo_pkg/__init__.py", "VALUE = 42\n"},
		{"demo_pkg/data.txt", strings.Repeat("W", 20000)},
		{"demo_pkg-1.0.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0.0\n"},
		{"demo_pkg-1.0.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: airlock-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var record strings.Builder
	for _, f := range files {
		w, _ := zw.CreateHeader(&zip.FileHeader{Name: f.name, Method: zip.Store})
		io.WriteString(w, f.body)
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	record.WriteString("demo_pkg-1.0.0.dist-info/RECORD,,\n")
	w, _ := zw.Create("demo_pkg-1.0.0.dist-info/RECORD")
	io.WriteString(w, record.String())
	zw.Close()
	return buf.String()
}

func wheelSHA256() string {
	sum := sha256.Sum256([]byte(wheelBody))
	return hex.EncodeToString(sum[:])
}

// fakeRegistry counts requests by path.
type fakeRegistry struct {
	mu   sync.Mutex
	hits map[string]int
}

func (f *fakeRegistry) count(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hits[path]
}

func (f *fakeRegistry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.hits[r.URL.Path]++
	f.mu.Unlock()
	switch r.URL.Path {
	case "/simple/demo-pkg/":
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!DOCTYPE html><html><body><a href="https://reg.test/files/demo_pkg-1.0.0-py3-none-any.whl#sha256=%s">demo_pkg-1.0.0-py3-none-any.whl</a></body></html>`, wheelSHA256())
	case "/files/demo_pkg-1.0.0-py3-none-any.whl":
		io.WriteString(w, wheelBody)
	case "/debian/pool/main/h/hello/hello_2.10-3_amd64.deb":
		io.WriteString(w, debBody)
	case "/debian/dists/bookworm/InRelease":
		io.WriteString(w, "release")
	default:
		http.NotFound(w, r)
	}
}

// newPkgWorld is the fake internet with the registries, and a Manager
// with a package cache and a download cap of capBytes.
func newPkgWorld(t *testing.T, capBytes int64) (*world, *fakeRegistry, *pkgEvents) {
	w := newWorld(t)
	reg := &fakeRegistry{hits: map[string]int{}}
	w.inet.AddAddr(t, "lo", netip.MustParsePrefix(pkgAddr+"/32"))
	w.inet.ServeTLS(t, pkgAddr+":443", w.ca, []string{"reg.test"}, reg)
	w.inet.ServeHTTP(t, pkgAddr+":80", reg)

	store, err := pkgcache.OpenStore(t.TempDir(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	pe := &pkgEvents{}
	if err := w.m.Close(); err != nil {
		t.Fatal(err)
	}
	w.cfg.Registries = map[string][]string{"pypi": {"reg.test"}, "debian": {"deb.test"}}
	w.cfg.Upstreams = map[string]string{
		pkgcache.RegPyPI: "https://reg.test", pkgcache.RegPyPIFiles: "https://reg.test/files",
		pkgcache.RegDebian: "http://deb.test/debian",
	}
	w.cfg.PackageCache = store
	w.cfg.UpstreamTLS = &tls.Config{RootCAs: w.ca.Pool()}
	w.cfg.PackageAudit = pe.add
	w.cfg.MaxDownloadBytes = capBytes
	w.m = w.newManager(t)
	return w, reg, pe
}

type pkgEvents struct {
	mu  sync.Mutex
	evs []pkgcache.Event
}

func (p *pkgEvents) add(e pkgcache.Event) {
	p.mu.Lock()
	p.evs = append(p.evs, e)
	p.mu.Unlock()
}

func (p *pkgEvents) list() []pkgcache.Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]pkgcache.Event(nil), p.evs...)
}

// fetch GETs url from inside the sandbox.
func fetch(t *testing.T, s *fakenet.NS, a *network.Attachment, ca *fakenet.CA, url string) (int, string, http.Header, error) {
	t.Helper()
	c := s.HTTPClient(resolver(a), ca)
	defer c.CloseIdleConnections()
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header, err
}

var pkgPolicy = network.Policy{Mode: network.ModeAllowlist, Registries: []string{"debian", "pypi"}, Allow: []string{"allowed.test"}}

func TestPackageMirrorCachesAndAudits(t *testing.T) {
	w, reg, pe := newPkgWorld(t, 0)
	a, s := w.sandbox(t, "pkg1", pkgPolicy)

	env := w.m.PackageEnv(a.Policy())
	index := env["PIP_INDEX_URL"]
	if index != "http://"+network.PackageHost+"/pypi/simple/" || env["PIP_TRUSTED_HOST"] != network.PackageHost {
		t.Fatalf("package env %v", env)
	}
	code, body, _, err := fetch(t, s, a, w.ca, index+"demo-pkg/")
	if err != nil || code != 200 {
		t.Fatalf("index: %d %v", code, err)
	}
	wheel := "http://" + network.PackageHost + "/pypi/files/demo_pkg-1.0.0-py3-none-any.whl"
	if !strings.Contains(body, wheel) {
		t.Fatalf("index links not rewritten: %s", body)
	}
	for i, want := range []string{"miss", "hit"} {
		code, body, hdr, err := fetch(t, s, a, w.ca, wheel)
		if err != nil || code != 200 || body != wheelBody || hdr.Get("X-Airlock-Cache") != want {
			t.Fatalf("wheel %d: %d %v cache=%q len=%d", i, code, err, hdr.Get("X-Airlock-Cache"), len(body))
		}
	}
	if n := reg.count("/files/demo_pkg-1.0.0-py3-none-any.whl"); n != 1 {
		t.Fatalf("upstream saw the wheel %d times, want 1", n)
	}

	// apt's plain HTTP to the Debian mirror is cached transparently.
	deb := "http://deb.test/debian/pool/main/h/hello/hello_2.10-3_amd64.deb"
	for i := range 2 {
		code, body, _, err := fetch(t, s, a, w.ca, deb)
		if err != nil || code != 200 || body != debBody {
			t.Fatalf("deb %d: %d %v len=%d", i, code, err, len(body))
		}
	}
	if n := reg.count("/debian/pool/main/h/hello/hello_2.10-3_amd64.deb"); n != 1 {
		t.Fatalf("upstream saw the deb %d times, want 1", n)
	}
	// Index files are not cached: apt revalidates them.
	for range 2 {
		if code, body, _, _ := fetch(t, s, a, w.ca, "http://deb.test/debian/dists/bookworm/InRelease"); code != 200 || body != "release" {
			t.Fatalf("InRelease: %d %q", code, body)
		}
	}
	if n := reg.count("/debian/dists/bookworm/InRelease"); n != 2 {
		t.Fatalf("InRelease reached upstream %d times, want 2", n)
	}

	var got []string
	for _, e := range pe.list() {
		got = append(got, fmt.Sprintf("%s %s %s %s cached=%v allowed=%v", e.SandboxID, e.Registry, e.Name, e.Version, e.Cached, e.Allowed))
	}
	want := []string{
		"pkg1 pypi demo-pkg 1.0.0 cached=false allowed=true",
		"pkg1 pypi demo-pkg 1.0.0 cached=true allowed=true",
		"pkg1 debian hello 2.10-3 cached=false allowed=true",
		"pkg1 debian hello 2.10-3 cached=true allowed=true",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("package events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestPackageMirrorRefusesWhatPolicyDoesNot(t *testing.T) {
	w, reg, _ := newPkgWorld(t, 0)
	// Only debian: the PyPI mirror answers 403, and offline gets no
	// mirror name at all.
	a, s := w.sandbox(t, "pkg2", network.Policy{Mode: network.ModeAllowlist, Registries: []string{"debian"}})
	code, _, _, err := fetch(t, s, a, w.ca, "http://"+network.PackageHost+"/pypi/files/demo_pkg-1.0.0-py3-none-any.whl")
	if err != nil || code != http.StatusForbidden {
		t.Fatalf("pypi not allowed: %d %v", code, err)
	}
	if reg.count("/files/demo_pkg-1.0.0-py3-none-any.whl") != 0 {
		t.Fatal("a refused registry reached upstream")
	}
	if env := w.m.PackageEnv(a.Policy()); env["PIP_INDEX_URL"] != "" {
		t.Fatalf("env for a registry the policy does not allow: %v", env)
	}
	b, sb := w.sandbox(t, "pkg3", network.Policy{Mode: network.ModeAllowlist, Offline: true})
	if code, _, _, err := fetch(t, sb, b, w.ca, "http://"+network.PackageHost+"/debian/pool/main/h/hello/hello_2.10-3_amd64.deb"); err != nil || code != http.StatusForbidden {
		t.Fatalf("offline sandbox: %d %v", code, err)
	}
	if env := w.m.PackageEnv(b.Policy()); len(env) != 0 {
		t.Fatalf("offline env %v", env)
	}
	if reg.count("/debian/pool/main/h/hello/hello_2.10-3_amd64.deb") != 0 {
		t.Fatal("an offline sandbox's request reached upstream")
	}
}

func TestDownloadCap(t *testing.T) {
	// 20000 (wheel) + 8000 (deb) fit in 60000; the 100000 bytes of /big
	// through the egress proxy do not, and after it nothing does.
	w, _, pe := newPkgWorld(t, 60000)
	a, s := w.sandbox(t, "pkgcap", pkgPolicy)
	wheel := "http://" + network.PackageHost + "/pypi/files/demo_pkg-1.0.0-py3-none-any.whl"
	if code, _, _, err := fetch(t, s, a, w.ca, wheel); err != nil || code != 200 {
		t.Fatalf("wheel: %d %v", code, err)
	}
	if code, _, _, err := fetch(t, s, a, w.ca, "http://deb.test/debian/pool/main/h/hello/hello_2.10-3_amd64.deb"); err != nil || code != 200 {
		t.Fatalf("deb: %d %v", code, err)
	}
	if used := a.Budget().Used(); used < int64(len(wheelBody)+len(debBody)) {
		t.Fatalf("budget used %d, want the wheel and the deb counted", used)
	}
	_, body, _, err := fetch(t, s, a, w.ca, "http://allowed.test/big")
	if err == nil && len(body) == 100000 {
		t.Fatal("the egress proxy relayed a transfer over the cap in full")
	}
	w.audit.wait(t, "proxied transfer cut at the cap", ev("pkgcap", network.KindHTTP, "allowed.test", "", 0, false, network.ReasonDownloadCap))
	if used := a.Budget().Used(); used > 60000 {
		t.Fatalf("budget used %d, over the cap", used)
	}
	code, body, _, err := fetch(t, s, a, w.ca, wheel)
	if err != nil || code != http.StatusInsufficientStorage || !strings.Contains(body, "download cap") {
		t.Fatalf("mirror after the cap: %d %v %q", code, err, body)
	}
	evs := pe.list()
	if last := evs[len(evs)-1]; last.Allowed || last.Reason != pkgcache.ReasonCap || last.Name != "demo-pkg" {
		t.Fatalf("cap event %+v", last)
	}
	// Proxied connections are refused from the start now.
	if code, _, _, err := fetch(t, s, a, w.ca, "http://allowed.test/"); err == nil && code == 200 {
		t.Fatal("proxy relayed after the cap")
	}
}

// TestPipThroughMirror runs the host's real pip inside a sandbox's network
// namespace, pointed at the mirror as PackageEnv says (by the gateway's
// address: the host's resolv.conf is not the sandbox's), twice: the wheel
// is downloaded and verified both times and fetched upstream once.
func TestPipThroughMirror(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on this host")
	}
	if out, err := exec.Command(py, "-m", "pip", "--version").CombinedOutput(); err != nil {
		t.Skipf("no pip on this host: %s", out)
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		t.Skip("no nsenter on this host")
	}
	w, reg, pe := newPkgWorld(t, 0)
	a, _ := w.sandbox(t, "pip1", pkgPolicy)
	gw := a.Gateway().String()
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "PIP_NO_CACHE_DIR=1", "PIP_CONFIG_FILE=/dev/null",
		"PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_NO_INPUT=1"}
	for k, v := range w.m.PackageEnv(a.Policy()) {
		env = append(env, k+"="+strings.ReplaceAll(v, network.PackageHost, gw))
	}
	for i := range 2 {
		dest := t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, nsenter, "--net="+a.NetNSPath(), py, "-m", "pip", "download",
			"--no-deps", "--only-binary=:all:", "--dest", dest, "demo-pkg==1.0.0")
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("pip download %d: %v\n%s", i, err, out)
		}
		got, err := os.ReadFile(filepath.Join(dest, "demo_pkg-1.0.0-py3-none-any.whl"))
		if err != nil || string(got) != wheelBody {
			t.Fatalf("pip download %d: wheel %d bytes, %v\n%s", i, len(got), err, out)
		}
	}
	if n := reg.count("/files/demo_pkg-1.0.0-py3-none-any.whl"); n != 1 {
		t.Fatalf("upstream saw the wheel %d times, want 1", n)
	}
	var cached []bool
	for _, e := range pe.list() {
		if e.Name != "demo-pkg" || e.Version != "1.0.0" || !e.Allowed {
			t.Fatalf("event %+v", e)
		}
		cached = append(cached, e.Cached)
	}
	if fmt.Sprint(cached) != "[false true]" {
		t.Fatalf("cached flags %v, want [false true]", cached)
	}
}

// TestTransparentMirrorOneHostPerConnection: the proxy checked the first
// request's Host; a later request on the same connection naming another
// host must not make the mirror fetch from it.
func TestTransparentMirrorOneHostPerConnection(t *testing.T) {
	w, reg, _ := newPkgWorld(t, 0)
	_, s := w.sandbox(t, "pkgfront", network.Policy{Mode: network.ModeAllowlist, Registries: []string{"debian"}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := s.Dial(ctx, "tcp4", pkgAddr+":80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET /debian/dists/bookworm/InRelease HTTP/1.1\r\nHost: deb.test\r\n\r\n"+
		"GET /debian/pool/main/h/hello/hello_2.10-3_amd64.deb HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
	br := bufio.NewReader(c)
	first, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(first.Body)
	if first.StatusCode != 200 || string(body) != "release" {
		t.Fatalf("first request: %d %q", first.StatusCode, body)
	}
	second, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, second.Body)
	if second.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("second request naming another host: %d", second.StatusCode)
	}
	if reg.count("/debian/pool/main/h/hello/hello_2.10-3_amd64.deb") != 0 || w.hits(webA+":80") != 0 {
		t.Fatal("a request for another host went upstream")
	}
}
