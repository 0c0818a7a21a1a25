package httpapi_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/driver"
)

func TestHealthzReadyzNeedNoKey(t *testing.T) {
	h := newHarness(t)
	h.expect(h.req("GET", "/healthz", "", nil), http.StatusOK, "")
	h.expect(h.req("GET", "/readyz", "", nil), http.StatusOK, "")
}

func TestCreateExecDelete(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{Metadata: map[string]string{"user": "u-42"}, Env: map[string]string{"GREETING": "hi"}})
	if !strings.HasPrefix(sb.ID, "sbx_") || len(sb.ID) < 24 || sb.State != api.StateRunning || sb.Tenant != "acme" {
		t.Fatalf("created %+v", sb)
	}
	if sb.Template != "base" || sb.TemplateVersion != 2 || sb.Runtime != "runc" || sb.ExpiresAt == nil || sb.Network.Mode != "none" {
		t.Fatalf("defaults not applied: %+v", sb)
	}
	if sb.Resources.MemoryMB != 512 || sb.Resources.CPU != 1 {
		t.Fatalf("default resources not applied: %+v", sb.Resources)
	}
	if got := sb.ExpiresAt.Sub(sb.CreatedAt); got < 299*time.Second || got > 302*time.Second {
		t.Fatalf("expires_at - created_at = %v, want ≈ 300s", got)
	}
	// Commands: argv, shell, env from the sandbox, non-zero exit is still 200.
	res := h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"echo", "hello", "world"}})
	if res.Status != api.ExecExited || intp(res.ExitCode) != "0" || strp(res.Stdout) != "hello world\n" || !strings.HasPrefix(res.ID, "ex_") {
		t.Fatalf("echo: %+v stdout=%q", res, strp(res.Stdout))
	}
	res = h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`echo "$GREETING from $USER"; echo oops >&2; exit 3`)})
	if intp(res.ExitCode) != "3" || strp(res.Stdout) != "hi from user\n" || strp(res.Stderr) != "oops\n" {
		t.Fatalf("shell: exit=%s stdout=%q stderr=%q", intp(res.ExitCode), strp(res.Stdout), strp(res.Stderr))
	}
	// A command that reads stdin in JSON mode gets the given stdin, then EOF.
	res = h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"cat"}, Stdin: sh("piped")})
	if strp(res.Stdout) != "piped" {
		t.Fatalf("stdin: %q", strp(res.Stdout))
	}
	res = h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"cat"}})
	if res.Status != api.ExecExited || strp(res.Stdout) != "" {
		t.Fatalf("cat without stdin must see EOF at once: %+v", res)
	}
	// Listing by metadata.
	r := h.req("GET", "/v1/sandboxes?metadata.user=u-42", h.key("acme"), nil)
	h.expect(r, http.StatusOK, "")
	var list api.SandboxList
	r.json(t, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != sb.ID {
		t.Fatalf("list by metadata: %+v", list)
	}
	// Delete is 204, twice; nothing is left in the runtime.
	h.expect(h.req("DELETE", "/v1/sandboxes/"+sb.ID, h.key("acme"), nil), http.StatusNoContent, "")
	h.expect(h.req("DELETE", "/v1/sandboxes/"+sb.ID, h.key("acme"), nil), http.StatusNoContent, "")
	if n := h.liveInDriver(); n != 0 {
		t.Fatalf("%d sandboxes left in the driver", n)
	}
	if got := h.state("acme", sb.ID); got.State != api.StateStopped || got.ExpiresAt != nil {
		t.Fatalf("after delete: %+v", got)
	}
	// A deleted sandbox cannot run commands.
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/exec", h.key("acme"), api.ExecRequest{Cmd: []string{"true"}}),
		http.StatusConflict, api.CodeInvalidState)
	// The default list shows live sandboxes only; state=all shows it.
	r = h.req("GET", "/v1/sandboxes", h.key("acme"), nil)
	r.json(t, &list)
	if len(list.Sandboxes) != 0 {
		t.Fatalf("stopped sandbox in the default list: %+v", list)
	}
	r = h.req("GET", "/v1/sandboxes?state=all", h.key("acme"), nil)
	r.json(t, &list)
	if len(list.Sandboxes) != 1 {
		t.Fatalf("state=all: %+v", list)
	}
	// Exec records outlive the sandbox.
	r = h.req("GET", "/v1/sandboxes/"+sb.ID+"/execs", h.key("acme"), nil)
	h.expect(r, http.StatusOK, "")
	var execs api.ExecList
	r.json(t, &execs)
	if len(execs.Execs) != 4 || execs.Execs[0].Cmd[0] != "cat" {
		t.Fatalf("exec records: %+v", execs)
	}
}

