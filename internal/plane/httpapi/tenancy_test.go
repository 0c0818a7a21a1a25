package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/config"
)

// quotas reads tenant's quotas with key.
func (h *harness) quotas(key, tenant string) api.TenantQuotas {
	h.t.Helper()
	r := h.req("GET", "/v1/tenants/"+tenant+"/quotas", key, nil)
	h.expect(r, http.StatusOK, "")
	var q api.TenantQuotas
	r.json(h.t, &q)
	return q
}

// setQuotas puts tenant's override with the admin key.
func (h *harness) setQuotas(tenant string, o any) api.TenantQuotas {
	h.t.Helper()
	r := h.req("PUT", "/v1/tenants/"+tenant+"/quotas", h.admin, o)
	h.expect(r, http.StatusOK, "")
	var q api.TenantQuotas
	r.json(h.t, &q)
	return q
}

// expectQuotaExceeded asserts a 429 quota_exceeded whose message names
// the quota and which says when to retry.
func expectQuotaExceeded(t *testing.T, h *harness, r resp, quota string) time.Duration {
	t.Helper()
	h.expect(r, http.StatusTooManyRequests, api.CodeQuotaExceeded)
	if msg := r.apiErr(t).Message; !strings.HasPrefix(msg, quota+" quota exceeded") {
		t.Fatalf("message %q does not name the %s quota", msg, quota)
	}
	s, err := strconv.Atoi(r.Header.Get("Retry-After"))
	if err != nil || s < 1 {
		t.Fatalf("Retry-After %q", r.Header.Get("Retry-After"))
	}
	return time.Duration(s) * time.Second
}

func ptr[T any](v T) *T { return &v }

// TestTenancyQuotaDimensions: each resource quota refuses the create that
// would exceed it, names itself, counts only live sandboxes of the tenant,
// and follows an admin's change at once.
func TestTenancyQuotaDimensions(t *testing.T) {
	res := &api.Resources{CPU: 1.5, MemoryMB: 256, DiskMB: 512}
	tests := []struct {
		name     string
		override api.QuotaOverride
		fits     int // sandboxes of res that fit
		used     func(api.QuotaUsage) bool
	}{
		{"sandboxes", api.QuotaOverride{Sandboxes: ptr(2)}, 2, func(u api.QuotaUsage) bool { return u.Sandboxes == 2 }},
		{"cpu", api.QuotaOverride{CPU: ptr(4.5)}, 3, func(u api.QuotaUsage) bool { return u.CPU == 4.5 }},
		{"memory", api.QuotaOverride{MemoryMB: ptr(int64(600))}, 2, func(u api.QuotaUsage) bool { return u.MemoryMB == 512 }},
		{"disk", api.QuotaOverride{DiskMB: ptr(int64(1024))}, 2, func(u api.QuotaUsage) bool { return u.DiskMB == 1024 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			// Another tenant's sandboxes do not count against acme.
			h.create("other", api.CreateSandboxRequest{Resources: res})
			q := h.setQuotas("acme", tt.override)
			if q.Override == nil || q.Quota == q.Default {
				t.Fatalf("override not applied: %+v", q)
			}
			var ids []string
			for range tt.fits {
				ids = append(ids, h.create("acme", api.CreateSandboxRequest{Resources: res}).ID)
			}
			r := h.req("POST", "/v1/sandboxes", h.key("acme"), api.CreateSandboxRequest{Resources: res})
			expectQuotaExceeded(t, h, r, tt.name)
			if u := h.quotas(h.key("acme"), "acme").Usage; !tt.used(u) || u.Sandboxes != tt.fits {
				t.Fatalf("usage %+v after %d sandboxes", u, tt.fits)
			}
			// A deleted sandbox frees its share at once.
			h.expect(h.req("DELETE", "/v1/sandboxes/"+ids[0], h.key("acme"), nil), http.StatusNoContent, "")
			ids[0] = h.create("acme", api.CreateSandboxRequest{Resources: res}).ID
			expectQuotaExceeded(t, h, h.req("POST", "/v1/sandboxes", h.key("acme"), api.CreateSandboxRequest{Resources: res}), tt.name)
			// Back to the defaults: the next create fits again.
			h.expect(h.req("DELETE", "/v1/tenants/acme/quotas", h.admin, nil), http.StatusNoContent, "")
			if q := h.quotas(h.key("acme"), "acme"); q.Override != nil || q.Quota != q.Default {
				t.Fatalf("after DELETE: %+v", q)
			}
			h.create("acme", api.CreateSandboxRequest{Resources: res})
		})
	}
}

