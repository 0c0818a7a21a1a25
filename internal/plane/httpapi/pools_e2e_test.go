package httpapi_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/testutil/daemontest"
)

// TestE2EPools: warm pools on runc behind the real daemon. A claim gets the
// request's env, secrets (as files), network policy and metadata; a later
// claimer never sees an earlier one's files, env or processes; members are
// not listed; a restart keeps the pool and its members; size 0 and DELETE
// drain; and the harness's leak check after many claim cycles finds
// nothing left (mounts, loop devices, cgroups, processes, sandbox files).
func TestE2EPools(t *testing.T) {
	w := newWorld(t)
	e := newE2E(t, e2eWorld(w))
	h := e.h
	h.putPool("acme", "warm", api.PutPoolRequest{Template: "base", Size: 2})
	h.waitPoolReady(t, "acme", "warm", 2)
	if ids := h.listed("acme"); len(ids) != 0 {
		t.Fatalf("members listed: %v", ids)
	}
	h.expect(h.req("GET", "/v1/pools/warm", h.key("globex"), nil), http.StatusNotFound, api.CodeNotFound)
	h.expect(h.req("POST", "/v1/sandboxes", h.key("globex"), api.CreateSandboxRequest{Pool: "warm"}), http.StatusNotFound, api.CodeNotFound)

	secret := daemontest.Token()
	first := h.create("acme", api.CreateSandboxRequest{Pool: "warm", Env: map[string]string{"GREETING": "hello"},
		Secrets: map[string]string{"TOKEN": secret}, SecretsAsFiles: true, Metadata: map[string]string{"claim": "first"},
		Network: &api.Network{Mode: "allowlist", Allow: []string{"allowed.test"}}})
	if first.Pool != "warm" || first.Network.Mode != "allowlist" || first.Metadata["claim"] != "first" {
		t.Fatalf("claimed %+v", first)
	}
	t.Run("claim_applies_the_request", func(t *testing.T) {
		res := h.exec("acme", first.ID, api.ExecRequest{Cmd: []string{"env"}})
		out := strp(res.Stdout)
		if !strings.Contains(out, "GREETING=hello\n") || strings.Contains(out, "TOKEN") || strings.Contains(out, secret) {
			t.Fatalf("env of the claimed member: %q", out)
		}
		res = h.exec("acme", first.ID, api.ExecRequest{Shell: sh(`[ "$(cat /run/secrets/TOKEN)" = "` + secret + `" ] && stat -c '%a %U' /run/secrets/TOKEN`)})
		if strp(res.Stdout) != "400 user\n" {
			t.Fatalf("secret file: %q %q", strp(res.Stdout), strp(res.Stderr))
		}
		res = h.exec("acme", first.ID, api.ExecRequest{Cmd: fetch("http://allowed.test/")})
		if !strings.HasPrefix(strp(res.Stdout), "OK web-a") {
			t.Fatalf("fetch allowed.test from the claimed member: %q %q", strp(res.Stdout), strp(res.Stderr))
		}
		before := w.hits("b80")
		res = h.exec("acme", first.ID, api.ExecRequest{Cmd: fetch("http://denied.test/")})
		if !strings.HasPrefix(strp(res.Stdout), "FAIL") || w.hits("b80") != before {
			t.Fatalf("fetch denied.test from the claimed member: %q", strp(res.Stdout))
		}
		if got := h.state("acme", first.ID); got.Network.Mode != "allowlist" || got.Metadata["claim"] != "first" {
			t.Fatalf("record of the claimed member: %+v", got)
		}
	})
	t.Run("a_later_claim_sees_nothing_of_it", func(t *testing.T) {
		res := h.exec("acme", first.ID, api.ExecRequest{Shell: sh(`echo mine > /tmp/left-behind && echo mine > /home/user/left-behind && (setsid sleep 600 </dev/null >/dev/null 2>&1 &) && echo ok`)})
		if strp(res.Stdout) != "ok\n" {
			t.Fatalf("leaving state behind: %q %q", strp(res.Stdout), strp(res.Stderr))
		}
		h.expect(h.req("DELETE", "/v1/sandboxes/"+first.ID, h.key("acme"), nil), http.StatusNoContent, "")
		h.waitPoolReady(t, "acme", "warm", 2)
		for range 2 { // both members: the older and the one made after the claim
			sb := h.create("acme", api.CreateSandboxRequest{})
			if sb.Pool != "warm" || sb.ID == first.ID || sb.Network.Mode != "none" {
				t.Fatalf("second claim %+v", sb)
			}
			res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`ls /tmp /home/user /run/secrets; echo "greeting=$GREETING"; ps -eo args | grep -c '[s]leep 600'`)})
			if out := strp(res.Stdout); strings.Contains(out, "left-behind") || strings.Contains(out, "TOKEN") ||
				!strings.Contains(out, "greeting=\n") || !strings.HasSuffix(out, "\n0\n") {
				t.Fatalf("a later claimer sees an earlier one's state: %q", out)
			}
			res = h.exec("acme", sb.ID, api.ExecRequest{Cmd: fetch("http://allowed.test/")})
			if !strings.HasPrefix(strp(res.Stdout), "FAIL") {
				t.Fatalf("network mode none reached out: %q", strp(res.Stdout))
			}
			h.expect(h.req("DELETE", "/v1/sandboxes/"+sb.ID, h.key("acme"), nil), http.StatusNoContent, "")
		}
	})
	t.Run("restart_keeps_the_members", func(t *testing.T) {
		h.waitPoolReady(t, "acme", "warm", 2)
		e.stop()
		e.start()
		h.waitPoolReady(t, "acme", "warm", 2)
		sb := h.create("acme", api.CreateSandboxRequest{Env: map[string]string{"AFTER": "restart"}})
		if sb.Pool != "warm" {
			t.Fatalf("claim after restart: %+v", sb)
		}
		if out := strp(h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`echo $AFTER`)}).Stdout); out != "restart\n" {
			t.Fatalf("env after restart: %q", out)
		}
		h.expect(h.req("DELETE", "/v1/sandboxes/"+sb.ID, h.key("acme"), nil), http.StatusNoContent, "")
	})
	t.Run("claim_cycles", func(t *testing.T) {
		claimed := 0
		for i := range 20 {
			sb := h.create("acme", api.CreateSandboxRequest{Env: map[string]string{"I": "x"}})
			if sb.Pool == "warm" {
				claimed++
			}
			if out := strp(h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`echo $I`)}).Stdout); out != "x\n" {
				t.Fatalf("cycle %d: %q", i, out)
			}
			h.expect(h.req("DELETE", "/v1/sandboxes/"+sb.ID, h.key("acme"), nil), http.StatusNoContent, "")
		}
		if claimed == 0 {
			t.Fatal("no create of 20 claimed a member")
		}
		t.Logf("%d of 20 creates claimed a member", claimed)
	})
	t.Run("size_0_and_delete_drain", func(t *testing.T) {
		h.waitPoolReady(t, "acme", "warm", 2)
		h.putPool("acme", "warm", api.PutPoolRequest{Template: "base", Size: 0})
		if u := h.quotas(h.key("acme"), "acme").Usage; u.Sandboxes != 0 {
			t.Fatalf("size 0 left %d sandboxes live", u.Sandboxes)
		}
		h.putPool("acme", "warm", api.PutPoolRequest{Template: "base", Size: 1})
		h.waitPoolReady(t, "acme", "warm", 1)
		h.expect(h.req("DELETE", "/v1/pools/warm", h.key("acme"), nil), http.StatusNoContent, "")
		if u := h.quotas(h.key("acme"), "acme").Usage; u.Sandboxes != 0 {
			t.Fatalf("delete left %d sandboxes live", u.Sandboxes)
		}
		// Every create's record is listed (state all), no member's: the
		// first claim, the two later ones, the one after the restart and
		// the 20 cycles.
		if ids := h.listed("acme"); len(ids) != 24 {
			t.Fatalf("acme's list has %d records, want the 24 creates'", len(ids))
		}
	})
}

