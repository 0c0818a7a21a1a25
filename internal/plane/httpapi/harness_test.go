package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/plane/httpapi"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/service/netpolicy"
	"github.com/airlockhq/airlock/internal/service/sandbox"
	"github.com/airlockhq/airlock/internal/service/servicetest"
	"github.com/airlockhq/airlock/internal/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// clock is real time plus an offset the test advances (TTL tests).
type clock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.off += d
	c.mu.Unlock()
}

// harness is a real HTTP server on 127.0.0.1:0 over a real manager, store
// and authenticator, with the fake driver whose sandboxes run the real agent.
type harness struct {
	e2b      http.Handler // Config.E2B, nil for none
	t        testing.TB
	dataDir  string
	settings config.Config
	clock    *clock
	st       *store.Store
	auth     *auth.Authenticator
	drv      *servicetest.Driver
	svc      *service.Set
	srv      *httpapi.Server
	ts       *httptest.Server
	url      string
	admin    string
	keys     map[string]string // tenant → key
	// keyFn, when set, makes the keys (a daemon's harness: see e2e).
	keyFn func(tenant string) string
	maxUp int64
	// rec is the audit trail (withAudit); net the sandbox network
	// (withNetwork) and regs its registry sets.
	wantAudit bool
	rec       *audit.Recorder
	net       sandbox.Network
	regs      map[string][]string
	// attr is the manager's attribution, the sink of network events
	// (made anew by every start, as by every daemon).
	attr *netpolicy.Attribution
	// metrics are the Prometheus metrics the manager observes into and
	// the server exports; noObserver leaves the manager without them
	// (the unmetered benchmark).
	metrics    *httpapi.Metrics
	noObserver bool
	// sampleEvery overrides the manager's sample interval when set.
	sampleEvery time.Duration
	// wrap, when set, is the driver the manager gets in place of drv
	// (withDriver).
	wrap   driver.Driver
	wrapFn func(*servicetest.Driver) driver.Driver
}

// withDriver gives the manager f(drv) in place of the fake driver (a
// wrapper adding an interface the fake lacks).
func withDriver(f func(*servicetest.Driver) driver.Driver) option {
	return func(h *harness) { h.wrapFn = f }
}

// driver is the driver the manager runs.
func (h *harness) driver() driver.Driver {
	if h.wrap == nil && h.wrapFn != nil {
		h.wrap = h.wrapFn(h.drv)
	}
	if h.wrap != nil {
		return h.wrap
	}
	return h.drv
}

type option func(*harness)

func withSettings(f func(*config.Config)) option { return func(h *harness) { f(&h.settings) } }
func withMaxUpload(n int64) option               { return func(h *harness) { h.maxUp = n } }

// withoutObserver runs the manager without the Prometheus observer.
func withoutObserver() option { return func(h *harness) { h.noObserver = true } }

// withSampleInterval sets how often the manager samples every sandbox.
func withSampleInterval(d time.Duration) option { return func(h *harness) { h.sampleEvery = d } }

// withE2B serves the E2B planes with h.
func withE2B(e http.Handler) option { return func(h *harness) { h.e2b = e } }

// withAudit records the audit trail in the harness's store.
func withAudit() option { return func(h *harness) { h.wantAudit = true } }

// withNetwork gives sandboxes network n with registry sets regs.
func withNetwork(n sandbox.Network, regs map[string][]string) option {
	return func(h *harness) { h.net, h.regs = n, regs }
}

