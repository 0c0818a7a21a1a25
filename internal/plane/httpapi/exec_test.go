package httpapi_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
)

// sseEvent is one parsed Server-Sent Event.
type sseEvent struct {
	name, id, data string
}

// readSSE parses events until the stream ends; comments are counted.
func readSSE(t testing.TB, body io.Reader) (events []sseEvent, comments int) {
	t.Helper()
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 1<<22)
	var cur sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.name != "" {
				events = append(events, cur)
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, ":"):
			comments++
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "id: "):
			cur.id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			cur.data += strings.TrimPrefix(line, "data: ")
		}
	}
	return events, comments
}

func (h *harness) sse(method, path, key string, body any, hdr ...string) (*http.Response, []sseEvent, int) {
	h.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = strings.NewReader(string(b))
	}
	r, _ := http.NewRequest(method, h.url+path, rd)
	r.Header.Set("Authorization", "Bearer "+key)
	r.Header.Set("Accept", "text/event-stream")
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(r)
	if err != nil {
		h.t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		b, _ := io.ReadAll(res.Body)
		h.t.Fatalf("SSE %s: status %d: %s", path, res.StatusCode, b)
	}
	ev, c := readSSE(h.t, res.Body)
	return res, ev, c
}

// outputOf concatenates the decoded data of output events by name.
func outputOf(t *testing.T, events []sseEvent) (map[string]string, api.ExecResult) {
	t.Helper()
	out := map[string]string{}
	var exit api.ExecResult
	next := int64(-1)
	for _, e := range events {
		switch e.name {
		case "stdout", "stderr":
			var oe api.OutputEvent
			if err := json.Unmarshal([]byte(e.data), &oe); err != nil {
				t.Fatal(err)
			}
			data := oe.Data
			if oe.Encoding == "base64" {
				b, _ := base64.StdEncoding.DecodeString(oe.Data)
				data = string(b)
			}
			if next >= 0 && oe.Offset != next {
				t.Fatalf("event at offset %d, want %d (contiguous)", oe.Offset, next)
			}
			next = oe.Offset + int64(len(data))
			if e.id != strconv.FormatInt(next, 10) {
				t.Fatalf("event id %q, want %d", e.id, next)
			}
			out[e.name] += data
		case "exit":
			if err := json.Unmarshal([]byte(e.data), &exit); err != nil {
				t.Fatal(err)
			}
		}
	}
	return out, exit
}

func TestExecSSE(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{})
	res, events, comments := h.sse("POST", "/v1/sandboxes/"+sb.ID+"/exec", h.key("acme"),
		api.ExecRequest{Shell: sh(`echo one; sleep 1; echo two >&2; printf '\377\376'; exit 2`)})
	if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content-type %q", ct)
	}
	if len(events) < 3 || events[0].name != "start" || events[len(events)-1].name != "exit" {
		t.Fatalf("events %+v", events)
	}
	var start api.ExecStarted
	json.Unmarshal([]byte(events[0].data), &start)
	out, exit := outputOf(t, events)
	if out["stdout"] != "one\n\xff\xfe" || out["stderr"] != "two\n" {
		t.Fatalf("output %q", out)
	}
	if exit.ID != start.ID || intp(exit.ExitCode) != "2" || exit.Stdout != nil || exit.Status != api.ExecExited {
		t.Fatalf("exit event %+v", exit)
	}
	// A 1 s pause is five heartbeat periods: two of them survive a server
	// that took its time to pass "one" on (a busy host), and no fewer may
	// go by without a comment.
	if comments < 2 {
		t.Fatalf("no heartbeat during a 1 s pause (heartbeat 200 ms): %d comments", comments)
	}
}