// TestE2EPoolsGVisor: on gVisor, whose sandboxes see only the interfaces
// they had at start, a member starts wired with every egress denied and
// the claim opens what the request asks.
func TestE2EPoolsGVisor(t *testing.T) {
	w := newWorld(t)
	e := newE2E(t, e2eWorld(w))
	h := e.h
	h.putPool("acme", "gv", api.PutPoolRequest{Template: "base", Runtime: "gvisor", Size: 1})
	h.waitPoolReady(t, "acme", "gv", 1)
	sb := h.create("acme", api.CreateSandboxRequest{Runtime: "gvisor", Env: map[string]string{"GREETING": "hello"},
		Network: &api.Network{Mode: "allowlist", Allow: []string{"allowed.test"}}})
	if sb.Pool != "gv" || sb.Runtime != "gvisor" || sb.Network.Mode != "allowlist" {
		t.Fatalf("claimed %+v", sb)
	}
	if out := strp(h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`echo $GREETING`)}).Stdout); out != "hello\n" {
		t.Fatalf("env: %q", out)
	}
	res := h.exec("acme", sb.ID, api.ExecRequest{Cmd: fetch("http://allowed.test/")})
	if !strings.HasPrefix(strp(res.Stdout), "OK web-a") {
		t.Fatalf("fetch allowed.test: %q %q", strp(res.Stdout), strp(res.Stderr))
	}
	res = h.exec("acme", sb.ID, api.ExecRequest{Cmd: fetch("http://denied.test/")})
	if !strings.HasPrefix(strp(res.Stdout), "FAIL") {
		t.Fatalf("fetch denied.test: %q", strp(res.Stdout))
	}
	h.expect(h.req("DELETE", "/v1/sandboxes/"+sb.ID, h.key("acme"), nil), http.StatusNoContent, "")
	h.expect(h.req("DELETE", "/v1/pools/gv", h.key("acme"), nil), http.StatusNoContent, "")
}
