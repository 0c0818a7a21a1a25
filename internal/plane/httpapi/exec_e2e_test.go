package httpapi_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
)

// TestE2ERuncExecStartFailures: through the real runc sandbox, a command
// that cannot start is the caller's to fix, never agent_unavailable: a
// missing or non-executable command is an exec with error_code exec_failed
// (exit code 127 / 126, as a shell says), an unknown user or a missing cwd
// is 400 invalid_argument in every mode. The sandbox stays usable.
func TestE2ERuncExecStartFailures(t *testing.T) {
	e := newE2E(t)
	h := e.h
	key := h.key("acme")
	sb := h.create("acme", api.CreateSandboxRequest{})
	base := "/v1/sandboxes/" + sb.ID
	h.expect(h.req("PUT", base+"/files?path=/home/user/script.sh&mode=0644", key, "#!/bin/sh\necho ran\n"), http.StatusCreated, "")

	failures := []struct {
		name     string
		req      api.ExecRequest
		exitCode int
		reason   string
	}{
		{"not-found", api.ExecRequest{Cmd: []string{"nosuchcmd"}}, 127, "nosuchcmd: executable file not found in PATH"},
		{"no-such-path", api.ExecRequest{Cmd: []string{"/opt/nosuchcmd"}}, 127, "no such file or directory"},
		{"no-exec-bit", api.ExecRequest{Cmd: []string{"/home/user/script.sh"}}, 126, "permission denied"},
		{"no-exec-bit-relative", api.ExecRequest{Cmd: []string{"./script.sh"}}, 126, "permission denied"},
	}
	for _, tt := range failures {
		t.Run(tt.name, func(t *testing.T) {
			res := h.exec("acme", sb.ID, tt.req)
			if res.Status != api.ExecError || res.ErrorCode != api.ExecCodeExecFailed || !strings.Contains(res.Error, tt.reason) ||
				res.ExitCode == nil || *res.ExitCode != tt.exitCode {
				t.Fatalf("result %+v (exit code %s), want error/exec_failed %d %q", res, intp(res.ExitCode), tt.exitCode, tt.reason)
			}
			// The record says the same.
			var rec api.ExecResult
			h.req("GET", base+"/execs/"+res.ID, key, nil).json(t, &rec)
			if rec.Status != api.ExecError || rec.ErrorCode != api.ExecCodeExecFailed || rec.ExitCode == nil || *rec.ExitCode != tt.exitCode {
				t.Fatalf("record %+v", rec)
			}
		})
	}

	refused := []struct {
		name   string
		req    api.ExecRequest
		reason string
	}{
		{"unknown-user", api.ExecRequest{Cmd: []string{"true"}, User: "nosuchuser"}, `unknown user "nosuchuser"`},
		{"missing-cwd", api.ExecRequest{Cmd: []string{"true"}, Cwd: "/nonexistent"}, "cwd /nonexistent: no such file or directory"},
		{"cwd-is-a-file", api.ExecRequest{Cmd: []string{"true"}, Cwd: "/home/user/script.sh"}, "not a directory"},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			for _, mode := range []struct {
				query string
				hdr   []string
			}{{"", nil}, {"?async=true", nil}, {"", []string{"Accept", "text/event-stream"}}} {
				r := h.req("POST", base+"/exec"+mode.query, key, tt.req, mode.hdr...)
				h.expect(r, http.StatusBadRequest, api.CodeInvalidArgument)
				if msg := r.apiErr(t).Message; !strings.Contains(msg, tt.reason) {
					t.Fatalf("%s%v: message %q, want %q", mode.query, mode.hdr, msg, tt.reason)
				}
			}
		})
	}

	// No exec of all these is a platform fault.
	var list api.ExecList
	h.req("GET", base+"/execs?limit=100", key, nil).json(t, &list)
	if len(list.Execs) != len(failures)+3*len(refused) {
		t.Fatalf("%d exec records, want %d", len(list.Execs), len(failures)+3*len(refused))
	}
	for _, x := range list.Execs {
		if x.Status != api.ExecError || x.ErrorCode != api.ExecCodeExecFailed {
			t.Errorf("record %+v, want error/exec_failed", x)
		}
	}
	if got := h.state("acme", sb.ID); got.State != api.StateRunning {
		t.Fatalf("sandbox after failed starts: %+v", got)
	}
	if res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh("echo ok")}); res.Status != api.ExecExited || strp(res.Stdout) != "ok\n" {
		t.Fatalf("exec after failed starts: %+v", res)
	}
}

