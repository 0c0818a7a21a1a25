package httpapi_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/service/servicetest"
)

// The durable lifecycle over the fake driver (its sandboxes run the real
// agent on host directories): pause to disk (the fake checkpoints no
// memory, so it is the filesystem-only pause runc has), lifecycle rules,
// activity, auto-resume and stop reasons. Real runc: e2e_lifecycle_runc_test.go.

func boolp(b bool) *bool { return &b }

func (h *harness) pauseDisk(tenant, id string) api.Sandbox {
	h.t.Helper()
	r := h.req("POST", "/v1/sandboxes/"+id+"/pause", h.key(tenant), api.PauseRequest{Memory: api.PauseMemoryDisk})
	h.expect(r, http.StatusOK, "")
	var sb api.Sandbox
	r.json(h.t, &sb)
	return sb
}

func (h *harness) putFile(tenant, id, path, body string) {
	h.t.Helper()
	h.expect(h.req("PUT", "/v1/sandboxes/"+id+"/files?path="+path, h.key(tenant), body), http.StatusCreated, "")
}

func (h *harness) getFile(tenant, id, path string) string {
	h.t.Helper()
	r := h.req("GET", "/v1/sandboxes/"+id+"/files?path="+path, h.key(tenant), nil)
	h.expect(r, http.StatusOK, "")
	return string(r.body)
}

// TestPauseToDiskKeepsFilesEndsProcesses: a pause to disk on a runtime
// without memory checkpoints stops the processes (their execs end killed,
// sandbox_stopped), keeps the files, and the resume starts the sandbox
// again on them. The TTL does not run while paused, and the paused seconds
// are metered as paused to disk.
func TestPauseToDiskKeepsFilesEndsProcesses(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{TimeoutS: i64(60)})
	h.putFile("acme", sb.ID, "/home/user/kept.txt", "before the pause\n")
	eid := h.startAsync("acme", sb.ID, api.ExecRequest{Cmd: []string{"sleep", "60"}})

	p := h.pauseDisk("acme", sb.ID)
	if p.State != api.StatePaused || p.PauseMemory != api.PauseMemoryDisk || p.PausedAt == nil {
		t.Fatalf("pause to disk: %+v", p)
	}
	if res := h.waitExec("acme", sb.ID, eid); res.Status != api.ExecKilled || res.ErrorCode != api.ExecCodeSandboxStopped {
		t.Fatalf("exec running at the pause: %s %s, want killed sandbox_stopped", res.Status, res.ErrorCode)
	}
	// Paused: no exec, pausing again (either way) changes nothing.
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/exec", h.key("acme"), api.ExecRequest{Cmd: []string{"true"}}), http.StatusConflict, api.CodeInvalidState)
	if again := h.pauseDisk("acme", sb.ID); again.PauseMemory != api.PauseMemoryDisk {
		t.Fatalf("second pause: %+v", again)
	}
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/pause", h.key("acme"), nil), http.StatusOK, "")

	// Ten minutes paused: the TTL neither runs nor kills it.
	left := p.ExpiresAt.Sub(time.Now().Add(h.clockOff()))
	h.clock.Advance(10 * time.Minute)
	time.Sleep(100 * time.Millisecond)
	got := h.state("acme", sb.ID)
	if got.State != api.StatePaused {
		t.Fatalf("paused sandbox became %s", got.State)
	}
	if d := got.ExpiresAt.Sub(time.Now().Add(h.clockOff())) - left; d < -2*time.Second || d > 2*time.Second {
		t.Fatalf("time left changed by %v while paused", d)
	}
	if got.PausedS < 599 {
		t.Fatalf("paused_s %v, want ≥ 600", got.PausedS)
	}

	r := h.req("POST", "/v1/sandboxes/"+sb.ID+"/resume", h.key("acme"), nil)
	h.expect(r, http.StatusOK, "")
	var res api.Sandbox
	r.json(t, &res)
	if res.State != api.StateRunning || res.PauseMemory != "" || res.PausedAt != nil {
		t.Fatalf("resume: %+v", res)
	}
	if d := res.ExpiresAt.Sub(*sb.ExpiresAt); d < 599*time.Second || d > 605*time.Second {
		t.Fatalf("resume moved expires_at by %v, want ≈ 600s", d)
	}
	if got := h.getFile("acme", sb.ID, "/home/user/kept.txt"); got != "before the pause\n" {
		t.Fatalf("file after resume: %q", got)
	}
	if got := h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"echo", "back"}}); strp(got.Stdout) != "back\n" {
		t.Fatalf("exec after resume: %+v", got)
	}
	var rep api.UsageReport
	h.req("GET", "/v1/usage", h.key("acme"), nil).json(t, &rep)
	if u := rep.Total; u.PausedDiskS < 599 || u.PausedDiskS > u.PausedS+1e-6 {
		t.Fatalf("paused %v, of it to disk %v: want ≈ 600 to disk", u.PausedS, u.PausedDiskS)
	}
}