// TestTenancyDefaultQuotaFromConfig: the configured default applies to a
// tenant without an override and is what GET shows.
func TestTenancyDefaultQuotaFromConfig(t *testing.T) {
	h := newHarness(t, withSettings(func(c *config.Config) {
		c.MaxSandboxesPerTenant = 10
		c.TenantQuota = config.TenantQuota{CPU: 2, MemoryMB: 4096, DiskMB: 8192, ExecsPerMinute: 100}
	}))
	want := api.Quota{Sandboxes: 10, CPU: 2, MemoryMB: 4096, DiskMB: 8192, ExecsPerMinute: 100}
	q := h.quotas(h.key("fresh"), "fresh")
	if q.Tenant != "fresh" || q.Quota != want || q.Default != want || q.Override != nil || q.Usage != (api.QuotaUsage{}) {
		t.Fatalf("fresh tenant: %+v", q)
	}
	h.create("fresh", api.CreateSandboxRequest{Resources: &api.Resources{CPU: 1.5}})
	expectQuotaExceeded(t, h, h.req("POST", "/v1/sandboxes", h.key("fresh"), api.CreateSandboxRequest{Resources: &api.Resources{CPU: 1}}), "cpu")
	// Half a cpu is left: a sandbox that small fits.
	h.create("fresh", api.CreateSandboxRequest{Resources: &api.Resources{CPU: 0.5}})
	// An override of one field keeps the others' defaults; 0 lifts a limit.
	q = h.setQuotas("fresh", api.QuotaOverride{CPU: ptr(0.0)})
	if q.Quota.CPU != 0 || q.Quota.MemoryMB != 4096 || q.Usage.CPU != 2 {
		t.Fatalf("override of cpu only: %+v", q)
	}
	h.create("fresh", api.CreateSandboxRequest{Resources: &api.Resources{CPU: 4}})
}

// TestTenancyConcurrentCreatesStayWithinQuota: creates racing for the last
// of a quota cannot overshoot it.
func TestTenancyConcurrentCreatesStayWithinQuota(t *testing.T) {
	h := newHarness(t)
	h.setQuotas("acme", api.QuotaOverride{CPU: ptr(3.0)})
	key := h.key("acme")
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[int]int{}
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := http.NewRequest("POST", h.url+"/v1/sandboxes", strings.NewReader(`{"resources":{"cpu":1}}`))
			if err != nil {
				t.Error(err)
				return
			}
			r.Header.Set("Authorization", "Bearer "+key)
			res, err := http.DefaultClient.Do(r)
			if err != nil {
				t.Error(err)
				return
			}
			res.Body.Close()
			mu.Lock()
			statuses[res.StatusCode]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if statuses[http.StatusCreated] != 3 || statuses[http.StatusTooManyRequests] != 5 {
		t.Fatalf("statuses %v, want 3 created and 5 refused", statuses)
	}
}

// TestTenancyExecRateQuota: the tenant's exec rate, whoever's key starts
// them; refused execs do not count and Retry-After is when one fits again.
func TestTenancyExecRateQuota(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{})
	other := h.create("other", api.CreateSandboxRequest{})
	h.setQuotas("acme", api.QuotaOverride{ExecsPerMinute: ptr(int64(3))})
	h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"true"}})
	h.clock.Advance(20 * time.Second)
	h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"true"}})
	// An admin's exec in acme's sandbox is acme's.
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/exec", h.admin, api.ExecRequest{Cmd: []string{"true"}}), http.StatusOK, "")
	for _, mode := range []string{"", "?async=true"} {
		r := h.req("POST", "/v1/sandboxes/"+sb.ID+"/exec"+mode, h.key("acme"), api.ExecRequest{Cmd: []string{"true"}})
		// The first exec leaves the window at t=60s; it is t=20s.
		if wait := expectQuotaExceeded(t, h, r, "exec rate"); wait != 40*time.Second {
			t.Fatalf("Retry-After %v, want 40s", wait)
		}
	}
	if u := h.quotas(h.key("acme"), "acme").Usage; u.ExecsLastMinute != 3 {
		t.Fatalf("execs_last_minute %d, want 3 (refused ones do not count)", u.ExecsLastMinute)
	}
	// Another tenant is not affected.
	h.exec("other", other.ID, api.ExecRequest{Cmd: []string{"true"}})
	h.clock.Advance(40 * time.Second)
	h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"true"}})
	// Raising the quota applies at once.
	expectQuotaExceeded(t, h, h.req("POST", "/v1/sandboxes/"+sb.ID+"/exec", h.key("acme"), api.ExecRequest{Cmd: []string{"true"}}), "exec rate")
	h.setQuotas("acme", api.QuotaOverride{ExecsPerMinute: ptr(int64(4))})
	h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"true"}})
}