// TestE2ERuncOOMShellChild: a shell's child killed for memory leaves the
// shell to report 137; the exec is oom all the same (the sandbox's OOM kill
// count grew while it ran). An exec running beside it that fails on its own
// stays exited.
func TestE2ERuncOOMShellChild(t *testing.T) {
	e := newE2E(t)
	h := e.h
	key := h.key("acme")
	sb := h.create("acme", api.CreateSandboxRequest{Resources: &api.Resources{MemoryMB: 128}})
	base := "/v1/sandboxes/" + sb.ID

	// Beside it: a command that fails on its own while the OOM kill happens.
	var bystander api.ExecStarted
	r := h.req("POST", base+"/exec?async=true", key, api.ExecRequest{Shell: sh(`sleep 4; exit 1`)})
	h.expect(r, http.StatusAccepted, "")
	r.json(t, &bystander)

	res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`python3 -c "x=bytearray(10**10)"; st=$?; echo "python ended $st"; exit $st`)})
	if res.Status != api.ExecOOM || res.ErrorCode != api.ExecCodeOOM || res.ExitCode == nil || *res.ExitCode != 137 ||
		strp(res.Stdout) != "python ended 137\n" {
		t.Fatalf("shell whose child ran out of memory: %+v stdout %q stderr %q", res, strp(res.Stdout), strp(res.Stderr))
	}
	// The form of the report: sh -c running python.
	res = h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`sh -c 'python3 -c "x=bytearray(10**10)"'`)})
	if res.Status != api.ExecOOM {
		t.Fatalf("sh -c python3 memory bomb: %+v stderr %q", res, strp(res.Stderr))
	}
	var by api.ExecResult
	eventually(t, "bystander exec", func() bool {
		h.req("GET", base+"/execs/"+bystander.ID, key, nil).json(t, &by)
		return by.Status != api.ExecRunning
	})
	if by.Status != api.ExecExited || by.ExitCode == nil || *by.ExitCode != 1 {
		t.Fatalf("an exec that failed beside the OOM kill: %+v", by)
	}
	// An exit 137 of its own, with no OOM kill, is a plain exit.
	if res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`exit 137`)}); res.Status != api.ExecExited {
		t.Fatalf("exit 137 without an OOM kill: %+v", res)
	}
}