// clockOff is how far the harness clock is ahead of real time.
func (h *harness) clockOff() time.Duration { return time.Until(h.clock.Now()) }

// TestPauseToDiskRefusedForTmpfs: a sandbox whose files are in RAM cannot
// release it.
func TestPauseToDiskRefusedForTmpfs(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{Resources: &api.Resources{DiskTmpfs: true}})
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/pause", h.key("acme"), api.PauseRequest{Memory: api.PauseMemoryDisk}),
		http.StatusBadRequest, api.CodeCapabilityUnsupported)
	if st := h.state("acme", sb.ID).State; st != api.StateRunning {
		t.Fatalf("refused pause left it %s", st)
	}
}

// TestFailedDiskResumeStaysPaused: a resume whose start fails leaves the
// sandbox paused to disk with its files, reported by an error event; the
// next resume works.
func TestFailedDiskResumeStaysPaused(t *testing.T) {
	h := newHarness(t, withAudit())
	sb := h.create("acme", api.CreateSandboxRequest{})
	h.putFile("acme", sb.ID, "/home/user/kept.txt", "data\n")
	h.pauseDisk("acme", sb.ID)
	h.drv.FailNextStart(errors.New("injected start failure"))
	r := h.req("POST", "/v1/sandboxes/"+sb.ID+"/resume", h.key("acme"), nil)
	if r.StatusCode < 500 {
		t.Fatalf("failed resume answered %d %s", r.StatusCode, r.body)
	}
	got := h.state("acme", sb.ID)
	if got.State != api.StatePaused || got.PauseMemory != api.PauseMemoryDisk {
		t.Fatalf("after a failed resume: %s %s", got.State, got.PauseMemory)
	}
	if err := h.rec.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, ev := range h.auditAll(h.key("acme"), "sandbox_id="+sb.ID, 100) {
		if ev.Type == api.AuditError && string(ev.Detail) != "" && strings.Contains(string(ev.Detail), `"op":"resume"`) {
			found = true
		}
	}
	if !found {
		t.Fatal("no error event for the failed resume")
	}
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/resume", h.key("acme"), nil), http.StatusOK, "")
	if got := h.getFile("acme", sb.ID, "/home/user/kept.txt"); got != "data\n" {
		t.Fatalf("file after resume: %q", got)
	}
}

// TestPausedToDiskSurvivesRestart: a daemon restart keeps a sandbox
// paused to disk paused, and it resumes with its files.
func TestPausedToDiskSurvivesRestart(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{})
	h.putFile("acme", sb.ID, "/home/user/kept.txt", "across the restart\n")
	h.pauseDisk("acme", sb.ID)
	h.restart()
	got := h.state("acme", sb.ID)
	if got.State != api.StatePaused || got.PauseMemory != api.PauseMemoryDisk {
		t.Fatalf("after restart: %s %s (%+v)", got.State, got.PauseMemory, got.Error)
	}
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/resume", h.key("acme"), nil), http.StatusOK, "")
	if got := h.getFile("acme", sb.ID, "/home/user/kept.txt"); got != "across the restart\n" {
		t.Fatalf("file after restart and resume: %q", got)
	}
}