// TestBadInputs sends every bad input of the issue and checks each gets its
// structured error and leaves no state behind.
func TestBadInputs(t *testing.T) {
	h := newHarness(t, withMaxUpload(1<<20))
	sb := h.create("acme", api.CreateSandboxRequest{})
	key := h.key("acme")
	base := "/v1/sandboxes/" + sb.ID
	huge := `{"metadata":{"k":"` + strings.Repeat("x", 2<<20) + `"}}`
	tests := []struct {
		name   string
		method string
		path   string
		key    string
		body   any
		hdr    []string
		status int
		code   string
	}{
		{"malformed-json", "POST", "/v1/sandboxes", key, `{"template": "base"`, nil, 400, api.CodeInvalidArgument},
		{"not-json", "POST", "/v1/sandboxes", key, `template=base`, nil, 400, api.CodeInvalidArgument},
		{"trailing-garbage", "POST", "/v1/sandboxes", key, `{} {}`, nil, 400, api.CodeInvalidArgument},
		{"unknown-field", "POST", "/v1/sandboxes", key, `{"tempalte": "base"}`, nil, 400, api.CodeInvalidArgument},
		{"wrong-type", "POST", "/v1/sandboxes", key, `{"timeout_s": "long"}`, nil, 400, api.CodeInvalidArgument},
		{"json-body-too-large", "POST", "/v1/sandboxes", key, huge, nil, 413, api.CodePayloadTooLarge},
		{"unknown-runtime", "POST", "/v1/sandboxes", key, `{"runtime": "docker"}`, nil, 400, api.CodeInvalidArgument},
		// Permanent: the host lacks it (503 would invite retries forever).
		{"runtime-not-on-host", "POST", "/v1/sandboxes", key, `{"runtime": "gvisor"}`, nil, 400, api.CodeRuntimeUnavailable},
		{"memory-over-max", "POST", "/v1/sandboxes", key, `{"resources": {"memory_mb": 999999}}`, nil, 400, api.CodeInvalidArgument},
		{"negative-cpu", "POST", "/v1/sandboxes", key, `{"resources": {"cpu": -1}}`, nil, 400, api.CodeInvalidArgument},
		{"timeout-zero", "POST", "/v1/sandboxes", key, `{"timeout_s": 0}`, nil, 400, api.CodeInvalidArgument},
		{"timeout-over-max", "POST", "/v1/sandboxes", key, `{"timeout_s": 99999999}`, nil, 400, api.CodeInvalidArgument},
		{"bad-env-name", "POST", "/v1/sandboxes", key, `{"env": {"1BAD": "x"}}`, nil, 400, api.CodeInvalidArgument},
		{"bad-secret-name", "POST", "/v1/sandboxes", key, `{"secrets": {"A-B": "x"}}`, nil, 400, api.CodeInvalidArgument},
		{"bad-metadata-key", "POST", "/v1/sandboxes", key, `{"metadata": {"a b": "x"}}`, nil, 400, api.CodeInvalidArgument},
		{"unknown-template", "POST", "/v1/sandboxes", key, `{"template": "nope"}`, nil, 404, api.CodeTemplateNotFound},
		{"unknown-template-version", "POST", "/v1/sandboxes", key, `{"template": "base@9"}`, nil, 404, api.CodeTemplateNotFound},
		{"bad-template-ref", "POST", "/v1/sandboxes", key, `{"template": "../etc"}`, nil, 400, api.CodeInvalidArgument},
		{"network-open-unsupported", "POST", "/v1/sandboxes", key, `{"network": {"mode": "open"}}`, nil, 400, api.CodeInvalidArgument},
		{"missing-key", "POST", "/v1/sandboxes", "", `{}`, nil, 401, api.CodeUnauthenticated},
		{"wrong-key", "POST", "/v1/sandboxes", "ak_doesnotexist", `{}`, nil, 401, api.CodeUnauthenticated},
		{"cmd-and-shell", "POST", base + "/exec", key, `{"cmd": ["ls"], "shell": "ls"}`, nil, 400, api.CodeInvalidArgument},
		{"neither-cmd-nor-shell", "POST", base + "/exec", key, `{}`, nil, 400, api.CodeInvalidArgument},
		{"empty-body-exec", "POST", base + "/exec", key, ``, nil, 400, api.CodeInvalidArgument},
		{"relative-cwd", "POST", base + "/exec", key, `{"cmd": ["ls"], "cwd": "tmp"}`, nil, 400, api.CodeInvalidArgument},
		{"bad-user", "POST", base + "/exec", key, `{"cmd": ["ls"], "user": "../root"}`, nil, 400, api.CodeInvalidArgument},
		{"exec-timeout-negative", "POST", base + "/exec", key, `{"cmd": ["ls"], "timeout_s": -1}`, nil, 400, api.CodeInvalidArgument},
		{"max-output-too-big", "POST", base + "/exec", key, `{"cmd": ["ls"], "max_output_bytes": 999999999999}`, nil, 400, api.CodeInvalidArgument},
		{"path-outside-dotdot", "GET", base + "/files?path=" + url.QueryEscape("/home/user/../../../etc/shadow"), key, nil, nil, 400, api.CodeInvalidArgument},
		{"path-outside-put", "PUT", base + "/files?path=" + url.QueryEscape("/../x"), key, "data", nil, 400, api.CodeInvalidArgument},
		{"path-relative", "GET", base + "/fs/stat?path=etc/passwd", key, nil, nil, 400, api.CodeInvalidArgument},
		{"path-missing", "GET", base + "/fs/stat", key, nil, nil, 400, api.CodeInvalidArgument},
		{"move-outside", "POST", base + "/fs/move", key, `{"from": "/home/user/a", "to": "/home/../../b"}`, nil, 400, api.CodeInvalidArgument},
		{"bad-mode", "PUT", base + "/files?path=/tmp/x&mode=999", key, "data", nil, 400, api.CodeInvalidArgument},
		{"bad-depth", "GET", base + "/fs/list?path=/&depth=0", key, nil, nil, 400, api.CodeInvalidArgument},
		{"missing-sandbox", "GET", "/v1/sandboxes/sbx_doesnotexist", key, nil, nil, 404, api.CodeSandboxNotFound},
		{"missing-sandbox-exec", "POST", "/v1/sandboxes/sbx_doesnotexist/exec", key, `{"cmd": ["ls"]}`, nil, 404, api.CodeSandboxNotFound},
		{"missing-exec", "GET", base + "/execs/ex_nope", key, nil, nil, 404, api.CodeExecNotFound},
		{"bad-signal", "POST", base + "/execs/ex_nope/signal", key, `{"signal": "SIG;rm"}`, nil, 400, api.CodeInvalidArgument},
		{"timeout-body-bad", "POST", base + "/timeout", key, `{"timeout_s": -5}`, nil, 400, api.CodeInvalidArgument},
		{"bad-limit", "GET", "/v1/sandboxes?limit=abc", key, nil, nil, 400, api.CodeInvalidArgument},
		{"bad-cursor", "GET", "/v1/sandboxes?cursor=%21%21", key, nil, nil, 400, api.CodeInvalidArgument},
		{"bad-state-filter", "GET", "/v1/sandboxes?state=bogus", key, nil, nil, 400, api.CodeInvalidArgument},
		{"tenant-creates-key", "POST", "/v1/keys", key, `{"tenant": "x"}`, nil, 403, api.CodePermissionDenied},
		{"tenant-reads-metrics", "GET", "/metrics", key, nil, nil, 403, api.CodePermissionDenied},
		{"bad-idempotency-key", "POST", "/v1/sandboxes", key, `{}`, []string{"Idempotency-Key", "a b"}, 400, api.CodeInvalidArgument},
		{"xml-content-type", "POST", "/v1/sandboxes", key, `{}`, []string{"Content-Type", "application/xml"}, 400, api.CodeInvalidArgument},
		{"unknown-route", "GET", "/v1/nope", key, nil, nil, 404, api.CodeNotFound},
		{"wrong-method", "PATCH", "/v1/sandboxes", key, nil, nil, 405, "method_not_allowed"},
	}
	created, _ := h.drv.Counts()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.req(tt.method, tt.path, tt.key, tt.body, tt.hdr...)
			h.expect(r, tt.status, tt.code)
			if strings.Contains(tt.path, "/v1/sandboxes/") && tt.status != 401 {
				if got := r.apiErr(t).SandboxID; got == "" {
					t.Errorf("error body lacks sandbox_id")
				}
			}
		})
	}
	// No input above created a sandbox, and the one sandbox still works.
	if c, _ := h.drv.Counts(); c != created {
		t.Fatalf("bad inputs created %d sandboxes", c-created)
	}
	r := h.req("GET", "/v1/sandboxes", key, nil)
	var list api.SandboxList
	r.json(t, &list)
	if len(list.Sandboxes) != 1 {
		t.Fatalf("sandboxes after bad inputs: %+v", list.Sandboxes)
	}
	if res := h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"true"}}); intp(res.ExitCode) != "0" {
		t.Fatalf("sandbox broken after bad inputs: %+v", res)
	}
}