func TestExecAsyncEventsReplayAndRecords(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{})
	key := h.key("acme")
	r := h.req("POST", "/v1/sandboxes/"+sb.ID+"/exec?async=true", key, api.ExecRequest{Shell: sh(`for i in 1 2 3; do echo line$i; sleep 0.2; done`)})
	h.expect(r, http.StatusAccepted, "")
	var st api.ExecStarted
	r.json(t, &st)
	base := "/v1/sandboxes/" + sb.ID + "/execs/" + st.ID
	// While running: status running, no output yet in the record.
	var ex api.ExecResult
	h.req("GET", base, key, nil).json(t, &ex)
	if ex.Status != api.ExecRunning || ex.Stdout != nil || ex.ExitCode != nil {
		t.Fatalf("running exec: %+v", ex)
	}
	// Attach from 0 while it runs: everything, then the exit.
	_, events, _ := h.sse("GET", base+"/events?from_offset=0", key, nil)
	out, exit := outputOf(t, events)
	if out["stdout"] != "line1\nline2\nline3\n" || exit.Status != api.ExecExited {
		t.Fatalf("replay from 0: %q %+v", out, exit)
	}
	// Re-attach mid-way (also in the middle of a chunk) after the end.
	_, events, _ = h.sse("GET", base+"/events?from_offset=8", key, nil)
	out, _ = outputOf(t, events)
	if out["stdout"] != "ne2\nline3\n" {
		t.Fatalf("replay from 8: %q", out["stdout"])
	}
	_, events, _ = h.sse("GET", base+"/events", key, nil, "Last-Event-ID", "12")
	out, _ = outputOf(t, events)
	if out["stdout"] != "line3\n" {
		t.Fatalf("replay from Last-Event-ID 12: %q", out["stdout"])
	}
	h.req("GET", base, key, nil).json(t, &ex)
	if ex.Status != api.ExecExited || strp(ex.Stdout) != "line1\nline2\nline3\n" || ex.EndedAt == nil || ex.DurationMS < 500 {
		t.Fatalf("ended exec record: %+v", ex)
	}
	// After a restart the output comes from the store.
	h.restart()
	_, events, _ = h.sse("GET", base+"/events?from_offset=6", key, nil)
	out, exit = outputOf(t, events)
	if out["stdout"] != "line2\nline3\n" || exit.Status != api.ExecExited {
		t.Fatalf("replay from the store: %q %+v", out, exit)
	}
	h.req("GET", base, key, nil).json(t, &ex)
	if strp(ex.Stdout) != "line1\nline2\nline3\n" {
		t.Fatalf("record from the store: %+v", ex)
	}
}

func TestStdinAndSignal(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{})
	key := h.key("acme")
	base := "/v1/sandboxes/" + sb.ID
	r := h.req("POST", base+"/exec?async=true", key, api.ExecRequest{Cmd: []string{"cat"}})
	var st api.ExecStarted
	r.json(t, &st)
	h.expect(h.req("POST", base+"/execs/"+st.ID+"/stdin", key, "hello "), 200, "")
	h.expect(h.req("POST", base+"/execs/"+st.ID+"/stdin?eof=true", key, "world"), 200, "")
	var ex api.ExecResult
	eventually(t, "cat to end", func() bool {
		h.req("GET", base+"/execs/"+st.ID, key, nil).json(t, &ex)
		return ex.Status != api.ExecRunning
	})
	if strp(ex.Stdout) != "hello world" || ex.Status != api.ExecExited {
		t.Fatalf("cat: %+v %q", ex, strp(ex.Stdout))
	}
	// Stdin to an ended exec is a state error.
	h.expect(h.req("POST", base+"/execs/"+st.ID+"/stdin", key, "late"), 409, api.CodeInvalidState)

	r = h.req("POST", base+"/exec?async=true", key, api.ExecRequest{Shell: sh(`sleep 100 & sleep 100; wait`)})
	r.json(t, &st)
	h.expect(h.req("POST", base+"/execs/"+st.ID+"/signal", key, api.SignalRequest{Signal: "SIGKILL"}), 204, "")
	eventually(t, "killed", func() bool {
		h.req("GET", base+"/execs/"+st.ID, key, nil).json(t, &ex)
		return ex.Status != api.ExecRunning
	})
	if ex.Status != api.ExecKilled || ex.Signal != "SIGKILL" {
		t.Fatalf("after SIGKILL: %+v", ex)
	}
	var list, list2 api.ExecList
	h.req("GET", base+"/execs?limit=1", key, nil).json(t, &list)
	if len(list.Execs) != 1 || list.Execs[0].ID != st.ID || list.NextCursor == "" {
		t.Fatalf("exec list page: %+v", list)
	}
	h.req("GET", base+"/execs?limit=1&cursor="+list.NextCursor, key, nil).json(t, &list2)
	if len(list2.Execs) != 1 || list2.Execs[0].Cmd[0] != "cat" || list2.NextCursor != "" {
		t.Fatalf("exec list page 2: %+v", list2)
	}
}

