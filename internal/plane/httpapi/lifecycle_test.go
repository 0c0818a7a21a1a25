package httpapi_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
)

func i64(n int64) *int64 { return &n }

func TestTTLExpiry(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{TimeoutS: i64(60)})
	h.clock.Advance(59 * time.Second)
	time.Sleep(100 * time.Millisecond) // several ticks
	if got := h.state("acme", sb.ID); got.State != api.StateRunning {
		t.Fatalf("expired early: %s", got.State)
	}
	h.clock.Advance(2 * time.Second)
	eventually(t, "expiry", func() bool { return h.state("acme", sb.ID).State == api.StateStopped })
	if n := h.liveInDriver(); n != 0 {
		t.Fatalf("expired sandbox left in the driver")
	}
}

func TestTimeoutExtends(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{TimeoutS: i64(60)})
	h.clock.Advance(50 * time.Second)
	r := h.req("POST", "/v1/sandboxes/"+sb.ID+"/timeout", h.key("acme"), api.TimeoutRequest{TimeoutS: 60})
	h.expect(r, http.StatusOK, "")
	var got api.Sandbox
	r.json(t, &got)
	if d := got.ExpiresAt.Sub(*sb.ExpiresAt); d < 49*time.Second || d > 52*time.Second {
		t.Fatalf("expires_at moved by %v, want ≈ 50s", d)
	}
	h.clock.Advance(30 * time.Second) // 80s after create, 30s after the extension
	time.Sleep(100 * time.Millisecond)
	if st := h.state("acme", sb.ID).State; st != api.StateRunning {
		t.Fatalf("extended sandbox expired: %s", st)
	}
	h.clock.Advance(31 * time.Second)
	eventually(t, "expiry", func() bool { return h.state("acme", sb.ID).State == api.StateStopped })
}

func TestPauseDoesNotBurnTTL(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{TimeoutS: i64(60)})
	key := h.key("acme")
	r := h.req("POST", "/v1/sandboxes/"+sb.ID+"/pause", key, nil)
	h.expect(r, http.StatusOK, "")
	var p api.Sandbox
	r.json(t, &p)
	if p.State != api.StatePaused {
		t.Fatalf("pause: %+v", p)
	}
	// Pausing again is fine; exec on a paused sandbox is not.
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/pause", key, nil), http.StatusOK, "")
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/exec", key, api.ExecRequest{Cmd: []string{"true"}}), http.StatusConflict, api.CodeInvalidState)
	// Ten minutes paused do not count.
	h.clock.Advance(10 * time.Minute)
	time.Sleep(100 * time.Millisecond)
	if st := h.state("acme", sb.ID).State; st != api.StatePaused {
		t.Fatalf("paused sandbox changed to %s", st)
	}
	r = h.req("POST", "/v1/sandboxes/"+sb.ID+"/resume", key, nil)
	h.expect(r, http.StatusOK, "")
	var res api.Sandbox
	r.json(t, &res)
	if d := res.ExpiresAt.Sub(*sb.ExpiresAt); d < 599*time.Second || d > 602*time.Second {
		t.Fatalf("resume moved expires_at by %v, want ≈ 600s", d)
	}
	if got := h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"echo", "back"}}); strp(got.Stdout) != "back\n" {
		t.Fatalf("exec after resume: %+v", got)
	}
	var mt api.Metrics
	h.req("GET", "/v1/sandboxes/"+sb.ID+"/metrics", key, nil).json(t, &mt)
	if mt.UptimeS > 30 || mt.CPUSeconds != 1.5 {
		t.Fatalf("metrics %+v: uptime must not count paused time", mt)
	}
	h.clock.Advance(61 * time.Second)
	eventually(t, "expiry after resume", func() bool { return h.state("acme", sb.ID).State == api.StateStopped })
}