// TestRuntimeAbsentOrUnhealthy: a runtime the host lacks is a permanent
// 400; one it has but that is unhealthy now is a 503 with Retry-After, and
// creates work again once a later probe finds it healthy.
func TestRuntimeAbsentOrUnhealthy(t *testing.T) {
	h := newHarness(t)
	key := h.key("acme")
	r := h.req("POST", "/v1/sandboxes", key, `{"runtime": "gvisor"}`)
	h.expect(r, http.StatusBadRequest, api.CodeRuntimeUnavailable)
	if ra := r.Header.Get("Retry-After"); ra != "" {
		t.Fatalf("an absent runtime says Retry-After %q", ra)
	}
	h.drv.SetHealth(driver.Health{State: driver.HealthUnhealthy, Description: "cgroups missing"})
	h.clock.Advance(time.Minute) // past the health TTL: probed again
	r = h.req("POST", "/v1/sandboxes", key, `{"runtime": "runc"}`)
	h.expect(r, http.StatusServiceUnavailable, api.CodeRuntimeUnavailable)
	if ra := r.Header.Get("Retry-After"); ra != "30" {
		t.Fatalf("an unhealthy runtime says Retry-After %q, want 30", ra)
	}
	h.drv.SetHealth(driver.Health{State: driver.HealthUndetected, Description: "needs root"})
	h.clock.Advance(time.Minute)
	h.expect(h.req("POST", "/v1/sandboxes", key, `{"runtime": "runc"}`), http.StatusBadRequest, api.CodeRuntimeUnavailable)
	h.drv.SetHealth(driver.Health{State: driver.HealthHealthy, Description: "ok"})
	h.clock.Advance(time.Minute)
	h.expect(h.req("POST", "/v1/sandboxes", key, `{"runtime": "runc"}`), http.StatusCreated, "")
}