// TestIdleTimeoutKeepaliveAutoResume: no activity for idle_timeout_s
// pauses (memory keep); a keepalive or a running exec is activity; with
// auto_resume the next exec resumes it, without it the exec is 409.
func TestIdleTimeoutKeepaliveAutoResume(t *testing.T) {
	h := newHarness(t)
	key := h.key("acme")
	sb := h.create("acme", api.CreateSandboxRequest{TimeoutS: i64(3600),
		Lifecycle: &api.Lifecycle{IdleTimeoutS: i64(60), AutoResume: boolp(true)}})
	if l := sb.Lifecycle; l == nil || l.OnTimeout != api.OnTimeoutKill || l.AutoResume == nil || !*l.AutoResume || l.IdleTimeoutS == nil || *l.IdleTimeoutS != 60 {
		t.Fatalf("lifecycle %+v", sb.Lifecycle)
	}
	h.clock.Advance(50 * time.Second)
	r := h.req("POST", "/v1/sandboxes/"+sb.ID+"/keepalive", key, nil)
	h.expect(r, http.StatusOK, "")
	var ka api.Sandbox
	r.json(t, &ka)
	if ka.LastActivityAt == nil || ka.LastActivityAt.Before(sb.CreatedAt.Add(49*time.Second)) {
		t.Fatalf("keepalive: last_activity_at %v", ka.LastActivityAt)
	}
	if !ka.ExpiresAt.Equal(*sb.ExpiresAt) {
		t.Fatalf("keepalive moved expires_at %v → %v", sb.ExpiresAt, ka.ExpiresAt)
	}
	h.clock.Advance(30 * time.Second) // 80 s after create, 30 after the keepalive
	time.Sleep(100 * time.Millisecond)
	if st := h.state("acme", sb.ID).State; st != api.StateRunning {
		t.Fatalf("paused %s after a keepalive", st)
	}
	// A running exec keeps it awake past its idle deadline.
	eid := h.startAsync("acme", sb.ID, api.ExecRequest{Cmd: []string{"sleep", "60"}})
	h.clock.Advance(2 * time.Minute)
	time.Sleep(200 * time.Millisecond)
	if st := h.state("acme", sb.ID).State; st != api.StateRunning {
		t.Fatalf("paused %s while an exec ran", st)
	}
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/execs/"+eid+"/signal", key, api.SignalRequest{Signal: "KILL"}), http.StatusNoContent, "")
	h.waitExec("acme", sb.ID, eid)
	h.clock.Advance(61 * time.Second)
	eventually(t, "idle pause", func() bool { return h.state("acme", sb.ID).State == api.StatePaused })
	if pm := h.state("acme", sb.ID).PauseMemory; pm != api.PauseMemoryKeep {
		t.Fatalf("idle pause memory %q, want keep", pm)
	}
	// auto_resume: the exec resumes it first.
	if got := h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"echo", "awake"}}); strp(got.Stdout) != "awake\n" {
		t.Fatalf("exec on an idle-paused sandbox: %+v", got)
	}
	if st := h.state("acme", sb.ID).State; st != api.StateRunning {
		t.Fatalf("after auto-resume: %s", st)
	}
	// Without auto_resume (PATCH), the request is refused.
	r = h.req("PATCH", "/v1/sandboxes/"+sb.ID, key, api.PatchSandboxRequest{Lifecycle: &api.Lifecycle{AutoResume: boolp(false)}})
	h.expect(r, http.StatusOK, "")
	h.clock.Advance(61 * time.Second)
	eventually(t, "idle pause", func() bool { return h.state("acme", sb.ID).State == api.StatePaused })
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/exec", key, api.ExecRequest{Cmd: []string{"true"}}), http.StatusConflict, api.CodeInvalidState)
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/keepalive", key, nil), http.StatusConflict, api.CodeInvalidState)
}

// TestOnTimeoutPause: the TTL's end pauses instead of killing, and the
// resume gives a whole new TTL.
func TestOnTimeoutPause(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{TimeoutS: i64(60), Lifecycle: &api.Lifecycle{OnTimeout: api.OnTimeoutPause}})
	h.putFile("acme", sb.ID, "/home/user/kept.txt", "x")
	h.clock.Advance(61 * time.Second)
	eventually(t, "timeout pause", func() bool { return h.state("acme", sb.ID).State == api.StatePaused })
	h.clock.Advance(time.Hour)
	time.Sleep(100 * time.Millisecond)
	if got := h.state("acme", sb.ID); got.State != api.StatePaused || got.StopReason != "" {
		t.Fatalf("an hour after the timeout pause: %s %q", got.State, got.StopReason)
	}
	r := h.req("POST", "/v1/sandboxes/"+sb.ID+"/resume", h.key("acme"), nil)
	h.expect(r, http.StatusOK, "")
	var res api.Sandbox
	r.json(t, &res)
	if left := res.ExpiresAt.Sub(h.clock.Now()); left < 55*time.Second || left > 61*time.Second {
		t.Fatalf("after resume %v left, want a new 60 s TTL", left)
	}
	if got := h.getFile("acme", sb.ID, "/home/user/kept.txt"); got != "x" {
		t.Fatalf("file: %q", got)
	}
}