func TestExecTimeoutAndOOM(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{})
	timeout := 0.3
	res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`trap "" TERM; sleep 30`), TimeoutS: &timeout})
	if res.Status != api.ExecTimeout || res.DurationMS > 10000 {
		t.Fatalf("timeout: %+v", res)
	}
	// The kernel's OOM killer is simulated: the driver's counter grows while
	// the exec dies by SIGKILL.
	key := h.key("acme")
	r := h.req("POST", "/v1/sandboxes/"+sb.ID+"/exec?async=true", key, api.ExecRequest{Shell: sh(`sleep 0.3; kill -KILL $$`)})
	var st api.ExecStarted
	r.json(t, &st)
	h.drv.AddOOMKill(sb.ID)
	var ex api.ExecResult
	eventually(t, "oom exec", func() bool {
		h.req("GET", "/v1/sandboxes/"+sb.ID+"/execs/"+st.ID, key, nil).json(t, &ex)
		return ex.Status != api.ExecRunning
	})
	if ex.Status != api.ExecOOM {
		t.Fatalf("status %q, want oom (%+v)", ex.Status, ex)
	}
	// SIGKILL without OOM growth is an ordinary death.
	res = h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`kill -KILL $$`)})
	if res.Status != api.ExecExited || res.Signal != "SIGKILL" {
		t.Fatalf("plain SIGKILL: %+v", res)
	}
	// Output past the cap is dropped and flagged, the command not blocked;
	// each stream has its own cap, so what comes on stderr after a flood
	// of stdout is kept, and the stdout kept is its first and last bytes.
	max := int64(1000)
	res = h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`echo first; head -c 100000 /dev/zero | tr '\0' a; echo last; echo done >&2`), MaxOutputBytes: &max})
	out := strp(res.Stdout)
	if !res.Truncated || len(out) != 1000 || !strings.HasPrefix(out, "first\naaa") || !strings.HasSuffix(out, "aaalast\n") ||
		strp(res.Stderr) != "done\n" || res.Status != api.ExecExited {
		t.Fatalf("cap: truncated=%v stdout=%d bytes stderr %q status=%s", res.Truncated, len(out), strp(res.Stderr), res.Status)
	}
	if res.StdoutDroppedBytes != 6+100000+5-1000 || res.StderrDroppedBytes != 0 {
		t.Fatalf("dropped %d/%d bytes", res.StdoutDroppedBytes, res.StderrDroppedBytes)
	}
	// The record says the same.
	var got api.ExecResult
	h.req("GET", "/v1/sandboxes/"+sb.ID+"/execs/"+res.ID, key, nil).json(t, &got)
	if strp(got.Stdout) != out || got.StdoutDroppedBytes != res.StdoutDroppedBytes || !got.Truncated {
		t.Fatalf("record: %d bytes, dropped %d", len(strp(got.Stdout)), got.StdoutDroppedBytes)
	}
}

// TestExecStartFailures: a command that cannot start is exec_failed with
// the shell's exit code, an unknown user or a missing cwd a 400; neither is
// agent_unavailable, which means the platform lost the agent.
func TestExecStartFailures(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{})
	key := h.key("acme")
	res := h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"nosuchcmd"}})
	if res.Status != api.ExecError || res.ErrorCode != api.ExecCodeExecFailed || res.ExitCode == nil || *res.ExitCode != 127 ||
		!strings.Contains(res.Error, "nosuchcmd: executable file not found") {
		t.Fatalf("nosuchcmd: %+v", res)
	}
	for _, req := range []api.ExecRequest{
		{Cmd: []string{"true"}, User: "nosuchuser"},
		{Cmd: []string{"true"}, Cwd: "/nonexistent"},
	} {
		r := h.req("POST", "/v1/sandboxes/"+sb.ID+"/exec", key, req)
		h.expect(r, http.StatusBadRequest, api.CodeInvalidArgument)
		if msg := r.apiErr(t).Message; !strings.Contains(msg, "nosuchuser") && !strings.Contains(msg, "/nonexistent") {
			t.Fatalf("message %q", msg)
		}
	}
	var list api.ExecList
	h.req("GET", "/v1/sandboxes/"+sb.ID+"/execs", key, nil).json(t, &list)
	for _, x := range list.Execs {
		if x.ErrorCode != api.ExecCodeExecFailed {
			t.Errorf("record %+v, want exec_failed", x)
		}
	}
	if len(list.Execs) != 3 {
		t.Errorf("%d records, want 3", len(list.Execs))
	}
}

