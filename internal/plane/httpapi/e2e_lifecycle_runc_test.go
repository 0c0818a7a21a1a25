package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	osexec "os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/reaper"
)

// runcStatus is what runc says of sandbox id ("" when it has no record).
func (e *e2e) runcStatus(id string) string {
	out, err := osexec.Command("runc", "--root", filepath.Join(e.dataDir, "runc"), "state", id).Output()
	if err != nil {
		return ""
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		e.t.Fatalf("runc state %s: %s", id, out)
	}
	return st.Status
}

// waitState polls sandbox id until it is in state (a minute at most).
func (e *e2e) waitState(tenant, id, state string) api.Sandbox {
	e.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		got := e.h.state(tenant, id)
		if got.State == state {
			return got
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("sandbox %s is %s, want %s: %+v", id, got.State, state, got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestE2ERuncPauseToDisk: on runc a pause to disk stops every process
// (runc reports the container stopped: no RAM held), keeps the files the
// sandbox wrote, survives a daemon restart paused, and the resume starts
// the sandbox again on its files. An exec that ran ends killed.
func TestE2ERuncPauseToDisk(t *testing.T) {
	e := newE2E(t)
	h := e.h
	key := h.key("acme")
	sb := h.create("acme", api.CreateSandboxRequest{Resources: &api.Resources{MemoryMB: 256}})
	if res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`mkdir -p /home/user/work && seq 1 100000 > /home/user/work/numbers && sync && echo ok`)}); strp(res.Stdout) != "ok\n" {
		t.Fatalf("write: %+v %q", res, strp(res.Stderr))
	}
	h.putFile("acme", sb.ID, "/home/user/uploaded.txt", "uploaded before the pause\n")
	eid := h.startAsync("acme", sb.ID, api.ExecRequest{Shell: sh(`echo started > /home/user/bg; sleep 600`)})

	p := h.pauseDisk("acme", sb.ID)
	if p.State != api.StatePaused || p.PauseMemory != api.PauseMemoryDisk {
		t.Fatalf("pause: %+v", p)
	}
	if st := e.runcStatus(sb.ID); st != "stopped" {
		t.Fatalf("runc says %q after a pause to disk, want stopped", st)
	}
	if res := h.waitExec("acme", sb.ID, eid); res.Status != api.ExecKilled || res.ErrorCode != api.ExecCodeSandboxStopped {
		t.Fatalf("exec at the pause: %s %s", res.Status, res.ErrorCode)
	}
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/exec", key, api.ExecRequest{Cmd: []string{"true"}}), http.StatusConflict, api.CodeInvalidState)

	// A daemon restart in between: still paused to disk, nothing lost.
	e.stop()
	e.start()
	got := h.state("acme", sb.ID)
	if got.State != api.StatePaused || got.PauseMemory != api.PauseMemoryDisk {
		t.Fatalf("after restart: %+v", got)
	}

	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/resume", key, nil), http.StatusOK, "")
	res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`wc -l < /home/user/work/numbers; tail -1 /home/user/work/numbers; cat /home/user/bg; cat /proc/[0-9]*/cmdline | tr '\0' ' ' | grep -c 'sleep [6]00' || true`)})
	if want := "100000\n100000\nstarted\n0\n"; strp(res.Stdout) != want {
		t.Fatalf("after resume: %q, want %q (stderr %q)", strp(res.Stdout), want, strp(res.Stderr))
	}
	if got := h.getFile("acme", sb.ID, "/home/user/uploaded.txt"); got != "uploaded before the pause\n" {
		t.Fatalf("uploaded file: %q", got)
	}

	// auto_resume: an exec on a sandbox paused to disk starts it first.
	h.expect(h.req("PATCH", "/v1/sandboxes/"+sb.ID, key, api.PatchSandboxRequest{Lifecycle: &api.Lifecycle{AutoResume: boolp(true)}}), http.StatusOK, "")
	h.pauseDisk("acme", sb.ID)
	if res := h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"cat", "/home/user/bg"}}); strp(res.Stdout) != "started\n" {
		t.Fatalf("exec with auto_resume: %+v", res)
	}
	if st := h.state("acme", sb.ID).State; st != api.StateRunning {
		t.Fatalf("after auto-resume: %s", st)
	}
	h.expect(h.req("DELETE", "/v1/sandboxes/"+sb.ID, key, nil), http.StatusNoContent, "")
	if got := h.state("acme", sb.ID); got.StopReason != api.StopDeleted {
		t.Fatalf("stop_reason %q, want deleted", got.StopReason)
	}
	if _, err := os.Stat(filepath.Join(e.dataDir, "sandboxes", sb.ID)); !os.IsNotExist(err) {
		t.Fatalf("sandbox dir left after delete: %v", err)
	}
	// A sandbox paused to disk deletes like any other, nothing left.
	other := h.create("acme", api.CreateSandboxRequest{})
	h.pauseDisk("acme", other.ID)
	h.expect(h.req("DELETE", "/v1/sandboxes/"+other.ID, key, nil), http.StatusNoContent, "")
	if got := h.state("acme", other.ID); got.State != api.StateStopped || got.StopReason != api.StopDeleted {
		t.Fatalf("deleted while paused to disk: %s %q", got.State, got.StopReason)
	}
	if _, err := os.Stat(filepath.Join(e.dataDir, "sandboxes", other.ID)); !os.IsNotExist(err) {
		t.Fatalf("sandbox dir left after deleting a sandbox paused to disk: %v", err)
	}
}