// TestUploadTooLargeFromHeader sends only the headers of a 10 GiB upload:
// the answer must come from Content-Length alone, before any body.
func TestUploadTooLargeFromHeader(t *testing.T) {
	h := newHarness(t, withMaxUpload(1<<20))
	sb := h.create("acme", api.CreateSandboxRequest{})
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "PUT /v1/sandboxes/%s/files?path=/home/user/big HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", sb.ID, h.key("acme"), int64(10)<<30)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d, want 413", res.StatusCode)
	}
	// Nothing was written.
	h.expect(h.req("GET", "/v1/sandboxes/"+sb.ID+"/fs/stat?path=/home/user/big", h.key("acme"), nil), 404, api.CodeNotFound)
}

// TestUploadTooLargeStreamed sends a body without Content-Length that goes
// past the limit: it is cut off while reading and nothing stays.
func TestUploadTooLargeStreamed(t *testing.T) {
	h := newHarness(t, withMaxUpload(1<<20))
	sb := h.create("acme", api.CreateSandboxRequest{})
	body := &chunked{n: 3 << 20}
	r := h.req("PUT", "/v1/sandboxes/"+sb.ID+"/files?path=/home/user/big", h.key("acme"), body)
	h.expect(r, http.StatusRequestEntityTooLarge, api.CodePayloadTooLarge)
	h.expect(h.req("GET", "/v1/sandboxes/"+sb.ID+"/fs/stat?path=/home/user/big", h.key("acme"), nil), 404, api.CodeNotFound)
	// Under the limit the same path works.
	r = h.req("PUT", "/v1/sandboxes/"+sb.ID+"/files?path=/home/user/ok", h.key("acme"), &chunked{n: 1000})
	h.expect(r, http.StatusCreated, "")
}

