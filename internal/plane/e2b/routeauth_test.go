package e2b_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/plane/e2b"
	pb "github.com/airlockhq/airlock/internal/plane/e2b/envd/processpb"
)

// testAuthDelay is the E2B planes' delay after a failed authentication in
// these tests: every refusal must have waited at least this long.
const testAuthDelay = 30 * time.Millisecond

// unknownID looks like a sandbox id and names none.
const unknownID = "sbx_aaaaaaaaaaaaaaaaaaaaaaaa"

// answer is what a client can observe of a response.
type answer struct {
	status  int
	ctype   string
	body    string
	elapsed time.Duration
}

func do(t *testing.T, method, url, body string, hdr map[string]string) answer {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return answer{status: resp.StatusCode, ctype: resp.Header.Get("Content-Type"), body: string(b), elapsed: time.Since(start)}
}

// sandboxRoutes are every route of the sandbox plane: envd's Connect
// methods and REST routes, the code interpreter's, a user port, and paths
// no plane serves.
var sandboxRoutes = []struct {
	port, method, path, body string
}{
	{"49983", "POST", "/process.Process/List", `{}`},
	{"49983", "POST", "/process.Process/Connect", `{"process":{"pid":1000}}`},
	{"49983", "POST", "/process.Process/Start", `{"process":{"cmd":"/bin/sh","args":["-c","touch /tmp/pwned"]}}`},
	{"49983", "POST", "/process.Process/Update", `{}`},
	{"49983", "POST", "/process.Process/StreamInput", `{}`},
	{"49983", "POST", "/process.Process/SendInput", `{}`},
	{"49983", "POST", "/process.Process/SendSignal", `{"process":{"pid":1000},"signal":"SIGNAL_SIGKILL"}`},
	{"49983", "POST", "/process.Process/CloseStdin", `{}`},
	{"49983", "POST", "/filesystem.Filesystem/Stat", `{"path":"/etc/hostname"}`},
	{"49983", "POST", "/filesystem.Filesystem/MakeDir", `{"path":"/tmp/pwned-dir"}`},
	{"49983", "POST", "/filesystem.Filesystem/Move", `{"source":"/a","destination":"/b"}`},
	{"49983", "POST", "/filesystem.Filesystem/ListDir", `{"path":"/"}`},
	{"49983", "POST", "/filesystem.Filesystem/Remove", `{"path":"/tmp"}`},
	{"49983", "POST", "/filesystem.Filesystem/WatchDir", `{"path":"/tmp"}`},
	{"49983", "POST", "/filesystem.Filesystem/CreateWatcher", `{"path":"/tmp"}`},
	{"49983", "POST", "/filesystem.Filesystem/GetWatcherEvents", `{"watcherId":"w"}`},
	{"49983", "POST", "/filesystem.Filesystem/RemoveWatcher", `{"watcherId":"w"}`},
	{"49983", "GET", "/health", ""},
	{"49983", "GET", "/files?path=/etc/hostname", ""},
	{"49983", "POST", "/files?path=/tmp/pwned-file", "x"},
	{"49983", "GET", "/envs", ""},
	{"49983", "GET", "/no/such/route", ""},
	{"49999", "POST", "/execute", `{"code":"1"}`},
	{"49999", "POST", "/contexts", `{"language":"python"}`},
	{"49999", "GET", "/contexts", ""},
	{"49999", "DELETE", "/contexts/ctx1", ""},
	{"49999", "POST", "/contexts/ctx1/restart", ""},
	{"49999", "GET", "/health", ""},
	{"49999", "GET", "/no/such/route", ""},
	{"8000", "GET", "/", ""},
	{"not-a-port", "GET", "/health", ""},
}