// TestTenancyQuotaPersists: an override is in the store and survives a
// daemon restart.
func TestTenancyQuotaPersists(t *testing.T) {
	h := newHarness(t)
	h.setQuotas("acme", api.QuotaOverride{Sandboxes: ptr(1), MemoryMB: ptr(int64(2048))})
	h.restart()
	q := h.quotas(h.admin, "acme")
	if q.Override == nil || q.Quota.Sandboxes != 1 || q.Quota.MemoryMB != 2048 {
		t.Fatalf("after restart: %+v", q)
	}
	h.create("acme", api.CreateSandboxRequest{})
	expectQuotaExceeded(t, h, h.req("POST", "/v1/sandboxes", h.key("acme"), `{}`), "sandboxes")
	// The sandbox that survived the restart is still counted.
	h.restart()
	expectQuotaExceeded(t, h, h.req("POST", "/v1/sandboxes", h.key("acme"), `{}`), "sandboxes")
	if u := h.quotas(h.admin, "acme").Usage; u.Sandboxes != 1 || u.MemoryMB != 512 {
		t.Fatalf("usage after restart: %+v", u)
	}
}

// TestTenancyScopes: what a tenant key may and may not do with quotas and
// keys; another tenant's are never readable or changeable.
func TestTenancyScopes(t *testing.T) {
	h := newHarness(t)
	acme, other := h.key("acme"), h.key("other")
	otherKeys := struct{ Keys []api.Key }{}
	h.req("GET", "/v1/keys", other, nil).json(t, &otherKeys)
	if len(otherKeys.Keys) != 1 {
		t.Fatalf("other's keys: %+v", otherKeys)
	}
	tests := []struct {
		name   string
		method string
		path   string
		key    string
		body   any
		status int
		code   string
	}{
		{"tenant-reads-own", "GET", "/v1/tenants/acme/quotas", acme, nil, 200, ""},
		{"tenant-reads-other", "GET", "/v1/tenants/other/quotas", acme, nil, 403, api.CodePermissionDenied},
		{"tenant-reads-unknown", "GET", "/v1/tenants/nobody/quotas", acme, nil, 403, api.CodePermissionDenied},
		{"tenant-puts-own", "PUT", "/v1/tenants/acme/quotas", acme, api.QuotaOverride{Sandboxes: ptr(1000)}, 403, api.CodePermissionDenied},
		{"tenant-puts-other", "PUT", "/v1/tenants/other/quotas", acme, api.QuotaOverride{Sandboxes: ptr(0)}, 403, api.CodePermissionDenied},
		{"tenant-deletes-own", "DELETE", "/v1/tenants/acme/quotas", acme, nil, 403, api.CodePermissionDenied},
		{"tenant-creates-key-for-other", "POST", "/v1/keys", acme, api.CreateKeyRequest{Tenant: "other", Name: "x"}, 403, api.CodePermissionDenied},
		{"tenant-creates-key-for-self", "POST", "/v1/keys", acme, api.CreateKeyRequest{Tenant: "acme", Name: "x"}, 403, api.CodePermissionDenied},
		{"tenant-revokes-other-key", "DELETE", "/v1/keys/" + otherKeys.Keys[0].ID, acme, nil, 404, api.CodeNotFound},
		{"admin-reads-any", "GET", "/v1/tenants/other/quotas", h.admin, nil, 200, ""},
		{"admin-puts-negative", "PUT", "/v1/tenants/acme/quotas", h.admin, `{"cpu": -1}`, 400, api.CodeInvalidArgument},
		{"admin-puts-unknown-field", "PUT", "/v1/tenants/acme/quotas", h.admin, `{"gpus": 1}`, 400, api.CodeInvalidArgument},
		{"admin-puts-huge-exec-rate", "PUT", "/v1/tenants/acme/quotas", h.admin, api.QuotaOverride{ExecsPerMinute: ptr(int64(config.MaxExecsPerMinute + 1))}, 400, api.CodeInvalidArgument},
		{"admin-bad-tenant-name", "PUT", "/v1/tenants/Not%20A%20Tenant/quotas", h.admin, `{}`, 400, api.CodeInvalidArgument},
		{"no-key", "GET", "/v1/tenants/acme/quotas", "", nil, 401, api.CodeUnauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h.expect(h.req(tt.method, tt.path, tt.key, tt.body), tt.status, tt.code)
		})
	}
	// Nothing the tenant tried changed anything.
	if q := h.quotas(h.admin, "acme"); q.Override != nil {
		t.Fatalf("acme's quota changed: %+v", q)
	}
	if q := h.quotas(h.admin, "other"); q.Override != nil {
		t.Fatalf("other's quota changed: %+v", q)
	}
	h.req("GET", "/v1/keys", other, nil).json(t, &otherKeys)
	if len(otherKeys.Keys) != 1 || otherKeys.Keys[0].RevokedAt != nil {
		t.Fatalf("other's keys after acme's attempts: %+v", otherKeys)
	}
}