// chunked is a body of n bytes with no known length (sent chunked).
type chunked struct{ n int }

func (c *chunked) Read(p []byte) (int, error) {
	if c.n == 0 {
		return 0, errEOF
	}
	k := min(len(p), c.n)
	for i := range p[:k] {
		p[i] = 'x'
	}
	c.n -= k
	return k, nil
}

func TestAuthKeysAndRevocation(t *testing.T) {
	h := newHarness(t)
	// Admin creates a tenant key; the secret is shown once.
	r := h.req("POST", "/v1/keys", h.admin, api.CreateKeyRequest{Tenant: "acme", Name: "ci"})
	h.expect(r, http.StatusCreated, "")
	var k api.Key
	r.json(t, &k)
	if !strings.HasPrefix(k.Key, "ak_") || !strings.HasPrefix(k.ID, "key_") || k.Tenant != "acme" || !strings.HasPrefix(k.Key, k.Prefix) {
		t.Fatalf("created key %+v", k)
	}
	// It works, with either header.
	h.expect(h.req("GET", "/v1/info", k.Key, nil), http.StatusOK, "")
	h.expect(h.req("GET", "/v1/info", "", nil, "X-API-Key", k.Key), http.StatusOK, "")
	// Listings never show secrets.
	r = h.req("GET", "/v1/keys", h.admin, nil)
	if strings.Contains(string(r.body), k.Key) {
		t.Fatal("key listing shows a secret")
	}
	var kl api.KeyList
	r.json(t, &kl)
	if len(kl.Keys) != 2 {
		t.Fatalf("admin sees %d keys, want 2", len(kl.Keys))
	}
	r = h.req("GET", "/v1/keys", k.Key, nil)
	r.json(t, &kl)
	if len(kl.Keys) != 1 || kl.Keys[0].ID != k.ID {
		t.Fatalf("tenant sees %+v", kl.Keys)
	}
	// Another tenant cannot revoke it.
	h.expect(h.req("DELETE", "/v1/keys/"+k.ID, h.key("other"), nil), 404, api.CodeNotFound)
	// Revocation is effective at once.
	h.expect(h.req("DELETE", "/v1/keys/"+k.ID, h.admin, nil), http.StatusNoContent, "")
	h.expect(h.req("GET", "/v1/info", k.Key, nil), 401, api.CodeUnauthenticated)
	h.expect(h.req("POST", "/v1/sandboxes", k.Key, `{}`), 401, api.CodeUnauthenticated)
	// Bad key requests.
	h.expect(h.req("POST", "/v1/keys", h.admin, `{"tenant": "Not Valid"}`), 400, api.CodeInvalidArgument)
}