// TestAutoPauseIsOnTimeoutPause: auto_pause (the E2B SDKs' name) is
// on_timeout pause; with on_timeout kill it is a contradiction.
func TestAutoPauseIsOnTimeoutPause(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{TimeoutS: i64(60), AutoPause: true})
	if sb.Lifecycle == nil || sb.Lifecycle.OnTimeout != api.OnTimeoutPause {
		t.Fatalf("lifecycle of an auto_pause create: %+v", sb.Lifecycle)
	}
	h.clock.Advance(61 * time.Second)
	eventually(t, "timeout pause", func() bool { return h.state("acme", sb.ID).State == api.StatePaused })
	h.expect(h.req("POST", "/v1/sandboxes", h.key("acme"), api.CreateSandboxRequest{AutoPause: true, Lifecycle: &api.Lifecycle{OnTimeout: api.OnTimeoutKill}}),
		http.StatusBadRequest, api.CodeInvalidArgument)
}

// TestPatchSandbox: lifecycle changes field by field, metadata as a whole;
// bad values are 400, another tenant's sandbox 404.
func TestPatchSandbox(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{Metadata: map[string]string{"a": "1"}})
	path := "/v1/sandboxes/" + sb.ID
	r := h.req("PATCH", path, h.key("acme"), api.PatchSandboxRequest{Lifecycle: &api.Lifecycle{IdleTimeoutS: i64(30)}})
	h.expect(r, http.StatusOK, "")
	r = h.req("PATCH", path, h.key("acme"), api.PatchSandboxRequest{Lifecycle: &api.Lifecycle{OnTimeout: api.OnTimeoutPause}, Metadata: map[string]string{"b": "2"}})
	h.expect(r, http.StatusOK, "")
	got := h.state("acme", sb.ID)
	if l := got.Lifecycle; l.OnTimeout != api.OnTimeoutPause || *l.IdleTimeoutS != 30 || *l.AutoResume {
		t.Fatalf("lifecycle %+v %d", l, *l.IdleTimeoutS)
	}
	if len(got.Metadata) != 1 || got.Metadata["b"] != "2" {
		t.Fatalf("metadata %v", got.Metadata)
	}
	h.expect(h.req("PATCH", path, h.key("acme"), `{"lifecycle":{"on_timeout":"explode"}}`), http.StatusBadRequest, api.CodeInvalidArgument)
	h.expect(h.req("PATCH", path, h.key("acme"), `{"lifecycle":{"idle_timeout_s":-1}}`), http.StatusBadRequest, api.CodeInvalidArgument)
	h.expect(h.req("PATCH", path, h.key("acme"), `{}`), http.StatusBadRequest, api.CodeInvalidArgument)
	h.expect(h.req("PATCH", path, h.key("other"), api.PatchSandboxRequest{Metadata: map[string]string{"x": "y"}}), http.StatusNotFound, api.CodeSandboxNotFound)
	h.expect(h.req("POST", path+"/keepalive", h.key("other"), nil), http.StatusNotFound, api.CodeSandboxNotFound)
	// {} clears it (sent raw: the Go type's omitempty drops an empty map).
	h.expect(h.req("PATCH", path, h.key("acme"), `{"metadata":{}}`), http.StatusOK, "")
	if got := h.state("acme", sb.ID); len(got.Metadata) != 0 {
		t.Fatalf("metadata not cleared: %v", got.Metadata)
	}
}

