package httpapi_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
)

// Warm pools over the fake driver (real processes, no root): the API, the
// refill, claims and drains. pools_e2e_test.go runs them on runc.

// pool reads tenant's pool name.
func (h *harness) pool(tenant, name string) api.Pool {
	h.t.Helper()
	r := h.req("GET", "/v1/pools/"+name, h.key(tenant), nil)
	h.expect(r, http.StatusOK, "")
	var p api.Pool
	r.json(h.t, &p)
	return p
}

// putPool puts tenant's pool name. The pool is deleted when the test
// ends, before the daemon stops: a daemon keeps its members running across
// a stop, as it keeps every sandbox.
func (h *harness) putPool(tenant, name string, req api.PutPoolRequest) api.Pool {
	h.t.Helper()
	r := h.req("PUT", "/v1/pools/"+name, h.key(tenant), req)
	h.expect(r, http.StatusOK, "")
	if r.StatusCode == http.StatusOK {
		key := h.key(tenant)
		h.t.Cleanup(func() {
			if h.url != "" {
				h.req("DELETE", "/v1/pools/"+name, key, nil)
			}
		})
	}
	var p api.Pool
	r.json(h.t, &p)
	return p
}

// waitPoolReady waits until tenant's pool name has n ready members and
// none starting.
func (h *harness) waitPoolReady(t testing.TB, tenant, name string, n int) api.Pool {
	t.Helper()
	var p api.Pool
	deadline := time.Now().Add(30 * time.Second)
	for {
		p = h.pool(tenant, name)
		if p.Status.Ready == n && p.Status.Starting == 0 {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s: status %+v, want %d ready", name, p.Status, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// listed returns the ids of tenant's sandboxes GET /v1/sandboxes lists
// (every state).
func (h *harness) listed(tenant string) []string {
	h.t.Helper()
	r := h.req("GET", "/v1/sandboxes?state=all", h.key(tenant), nil)
	h.expect(r, http.StatusOK, "")
	var l api.SandboxList
	r.json(h.t, &l)
	var ids []string
	for _, sb := range l.Sandboxes {
		ids = append(ids, sb.ID)
	}
	return ids
}

func TestPoolAPI(t *testing.T) {
	h := newHarness(t)
	p := h.putPool("acme", "warm", api.PutPoolRequest{Template: "base", Size: 2})
	if p.Name != "warm" || p.Tenant != "acme" || p.Template != "base" || p.Runtime != "runc" || p.Size != 2 ||
		p.Resources.MemoryMB != 512 || p.Resources.CPU != 1 || p.CreatedAt.IsZero() {
		t.Fatalf("put: %+v", p)
	}
	p = h.waitPoolReady(t, "acme", "warm", 2)
	if p.Status.Claimed != 0 || p.Status.Error != "" {
		t.Fatalf("status %+v", p.Status)
	}
	// Members are live sandboxes of the tenant (its quota usage counts
	// them) that no list shows.
	if ids := h.listed("acme"); len(ids) != 0 {
		t.Fatalf("members listed: %v", ids)
	}
	if ids := h.listed("admin-view"); len(ids) != 0 {
		t.Fatalf("members listed: %v", ids)
	}
	r := h.req("GET", "/v1/sandboxes?state=all", h.admin, nil)
	var all api.SandboxList
	r.json(t, &all)
	if len(all.Sandboxes) != 0 {
		t.Fatalf("an admin's list shows members: %+v", all.Sandboxes)
	}
	if u := h.quotas(h.key("acme"), "acme").Usage; u.Sandboxes != 2 {
		t.Fatalf("usage %+v, want the 2 members", u)
	}

	// List: the tenant's own; an admin's: everyone's.
	h.putPool("globex", "other", api.PutPoolRequest{Template: "base", Size: 0})
	r = h.req("GET", "/v1/pools", h.key("acme"), nil)
	h.expect(r, http.StatusOK, "")
	var l api.PoolList
	r.json(t, &l)
	if len(l.Pools) != 1 || l.Pools[0].Name != "warm" {
		t.Fatalf("acme's list: %+v", l)
	}
	r = h.req("GET", "/v1/pools", h.admin, nil)
	r.json(t, &l)
	if len(l.Pools) != 2 || l.Pools[0].Tenant != "acme" || l.Pools[1].Tenant != "globex" {
		t.Fatalf("admin's list: %+v", l)
	}
	r = h.req("GET", "/v1/pools/warm?tenant=acme", h.admin, nil)
	h.expect(r, http.StatusOK, "")

	// Another tenant's pool is a missing one, on every route.
	h.expect(h.req("GET", "/v1/pools/warm", h.key("globex"), nil), http.StatusNotFound, api.CodeNotFound)
	h.expect(h.req("GET", "/v1/pools/warm?tenant=acme", h.key("globex"), nil), http.StatusNotFound, api.CodeNotFound)
	h.expect(h.req("DELETE", "/v1/pools/warm", h.key("globex"), nil), http.StatusNotFound, api.CodeNotFound)
	h.expect(h.req("POST", "/v1/sandboxes", h.key("globex"), api.CreateSandboxRequest{Pool: "warm"}), http.StatusNotFound, api.CodeNotFound)
	// A create of globex that matches acme's pool is never acme's member.
	cold := h.create("globex", api.CreateSandboxRequest{})
	if cold.Pool != "" || cold.Tenant != "globex" {
		t.Fatalf("globex's create: %+v", cold)
	}
	if p := h.pool("acme", "warm"); p.Status.Ready != 2 || p.Status.Claimed != 0 {
		t.Fatalf("acme's pool after globex's create: %+v", p.Status)
	}

	// Bad input.
	for _, tc := range []struct {
		name string
		body any
	}{
		{"Bad_Name", api.PutPoolRequest{Template: "base", Size: 1}},
		{"ok", api.PutPoolRequest{Template: "base", Size: -1}},
		{"ok", api.PutPoolRequest{Template: "base", Size: 1000}},
		{"ok", api.PutPoolRequest{Size: 1}},
		{"ok", api.PutPoolRequest{Template: "base", Size: 1, Runtime: "nope"}},
		{"ok", `{"template": "base", "size": 1, "bogus": 1}`},
	} {
		h.expect(h.req("PUT", "/v1/pools/"+tc.name, h.key("acme"), tc.body), http.StatusBadRequest, api.CodeInvalidArgument)
	}
	h.expect(h.req("PUT", "/v1/pools/ok", h.key("acme"), api.PutPoolRequest{Template: "missing", Size: 1}), http.StatusNotFound, api.CodeTemplateNotFound)
	// A create naming a pool it does not match.
	h.expect(h.req("POST", "/v1/sandboxes", h.key("acme"), api.CreateSandboxRequest{Pool: "warm", Resources: &api.Resources{MemoryMB: 256}}),
		http.StatusBadRequest, api.CodeInvalidArgument)
	// The quota bounds what pools may hold.
	h.setQuotas("acme", api.QuotaOverride{Sandboxes: ptr(3)})
	h.expect(h.req("PUT", "/v1/pools/big", h.key("acme"), api.PutPoolRequest{Template: "base", Size: 2}), http.StatusTooManyRequests, api.CodeQuotaExceeded)

	// DELETE drains: no member is left live.
	h.expect(h.req("DELETE", "/v1/pools/warm", h.key("acme"), nil), http.StatusNoContent, "")
	h.expect(h.req("GET", "/v1/pools/warm", h.key("acme"), nil), http.StatusNotFound, api.CodeNotFound)
	eventually(t, "the members drained", func() bool { return h.quotas(h.key("acme"), "acme").Usage.Sandboxes == 0 })
	if ids := h.listed("acme"); len(ids) != 0 {
		t.Fatalf("drained members listed: %v", ids)
	}
}

func TestPoolClaim(t *testing.T) {
	h := newHarness(t, withAudit())
	h.putPool("acme", "warm", api.PutPoolRequest{Template: "base", Size: 1})
	h.waitPoolReady(t, "acme", "warm", 1)

	secret := "s3cr3t-" + t.Name()
	first := h.create("acme", api.CreateSandboxRequest{Pool: "warm", Env: map[string]string{"GREETING": "hello"},
		Secrets: map[string]string{"TOKEN": secret}, Metadata: map[string]string{"run": "1"}, TimeoutS: ptr[int64](120)})
	if first.Pool != "warm" || first.State != api.StateRunning || first.Metadata["run"] != "1" || first.Tenant != "acme" {
		t.Fatalf("claimed %+v", first)
	}
	if got := first.ExpiresAt.Sub(first.CreatedAt); got < 119*time.Second || got > 122*time.Second {
		t.Fatalf("the TTL runs from the claim: expires - created = %v", got)
	}
	res := h.exec("acme", first.ID, api.ExecRequest{Shell: sh(`echo "$GREETING"; echo "$TOKEN"`)})
	if out := strp(res.Stdout); !strings.HasPrefix(out, "hello\n***") || strings.Contains(out, secret) {
		t.Fatalf("env and secret in the claimed member: %q", out)
	}
	if ids := h.listed("acme"); len(ids) != 1 || ids[0] != first.ID {
		t.Fatalf("listed %v, want the claimed one", ids)
	}
	// The pool refills with a new member; the claimed one is never its
	// member again.
	p := h.waitPoolReady(t, "acme", "warm", 1)
	if p.Status.Claimed != 1 {
		t.Fatalf("status %+v", p.Status)
	}
	h.expect(h.req("DELETE", "/v1/sandboxes/"+first.ID, h.key("acme"), nil), http.StatusNoContent, "")

	// Without naming the pool, a matching create claims too; it gets
	// nothing of the first claimer's env or secrets (the fake driver's
	// sandboxes share the host's files and processes: the e2e test checks
	// those on runc).
	second := h.create("acme", api.CreateSandboxRequest{})
	if second.Pool != "warm" || second.ID == first.ID {
		t.Fatalf("second claim %+v", second)
	}
	res = h.exec("acme", second.ID, api.ExecRequest{Shell: sh(`echo "greeting=$GREETING token=$TOKEN"`)})
	if out := strp(res.Stdout); out != "greeting= token=\n" {
		t.Fatalf("the second claimer sees the first's env: %q", out)
	}
	// The audit trail's create says pool.
	evs := h.auditAll(h.key("acme"), "type=create&sandbox_id="+second.ID, 0)
	if len(evs) != 1 {
		t.Fatalf("create events of %s: %+v", second.ID, evs)
	}
	var d map[string]any
	if err := json.Unmarshal(evs[0].Detail, &d); err != nil || d["pool"] != "warm" {
		t.Fatalf("create event detail %s", evs[0].Detail)
	}

	// Idempotency-Key: the retry answers the same sandbox.
	h.waitPoolReady(t, "acme", "warm", 1)
	r1 := h.req("POST", "/v1/sandboxes", h.key("acme"), `{"pool":"warm"}`, "Idempotency-Key", "claim-1")
	h.expect(r1, http.StatusCreated, "")
	r2 := h.req("POST", "/v1/sandboxes", h.key("acme"), `{"pool":"warm"}`, "Idempotency-Key", "claim-1")
	h.expect(r2, http.StatusCreated, "")
	var s1, s2 api.Sandbox
	r1.json(t, &s1)
	r2.json(t, &s2)
	if s1.ID != s2.ID || s1.Pool != "warm" || r2.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry answered %s (replayed %q), first %s (pool %q)", s2.ID, r2.Header.Get("Idempotent-Replayed"), s1.ID, s1.Pool)
	}
	// No member ready: a cold create, never a wait.
	h.putPool("acme", "warm", api.PutPoolRequest{Template: "base", Size: 0})
	if p := h.pool("acme", "warm"); p.Status.Ready != 0 {
		t.Fatalf("size 0 left %+v", p.Status)
	}
	cold := h.create("acme", api.CreateSandboxRequest{Pool: "warm"})
	if cold.Pool != "" {
		t.Fatalf("with no member ready: %+v", cold)
	}
}

// TestPoolConcurrentClaims: a member is handed out once, however many
// creates race for it.
func TestPoolConcurrentClaims(t *testing.T) {
	h := newHarness(t)
	const size, creates = 3, 6
	h.putPool("acme", "warm", api.PutPoolRequest{Template: "base", Size: size})
	h.waitPoolReady(t, "acme", "warm", size)
	key := h.key("acme")
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		got []api.Sandbox
	)
	for range creates {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := h.req("POST", "/v1/sandboxes", key, `{}`)
			if r.StatusCode != http.StatusCreated {
				t.Errorf("create: %d %s", r.StatusCode, r.body)
				return
			}
			var sb api.Sandbox
			if err := json.Unmarshal(r.body, &sb); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			got = append(got, sb)
			mu.Unlock()
		}()
	}
	wg.Wait()
	seen, claimed := map[string]bool{}, 0
	for _, sb := range got {
		if seen[sb.ID] {
			t.Fatalf("sandbox %s handed out twice", sb.ID)
		}
		seen[sb.ID] = true
		if sb.Pool == "warm" {
			claimed++
		}
	}
	if len(got) != creates || claimed == 0 || claimed > size {
		t.Fatalf("%d creates, %d claimed of %d members", len(got), claimed, size)
	}
}

// TestPoolRestart: a daemon restart keeps the pool and its ready members.
func TestPoolRestart(t *testing.T) {
	h := newHarness(t)
	h.putPool("acme", "warm", api.PutPoolRequest{Template: "base", Size: 2})
	h.waitPoolReady(t, "acme", "warm", 2)
	h.restart()
	h.waitPoolReady(t, "acme", "warm", 2)
	if n := h.liveInDriver(); n != 2 {
		t.Fatalf("%d sandboxes in the driver after restart, want the 2 members", n)
	}
	sb := h.create("acme", api.CreateSandboxRequest{Env: map[string]string{"X": "after-restart"}})
	if sb.Pool != "warm" {
		t.Fatalf("claim after restart: %+v", sb)
	}
	if out := strp(h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`echo $X`)}).Stdout); out != "after-restart\n" {
		t.Fatalf("env after restart: %q", out)
	}
	// The claimed one's env survives a restart too (it is in its record).
	h.restart()
	if out := strp(h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`echo $X`)}).Stdout); out != "after-restart\n" {
		t.Fatalf("env after a second restart: %q", out)
	}
	h.waitPoolReady(t, "acme", "warm", 2)
}
