package pkgcache

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeUpstream is a TLS registry serving PyPI-, npm-, Go proxy- and
// Debian-shaped paths, counting requests by path.
type fakeUpstream struct {
	srv   *httptest.Server
	mu    sync.Mutex
	hits  map[string]int
	gate  chan struct{} // when set, artifact answers wait for it
	blobs map[string]string
}

func newFakeUpstream(t *testing.T) *fakeUpstream {
	u := &fakeUpstream{hits: map[string]int{}, blobs: map[string]string{
		"/packages/ab/cd/demo_pkg-1.2.0-py3-none-any.whl":   strings.Repeat("W", 5000),
		"/left-pad/-/left-pad-1.3.0.tgz":                    strings.Repeat("T", 3000),
		"/example.com/!foo/@v/v1.0.0.zip":                   strings.Repeat("Z", 2000),
		"/debian/pool/main/c/curl/curl_7.88.1-10_amd64.deb": strings.Repeat("D", 4000),
		"/big/big-1.0.tar.gz":                               strings.Repeat("B", 50000),
	}}
	u.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.hits[r.URL.Path]++
		gate := u.gate
		u.mu.Unlock()
		switch {
		case r.URL.Path == "/simple/demo-pkg/":
			fmt.Fprintf(w, `<a href="%s/packages/ab/cd/demo_pkg-1.2.0-py3-none-any.whl#sha256=00">demo_pkg-1.2.0-py3-none-any.whl</a>`, u.srv.URL)
		case r.URL.Path == "/left-pad":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"name":"left-pad","versions":{"1.3.0":{"dist":{"tarball":"%s/left-pad/-/left-pad-1.3.0.tgz"}}}}`, u.srv.URL)
		case u.blobs[r.URL.Path] != "":
			if gate != nil {
				<-gate
			}
			io.WriteString(w, u.blobs[r.URL.Path])
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *fakeUpstream) count(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.hits[path]
}

type events struct {
	mu  sync.Mutex
	evs []Event
}

func (e *events) add(ev Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.evs = append(e.evs, ev)
}

func (e *events) list() []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Event(nil), e.evs...)
}

type mirrorRig struct {
	up     *fakeUpstream
	store  *Store
	mirror *Mirror
	audit  *events
	budget *Budget
	srv    *httptest.Server
}

func newMirrorRig(t *testing.T, cacheBytes, capBytes int64, allowed ...string) *mirrorRig {
	t.Helper()
	up := newFakeUpstream(t)
	st, err := OpenStore(t.TempDir(), cacheBytes)
	if err != nil {
		t.Fatal(err)
	}
	ev := &events{}
	client := up.srv.Client()
	t.Cleanup(client.CloseIdleConnections)
	m := NewMirror(Config{
		Store: st, Client: client, Audit: ev.add,
		Upstreams: map[string]string{
			RegPyPI: up.srv.URL, RegPyPIFiles: up.srv.URL, RegNPM: up.srv.URL,
			RegGoProxy: up.srv.URL, RegDebian: up.srv.URL + "/debian/",
		},
	})
	b := NewBudget(capBytes)
	sb := Sandbox{ID: "sbx_t", Budget: b, Allowed: func(reg string) bool {
		return len(allowed) == 0 || strings.Contains(strings.Join(allowed, ","), reg)
	}}
	srv := httptest.NewServer(m.Handler(sb))
	t.Cleanup(srv.Close)
	return &mirrorRig{up: up, store: st, mirror: m, audit: ev, budget: b, srv: srv}
}

func (r *mirrorRig) get(t *testing.T, path string) (int, string, http.Header) {
	t.Helper()
	resp, err := r.srv.Client().Get(r.srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func TestMirrorCachesArtifacts(t *testing.T) {
	tests := []struct {
		name, index, artifact, upstreamPath string
		pkg                                 Package
		reg                                 string
	}{
		{"PyPI", "/pypi/simple/demo-pkg/", "/pypi/files/packages/ab/cd/demo_pkg-1.2.0-py3-none-any.whl",
			"/packages/ab/cd/demo_pkg-1.2.0-py3-none-any.whl", Package{"demo-pkg", "1.2.0"}, "pypi"},
		{"NPM", "/npm/left-pad", "/npm/left-pad/-/left-pad-1.3.0.tgz", "/left-pad/-/left-pad-1.3.0.tgz", Package{"left-pad", "1.3.0"}, "npm"},
		{"GoProxy", "", "/goproxy/example.com/!foo/@v/v1.0.0.zip", "/example.com/!foo/@v/v1.0.0.zip", Package{"example.com/Foo", "v1.0.0"}, "goproxy"},
		{"Debian", "", "/debian/pool/main/c/curl/curl_7.88.1-10_amd64.deb", "/debian/pool/main/c/curl/curl_7.88.1-10_amd64.deb", Package{"curl", "7.88.1-10"}, "debian"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newMirrorRig(t, 1<<20, 0)
			if tc.index != "" {
				code, body, _ := r.get(t, tc.index)
				if code != 200 || !strings.Contains(body, r.srv.URL+tc.artifact) || strings.Contains(body, r.up.srv.URL) {
					t.Fatalf("index %d %s: links not rewritten to the mirror", code, body)
				}
			}
			for i, want := range []string{"miss", "hit", "hit"} {
				code, body, hdr := r.get(t, tc.artifact)
				if code != 200 || body != r.up.blobs[tc.upstreamPath] || hdr.Get("X-Airlock-Cache") != want {
					t.Fatalf("fetch %d: %d %q len %d, want %s", i, code, hdr.Get("X-Airlock-Cache"), len(body), want)
				}
			}
			if n := r.up.count(tc.upstreamPath); n != 1 {
				t.Fatalf("upstream saw the artifact %d times, want 1", n)
			}
			evs := r.audit.list()
			if len(evs) != 3 {
				t.Fatalf("events %+v", evs)
			}
			for i, ev := range evs {
				if ev.Package != tc.pkg || ev.Registry != tc.reg || !ev.Allowed || ev.Cached != (i > 0) || ev.Bytes != int64(len(r.up.blobs[tc.upstreamPath])) || ev.SandboxID != "sbx_t" {
					t.Fatalf("event %d: %+v", i, ev)
				}
			}
			if r.budget.Used() < 3*int64(len(r.up.blobs[tc.upstreamPath])) {
				t.Fatalf("budget counted %d bytes", r.budget.Used())
			}
		})
	}
}

func TestMirrorCoalescesConcurrentFetches(t *testing.T) {
	r := newMirrorRig(t, 1<<20, 0)
	gate := make(chan struct{})
	r.up.mu.Lock()
	r.up.gate = gate
	r.up.mu.Unlock()
	const n = 8
	var wg sync.WaitGroup
	var ok atomic.Int32
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := r.srv.Client().Get(r.srv.URL + "/npm/left-pad/-/left-pad-1.3.0.tgz")
			if err != nil {
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && len(b) == 3000 {
				ok.Add(1)
			}
		}()
	}
	// Let every client reach the mirror before the upstream answers.
	deadline := time.Now().Add(5 * time.Second)
	for r.up.count("/left-pad/-/left-pad-1.3.0.tgz") == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	close(gate)
	wg.Wait()
	if ok.Load() != n {
		t.Fatalf("%d of %d clients got the artifact", ok.Load(), n)
	}
	if c := r.up.count("/left-pad/-/left-pad-1.3.0.tgz"); c != 1 {
		t.Fatalf("upstream saw %d requests, want 1", c)
	}
}

func TestMirrorDownloadCap(t *testing.T) {
	r := newMirrorRig(t, 1<<20, 6000)
	if code, _, _ := r.get(t, "/debian/pool/main/c/curl/curl_7.88.1-10_amd64.deb"); code != 200 {
		t.Fatalf("first download: %d", code)
	}
	// 4000 of 6000 used: the 5000-byte wheel does not fit.
	code, body, _ := r.get(t, "/pypi/files/packages/ab/cd/demo_pkg-1.2.0-py3-none-any.whl")
	if code != http.StatusInsufficientStorage || !strings.Contains(body, "download cap") {
		t.Fatalf("over the cap: %d %q", code, body)
	}
	evs := r.audit.list()
	last := evs[len(evs)-1]
	if last.Allowed || last.Reason != ReasonCap || last.Name != "demo-pkg" {
		t.Fatalf("cap event %+v", last)
	}
	if r.budget.Used() > 6000 {
		t.Fatalf("used %d, more than the cap", r.budget.Used())
	}
}

func TestMirrorPassThroughCutAtCap(t *testing.T) {
	// No store: artifacts stream through and are cut mid-way at the cap.
	up := newFakeUpstream(t)
	client := up.srv.Client()
	t.Cleanup(client.CloseIdleConnections)
	ev := &events{}
	m := NewMirror(Config{Client: client, Audit: ev.add, Upstreams: map[string]string{RegNPM: up.srv.URL}})
	b := NewBudget(1000)
	srv := httptest.NewServer(m.Handler(Sandbox{ID: "sbx_c", Budget: b}))
	t.Cleanup(srv.Close)
	resp, err := srv.Client().Get(srv.URL + "/npm/left-pad/-/left-pad-1.3.0.tgz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// Refused up front when the upstream told the length, else cut at the
	// cap; either way the sandbox never gets the whole artifact.
	switch {
	case resp.StatusCode == http.StatusInsufficientStorage:
	case resp.StatusCode == http.StatusOK && len(body) == 1000:
	default:
		t.Fatalf("status %d body %d bytes", resp.StatusCode, len(body))
	}
	if b.Used() > 1000 {
		t.Fatalf("counted %d bytes, over the cap", b.Used())
	}
	evs := ev.list()
	if len(evs) != 1 || evs[0].Reason != ReasonCap || evs[0].Allowed || evs[0].Name != "left-pad" {
		t.Fatalf("events %+v", evs)
	}
}

func TestMirrorRegistryNotAllowed(t *testing.T) {
	r := newMirrorRig(t, 1<<20, 0, "pypi")
	code, body, _ := r.get(t, "/npm/left-pad/-/left-pad-1.3.0.tgz")
	if code != http.StatusForbidden || !strings.Contains(body, "not allowed") {
		t.Fatalf("%d %q", code, body)
	}
	if r.up.count("/left-pad/-/left-pad-1.3.0.tgz") != 0 {
		t.Fatal("a refused registry reached upstream")
	}
	if code, _, _ := r.get(t, "/nope/x"); code != http.StatusNotFound {
		t.Fatalf("unknown registry: %d", code)
	}
}

func TestMirrorUpstreamStatus(t *testing.T) {
	r := newMirrorRig(t, 1<<20, 0)
	code, _, _ := r.get(t, "/npm/nothere/-/nothere-1.0.0.tgz")
	if code != http.StatusNotFound {
		t.Fatalf("missing artifact: %d", code)
	}
	// A failure is not cached: the next request asks again.
	r.get(t, "/npm/nothere/-/nothere-1.0.0.tgz")
	if n := r.up.count("/nothere/-/nothere-1.0.0.tgz"); n != 2 {
		t.Fatalf("upstream saw %d requests", n)
	}
}

func TestStoreEvictsLeastRecentlyUsed(t *testing.T) {
	dir := t.TempDir()
	st, err := OpenStore(dir, 250)
	if err != nil {
		t.Fatal(err)
	}
	put := func(key string, n int) {
		t.Helper()
		fetched, err := st.Fill(context.Background(), key, func(_ context.Context, w io.Writer) error {
			_, err := io.WriteString(w, strings.Repeat("x", n))
			return err
		})
		if err != nil || !fetched {
			t.Fatalf("fill %s: %v %v", key, fetched, err)
		}
	}
	has := func(key string) bool {
		f, _, ok := st.Open(key)
		if ok {
			f.Close()
		}
		return ok
	}
	put("a", 100)
	put("b", 100)
	if !has("a") { // a is now the most recently used
		t.Fatal("a missing")
	}
	put("c", 100) // 300 > 250: b goes
	if has("b") || !has("a") || !has("c") {
		t.Fatalf("after eviction: a=%v b=%v c=%v", has("a"), has("b"), has("c"))
	}
	if st.Size() != 200 {
		t.Fatalf("size %d", st.Size())
	}
	put("huge", 1000) // larger than the store: not kept
	if has("huge") || st.Size() != 200 {
		t.Fatal("an oversized blob was kept")
	}
	// A failed fetch leaves nothing.
	if _, err := st.Fill(context.Background(), "bad", func(_ context.Context, w io.Writer) error {
		io.WriteString(w, "partial")
		return io.ErrUnexpectedEOF
	}); err == nil || has("bad") {
		t.Fatalf("failed fill: %v, kept=%v", err, has("bad"))
	}
	// Reopened, the store knows what is on disk and nothing else.
	st2, err := OpenStore(dir, 250)
	if err != nil {
		t.Fatal(err)
	}
	if st2.Size() != 200 {
		t.Fatalf("reopened size %d", st2.Size())
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Fatalf("%d files on disk, want 2", len(ents))
	}
}

func TestPackageOf(t *testing.T) {
	tests := []struct {
		reg, path string
		want      Package
	}{
		{"pypi", "/files/packages/xx/requests-2.31.0-py3-none-any.whl", Package{"requests", "2.31.0"}},
		{"pypi", "/files/packages/xx/Zope.Interface-6.0-cp311-cp311-manylinux_2_17_x86_64.whl", Package{"zope-interface", "6.0"}},
		{"pypi", "/files/packages/xx/python-dateutil-2.8.2.tar.gz", Package{"python-dateutil", "2.8.2"}},
		{"pypi", "/simple/requests/", Package{}},
		{"npm", "/@types/node/-/node-20.1.0.tgz", Package{"@types/node", "20.1.0"}},
		{"npm", "/left-pad/-/left-pad-1.3.0.tgz", Package{"left-pad", "1.3.0"}},
		{"npm", "/left-pad", Package{}},
		{"goproxy", "/github.com/!burnt!sushi/toml/@v/v1.3.2.zip", Package{"github.com/BurntSushi/toml", "v1.3.2"}},
		{"goproxy", "/golang.org/x/sys/@v/list", Package{"golang.org/x/sys", "list"}},
		{"debian", "/pool/main/c/curl/curl_7.88.1-10%2bdeb12u5_amd64.deb", Package{"curl", "7.88.1-10+deb12u5"}},
		{"debian", "/pool/main/s/systemd/libsystemd0_252.22-1~deb12u1_amd64.deb", Package{"libsystemd0", "252.22-1~deb12u1"}},
		{"debian", "/pool/main/p/python3.11/python3.11_3.11.2.orig.tar.xz", Package{"python3.11", "3.11.2"}},
		{"debian", "/dists/bookworm/InRelease", Package{}},
	}
	for _, tc := range tests {
		t.Run(tc.reg+tc.path, func(t *testing.T) {
			if got := PackageOf(tc.reg, tc.path); got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestImmutable(t *testing.T) {
	tests := []struct {
		reg, path string
		want      bool
	}{
		{"pypi", "/files/packages/xx/requests-2.31.0-py3-none-any.whl", true},
		{"pypi", "/simple/requests/", false},
		{"npm", "/left-pad/-/left-pad-1.3.0.tgz", true},
		{"npm", "/left-pad", false},
		{"goproxy", "/golang.org/x/sys/@v/v0.1.0.zip", true},
		{"goproxy", "/golang.org/x/sys/@v/list", false},
		{"goproxy", "/golang.org/x/sys/@latest", false},
		{"debian", "/pool/main/c/curl/curl_7.88.1-10_amd64.deb", true},
		{"debian", "/dists/bookworm/InRelease", false},
	}
	for _, tc := range tests {
		t.Run(tc.reg+tc.path, func(t *testing.T) {
			if got := immutable(tc.reg, tc.path); got != tc.want {
				t.Fatalf("got %v", got)
			}
		})
	}
}