// TestSandboxPlaneRefusesWithoutCredential runs every route of the sandbox
// plane with no credential, wrong ones, another tenant's, the owner's API
// key (not a sandbox credential) and an unknown sandbox id: every answer is
// the same 401, after the same delay, and nothing reaches the sandbox or
// the code service. Before the fix, the code interpreter's /contexts routes
// answered anonymous requests (200, 204) and told a live sandbox (200) from
// an unknown id (502).
func TestSandboxPlaneRefusesWithoutCredential(t *testing.T) {
	fc := &fakeCode{}
	h := newHarness(t, withCode(fc), func(c *e2b.Config) { c.AuthFailureDelay = testAuthDelay })
	a, b := h.create("acme"), h.create("other")
	zeros := strings.Repeat("0", 64)
	creds := []struct {
		name string
		id   string
		hdr  map[string]string
		// envdOnly: a credential that is valid, but not for envd.
		envdOnly bool
	}{
		{name: "None", id: a.SandboxID},
		{name: "WrongToken", id: a.SandboxID, hdr: map[string]string{e2b.HeaderAccessToken: zeros}},
		{name: "WrongTrafficToken", id: a.SandboxID, hdr: map[string]string{e2b.HeaderTrafficToken: zeros}},
		{name: "OtherTenantsToken", id: a.SandboxID, hdr: map[string]string{e2b.HeaderAccessToken: b.EnvdAccessToken}},
		{name: "OtherTenantsTrafficToken", id: a.SandboxID, hdr: map[string]string{e2b.HeaderTrafficToken: b.TrafficAccessToken}},
		{name: "TrafficTokenAsAccessToken", id: a.SandboxID, hdr: map[string]string{e2b.HeaderAccessToken: a.TrafficAccessToken}},
		{name: "OwnersAPIKey", id: a.SandboxID, hdr: map[string]string{"X-API-KEY": h.key("acme")}},
		{name: "OtherTenantsAPIKey", id: a.SandboxID, hdr: map[string]string{"X-API-KEY": h.key("other")}},
		{name: "UnknownSandbox", id: unknownID},
		{name: "UnknownSandboxWithAToken", id: unknownID, hdr: map[string]string{e2b.HeaderAccessToken: a.EnvdAccessToken}},
		{name: "TrafficTokenOnEnvd", id: a.SandboxID, hdr: map[string]string{e2b.HeaderTrafficToken: a.TrafficAccessToken}, envdOnly: true},
	}
	var (
		mu    sync.Mutex
		first *answer
	)
	t.Run("Refused", func(t *testing.T) {
		for _, rt := range sandboxRoutes {
			for _, c := range creds {
				if c.envdOnly && rt.port != "49983" {
					continue
				}
				t.Run(rt.port+rt.method+strings.ReplaceAll(rt.path, "/", "_")+"/"+c.name, func(t *testing.T) {
					t.Parallel()
					hdr := map[string]string{e2b.HeaderSandboxID: c.id, e2b.HeaderSandboxPort: rt.port, "Content-Type": "application/json"}
					for k, v := range c.hdr {
						hdr[k] = v
					}
					got := do(t, rt.method, h.url+rt.path, rt.body, hdr)
					if got.status != http.StatusUnauthorized || got.elapsed < testAuthDelay {
						t.Fatalf("%d %q after %s, want 401 after at least %s", got.status, got.body, got.elapsed, testAuthDelay)
					}
					mu.Lock()
					defer mu.Unlock()
					if first == nil {
						first = &got
					} else if got.body != first.body || got.ctype != first.ctype {
						t.Fatalf("answer %q (%s), want the same as every refusal: %q (%s)", got.body, got.ctype, first.body, first.ctype)
					}
				})
			}
		}
	})
	if got := fc.seen(); len(got) != 0 {
		t.Fatalf("the code service was called: %v", got)
	}
	// Nothing ran or changed in the sandbox: its own token sees no
	// process and none of the files the routes would have made.
	ctx := context.Background()
	procs, err := h.svc.Execs.ListExecs(ctx, auth.Principal{Tenant: "acme"}, a.SandboxID, 10, "")
	if err != nil || len(procs.Execs) != 0 {
		t.Fatalf("execs in the sandbox: %+v, %v", procs.Execs, err)
	}
	for _, p := range []string{"/tmp/pwned", "/tmp/pwned-dir", "/tmp/pwned-file"} {
		if _, err := h.svc.Files.StatFile(ctx, auth.Principal{Tenant: "acme"}, a.SandboxID, p, "user"); !errdefs.IsNotFound(err) {
			t.Fatalf("stat %s in the sandbox: %v, want not found", p, err)
		}
	}
	// The right credentials do open the routes.
	t.Run("Allowed", func(t *testing.T) {
		for _, c := range []struct {
			port, method, path string
			hdr                map[string]string
			status             int
		}{
			{"49983", "GET", "/health", map[string]string{e2b.HeaderAccessToken: a.EnvdAccessToken}, http.StatusNoContent},
			{"49983", "GET", "/health", map[string]string{e2b.HeaderTrafficToken: a.EnvdAccessToken}, http.StatusNoContent},
			{"49999", "GET", "/contexts", map[string]string{e2b.HeaderAccessToken: a.EnvdAccessToken}, http.StatusOK},
			{"49999", "GET", "/contexts", map[string]string{e2b.HeaderTrafficToken: a.TrafficAccessToken}, http.StatusOK},
			{"49999", "GET", "/health", map[string]string{e2b.HeaderTrafficToken: a.TrafficAccessToken}, http.StatusNoContent},
			{"not-a-port", "GET", "/health", map[string]string{e2b.HeaderAccessToken: a.EnvdAccessToken}, http.StatusBadRequest},
		} {
			hdr := map[string]string{e2b.HeaderSandboxID: a.SandboxID, e2b.HeaderSandboxPort: c.port}
			for k, v := range c.hdr {
				hdr[k] = v
			}
			if got := do(t, c.method, h.url+c.path, "", hdr); got.status != c.status {
				t.Errorf("%s %s:%s with %v: %d %q, want %d", c.method, c.port, c.path, c.hdr, got.status, got.body, c.status)
			}
		}
	})
}