func newHarness(t testing.TB, opts ...option) *harness {
	t.Helper()
	dir := t.TempDir()
	h := &harness{t: t, dataDir: dir, clock: &clock{}, keys: map[string]string{}, maxUp: 64 << 20}
	h.settings = config.Default()
	h.settings.DataDir = dir
	for _, o := range opts {
		o(h)
	}
	st, err := store.Open(context.Background(), filepath.Join(dir, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	h.st = st
	h.auth = auth.New(st)
	h.admin, err = h.auth.Bootstrap(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	h.drv = servicetest.New("runc", filepath.Join(dir, "sandboxes"))
	if h.net != nil {
		h.drv.SetNetworkModes(driver.NetworkNone, driver.NetworkAllowlist, driver.NetworkOpen)
	}
	if h.wantAudit {
		if h.rec, err = audit.New(audit.Config{Sink: st, Logger: testLog}); err != nil {
			t.Fatal(err)
		}
	}
	h.metrics = httpapi.NewMetrics(nil)
	h.start()
	t.Cleanup(func() {
		h.stop()
		if err := h.drv.Close(); err != nil {
			t.Errorf("driver cleanup: %v", err)
		}
		h.rec.Close()
		h.st.Close()
	})
	return h
}

var testLog = slog.New(slog.NewTextHandler(io.Discard, nil))

func init() {
	if os.Getenv("AIRLOCK_TEST_LOG") != "" {
		testLog = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
}

// start runs a manager and server over the harness's store and driver.
func (h *harness) start() {
	h.t.Helper()
	var obs service.Observer
	if !h.noObserver {
		obs = h.metrics
	}
	h.attr = netpolicy.NewAttribution(netpolicy.AttributionConfig{Audit: h.rec, Registries: h.regs, Logger: testLog, Now: h.clock.Now})
	svc, err := service.New(service.Config{
		Observer: obs, SampleInterval: h.sampleEvery, Attribution: h.attr,
		Settings: h.settings, Store: h.st, Drivers: []driver.Driver{h.driver()},
		Templates: servicetest.Templates{"base": {{Name: "base", Version: 1}, {Name: "base", Version: 2}}},
		Logger:    testLog, Now: h.clock.Now,
		TickInterval: 20 * time.Millisecond, SweepInterval: 200 * time.Millisecond,
		AgentDialTimeout: 5 * time.Second, ExecRetention: time.Minute,
		Audit: h.rec, Network: h.net, Registries: h.regs,
	})
	if err != nil {
		h.t.Fatal(err)
	}
	if err := svc.Start(context.Background()); err != nil {
		h.t.Fatal(err)
	}
	h.svc = svc
	h.srv = httpapi.New(httpapi.Config{Auth: h.auth, Logger: testLog, Version: "test",
		Sandboxes: svc.Sandboxes, Execs: svc.Execs, Files: svc.Files, Networks: svc.Networks,
		Previews: svc.Previews, Accounting: svc.Accounting, Templates: svc.Templates,
		Host:           &api.HostInfo{Slot: 3, NftTable: "airlock_3", VethPrefix: "al3v", Subnet: "10.230.32.0/20", CgroupParent: "airlock/slot3"},
		MaxUploadBytes: h.maxUp, Heartbeat: 200 * time.Millisecond, Audit: h.rec, Metrics: h.metrics, E2B: h.e2b})
	h.ts = httptest.NewServer(h.srv.Handler())
	h.url = h.ts.URL
}

// stop closes the server and manager; sandboxes keep "running" in the
// fake driver, as they would across a daemon restart.
func (h *harness) stop() {
	if h.ts == nil {
		return
	}
	h.srv.CloseStreams()
	h.ts.Close()
	h.svc.Close()
	h.ts = nil
}

// restart simulates a daemon restart on the same data dir.
func (h *harness) restart() {
	h.t.Helper()
	h.stop()
	h.start()
}

// key returns a key of tenant (created once).
func (h *harness) key(tenant string) string {
	h.t.Helper()
	if k, ok := h.keys[tenant]; ok {
		return k
	}
	if h.keyFn != nil {
		h.keys[tenant] = h.keyFn(tenant)
		return h.keys[tenant]
	}
	c, err := h.auth.CreateKey(context.Background(), tenant, "test", false)
	if err != nil {
		h.t.Fatal(err)
	}
	h.keys[tenant] = c.Secret
	return c.Secret
}

type resp struct {
	*http.Response
	body []byte
}

func (r resp) json(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decoding %q: %v", r.body, err)
	}
}

func (r resp) apiErr(t testing.TB) api.ErrorDetail {
	t.Helper()
	var b api.ErrorBody
	r.json(t, &b)
	return b.Error
}

// req sends one request. body may be nil, a string/[]byte (sent raw) or any
// value (sent as JSON).
func (h *harness) req(method, path, key string, body any, hdr ...string) resp {
	h.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	case io.Reader:
		rd = b
	default:
		j, err := json.Marshal(b)
		if err != nil {
			h.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	r, err := http.NewRequest(method, h.url+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	if key != "" {
		r.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(r)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		h.t.Fatalf("%s %s: reading body: %v", method, path, err)
	}
	return resp{res, b}
}

// expect asserts status and, for errors, the API error shape and code.
func (h *harness) expect(r resp, status int, code string) {
	h.t.Helper()
	if r.StatusCode != status {
		h.t.Fatalf("%s %s: status %d, want %d; body %s", r.Request.Method, r.Request.URL.Path, r.StatusCode, status, r.body)
	}
	if code == "" {
		return
	}
	e := r.apiErr(h.t)
	if e.Code != code {
		h.t.Fatalf("%s %s: code %q, want %q (message %q)", r.Request.Method, r.Request.URL.Path, e.Code, code, e.Message)
	}
	if e.Message == "" || !strings.HasPrefix(e.RequestID, "req_") || e.RequestID != r.Header.Get("X-Request-Id") {
		h.t.Fatalf("error body %+v lacks message or request id (header %q)", e, r.Header.Get("X-Request-Id"))
	}
}

// create makes a sandbox for tenant and returns it.
func (h *harness) create(tenant string, req api.CreateSandboxRequest) api.Sandbox {
	h.t.Helper()
	r := h.req("POST", "/v1/sandboxes", h.key(tenant), req)
	h.expect(r, http.StatusCreated, "")
	var sb api.Sandbox
	r.json(h.t, &sb)
	return sb
}

// exec runs a command (JSON mode) and returns its result.
func (h *harness) exec(tenant, id string, req api.ExecRequest) api.ExecResult {
	h.t.Helper()
	r := h.req("POST", "/v1/sandboxes/"+id+"/exec", h.key(tenant), req)
	h.expect(r, http.StatusOK, "")
	var res api.ExecResult
	r.json(h.t, &res)
	return res
}

func sh(s string) *string { return &s }

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// state returns a sandbox's state as its tenant sees it.
func (h *harness) state(tenant, id string) api.Sandbox {
	h.t.Helper()
	r := h.req("GET", "/v1/sandboxes/"+id, h.key(tenant), nil)
	h.expect(r, http.StatusOK, "")
	var sb api.Sandbox
	r.json(h.t, &sb)
	return sb
}

func (h *harness) liveInDriver() int { return len(h.drv.Live()) }

func strp(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

func intp(p *int) string {
	if p == nil {
		return "<nil>"
	}
	return fmt.Sprint(*p)
}