// TestTenancyKeyRateLimit: each key has its own bucket; over it, 429
// rate_limited with Retry-After; a key's own limit replaces the default.
func TestTenancyKeyRateLimit(t *testing.T) {
	h := newHarness(t, withSettings(func(c *config.Config) {
		// A bucket that refills slowly enough not to refill mid-test.
		c.KeyRateLimitRPS, c.KeyRateLimitBurst = 0.2, 3
	}))
	limited, sibling := h.key("acme"), ""
	c, err := h.auth.CreateKey(context.Background(), "acme", "sibling", false)
	if err != nil {
		t.Fatal(err)
	}
	sibling = c.Secret
	own, err := h.auth.CreateKey(context.Background(), "acme", "own", false, auth.KeyRateLimit(ptr(0.2), ptr(6)))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		h.expect(h.req("GET", "/v1/sandboxes", limited, nil), http.StatusOK, "")
		_ = i
	}
	r := h.req("GET", "/v1/sandboxes", limited, nil)
	h.expect(r, http.StatusTooManyRequests, api.CodeRateLimited)
	if s, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || s < 1 || s > 5 {
		t.Fatalf("Retry-After %q, want 1..5 s for 0.2 rps", r.Header.Get("Retry-After"))
	}
	// The same tenant's other keys have their own buckets.
	h.expect(h.req("GET", "/v1/sandboxes", sibling, nil), http.StatusOK, "")
	for i := range 6 {
		h.expect(h.req("GET", "/v1/sandboxes", own.Secret, nil), http.StatusOK, "")
		_ = i
	}
	h.expect(h.req("GET", "/v1/sandboxes", own.Secret, nil), http.StatusTooManyRequests, api.CodeRateLimited)
	// A wrong key is refused as unauthenticated, never rate limited.
	for range 3 {
		h.expect(h.req("GET", "/v1/sandboxes", "ak_wrong", nil), http.StatusUnauthorized, api.CodeUnauthenticated)
	}
}