func TestSecretsAreMaskedAndNotStored(t *testing.T) {
	h := newHarness(t)
	secret := "sk-live-0123456789abcdefXYZ"
	sb := h.create("acme", api.CreateSandboxRequest{Secrets: map[string]string{"OPENAI_KEY": secret}})
	res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(
		`echo "plain:$OPENAI_KEY"; printf %s "$OPENAI_KEY" | base64; printf 'x%s' "$OPENAI_KEY" | base64 -w0; echo; ` +
			`printf 'ab%s' "$OPENAI_KEY" | base64 -w0; echo; echo "url:sk-live-0123456789abcdefXYZ%2F" >&2; ` +
			`printf 'sk-live-0123'; sleep 0.1; printf '456789abcdefXYZ\n'`)})
	all := strp(res.Stdout) + strp(res.Stderr)
	enc := base64.StdEncoding.EncodeToString([]byte(secret))
	for _, leak := range []string{secret, enc, "0123456789abcdef"} {
		if strings.Contains(all, leak) {
			t.Fatalf("secret form %q leaked in output:\n%s", leak, all)
		}
	}
	if !strings.Contains(strp(res.Stdout), "plain:"+strings.Repeat("*", len(secret))) {
		t.Fatalf("plain secret not masked in place: %q", strp(res.Stdout))
	}
	// The same through SSE and from the record.
	_, events, _ := h.sse("POST", "/v1/sandboxes/"+sb.ID+"/exec", h.key("acme"), api.ExecRequest{Shell: sh(`echo $OPENAI_KEY`)})
	out, _ := outputOf(t, events)
	if strings.Contains(out["stdout"], secret) || len(out["stdout"]) != len(secret)+1 {
		t.Fatalf("SSE output %q", out["stdout"])
	}
	var rec api.ExecResult
	h.req("GET", "/v1/sandboxes/"+sb.ID+"/execs/"+res.ID, h.key("acme"), nil).json(t, &rec)
	if strings.Contains(strp(rec.Stdout)+strp(rec.Stderr)+strp(rec.Shell), secret) {
		t.Fatal("secret in the stored record")
	}
	// Never in plaintext on disk (the database and its WAL), nor in the API.
	h.expect(h.req("DELETE", "/v1/sandboxes/"+sb.ID, h.key("acme"), nil), 204, "")
	files, _ := filepath.Glob(filepath.Join(h.dataDir, "airlock.db*"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if strings.Contains(string(b), secret) {
			t.Fatalf("secret in plaintext in %s", f)
		}
	}
	got := h.req("GET", "/v1/sandboxes/"+sb.ID, h.key("acme"), nil)
	if strings.Contains(string(got.body), secret) {
		t.Fatal("secret in the sandbox view")
	}
}

func TestClientGoneExecContinues(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{})
	ctx, cancel := context.WithCancel(context.Background())
	body := strings.NewReader(`{"shell": "sleep 0.3; echo finished"}`)
	r, _ := http.NewRequestWithContext(ctx, "POST", h.url+"/v1/sandboxes/"+sb.ID+"/exec", body)
	r.Header.Set("Authorization", "Bearer "+h.key("acme"))
	go func() { time.Sleep(100 * time.Millisecond); cancel() }()
	if _, err := http.DefaultClient.Do(r); err == nil {
		t.Fatal("request was not cancelled")
	}
	var list api.ExecList
	eventually(t, "exec recorded to its end", func() bool {
		h.req("GET", "/v1/sandboxes/"+sb.ID+"/execs", h.key("acme"), nil).json(t, &list)
		return len(list.Execs) == 1 && list.Execs[0].Status == api.ExecExited
	})
	var ex api.ExecResult
	h.req("GET", "/v1/sandboxes/"+sb.ID+"/execs/"+list.Execs[0].ID, h.key("acme"), nil).json(t, &ex)
	if strp(ex.Stdout) != "finished\n" {
		t.Fatalf("output of an exec whose client left: %q", strp(ex.Stdout))
	}
}