// controlRoutes are the control plane's routes that name a sandbox.
var controlRoutes = []struct {
	method, path, body string
}{
	{"GET", "/sandboxes/{id}", ""},
	{"DELETE", "/sandboxes/{id}", ""},
	{"POST", "/sandboxes/{id}/timeout", `{"timeout":5}`},
	{"POST", "/sandboxes/{id}/refreshes", `{"duration":5}`},
	{"POST", "/sandboxes/{id}/pause", ""},
	{"POST", "/sandboxes/{id}/resume", `{}`},
	{"POST", "/sandboxes/{id}/connect", `{"timeout":5}`},
	{"POST", "/v2/sandboxes/{id}/connect", `{"timeout":5}`},
	{"GET", "/sandboxes/{id}/metrics", ""},
	{"GET", "/sandboxes/{id}/logs", ""},
}

// TestControlPlaneRefusesForeignAndUnknown runs every control-plane route
// with no key, a wrong key or a sandbox token (all the same 401 after the
// same delay), and with another tenant's key or an unknown id (all the same
// 404): another tenant's sandbox cannot be told from one that never
// existed, nor touched.
func TestControlPlaneRefusesForeignAndUnknown(t *testing.T) {
	h := newHarness(t, func(c *e2b.Config) { c.AuthFailureDelay = testAuthDelay })
	a := h.create("acme")
	gone := h.create("acme")
	if st := h.call("acme", "DELETE", "/sandboxes/"+gone.SandboxID, nil, nil); st != http.StatusNoContent {
		t.Fatalf("kill: %d", st)
	}
	before, err := h.svc.Sandboxes.Get(context.Background(), auth.Principal{Tenant: "acme"}, a.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	type cred struct {
		name string
		hdr  map[string]string
	}
	unauth := []cred{
		{name: "NoKey"},
		{name: "WrongKey", hdr: map[string]string{"X-API-KEY": "ak_wrong_0123456789abcdef"}},
		{name: "SandboxToken", hdr: map[string]string{e2b.HeaderAccessToken: a.EnvdAccessToken}},
		{name: "SandboxTokenAsKey", hdr: map[string]string{"X-API-KEY": a.EnvdAccessToken}},
	}
	routes := append([]struct{ method, path, body string }{
		{"POST", "/sandboxes", `{"templateID":"base"}`},
		{"POST", "/v2/sandboxes", `{"templateID":"base"}`},
		{"GET", "/sandboxes", ""},
		{"GET", "/v2/sandboxes", ""},
		{"GET", "/templates", ""},
		{"POST", "/snapshots", ""},
	}, controlRoutes...)
	var first401 *answer
	for _, rt := range routes {
		for _, c := range unauth {
			got := do(t, rt.method, h.url+strings.ReplaceAll(rt.path, "{id}", a.SandboxID), rt.body, c.hdr)
			if got.status != http.StatusUnauthorized || got.elapsed < testAuthDelay {
				t.Fatalf("%s %s, %s: %d %q after %s, want 401 after at least %s", rt.method, rt.path, c.name, got.status, got.body, got.elapsed, testAuthDelay)
			}
			if first401 == nil {
				first401 = &got
			} else if got.body != first401.body || got.ctype != first401.ctype {
				t.Fatalf("%s %s, %s: %q, want the same as every refusal: %q", rt.method, rt.path, c.name, got.body, first401.body)
			}
		}
	}
	// Another tenant's key on acme's sandbox, or any key on an unknown or
	// gone id: one answer.
	notFound := []struct {
		name, tenant, id string
	}{
		{"OtherTenantsSandbox", "other", a.SandboxID},
		{"UnknownSandbox", "acme", unknownID},
		{"OtherTenantUnknownSandbox", "other", unknownID},
		{"GoneSandbox", "acme", gone.SandboxID},
		{"OtherTenantGoneSandbox", "other", gone.SandboxID},
	}
	for _, rt := range controlRoutes {
		var first *answer
		for _, c := range notFound {
			got := do(t, rt.method, h.url+strings.ReplaceAll(rt.path, "{id}", c.id), rt.body,
				map[string]string{"X-API-KEY": h.key(c.tenant), "Content-Type": "application/json"})
			got.body = strings.ReplaceAll(got.body, c.id, "{id}") // the request's own id may come back
			if got.status != http.StatusNotFound {
				t.Fatalf("%s %s, %s: %d %q, want 404", rt.method, rt.path, c.name, got.status, got.body)
			}
			if first == nil {
				first = &got
			} else if got.body != first.body || got.ctype != first.ctype {
				t.Fatalf("%s %s, %s: %q, want the same as %s: %q", rt.method, rt.path, c.name, got.body, notFound[0].name, first.body)
			}
		}
	}
	after, err := h.svc.Sandboxes.Get(context.Background(), auth.Principal{Tenant: "acme"}, a.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if after.State != api.StateRunning || !after.ExpiresAt.Equal(*before.ExpiresAt) {
		t.Fatalf("the sandbox changed: %+v → %+v", before, after)
	}
}

// TestAPIRefusesForeignAndUnknown spot-checks airlock's own API on the same
// listener: another tenant's sandbox and an unknown one give the same
// error (but for its request id), a missing key the same 401.
func TestAPIRefusesForeignAndUnknown(t *testing.T) {
	h := newHarness(t)
	a := h.create("acme")
	requestID := regexp.MustCompile(`"request_id":"[^"]*"`)
	for _, rt := range []struct{ method, path, body string }{
		{"GET", "/v1/sandboxes/{id}", ""},
		{"DELETE", "/v1/sandboxes/{id}", ""},
		{"POST", "/v1/sandboxes/{id}/exec", `{"cmd":["true"]}`},
		{"GET", "/v1/sandboxes/{id}/files?path=/etc/hostname", ""},
		{"GET", "/v1/sandboxes/{id}/execs", ""},
		{"POST", "/v1/sandboxes/{id}/previews", `{"port":8080}`},
		{"GET", "/v1/sandboxes/{id}/pty", ""},
	} {
		var answers []answer
		for _, c := range []struct{ tenant, id string }{{"other", a.SandboxID}, {"acme", unknownID}, {"other", unknownID}} {
			got := do(t, rt.method, h.url+strings.ReplaceAll(rt.path, "{id}", c.id), rt.body,
				map[string]string{"Authorization": "Bearer " + h.key(c.tenant), "Content-Type": "application/json"})
			got.body = strings.ReplaceAll(requestID.ReplaceAllString(got.body, ""), c.id, "{id}")
			answers = append(answers, got)
		}
		for _, got := range answers {
			if got.status != http.StatusNotFound || got.body != answers[0].body {
				t.Fatalf("%s %s: %d %q, want 404 %q for each", rt.method, rt.path, got.status, got.body, answers[0].body)
			}
		}
		noKey := do(t, rt.method, h.url+strings.ReplaceAll(rt.path, "{id}", a.SandboxID), rt.body, nil)
		var e api.ErrorBody
		if json.Unmarshal([]byte(noKey.body), &e); noKey.status != http.StatusUnauthorized || e.Error.Code != api.CodeUnauthenticated {
			t.Fatalf("%s %s without a key: %d %q", rt.method, rt.path, noKey.status, noKey.body)
		}
	}
}

// TestProcessStreamMasksSlowSecret: a command that prints the sandbox's
// secret one byte every 30 ms through envd's Process.Start stream shows it
// masked (before the fix, in plain: each byte went out on its own after
// the redactor's 20 ms hold).
func TestProcessStreamMasksSlowSecret(t *testing.T) {
	h := newHarness(t)
	const secret = "Zq9x-Vw7K-Lp3M"
	res, err := h.svc.Sandboxes.Create(context.Background(), auth.Principal{Tenant: "acme"},
		api.CreateSandboxRequest{Template: "base", Secrets: map[string]string{"TOKEN": secret}}, "")
	if err != nil {
		t.Fatal(err)
	}
	c := created{SandboxID: res.Sandbox.ID, EnvdAccessToken: h.e2b.AccessToken(res.Sandbox.ID)}
	stream, err := h.process(c, codecs[0].opts).Start(context.Background(), connect.NewRequest(&pb.StartRequest{
		Process: shell(`printf '%s\n' "$TOKEN" | fold -w1 | while IFS= read -r c; do printf %s "$c"; printf . >&2; sleep 0.03; done`)}))
	if err != nil {
		t.Fatal(err)
	}
	r, err := collect(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	if r.stdout != strings.Repeat("*", len(secret)) || r.stderr != strings.Repeat(".", len(secret)) {
		t.Fatalf("stdout %q stderr %q", r.stdout, r.stderr)
	}
}