func TestTenantIsolation(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{})
	h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"true"}})
	evil := h.key("evil")
	missing := "sbx_" + strings.Repeat("a", 24)
	for _, rt := range []struct{ method, suffix, body string }{
		{"GET", "", ""}, {"DELETE", "", ""}, {"POST", "/exec", `{"cmd":["id"]}`}, {"GET", "/execs", ""},
		{"POST", "/pause", ""}, {"POST", "/resume", ""}, {"POST", "/timeout", `{"timeout_s": 60}`},
		{"GET", "/metrics", ""}, {"GET", "/files?path=/etc/passwd", ""}, {"GET", "/fs/list?path=/", ""},
		{"PUT", "/files?path=/tmp/x", "data"}, {"DELETE", "/fs?path=/tmp", ""},
	} {
		t.Run(rt.method+rt.suffix, func(t *testing.T) {
			var body any
			if rt.body != "" {
				body = rt.body
			}
			foreign := h.req(rt.method, "/v1/sandboxes/"+sb.ID+rt.suffix, evil, body)
			absent := h.req(rt.method, "/v1/sandboxes/"+missing+rt.suffix, evil, body)
			h.expect(foreign, 404, api.CodeSandboxNotFound)
			h.expect(absent, 404, api.CodeSandboxNotFound)
			f, a := foreign.apiErr(t), absent.apiErr(t)
			if f.Message != a.Message || len(foreign.body)-len(sb.ID) != len(absent.body)-len(missing) {
				t.Fatalf("foreign %s and missing %s bodies differ", foreign.body, absent.body)
			}
		})
	}
	// Not listed for the other tenant; the admin sees every tenant.
	var list api.SandboxList
	h.req("GET", "/v1/sandboxes", evil, nil).json(t, &list)
	if len(list.Sandboxes) != 0 {
		t.Fatalf("evil lists %+v", list.Sandboxes)
	}
	h.req("GET", "/v1/sandboxes", h.admin, nil).json(t, &list)
	if len(list.Sandboxes) != 1 {
		t.Fatalf("admin lists %+v", list.Sandboxes)
	}
	h.expect(h.req("GET", "/v1/sandboxes/"+sb.ID, h.admin, nil), 200, "")
	// And the sandbox survived the other tenant's delete attempt.
	if got := h.state("acme", sb.ID); got.State != api.StateRunning {
		t.Fatalf("state after foreign delete: %s", got.State)
	}
}

func TestIdempotencyKey(t *testing.T) {
	h := newHarness(t)
	key := h.key("acme")
	body := `{"metadata": {"run": "1"}}`
	first := h.req("POST", "/v1/sandboxes", key, body, "Idempotency-Key", "create-1")
	h.expect(first, 201, "")
	second := h.req("POST", "/v1/sandboxes", key, body, "Idempotency-Key", "create-1")
	h.expect(second, 201, "")
	var a, b api.Sandbox
	first.json(t, &a)
	second.json(t, &b)
	if a.ID != b.ID || second.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry gave %s (replayed %q), want %s", b.ID, second.Header.Get("Idempotent-Replayed"), a.ID)
	}
	// Same key, different request: conflict.
	h.expect(h.req("POST", "/v1/sandboxes", key, `{"metadata": {"run": "2"}}`, "Idempotency-Key", "create-1"), 409, api.CodeConflict)
	// Keys are per tenant.
	other := h.req("POST", "/v1/sandboxes", h.key("other"), body, "Idempotency-Key", "create-1")
	h.expect(other, 201, "")
	var c api.Sandbox
	other.json(t, &c)
	if c.ID == a.ID {
		t.Fatal("another tenant got the same sandbox for the same key")
	}
	// Concurrent retries of a new key all get one sandbox.
	var wg sync.WaitGroup
	ids := make([]string, 6)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := h.req("POST", "/v1/sandboxes", key, body, "Idempotency-Key", "create-2")
			if r.StatusCode == 201 {
				var s api.Sandbox
				r.json(t, &s)
				ids[i] = s.ID
			}
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if id == "" || id != ids[0] {
			t.Fatalf("concurrent retries got %v", ids)
		}
	}
	if created, _ := h.drv.Counts(); created != 3 {
		t.Fatalf("driver created %d sandboxes, want 3", created)
	}
}