// TestE2ERuncStopReasons: a TTL's end is expired, an init killed from
// outside is crashed, an init the kernel killed for memory is oom.
func TestE2ERuncStopReasons(t *testing.T) {
	e := newE2E(t)
	h := e.h
	exp := h.create("acme", api.CreateSandboxRequest{TimeoutS: i64(1)})
	crash := h.create("acme", api.CreateSandboxRequest{})
	oom := h.create("acme", api.CreateSandboxRequest{Resources: &api.Resources{MemoryMB: 64}})

	// Crash: the agent (the init) killed by its pid, held by a pidfd.
	p, err := reaper.Watch(e.initPid(crash.ID))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Signal(unix.SIGKILL); err != nil {
		t.Fatal(err)
	}

	// OOM: the agent is made the OOM killer's first choice (score 1000;
	// execs get 500 from the agent) and the sandbox's memory is filled by
	// many small processes, none of which outscores it. (cgroup v1 has no
	// memory.oom.group to kill the whole sandbox.)
	pid := e.initPid(oom.ID)
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte("1000"), 0); err != nil {
		t.Fatal(err)
	}
	h.startAsync("acme", oom.ID, api.ExecRequest{Shell: sh(`for i in $(seq 24); do python3 -c 'import time; a = bytearray(6 << 20); time.sleep(600)' & sleep 0.1; done; wait`)})

	for id, want := range map[string]string{exp.ID: api.StopExpired, crash.ID: api.StopCrashed, oom.ID: api.StopOOM} {
		wantState := api.StateError
		if want == api.StopExpired {
			wantState = api.StateStopped
		}
		got := e.waitState("acme", id, wantState)
		if got.StopReason != want || got.EndedAt == nil {
			t.Errorf("%s: stop_reason %q (error %+v), want %q", id, got.StopReason, got.Error, want)
		}
	}
}

// TestE2ERuncPauseToDiskRestartsTheTemplate: a template with a start
// command (code-interpreter's kernel server) runs it again at the resume
// from disk, so that the sandbox answers as after its create: code runs
// (in a new interpreter: its state is gone with its processes), the files
// written before are there.
func TestE2ERuncPauseToDiskRestartsTheTemplate(t *testing.T) {
	c := newCodeE2E(t)
	h := c.h
	c.code(t, api.CodeRequest{Code: "open('/home/user/cell.txt', 'w').write('from a cell'); x = 41"})
	h.pauseDisk("acme", c.sb.ID)
	h.expect(h.req("POST", "/v1/sandboxes/"+c.sb.ID+"/resume", h.key("acme"), nil), http.StatusOK, "")
	evs := c.code(t, api.CodeRequest{Code: "print(open('/home/user/cell.txt').read()); print('x' in dir())"})
	if got := evStdout(evs); got != "from a cell\nFalse\n" {
		t.Fatalf("cell after resume: %q (%+v)", got, evs)
	}
}

// TestE2ERuncPauseToDiskRunsStartCommandAgain: the resume from disk of a
// sandbox whose template has a start command runs it again (and waits for
// its ready check) before it answers.
func TestE2ERuncPauseToDiskRunsStartCommandAgain(t *testing.T) {
	e := newE2E(t)
	h := e.h
	c := e.env.Client(h.key("acme"))
	ctx := context.Background()
	// The ready marker is on a memory file system (/dev/shm), new at every
	// start: a marker on disk would pass the ready check of the resume
	// before the start command ran again.
	start, ready := `echo start >> /home/user/starts; touch /dev/shm/up; exec sleep 1000`, `test -e /dev/shm/up`
	st, err := c.BuildTemplate(ctx, api.TemplateBuildRequest{Name: "svc", Dockerfile: "FROM base\n", StartCmd: &start, ReadyCmd: &ready}, client.BuildUploads{})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := c.FollowTemplateBuild(ctx, st.BuildID, io.Discard); err != nil || b.Status != api.BuildReady {
		t.Fatalf("build: %+v %v", b, err)
	}
	sb := h.create("acme", api.CreateSandboxRequest{Template: "svc"})
	h.pauseDisk("acme", sb.ID)
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/resume", h.key("acme"), nil), http.StatusOK, "")
	res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`cat /home/user/starts; test -e /dev/shm/up && echo up`)})
	if got := strp(res.Stdout); got != "start\nstart\nup\n" {
		t.Fatalf("after resume: %q (stderr %q)", got, strp(res.Stderr))
	}
	var l api.ExecList
	h.req("GET", "/v1/sandboxes/"+sb.ID+"/execs?status=running", h.key("acme"), nil).json(t, &l)
	running := 0
	for _, x := range l.Execs {
		if x.Status == api.ExecRunning {
			running++
		}
	}
	if running != 1 {
		t.Fatalf("%d running execs after the resume, want the start command's one: %+v", running, l.Execs)
	}
	// The start command, which always runs, does not keep it awake: an
	// idle timeout pauses it (memory kept).
	h.expect(h.req("PATCH", "/v1/sandboxes/"+sb.ID, h.key("acme"), api.PatchSandboxRequest{Lifecycle: &api.Lifecycle{IdleTimeoutS: i64(2)}}), http.StatusOK, "")
	if got := e.waitState("acme", sb.ID, api.StatePaused); got.PauseMemory != api.PauseMemoryKeep {
		t.Fatalf("idle pause: %+v", got)
	}
}