// TestTenancyRevocationIsImmediate: a revoked key's next request is 401,
// also while a stream it opened is still running.
func TestTenancyRevocationIsImmediate(t *testing.T) {
	h := newHarness(t)
	c, err := h.auth.CreateKey(context.Background(), "acme", "doomed", false)
	if err != nil {
		t.Fatal(err)
	}
	key := c.Secret
	r := h.req("POST", "/v1/sandboxes", key, `{}`)
	h.expect(r, http.StatusCreated, "")
	var sb api.Sandbox
	r.json(t, &sb)
	eid := func() string {
		r := h.req("POST", "/v1/sandboxes/"+sb.ID+"/exec?async=true", key, api.ExecRequest{Shell: sh("echo started; sleep 30")})
		h.expect(r, http.StatusAccepted, "")
		var st api.ExecStarted
		r.json(t, &st)
		return st.ID
	}()
	// A stream opened with the key, following the exec.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sreq, _ := http.NewRequestWithContext(ctx, "GET", h.url+"/v1/sandboxes/"+sb.ID+"/execs/"+eid+"/events", nil)
	sreq.Header.Set("Authorization", "Bearer "+key)
	sreq.Header.Set("Accept", "text/event-stream")
	stream, err := http.DefaultClient.Do(sreq)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	if stream.StatusCode != http.StatusOK {
		t.Fatalf("stream: %d", stream.StatusCode)
	}
	buf := make([]byte, 64)
	if _, err := stream.Body.Read(buf); err != nil { // the stream is live
		t.Fatal(err)
	}
	h.expect(h.req("DELETE", "/v1/keys/"+c.ID, h.admin, nil), http.StatusNoContent, "")
	// The stream the key opened ends too, long before its exec (30 s).
	ended := make(chan []byte, 1)
	go func() {
		rest, _ := io.ReadAll(stream.Body)
		ended <- rest
	}()
	select {
	case rest := <-ended:
		// Its last event says why.
		if !strings.Contains(string(rest), "event: error\ndata: {\"error\":{\"code\":\"unauthenticated\"") {
			t.Fatalf("the revoked key's stream ended without saying why: %q", rest)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the revoked key's event stream is still open")
	}
	for _, path := range []string{"/v1/sandboxes", "/v1/sandboxes/" + sb.ID, "/v1/tenants/acme/quotas", "/v1/sandboxes/" + sb.ID + "/execs/" + eid} {
		h.expect(h.req("GET", path, key, nil), http.StatusUnauthorized, api.CodeUnauthenticated)
	}
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/exec", key, api.ExecRequest{Cmd: []string{"true"}}), http.StatusUnauthorized, api.CodeUnauthenticated)
	// The tenant's other keys still work, and the sandbox is untouched.
	if got := h.state("acme", sb.ID); got.State != api.StateRunning {
		t.Fatalf("sandbox after its creator's key was revoked: %+v", got)
	}
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/execs/"+eid+"/signal", h.key("acme"), api.SignalRequest{Signal: "SIGKILL"}), http.StatusNoContent, "")
}

// TestTenancyQuotaMessages: GET for a tenant shows usage against quota in
// the units of the create request.
func TestTenancyUsageMatchesSandboxes(t *testing.T) {
	h := newHarness(t)
	for i, r := range []api.Resources{{CPU: 0.25, MemoryMB: 128, DiskMB: 64}, {CPU: 0.5, MemoryMB: 256, DiskMB: 128}, {}} {
		h.create("acme", api.CreateSandboxRequest{Resources: &r, Metadata: map[string]string{"i": fmt.Sprint(i)}})
	}
	d := config.Default().DefaultResources
	want := api.QuotaUsage{Sandboxes: 3, CPU: 0.75 + d.CPU, MemoryMB: 384 + d.MemoryMB, DiskMB: 192 + d.DiskMB}
	if u := h.quotas(h.key("acme"), "acme").Usage; u != want {
		t.Fatalf("usage %+v, want %+v", u, want)
	}
}

// TestTenancyIdempotentRetryAtFullQuota: the retry of a create whose
// sandbox filled the quota gets that sandbox, not quota_exceeded.
func TestTenancyIdempotentRetryAtFullQuota(t *testing.T) {
	h := newHarness(t)
	h.setQuotas("acme", api.QuotaOverride{Sandboxes: ptr(1)})
	r := h.req("POST", "/v1/sandboxes", h.key("acme"), `{}`, "Idempotency-Key", "job-1")
	h.expect(r, http.StatusCreated, "")
	var first api.Sandbox
	r.json(t, &first)
	r = h.req("POST", "/v1/sandboxes", h.key("acme"), `{}`, "Idempotency-Key", "job-1")
	h.expect(r, http.StatusCreated, "")
	var again api.Sandbox
	r.json(t, &again)
	if again.ID != first.ID || r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry got %s (replayed %q), want %s", again.ID, r.Header.Get("Idempotent-Replayed"), first.ID)
	}
	expectQuotaExceeded(t, h, h.req("POST", "/v1/sandboxes", h.key("acme"), `{}`, "Idempotency-Key", "job-2"), "sandboxes")
}

// TestTenancyKeyRateLimitThroughAPI: POST /v1/keys with a rate limit gives
// the new key that bucket, and the key's view shows it.
func TestTenancyKeyRateLimitThroughAPI(t *testing.T) {
	h := newHarness(t)
	r := h.req("POST", "/v1/keys", h.admin, map[string]any{"tenant": "acme", "name": "slow", "rate_limit_rps": 0.2, "rate_limit_burst": 2})
	h.expect(r, http.StatusCreated, "")
	var k api.Key
	if err := json.Unmarshal(r.body, &k); err != nil {
		t.Fatal(err)
	}
	if k.RateLimitRPS == nil || *k.RateLimitRPS != 0.2 || k.RateLimitBurst == nil || *k.RateLimitBurst != 2 {
		t.Fatalf("key view %+v: want its own rate limit", k)
	}
	for range 2 {
		h.expect(h.req("GET", "/v1/sandboxes", k.Key, nil), http.StatusOK, "")
	}
	h.expect(h.req("GET", "/v1/sandboxes", k.Key, nil), http.StatusTooManyRequests, api.CodeRateLimited)
	t.Run("bad_limit", func(t *testing.T) {
		r := h.req("POST", "/v1/keys", h.admin, map[string]any{"tenant": "acme", "name": "bad", "rate_limit_burst": 0})
		h.expect(r, http.StatusBadRequest, api.CodeInvalidArgument)
	})
}