// TestStopReasons: every stop says why, in the sandbox and its event.
func TestStopReasons(t *testing.T) {
	h := newHarness(t, withAudit())
	del := h.create("acme", api.CreateSandboxRequest{})
	h.expect(h.req("DELETE", "/v1/sandboxes/"+del.ID, h.key("acme"), nil), http.StatusNoContent, "")
	exp := h.create("acme", api.CreateSandboxRequest{TimeoutS: i64(60)})
	crash := h.create("acme", api.CreateSandboxRequest{})
	oom := h.create("acme", api.CreateSandboxRequest{})
	h.drv.Crash(crash.ID)
	h.drv.AddOOMKill(oom.ID)
	h.drv.Crash(oom.ID)
	h.clock.Advance(61 * time.Second)
	for id, want := range map[string]string{del.ID: api.StopDeleted, exp.ID: api.StopExpired, crash.ID: api.StopCrashed, oom.ID: api.StopOOM} {
		eventually(t, "stop of "+want, func() bool {
			st := h.state("acme", id).State
			return st == api.StateStopped || st == api.StateError
		})
		got := h.state("acme", id)
		if got.StopReason != want || got.EndedAt == nil {
			t.Errorf("%s: stop_reason %q ended_at %v, want %q", id, got.StopReason, got.EndedAt, want)
		}
	}
	if err := h.rec.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{del.ID: api.StopDeleted, exp.ID: api.StopExpired, crash.ID: api.StopCrashed, oom.ID: api.StopOOM} {
		found := false
		for _, ev := range h.auditAll(h.key("acme"), "sandbox_id="+id, 100) {
			found = found || strings.Contains(string(ev.Detail), `"stop_reason":"`+want+`"`)
		}
		if !found {
			t.Errorf("%s: no event with stop_reason %s", id, want)
		}
	}
}

// TestSDKLifecycle: the Go SDK's pause to disk, PATCH and keepalive.
func TestSDKLifecycle(t *testing.T) {
	h := newHarness(t)
	c, err := client.New(h.url, h.key("acme"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sb := h.create("acme", api.CreateSandboxRequest{})
	got, err := c.PauseWith(ctx, sb.ID, client.PauseOptions{Disk: true})
	if err != nil || got.PauseMemory != api.PauseMemoryDisk {
		t.Fatalf("pause to disk: %+v %v", got, err)
	}
	var ae *client.APIError
	if _, err := c.Keepalive(ctx, sb.ID); !errors.As(err, &ae) || ae.Code != api.CodeInvalidState {
		t.Fatalf("keepalive of a paused sandbox without auto_resume: %v", err)
	}
	got, err = c.Patch(ctx, sb.ID, api.PatchSandboxRequest{Lifecycle: &api.Lifecycle{AutoResume: boolp(true), IdleTimeoutS: i64(90)}})
	if err != nil || !*got.Lifecycle.AutoResume || *got.Lifecycle.IdleTimeoutS != 90 {
		t.Fatalf("patch: %+v %v", got, err)
	}
	// With auto_resume the keepalive resumes it.
	got, err = c.Keepalive(ctx, sb.ID)
	if err != nil || got.State != api.StateRunning || got.LastActivityAt == nil {
		t.Fatalf("keepalive: %+v %v", got, err)
	}
}

// ckDriver is the fake driver with memory checkpoints: Checkpoint writes
// an image file and stops the sandbox, Restore needs the image and starts
// it (the fake keeps no processes; what is tested is the service's path).
type ckDriver struct {
	*servicetest.Driver
	mu       sync.Mutex
	failNext error // the next Checkpoint fails, leaving the sandbox running
	restored []string
}

func (d *ckDriver) Capabilities() driver.Capabilities {
	c := d.Driver.Capabilities()
	c.MemorySnapshot = true
	return c
}

func (d *ckDriver) Checkpoint(ctx context.Context, id, dir string, o driver.CheckpointOptions) error {
	d.mu.Lock()
	err := d.failNext
	d.failNext = nil
	d.mu.Unlock()
	if err != nil {
		return err
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		return errors.New("checkpoint dir not empty")
	}
	if err := os.WriteFile(filepath.Join(dir, "pages.img"), []byte("memory"), 0o600); err != nil {
		return err
	}
	return d.Driver.Stop(ctx, id, 0)
}

func (d *ckDriver) Restore(ctx context.Context, id, dir string) error {
	if _, err := os.Stat(filepath.Join(dir, "pages.img")); err != nil {
		return err
	}
	d.mu.Lock()
	d.restored = append(d.restored, id)
	d.mu.Unlock()
	return d.Driver.Start(ctx, id)
}

// TestPauseToDiskWithCheckpoint: where the driver checkpoints memory, the
// pause writes a memory image of the sandbox's own and the resume
// restores from it (then removes it); a checkpoint that fails with the
// sandbox still running leaves it running and reports it.
func TestPauseToDiskWithCheckpoint(t *testing.T) {
	var ck *ckDriver
	h := newHarness(t, withAudit(), withDriver(func(d *servicetest.Driver) driver.Driver {
		ck = &ckDriver{Driver: d}
		return ck
	}))
	sb := h.create("acme", api.CreateSandboxRequest{})
	h.putFile("acme", sb.ID, "/home/user/kept.txt", "x")
	h.pauseDisk("acme", sb.ID)
	image := filepath.Join(h.dataDir, "pause", sb.ID)
	if _, err := os.Stat(filepath.Join(image, "complete")); err != nil {
		t.Fatalf("no complete memory image: %v", err)
	}
	// A restart keeps it paused with its image; the resume restores it.
	h.restart()
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/resume", h.key("acme"), nil), http.StatusOK, "")
	ck.mu.Lock()
	restored := slices.Clone(ck.restored)
	ck.mu.Unlock()
	if !slices.Equal(restored, []string{sb.ID}) {
		t.Fatalf("restored %v, want the sandbox once", restored)
	}
	if _, err := os.Stat(image); !os.IsNotExist(err) {
		t.Fatalf("used memory image left: %v", err)
	}
	if got := h.getFile("acme", sb.ID, "/home/user/kept.txt"); got != "x" {
		t.Fatalf("file: %q", got)
	}

	ck.mu.Lock()
	ck.failNext = errors.New("injected checkpoint failure")
	ck.mu.Unlock()
	r := h.req("POST", "/v1/sandboxes/"+sb.ID+"/pause", h.key("acme"), api.PauseRequest{Memory: api.PauseMemoryDisk})
	if r.StatusCode < 500 {
		t.Fatalf("failed checkpoint answered %d %s", r.StatusCode, r.body)
	}
	if st := h.state("acme", sb.ID).State; st != api.StateRunning {
		t.Fatalf("after a failed checkpoint: %s, want running", st)
	}
	if got := h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"echo", "still"}}); strp(got.Stdout) != "still\n" {
		t.Fatalf("exec after a failed checkpoint: %+v", got)
	}
	if err := h.rec.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, ev := range h.auditAll(h.key("acme"), "sandbox_id="+sb.ID, 100) {
		found = found || ev.Type == api.AuditError && strings.Contains(string(ev.Detail), `"op":"pause"`)
	}
	if !found {
		t.Fatal("no error event for the failed pause")
	}
	if _, err := os.Stat(image); !os.IsNotExist(err) {
		t.Fatalf("failed memory image left: %v", err)
	}
}

