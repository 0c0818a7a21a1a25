package e2b_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"

	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/plane/e2b"
	"github.com/airlockhq/airlock/internal/plane/e2b/envd/filesystempb/filesystempbconnect"
	"github.com/airlockhq/airlock/internal/plane/e2b/envd/processpb/processpbconnect"
	"github.com/airlockhq/airlock/internal/plane/httpapi"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/service/sandbox"
	"github.com/airlockhq/airlock/internal/service/servicetest"
	"github.com/airlockhq/airlock/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testLog = slog.New(slog.NewTextHandler(io.Discard, nil))

func init() {
	if os.Getenv("AIRLOCK_TEST_LOG") != "" {
		testLog = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
}

// harness is airlock's real HTTP server with the E2B planes, over a real
// manager, store and authenticator and the fake driver whose sandboxes run
// the real agent (no root needed).
type harness struct {
	t    *testing.T
	url  string
	e2b  *e2b.Handler
	svc  *service.Set
	auth *auth.Authenticator
	keys map[string]string // tenant → key
}

// harnessOption adjusts the E2B handler's configuration.
type harnessOption func(*e2b.Config)

func withCode(c e2b.CodeService) harnessOption { return func(cfg *e2b.Config) { cfg.Code = c } }

func newHarness(t *testing.T, opts ...harnessOption) *harness {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(context.Background(), filepath.Join(dir, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	authn := auth.New(st)
	if _, err := authn.Bootstrap(context.Background(), ""); err != nil {
		t.Fatal(err)
	}
	drv := servicetest.New("runc", filepath.Join(dir, "sandboxes"))
	settings := config.Default()
	settings.DataDir = dir
	svc, err := service.New(service.Config{
		Settings: settings, Store: st, Drivers: []driver.Driver{drv},
		Templates: servicetest.Templates{
			"base":             {{Name: "base", Version: 1}},
			"code-interpreter": {{Name: "code-interpreter", Version: 1}},
		},
		Logger: testLog, TickInterval: 20 * time.Millisecond, SweepInterval: 200 * time.Millisecond,
		AgentDialTimeout: 5 * time.Second, ExecRetention: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	ecfg := e2b.Config{Sandboxes: svc.Sandboxes, Execs: svc.Execs, Files: svc.Files, Ports: svc.Previews,
		Auth: authn, Logger: testLog, AuthFailureDelay: -1, Keepalive: 200 * time.Millisecond}
	for _, o := range opts {
		o(&ecfg)
	}
	eh := e2b.New(ecfg)
	srv := httpapi.New(httpapi.Config{Auth: authn, Logger: testLog, Version: "test", E2B: eh, AuthFailureDelay: -1,
		Sandboxes: svc.Sandboxes, Execs: svc.Execs, Files: svc.Files, Networks: svc.Networks,
		Previews: svc.Previews, Accounting: svc.Accounting, Templates: svc.Templates})
	ts := httptest.NewServer(srv.Handler())
	h := &harness{t: t, url: ts.URL, e2b: eh, svc: svc, auth: authn, keys: map[string]string{}}
	t.Cleanup(func() {
		ctx := context.Background()
		if l, err := svc.Sandboxes.List(ctx, auth.Principal{Admin: true}, sandbox.ListFilter{}); err == nil {
			for _, sb := range l.Sandboxes {
				svc.Sandboxes.Delete(ctx, auth.Principal{Admin: true}, sb.ID)
			}
		}
		srv.CloseStreams()
		ts.CloseClientConnections()
		ts.Close()
		svc.Close()
		if err := drv.Close(); err != nil {
			t.Errorf("driver cleanup: %v", err)
		}
		st.Close()
	})
	return h
}

// key returns an API key of tenant.
func (h *harness) key(tenant string) string {
	if k, ok := h.keys[tenant]; ok {
		return k
	}
	res, err := h.auth.CreateKey(context.Background(), tenant, "e2b-test", false)
	if err != nil {
		h.t.Fatal(err)
	}
	h.keys[tenant] = res.Secret
	return res.Secret
}

// call makes a control-plane call with tenant's key ("" for none) and
// decodes a JSON answer into out when given.
func (h *harness) call(tenant, method, path string, body any, out any) int {
	h.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, h.url+path, rd)
	req.Header.Set("Content-Type", "application/json")
	if tenant != "" {
		req.Header.Set("X-API-KEY", h.key(tenant))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			h.t.Fatalf("%s %s: decoding %q: %v", method, path, b, err)
		}
	}
	return resp.StatusCode
}

// created is the part of E2B's Sandbox the tests read.
type created struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken string  `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// create makes a sandbox for tenant through the E2B control plane.
func (h *harness) create(tenant string) created {
	h.t.Helper()
	var c created
	if st := h.call(tenant, "POST", "/v2/sandboxes", map[string]any{"templateID": "base"}, &c); st != http.StatusCreated {
		h.t.Fatalf("create: status %d", st)
	}
	return c
}

// sandboxHeaders routes a client's calls to sandbox c with its token.
type sandboxHeaders struct {
	base  http.RoundTripper
	id    string
	port  string
	token string
	user  string
}

func (s *sandboxHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(e2b.HeaderSandboxID, s.id)
	r.Header.Set(e2b.HeaderSandboxPort, s.port)
	if s.token != "" {
		r.Header.Set(e2b.HeaderAccessToken, s.token)
	}
	if s.user != "" {
		r.Header.Set("Authorization", "Basic "+basic(s.user))
	}
	return s.base.RoundTrip(r)
}

func basic(user string) string {
	return base64Std(user + ":")
}

// client is an HTTP client whose requests go to sandbox c's envd.
func (h *harness) client(c created) *http.Client {
	return &http.Client{Transport: &sandboxHeaders{base: http.DefaultTransport, id: c.SandboxID, port: "49983", token: c.EnvdAccessToken}}
}

// codecs are the two encodings the envd protocol takes: the SDKs' JSON and
// binary protobuf.
var codecs = []struct {
	name string
	opts []connect.ClientOption
}{
	{"json", []connect.ClientOption{connect.WithProtoJSON()}},
	{"proto", nil},
}

func (h *harness) process(c created, opts []connect.ClientOption) processpbconnect.ProcessClient {
	return processpbconnect.NewProcessClient(h.client(c), h.url, opts...)
}

func (h *harness) filesystem(c created, opts []connect.ClientOption) filesystempbconnect.FilesystemClient {
	return filesystempbconnect.NewFilesystemClient(h.client(c), h.url, opts...)
}

func gzipWriter(w io.Writer) *gzip.Writer { return gzip.NewWriter(w) }

// processpbconnectWithUser is a process client acting as user.
func processpbconnectWithUser(h *harness, c created, user string) processpbconnect.ProcessClient {
	cl := &http.Client{Transport: &sandboxHeaders{base: http.DefaultTransport, id: c.SandboxID, port: "49983", token: c.EnvdAccessToken, user: user}}
	return processpbconnect.NewProcessClient(cl, h.url, connect.WithProtoJSON())
}