// TestRestartReadopts closes the manager and opens a new one on the same
// store and driver, as a daemon restart does.
func TestRestartReadopts(t *testing.T) {
	h := newHarness(t)
	keep := h.create("acme", api.CreateSandboxRequest{Secrets: map[string]string{"TOKEN": "restart-secret-value"}})
	dies := h.create("acme", api.CreateSandboxRequest{})
	gone := h.create("acme", api.CreateSandboxRequest{})
	paused := h.create("acme", api.CreateSandboxRequest{})
	h.expect(h.req("POST", "/v1/sandboxes/"+paused.ID+"/pause", h.key("acme"), nil), 200, "")
	// A command that runs across the restart.
	r := h.req("POST", "/v1/sandboxes/"+keep.ID+"/exec?async=true", h.key("acme"),
		api.ExecRequest{Shell: sh(`sleep 0.5; echo "survived $TOKEN"`)})
	h.expect(r, http.StatusAccepted, "")
	var started api.ExecStarted
	r.json(t, &started)

	h.stop()
	h.drv.Crash(dies.ID)  // init died while no daemon watched
	h.drv.Vanish(gone.ID) // the runtime forgot it altogether
	h.start()

	if got := h.state("acme", keep.ID); got.State != api.StateRunning {
		t.Fatalf("kept sandbox: %+v", got)
	}
	res := h.exec("acme", keep.ID, api.ExecRequest{Shell: sh(`echo "$TOKEN"`)})
	if strp(res.Stdout) != strings.Repeat("*", len("restart-secret-value"))+"\n" {
		t.Fatalf("after restart the secret must still be injected and masked: %q", strp(res.Stdout))
	}
	// The exec that ran across the restart is followed to its end.
	var ex api.ExecResult
	eventually(t, "exec across restart", func() bool {
		h.req("GET", "/v1/sandboxes/"+keep.ID+"/execs/"+started.ID, h.key("acme"), nil).json(t, &ex)
		return ex.Status != api.ExecRunning
	})
	if ex.Status != api.ExecExited || !strings.HasPrefix(strp(ex.Stdout), "survived *****") {
		t.Fatalf("exec across restart: %+v stdout %q", ex, strp(ex.Stdout))
	}
	for _, id := range []string{dies.ID, gone.ID} {
		got := h.state("acme", id)
		if got.State != "error" || got.Error == nil || got.Error.Code != "sandbox_crashed" {
			t.Fatalf("dead sandbox %s: %+v", id, got)
		}
	}
	if got := h.state("acme", paused.ID); got.State != api.StatePaused {
		t.Fatalf("paused sandbox after restart: %+v", got)
	}
	h.expect(h.req("POST", "/v1/sandboxes/"+paused.ID+"/resume", h.key("acme"), nil), 200, "")
	if got := h.exec("acme", paused.ID, api.ExecRequest{Cmd: []string{"true"}}); got.Status != api.ExecExited {
		t.Fatalf("resumed after restart: %+v", got)
	}
	live := map[string]bool{}
	for _, id := range h.drv.Live() {
		live[id] = true
	}
	if live[dies.ID] || live[gone.ID] || !live[keep.ID] || !live[paused.ID] {
		t.Fatalf("driver after recovery holds %v", h.drv.Live())
	}
}

func TestCrashIsReported(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{})
	r := h.req("POST", "/v1/sandboxes/"+sb.ID+"/exec?async=true", h.key("acme"), api.ExecRequest{Cmd: []string{"sleep", "60"}})
	h.expect(r, http.StatusAccepted, "")
	var started api.ExecStarted
	r.json(t, &started)
	h.drv.Crash(sb.ID)
	eventually(t, "crash noticed", func() bool { return h.state("acme", sb.ID).State == "error" })
	got := h.state("acme", sb.ID)
	if got.Error == nil || got.Error.Code != "sandbox_crashed" || !strings.Contains(got.Error.Message, "SIGKILL") {
		t.Fatalf("crash report: %+v", got.Error)
	}
	if n := h.liveInDriver(); n != 0 {
		t.Fatal("crashed sandbox not cleaned")
	}
	var ex api.ExecResult
	eventually(t, "exec ended", func() bool {
		h.req("GET", "/v1/sandboxes/"+sb.ID+"/execs/"+started.ID, h.key("acme"), nil).json(t, &ex)
		return ex.Status != api.ExecRunning
	})
	if ex.Status != api.ExecKilled && ex.Status != api.ExecError {
		t.Fatalf("exec of a crashed sandbox: %+v", ex)
	}
	// It stays visible until deleted.
	var list api.SandboxList
	h.req("GET", "/v1/sandboxes", h.key("acme"), nil).json(t, &list)
	if len(list.Sandboxes) != 1 {
		t.Fatal("crashed sandbox not listed")
	}
	h.expect(h.req("DELETE", "/v1/sandboxes/"+sb.ID, h.key("acme"), nil), 204, "")
}
