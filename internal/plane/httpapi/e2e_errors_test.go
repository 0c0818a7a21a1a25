package httpapi_test

import (
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
)

// startAsync starts cmd as an async exec and returns its id.
func (h *harness) startAsync(tenant, id string, req api.ExecRequest) string {
	h.t.Helper()
	r := h.req("POST", "/v1/sandboxes/"+id+"/exec?async=true", h.key(tenant), req)
	h.expect(r, http.StatusAccepted, "")
	var st api.ExecStarted
	r.json(h.t, &st)
	return st.ID
}

// waitExec polls an exec until it is no longer running.
func (h *harness) waitExec(tenant, id, eid string) api.ExecResult {
	h.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var res api.ExecResult
		r := h.req("GET", "/v1/sandboxes/"+id+"/execs/"+eid, h.key(tenant), nil)
		h.expect(r, http.StatusOK, "")
		r.json(h.t, &res)
		if res.Status != api.ExecRunning {
			return res
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("exec %s still running: %+v", eid, res)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestE2ERuncErrorsApart is issue #7 point 6: each way an exec can end
// badly has its own (status, error_code), through the real HTTP server
// and runc.
func TestE2ERuncErrorsApart(t *testing.T) {
	e := newE2E(t)
	h := e.h
	sb := h.create("acme", api.CreateSandboxRequest{Resources: &api.Resources{MemoryMB: 128}})
	one := 1.0
	tests := []struct {
		name       string
		run        func() api.ExecResult
		status     string
		code       string
		stateAfter string
	}{
		{"timeout", func() api.ExecResult {
			return h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"sleep", "60"}, TimeoutS: &one})
		}, api.ExecTimeout, api.ExecCodeTimeout, api.StateRunning},
		{"oom", func() api.ExecResult {
			return h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"python3", "-c", "a = bytearray(1 << 30)"}})
		}, api.ExecOOM, api.ExecCodeOOM, api.StateRunning},
		{"killed_by_user", func() api.ExecResult {
			eid := h.startAsync("acme", sb.ID, api.ExecRequest{Cmd: []string{"sleep", "60"}})
			h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/execs/"+eid+"/signal", h.key("acme"), api.SignalRequest{Signal: "SIGKILL"}), http.StatusNoContent, "")
			return h.waitExec("acme", sb.ID, eid)
		}, api.ExecKilled, api.ExecCodeSignaled, api.StateRunning},
		{"exited_normally", func() api.ExecResult {
			return h.exec("acme", sb.ID, api.ExecRequest{Shell: sh("exit 3")})
		}, api.ExecExited, "", api.StateRunning},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := tc.run()
			if res.Status != tc.status || res.ErrorCode != tc.code {
				t.Fatalf("got status %q code %q, want %q %q (%+v)", res.Status, res.ErrorCode, tc.status, tc.code, res)
			}
			if got := h.state("acme", sb.ID); got.State != tc.stateAfter {
				t.Fatalf("sandbox after %s: %+v", tc.name, got)
			}
		})
	}
	t.Run("sandbox_stopped", func(t *testing.T) {
		other := h.create("acme", api.CreateSandboxRequest{})
		eid := h.startAsync("acme", other.ID, api.ExecRequest{Cmd: []string{"sleep", "60"}})
		h.expect(h.req("DELETE", "/v1/sandboxes/"+other.ID, h.key("acme"), nil), http.StatusNoContent, "")
		res := h.waitExec("acme", other.ID, eid)
		if res.Status != api.ExecKilled || res.ErrorCode != api.ExecCodeSandboxStopped || res.Error != "sandbox stopped (deleted)" {
			t.Fatalf("exec of a deleted sandbox: %+v", res)
		}
	})
	t.Run("sandbox_crashed", func(t *testing.T) {
		victim := h.create("acme", api.CreateSandboxRequest{})
		eid := h.startAsync("acme", victim.ID, api.ExecRequest{Cmd: []string{"sleep", "60"}})
		pid := e.initPid(victim.ID)
		// The sandbox's init (its agent), found by host pid: a process this
		// test made through the daemon, killed by pid.
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		res := h.waitExec("acme", victim.ID, eid)
		if res.Status != api.ExecError || res.ErrorCode != api.ExecCodeSandboxCrashed {
			t.Fatalf("exec of a crashed sandbox: %+v", res)
		}
		got := h.state("acme", victim.ID)
		if got.State != api.StateError || got.Error == nil || got.Error.Code != api.SandboxCodeCrashed {
			t.Fatalf("crashed sandbox: %+v", got)
		}
	})
}