// TestE2ERuncOutputFloodKeepsTraceback: a program floods stdout past the
// cap, then dies with a traceback on stderr. The traceback is kept whole,
// stdout keeps its first and last bytes, the dropped bytes are counted, and
// a replay of the ended exec has the same bytes at the offsets of the
// whole output (the dropped range is a jump).
func TestE2ERuncOutputFloodKeepsTraceback(t *testing.T) {
	e := newE2E(t)
	h := e.h
	key := h.key("acme")
	sb := h.create("acme", api.CreateSandboxRequest{})
	base := "/v1/sandboxes/" + sb.ID
	const flood = 20 << 20
	prog := `import sys
sys.stdout.write("START\n")
sys.stdout.write("x" * ` + "20971520" + `)
sys.stdout.write("\nEND\n")
sys.stdout.flush()
1/0
`
	h.expect(h.req("PUT", base+"/files?path=/home/user/flood.py", key, prog), http.StatusCreated, "")
	res := h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"python3", "flood.py"}})
	out, errOut := strp(res.Stdout), strp(res.Stderr)
	if res.Status != api.ExecExited || res.ExitCode == nil || *res.ExitCode != 1 {
		t.Fatalf("result %+v", res)
	}
	if !strings.Contains(errOut, "Traceback (most recent call last)") || !strings.HasSuffix(errOut, "ZeroDivisionError: division by zero\n") {
		t.Fatalf("stderr %q: the traceback is lost", errOut)
	}
	const capBytes = 1 << 20 // the default max_output_bytes, per stream
	total := int64(len("START\n") + flood + len("\nEND\n"))
	if len(out) != capBytes || !strings.HasPrefix(out, "START\nxxx") || !strings.HasSuffix(out, "xxx\nEND\n") {
		t.Fatalf("stdout: %d bytes, %q…%q", len(out), out[:min(len(out), 16)], out[max(0, len(out)-16):])
	}
	if !res.Truncated || res.StdoutDroppedBytes != total-capBytes || res.StderrDroppedBytes != 0 {
		t.Fatalf("truncated %v, dropped %d/%d, want %d/0", res.Truncated, res.StdoutDroppedBytes, res.StderrDroppedBytes, total-capBytes)
	}

	// A re-attach after the end: the kept bytes, at their own offsets.
	req, _ := http.NewRequest("GET", h.url+base+"/execs/"+res.ID+"/events?from_offset=0", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Accept", "text/event-stream")
	hr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer hr.Body.Close()
	events, _ := readSSE(t, bufio.NewReader(hr.Body))
	var replayOut, replayErr strings.Builder
	var next, resumed int64
	jumps := 0
	var exit api.ExecResult
	for _, ev := range events {
		switch ev.name {
		case "stdout", "stderr":
			var oe api.OutputEvent
			if err := json.Unmarshal([]byte(ev.data), &oe); err != nil {
				t.Fatal(err)
			}
			if oe.Offset < next {
				t.Fatalf("event at offset %d before %d", oe.Offset, next)
			}
			if oe.Offset > next {
				jumps++
				resumed = oe.Offset
			}
			next = oe.Offset + int64(len(oe.Data))
			if ev.name == "stdout" {
				replayOut.WriteString(oe.Data)
			} else {
				replayErr.WriteString(oe.Data)
			}
		case "exit":
			json.Unmarshal([]byte(ev.data), &exit)
		}
	}
	if replayOut.String() != out || replayErr.String() != errOut || jumps != 1 || next != total+int64(len(errOut)) {
		t.Fatalf("replay: %d/%d bytes, %d jumps, ends at %d (want the result's bytes, one jump, end %d)",
			replayOut.Len(), replayErr.Len(), jumps, next, total+int64(len(errOut)))
	}
	if exit.StdoutDroppedBytes != res.StdoutDroppedBytes || !exit.Truncated {
		t.Fatalf("exit event %+v", exit)
	}
	// A re-attach from inside the dropped range resumes at the next kept byte.
	req, _ = http.NewRequest("GET", h.url+base+"/execs/"+res.ID+"/events?from_offset=4000000", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Accept", "text/event-stream")
	hr2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer hr2.Body.Close()
	events, _ = readSSE(t, bufio.NewReader(hr2.Body))
	var first api.OutputEvent
	if len(events) == 0 || json.Unmarshal([]byte(events[0].data), &first) != nil || first.Offset != resumed || resumed < 4000000 {
		t.Fatalf("re-attach in the dropped range: first event %+v, want offset %d", first, resumed)
	}

	// A live stream of the flood (samples of the tail once past the cap)
	// ends with the end of stdout and the whole traceback too.
	start := time.Now()
	_, live, _ := h.sse("POST", base+"/exec", key, api.ExecRequest{Cmd: []string{"python3", "flood.py"}})
	var liveOut, liveErr strings.Builder
	for _, ev := range live {
		var oe api.OutputEvent
		if ev.name == "stdout" || ev.name == "stderr" {
			json.Unmarshal([]byte(ev.data), &oe)
			if ev.name == "stdout" {
				liveOut.WriteString(oe.Data)
			} else {
				liveErr.WriteString(oe.Data)
			}
		}
	}
	if !strings.HasPrefix(liveOut.String(), "START\n") || !strings.HasSuffix(liveOut.String(), "\nEND\n") ||
		!strings.HasSuffix(liveErr.String(), "ZeroDivisionError: division by zero\n") {
		t.Fatalf("live stream: stdout %d bytes, stderr %q (%s)", liveOut.Len(), liveErr.String(), time.Since(start))
	}
}