// TestOpenStreamsAreActivity: an open file watch and a download not read
// to its end keep a sandbox awake past its idle deadline; once they end,
// the idle timeout pauses it.
func TestOpenStreamsAreActivity(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sb := h.create("acme", api.CreateSandboxRequest{TimeoutS: i64(3600), Lifecycle: &api.Lifecycle{IdleTimeoutS: i64(60)}})
	h.putFile("acme", sb.ID, "/home/user/big.bin", strings.Repeat("x", 48<<20))
	c, err := client.New(h.url, h.key("acme"))
	if err != nil {
		t.Fatal(err)
	}
	awake := func(what string) {
		t.Helper()
		h.clock.Advance(2 * time.Minute)
		time.Sleep(200 * time.Millisecond) // the lifecycle loop's ticks
		if st := h.state("acme", sb.ID).State; st != api.StateRunning {
			t.Fatalf("%s with %s open", st, what)
		}
	}

	w, err := c.WatchDir(ctx, sb.ID, "/home/user", client.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	awake("a watch")
	w.Close()

	rc, err := c.ReadFile(ctx, sb.ID, "/home/user/big.bin")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(rc, make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	awake("a download")
	rc.Close()

	// The server sees the close a moment later (and that is activity too):
	// the clock moves on until the idle timeout pauses it.
	eventually(t, "idle pause once the streams closed", func() bool {
		h.clock.Advance(2 * time.Minute)
		time.Sleep(20 * time.Millisecond)
		return h.state("acme", sb.ID).State == api.StatePaused
	})
}

// TestPausedBounds: a keep pause held past paused_keep_max_s moves to disk
// where the runtime checkpoints memory (the pause keeps its start and its
// files); a sandbox paused past paused_retention_s is deleted, expired. A
// running sandbox is touched by neither.
func TestPausedBounds(t *testing.T) {
	h := newHarness(t, withAudit(), withDriver(func(d *servicetest.Driver) driver.Driver {
		return &ckDriver{Driver: d}
	}), withSettings(func(c *config.Config) { c.PausedKeepMaxS, c.PausedRetentionS = 600, 3600 }))
	sb := h.create("acme", api.CreateSandboxRequest{TimeoutS: i64(86400)})
	run := h.create("acme", api.CreateSandboxRequest{TimeoutS: i64(86400)})
	h.putFile("acme", sb.ID, "/home/user/kept.txt", "x")
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/pause", h.key("acme"), nil), http.StatusOK, "")
	paused := h.state("acme", sb.ID)
	if paused.PauseMemory != api.PauseMemoryKeep || paused.PausedAt == nil {
		t.Fatalf("pause: %+v", paused)
	}
	h.clock.Advance(599 * time.Second)
	time.Sleep(100 * time.Millisecond)
	if got := h.state("acme", sb.ID); got.PauseMemory != api.PauseMemoryKeep {
		t.Fatalf("before paused_keep_max_s: %s", got.PauseMemory)
	}
	h.clock.Advance(2 * time.Second)
	eventually(t, "keep pause moved to disk", func() bool { return h.state("acme", sb.ID).PauseMemory == api.PauseMemoryDisk })
	got := h.state("acme", sb.ID)
	if got.State != api.StatePaused || got.PausedAt == nil || !got.PausedAt.Equal(*paused.PausedAt) {
		t.Fatalf("moved to disk: %s paused_at %v, want paused since %v", got.State, got.PausedAt, paused.PausedAt)
	}
	if _, err := os.Stat(filepath.Join(h.dataDir, "pause", sb.ID, "complete")); err != nil {
		t.Fatalf("no memory image after the move: %v", err)
	}
	h.clock.Advance(3000 * time.Second) // 3601 s paused
	eventually(t, "deleted past paused_retention_s", func() bool { return h.state("acme", sb.ID).State == api.StateStopped })
	if got := h.state("acme", sb.ID); got.StopReason != api.StopExpired {
		t.Fatalf("stop_reason %q, want expired", got.StopReason)
	}
	if got := h.state("acme", run.ID); got.State != api.StateRunning {
		t.Fatalf("a running sandbox: %s", got.State)
	}
	if err := h.rec.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, ev := range h.auditAll(h.key("acme"), "sandbox_id="+sb.ID, 100) {
		found = found || ev.Type == api.AuditPause && strings.Contains(string(ev.Detail), pauseKeepMax)
	}
	if !found {
		t.Fatal("no pause event with reason keep_max")
	}
}

// pauseKeepMax is the reason of a pause event of a keep pause moved to disk.
const pauseKeepMax = `"reason":"keep_max"`

// TestDiskPauseHoldsOnlyDisk: a sandbox paused to disk leaves the
// tenant's cpu and memory quota (its disk stays counted); its resume takes
// them again, refused with 429 (it stays paused, files intact) while the
// tenant has no room.
func TestDiskPauseHoldsOnlyDisk(t *testing.T) {
	h := newHarness(t)
	mem := int64(2 * config.Default().DefaultResources.MemoryMB)
	h.setQuotas("acme", api.QuotaOverride{MemoryMB: &mem})
	a := h.create("acme", api.CreateSandboxRequest{})
	h.create("acme", api.CreateSandboxRequest{})
	expectQuotaExceeded(t, h, h.req("POST", "/v1/sandboxes", h.key("acme"), api.CreateSandboxRequest{}), "memory")
	h.putFile("acme", a.ID, "/home/user/kept.txt", "x")
	h.pauseDisk("acme", a.ID)
	u := h.quotas(h.key("acme"), "acme").Usage
	if u.MemoryMB != mem/2 || u.Sandboxes != 2 || u.DiskMB != 2*config.Default().DefaultResources.DiskMB {
		t.Fatalf("usage with one sandbox paused to disk: %+v", u)
	}
	c := h.create("acme", api.CreateSandboxRequest{})
	expectQuotaExceeded(t, h, h.req("POST", "/v1/sandboxes/"+a.ID+"/resume", h.key("acme"), nil), "memory")
	if got := h.state("acme", a.ID); got.State != api.StatePaused || got.PauseMemory != api.PauseMemoryDisk {
		t.Fatalf("after a refused resume: %s %s", got.State, got.PauseMemory)
	}
	h.expect(h.req("POST", "/v1/sandboxes/"+a.ID+"/reset", h.key("acme"), nil), http.StatusTooManyRequests, api.CodeQuotaExceeded)
	h.expect(h.req("DELETE", "/v1/sandboxes/"+c.ID, h.key("acme"), nil), http.StatusNoContent, "")
	h.expect(h.req("POST", "/v1/sandboxes/"+a.ID+"/resume", h.key("acme"), nil), http.StatusOK, "")
	if got := h.getFile("acme", a.ID, "/home/user/kept.txt"); got != "x" {
		t.Fatalf("file after the resume: %q", got)
	}
	if u := h.quotas(h.key("acme"), "acme").Usage; u.MemoryMB != mem {
		t.Fatalf("usage after the resume: %+v", u)
	}
	expectQuotaExceeded(t, h, h.req("POST", "/v1/sandboxes", h.key("acme"), api.CreateSandboxRequest{}), "memory")
}

// TestStreamsSayWhyTheyEnd: at shutdown every open stream (an exec's
// events, a watch) ends with an `event: error` saying the daemon is going
// away (code unavailable), never by a bare close; the exec goes on.
func TestStreamsSayWhyTheyEnd(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{})
	r := h.req("POST", "/v1/sandboxes/"+sb.ID+"/exec?async=true", h.key("acme"), api.ExecRequest{Shell: sh("echo started; sleep 30")})
	h.expect(r, http.StatusAccepted, "")
	var st api.ExecStarted
	r.json(t, &st)
	open := func(path string) io.ReadCloser {
		req, _ := http.NewRequest("GET", h.url+path, nil)
		req.Header.Set("Authorization", "Bearer "+h.key("acme"))
		req.Header.Set("Accept", "text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", path, resp.StatusCode)
		}
		buf := make([]byte, 16)
		if _, err := resp.Body.Read(buf); err != nil { // live
			t.Fatal(err)
		}
		return resp.Body
	}
	streams := []io.ReadCloser{
		open("/v1/sandboxes/" + sb.ID + "/execs/" + st.ID + "/events"),
		open("/v1/sandboxes/" + sb.ID + "/fs/watch?path=/home/user"),
	}
	h.srv.CloseStreams()
	for i, s := range streams {
		done := make(chan []byte, 1)
		go func() { b, _ := io.ReadAll(s); done <- b }()
		select {
		case rest := <-done:
			if !strings.Contains(string(rest), "event: error\ndata: {\"error\":{\"code\":\"unavailable\",\"message\":\"the daemon is shutting down") {
				t.Errorf("stream %d ended without saying why: %q", i, rest)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("stream %d still open after CloseStreams", i)
		}
		s.Close()
	}
	if got := h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"true"}}); got.ExitCode == nil || *got.ExitCode != 0 {
		t.Fatalf("an exec after the streams closed: %+v", got)
	}
}

// TestExecEndsWithStopReason: an exec whose sandbox stopped under it says
// why the sandbox stopped.
func TestExecEndsWithStopReason(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name, want string
		stop       func(id string)
	}{
		{"deleted", "sandbox stopped (deleted)", func(id string) {
			h.expect(h.req("DELETE", "/v1/sandboxes/"+id, h.key("acme"), nil), http.StatusNoContent, "")
		}},
		{"expired", "sandbox stopped (expired)", func(string) { h.clock.Advance(61 * time.Second) }},
	} {
		sb := h.create("acme", api.CreateSandboxRequest{TimeoutS: i64(60)})
		eid := h.startAsync("acme", sb.ID, api.ExecRequest{Cmd: []string{"sleep", "60"}})
		tc.stop(sb.ID)
		res := h.waitExec("acme", sb.ID, eid)
		if res.Status != api.ExecKilled || res.ErrorCode != api.ExecCodeSandboxStopped || res.Error != tc.want {
			t.Errorf("%s: %+v", tc.name, res)
		}
	}
}