func TestCapacityAndQuota(t *testing.T) {
	h := newHarness(t, withSettings(func(c *config.Config) {
		c.MaxSandboxes = 3
		c.MaxSandboxesPerTenant = 2
	}))
	a1 := h.create("acme", api.CreateSandboxRequest{})
	h.create("acme", api.CreateSandboxRequest{})
	// Tenant quota: 429 with Retry-After.
	r := h.req("POST", "/v1/sandboxes", h.key("acme"), `{}`)
	h.expect(r, 429, api.CodeQuotaExceeded)
	if r.Header.Get("Retry-After") == "" {
		t.Fatal("quota_exceeded without Retry-After")
	}
	// Another tenant takes the last host slot; then the host is full: 503.
	h.create("other", api.CreateSandboxRequest{})
	r = h.req("POST", "/v1/sandboxes", h.key("third"), `{}`)
	h.expect(r, 503, api.CodeCapacityExhausted)
	if r.Header.Get("Retry-After") == "" {
		t.Fatal("capacity_exhausted without Retry-After")
	}
	if n := h.liveInDriver(); n != 3 {
		t.Fatalf("%d sandboxes in the driver, want 3", n)
	}
	// Freeing one makes room again.
	h.expect(h.req("DELETE", "/v1/sandboxes/"+a1.ID, h.key("acme"), nil), 204, "")
	h.create("third", api.CreateSandboxRequest{})
}

func TestCreateFailureCleansUp(t *testing.T) {
	h := newHarness(t)
	h.drv.FailNextStart(fmt.Errorf("runc: exec failed at /var/lib/secret/path"))
	r := h.req("POST", "/v1/sandboxes", h.key("acme"), `{}`, "Idempotency-Key", "k1")
	h.expect(r, 500, api.CodeInternal)
	if strings.Contains(string(r.body), "/var/lib") {
		t.Fatalf("host path leaked to the client: %s", r.body)
	}
	if n := h.liveInDriver(); n != 0 {
		t.Fatalf("failed create left %d sandboxes", n)
	}
	// The failure is recorded, not forgotten.
	var list api.SandboxList
	h.req("GET", "/v1/sandboxes", h.key("acme"), nil).json(t, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].State != "error" || list.Sandboxes[0].Error == nil {
		t.Fatalf("failed sandbox record: %+v", list.Sandboxes)
	}
	// A retry with the same key tries again rather than replaying the failure.
	h.expect(h.req("POST", "/v1/sandboxes", h.key("acme"), `{}`, "Idempotency-Key", "k1"), 201, "")
	// Deleting the failed one acknowledges it.
	h.expect(h.req("DELETE", "/v1/sandboxes/"+list.Sandboxes[0].ID, h.key("acme"), nil), 204, "")
	if got := h.state("acme", list.Sandboxes[0].ID); got.State != api.StateStopped || got.Error == nil {
		t.Fatalf("deleted failed sandbox: %+v", got)
	}
}

func TestInfoAndMetrics(t *testing.T) {
	h := newHarness(t)
	h.create("acme", api.CreateSandboxRequest{})
	var info api.Info
	h.req("GET", "/v1/info", h.key("acme"), nil).json(t, &info)
	if info.Version != "test" || len(info.Drivers) != 4 || info.Limits.MaxSandboxes != 200 {
		t.Fatalf("info %+v", info)
	}
	// The host's names are the operator's business: admins only.
	if info.Host != nil {
		t.Fatalf("a tenant key sees the host slot %+v", info.Host)
	}
	var adm api.Info
	h.req("GET", "/v1/info", h.admin, nil).json(t, &adm)
	if adm.Host == nil || adm.Host.Slot != 3 || adm.Host.NftTable != "airlock_3" {
		t.Fatalf("admin info host %+v", adm.Host)
	}
	for _, d := range info.Drivers {
		want := "undetected"
		if d.Name == "runc" {
			want = "healthy"
			if !d.Default || len(d.Capabilities) == 0 {
				t.Fatalf("runc info %+v", d)
			}
		}
		if d.Health != want {
			t.Fatalf("driver %s health %s, want %s", d.Name, d.Health, want)
		}
	}
	r := h.req("GET", "/metrics", h.admin, nil)
	h.expect(r, 200, "")
	for _, want := range []string{`airlock_sandboxes{runtime="runc",state="running",template="base"} 1`, `airlock_capacity_sandboxes 200`, `airlock_http_request_duration_seconds_bucket{code="201",method="POST",route="POST /v1/sandboxes"`} {
		if !strings.Contains(string(r.body), want) {
			t.Fatalf("metrics lack %q", want)
		}
	}
}
