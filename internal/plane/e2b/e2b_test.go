package e2b_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlockhq/airlock/internal/plane/e2b"
	fspb "github.com/airlockhq/airlock/internal/plane/e2b/envd/filesystempb"
	pb "github.com/airlockhq/airlock/internal/plane/e2b/envd/processpb"
)

func base64Std(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// errBody is E2B's error shape.
type errBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func TestControlPlane(t *testing.T) {
	h := newHarness(t)

	t.Run("CreateV2", func(t *testing.T) {
		c := h.create("acme")
		if !strings.HasPrefix(c.SandboxID, "sbx_") || c.TemplateID != "base" || c.EnvdVersion != e2b.EnvdVersion ||
			c.EnvdAccessToken == "" || c.Domain != nil {
			t.Fatalf("create answered %+v", c)
		}
	})
	t.Run("CreateV1CodeInterpreterAlias", func(t *testing.T) {
		var c created
		if st := h.call("acme", "POST", "/sandboxes", map[string]any{"templateID": "code-interpreter-v1", "secure": true,
			"metadata": map[string]string{"k": "v1"}}, &c); st != http.StatusCreated {
			t.Fatalf("status %d", st)
		}
		if c.TemplateID != "code-interpreter-v1" {
			t.Fatalf("templateID %q, want the e2b name back", c.TemplateID)
		}
		var d struct {
			State    string            `json:"state"`
			Metadata map[string]string `json:"metadata"`
			Token    string            `json:"envdAccessToken"`
		}
		if st := h.call("acme", "GET", "/sandboxes/"+c.SandboxID, nil, &d); st != http.StatusOK {
			t.Fatalf("info: status %d", st)
		}
		if d.State != "running" || d.Metadata["k"] != "v1" || d.Token != c.EnvdAccessToken {
			t.Fatalf("info answered %+v", d)
		}
	})
	t.Run("UnknownTemplate", func(t *testing.T) {
		var e errBody
		if st := h.call("acme", "POST", "/v2/sandboxes", map[string]any{"templateID": "nope"}, &e); st != http.StatusNotFound || e.Code != 404 || e.Message == "" {
			t.Fatalf("status %d body %+v", st, e)
		}
	})
	t.Run("MissingTemplateID", func(t *testing.T) {
		var e errBody
		if st := h.call("acme", "POST", "/v2/sandboxes", map[string]any{}, &e); st != http.StatusBadRequest || e.Code != 400 {
			t.Fatalf("status %d body %+v", st, e)
		}
	})
	t.Run("NoKey", func(t *testing.T) {
		var e errBody
		if st := h.call("", "GET", "/v2/sandboxes", nil, &e); st != http.StatusUnauthorized || e.Code != 401 {
			t.Fatalf("status %d body %+v", st, e)
		}
	})
	t.Run("ListFiltersByMetadataAndTenant", func(t *testing.T) {
		var mine created
		h.call("acme", "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "metadata": map[string]string{"who": "list-me"}}, &mine)
		h.create("other")
		var l []struct {
			SandboxID string `json:"sandboxID"`
			State     string `json:"state"`
		}
		q := url.Values{"metadata": {"who=list-me"}, "state": {"running,paused"}}
		if st := h.call("acme", "GET", "/v2/sandboxes?"+q.Encode(), nil, &l); st != http.StatusOK {
			t.Fatalf("status %d", st)
		}
		if len(l) != 1 || l[0].SandboxID != mine.SandboxID || l[0].State != "running" {
			t.Fatalf("list answered %+v, want only %s", l, mine.SandboxID)
		}
		var others []struct{}
		h.call("other", "GET", "/v2/sandboxes?"+q.Encode(), nil, &others)
		if len(others) != 0 {
			t.Fatalf("another tenant lists %d of acme's sandboxes", len(others))
		}
	})
	t.Run("OtherTenantIsNotFound", func(t *testing.T) {
		c := h.create("acme")
		for _, call := range []struct{ method, path string }{
			{"GET", "/sandboxes/" + c.SandboxID},
			{"DELETE", "/sandboxes/" + c.SandboxID},
			{"POST", "/sandboxes/" + c.SandboxID + "/pause"},
			{"POST", "/v2/sandboxes/" + c.SandboxID + "/connect"},
		} {
			var e errBody
			if st := h.call("other", call.method, call.path, map[string]any{}, &e); st != http.StatusNotFound || e.Code != 404 {
				t.Errorf("%s %s by another tenant: status %d %+v", call.method, call.path, st, e)
			}
		}
	})
	t.Run("TimeoutPauseConnectKill", func(t *testing.T) {
		c := h.create("acme")
		type detail struct {
			State string    `json:"state"`
			EndAt time.Time `json:"endAt"`
		}
		if st := h.call("acme", "POST", "/sandboxes/"+c.SandboxID+"/timeout", map[string]any{"timeout": 3600}, nil); st != http.StatusNoContent {
			t.Fatalf("timeout: status %d", st)
		}
		var d detail
		h.call("acme", "GET", "/sandboxes/"+c.SandboxID, nil, &d)
		if left := time.Until(d.EndAt); left < 50*time.Minute || left > 61*time.Minute {
			t.Fatalf("endAt %v is %v away, want about an hour", d.EndAt, left)
		}
		if st := h.call("acme", "POST", "/sandboxes/"+c.SandboxID+"/pause", nil, nil); st != http.StatusNoContent {
			t.Fatalf("pause: status %d", st)
		}
		if st := h.call("acme", "POST", "/sandboxes/"+c.SandboxID+"/pause", nil, nil); st != http.StatusConflict {
			t.Fatalf("second pause: status %d, want 409", st)
		}
		h.call("acme", "GET", "/sandboxes/"+c.SandboxID, nil, &d)
		if d.State != "paused" {
			t.Fatalf("state %q after pause", d.State)
		}
		if st := h.call("acme", "POST", "/sandboxes/"+c.SandboxID+"/resume", map[string]any{}, nil); st != http.StatusCreated {
			t.Fatalf("resume: status %d, want 201", st)
		}
		if st := h.call("acme", "POST", "/sandboxes/"+c.SandboxID+"/resume", map[string]any{}, nil); st != http.StatusConflict {
			t.Fatalf("resume of a running sandbox: status %d, want 409", st)
		}
		if st := h.call("acme", "POST", "/sandboxes/"+c.SandboxID+"/pause", nil, nil); st != http.StatusNoContent {
			t.Fatalf("pause again: status %d", st)
		}
		var again created
		if st := h.call("acme", "POST", "/v2/sandboxes/"+c.SandboxID+"/connect", map[string]any{"timeout": 600}, &again); st != http.StatusCreated {
			t.Fatalf("connect to a paused sandbox: status %d, want 201", st)
		}
		if again.EnvdAccessToken != c.EnvdAccessToken {
			t.Fatal("connect gave another access token")
		}
		h.call("acme", "GET", "/sandboxes/"+c.SandboxID, nil, &d)
		if d.State != "running" {
			t.Fatalf("state %q after connect", d.State)
		}
		if st := h.call("acme", "POST", "/sandboxes/"+c.SandboxID+"/connect", map[string]any{}, &again); st != http.StatusOK {
			t.Fatalf("connect to a running sandbox: status %d, want 200", st)
		}
		// connect only extends: a shorter timeout leaves the hour (set
		// above, and kept by the connect with 600 s), a longer one extends.
		if st := h.call("acme", "POST", "/sandboxes/"+c.SandboxID+"/connect", map[string]any{"timeout": 10}, &again); st != http.StatusOK {
			t.Fatalf("connect with a short timeout: status %d, want 200", st)
		}
		h.call("acme", "GET", "/sandboxes/"+c.SandboxID, nil, &d)
		if left := time.Until(d.EndAt); left < 50*time.Minute {
			t.Fatalf("connect with timeout 10 shortened the end to %v away", left)
		}
		h.call("acme", "POST", "/sandboxes/"+c.SandboxID+"/connect", map[string]any{"timeout": 7200}, &again)
		h.call("acme", "GET", "/sandboxes/"+c.SandboxID, nil, &d)
		if left := time.Until(d.EndAt); left < 110*time.Minute {
			t.Fatalf("connect with timeout 7200 left the end %v away, want about two hours", left)
		}
		var ms []struct {
			CPUCount int    `json:"cpuCount"`
			MemTotal uint64 `json:"memTotal"`
		}
		if st := h.call("acme", "GET", "/sandboxes/"+c.SandboxID+"/metrics", nil, &ms); st != http.StatusOK || len(ms) != 1 || ms[0].CPUCount < 1 {
			t.Fatalf("metrics: status %d %+v", st, ms)
		}
		// A range before the sandbox existed has no points; one around now
		// has the current one.
		past := time.Now().Add(-time.Hour).Unix()
		if st := h.call("acme", "GET", fmt.Sprintf("/sandboxes/%s/metrics?start=%d&end=%d", c.SandboxID, past, past+1800), nil, &ms); st != http.StatusOK || len(ms) != 0 {
			t.Fatalf("metrics of an hour ago: status %d %+v, want none", st, ms)
		}
		if st := h.call("acme", "GET", fmt.Sprintf("/sandboxes/%s/metrics?start=%d&end=%d", c.SandboxID, past, time.Now().Unix()+5), nil, &ms); st != http.StatusOK || len(ms) != 1 {
			t.Fatalf("metrics of the last hour: status %d %+v, want the current point", st, ms)
		}
		if st := h.call("acme", "GET", "/sandboxes/"+c.SandboxID+"/metrics?start=yesterday", nil, nil); st != http.StatusBadRequest {
			t.Fatalf("metrics with a bad start: status %d, want 400", st)
		}
		if st := h.call("acme", "DELETE", "/sandboxes/"+c.SandboxID, nil, nil); st != http.StatusNoContent {
			t.Fatalf("kill: status %d", st)
		}
		// The SDK's kill() returns false on 404: a killed sandbox is gone.
		if st := h.call("acme", "DELETE", "/sandboxes/"+c.SandboxID, nil, nil); st != http.StatusNotFound {
			t.Fatalf("second kill: status %d, want 404", st)
		}
	})
	t.Run("UnknownRoute", func(t *testing.T) {
		var e errBody
		if st := h.call("acme", "POST", "/sandboxes/x/fork", map[string]any{}, &e); st != http.StatusNotFound && st != http.StatusMethodNotAllowed {
			t.Fatalf("status %d", st)
		}
	})
	t.Run("AirlockAPIUntouched", func(t *testing.T) {
		req, _ := http.NewRequest("GET", h.url+"/v1/sandboxes", nil)
		req.Header.Set("Authorization", "Bearer "+h.key("acme"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"sandboxes"`) {
			t.Fatalf("GET /v1/sandboxes: %d %s", resp.StatusCode, b)
		}
	})
}

// startEvents runs cmd through Start and collects its events.
type procResult struct {
	pid      uint32
	stdout   string
	stderr   string
	end      *pb.ProcessEvent_EndEvent
	keepBeat int
}

func collect(t *testing.T, stream *connect.ServerStreamForClient[pb.StartResponse]) (procResult, error) {
	t.Helper()
	var r procResult
	first := true
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if first {
			if ev.GetStart() == nil {
				t.Fatalf("first event is %v, want start", ev)
			}
			r.pid = ev.GetStart().GetPid()
			first = false
			continue
		}
		switch {
		case ev.GetData() != nil:
			r.stdout += string(ev.GetData().GetStdout())
			r.stderr += string(ev.GetData().GetStderr())
		case ev.GetEnd() != nil:
			r.end = ev.GetEnd()
		case ev.GetKeepalive() != nil:
			r.keepBeat++
		}
	}
	return r, stream.Err()
}

func shell(script string) *pb.ProcessConfig {
	return &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}}
}

func TestProcessStart(t *testing.T) {
	h := newHarness(t)
	c := h.create("acme")
	for _, codec := range codecs {
		t.Run(codec.name, func(t *testing.T) {
			pc := h.process(c, codec.opts)
			ctx := context.Background()
			stream, err := pc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{
				Cmd: "/bin/sh", Args: []string{"-c", `echo "out $A $PWD"; echo err >&2; exit 3`},
				Envs: map[string]string{"A": "x1"}, Cwd: strPtr("/tmp"),
			}}))
			if err != nil {
				t.Fatal(err)
			}
			r, err := collect(t, stream)
			if err != nil {
				t.Fatal(err)
			}
			if r.stdout != "out x1 /tmp\n" || r.stderr != "err\n" {
				t.Fatalf("stdout %q stderr %q", r.stdout, r.stderr)
			}
			if r.end == nil || r.end.GetExitCode() != 3 || !r.end.GetExited() || r.end.GetStatus() != "exit status 3" {
				t.Fatalf("end event %v", r.end)
			}
		})
	}
}

func strPtr(s string) *string { return &s }

func TestSandboxPlaneAuth(t *testing.T) {
	h := newHarness(t)
	a, b := h.create("acme"), h.create("acme")
	cases := []struct {
		name   string
		id     string
		token  string
		status int
	}{
		{"NoToken", a.SandboxID, "", http.StatusUnauthorized},
		{"WrongToken", a.SandboxID, strings.Repeat("0", 64), http.StatusUnauthorized},
		{"OtherSandboxToken", a.SandboxID, b.EnvdAccessToken, http.StatusUnauthorized},
		{"UnknownSandbox", "sbx_doesnotexist", "", http.StatusUnauthorized},
		{"OwnToken", a.SandboxID, a.EnvdAccessToken, http.StatusNoContent},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", h.url+"/health", nil)
			req.Header.Set(e2b.HeaderSandboxID, tc.id)
			req.Header.Set(e2b.HeaderSandboxPort, "49983")
			if tc.token != "" {
				req.Header.Set(e2b.HeaderAccessToken, tc.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
		})
	}
	t.Run("RPCUnauthenticated", func(t *testing.T) {
		pc := processpbClient(h, a.SandboxID, b.EnvdAccessToken)
		_, err := pc.List(context.Background(), connect.NewRequest(&pb.ListRequest{}))
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("List with another sandbox's token: %v, want unauthenticated", err)
		}
	})
	t.Run("KilledSandboxIs502", func(t *testing.T) {
		c := h.create("acme")
		h.call("acme", "DELETE", "/sandboxes/"+c.SandboxID, nil, nil)
		req, _ := http.NewRequest("GET", h.url+"/health", nil)
		req.Header.Set(e2b.HeaderSandboxID, c.SandboxID)
		req.Header.Set(e2b.HeaderAccessToken, c.EnvdAccessToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		// The SDK's isRunning() reads 502 as "not running".
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("status %d, want 502", resp.StatusCode)
		}
	})
}

func processpbClient(h *harness, id, token string) interface {
	List(context.Context, *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error)
} {
	return h.process(created{SandboxID: id, EnvdAccessToken: token}, codecs[0].opts)
}

func TestProcessStdinListConnect(t *testing.T) {
	h := newHarness(t)
	c := h.create("acme")
	for _, codec := range codecs {
		t.Run(codec.name, func(t *testing.T) {
			pc := h.process(c, codec.opts)
			ctx := context.Background()
			tag := "cat-" + codec.name
			stream, err := pc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/cat"},
				Stdin: boolPtr(true), Tag: &tag}))
			if err != nil {
				t.Fatal(err)
			}
			if !stream.Receive() || stream.Msg().GetEvent().GetStart() == nil {
				t.Fatalf("no start event: %v", stream.Err())
			}
			pid := stream.Msg().GetEvent().GetStart().GetPid()
			defer stream.Close()

			l, err := pc.List(ctx, connect.NewRequest(&pb.ListRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, p := range l.Msg.GetProcesses() {
				if p.GetPid() == pid && p.GetTag() == tag && p.GetConfig().GetCmd() == "/bin/cat" {
					found = true
				}
			}
			if !found {
				t.Fatalf("List has no pid %d tag %s: %v", pid, tag, l.Msg)
			}
			sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
			if _, err := pc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel,
				Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("hello ")}}})); err != nil {
				t.Fatal(err)
			}
			// StreamInput by tag, as the Python SDK does.
			si := pc.StreamInput(ctx)
			si.Send(&pb.StreamInputRequest{Event: &pb.StreamInputRequest_Start{Start: &pb.StreamInputRequest_StartEvent{
				Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: tag}}}}})
			si.Send(&pb.StreamInputRequest{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{
				Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("world")}}}}})
			if _, err := si.CloseAndReceive(); err != nil {
				t.Fatal(err)
			}
			if _, err := pc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
				t.Fatal(err)
			}
			var out string
			var end *pb.ProcessEvent_EndEvent
			for stream.Receive() {
				ev := stream.Msg().GetEvent()
				out += string(ev.GetData().GetStdout())
				if ev.GetEnd() != nil {
					end = ev.GetEnd()
				}
			}
			if out != "hello world" || end.GetExitCode() != 0 {
				t.Fatalf("cat echoed %q, end %v", out, end)
			}
			// Connect after the end replays the whole output.
			cs, err := pc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: sel}))
			if err != nil {
				t.Fatal(err)
			}
			var replay string
			for cs.Receive() {
				replay += string(cs.Msg().GetEvent().GetData().GetStdout())
			}
			if replay != "hello world" {
				t.Fatalf("Connect replayed %q", replay)
			}
		})
	}
}

func boolPtr(b bool) *bool { return &b }

// TestKillProcessTree proves that SendSignal(SIGKILL) ends the whole tree:
// a backgrounded grandchild dies with its parent (E2B's envd leaves it).
func TestKillProcessTree(t *testing.T) {
	h := newHarness(t)
	c := h.create("acme")
	pc := h.process(c, codecs[0].opts)
	ctx := context.Background()
	stream, err := pc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: shell(`sleep 1000 & echo $!; wait`)}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	pid := stream.Msg().GetEvent().GetStart().GetPid()
	var out string
	for !strings.Contains(out, "\n") && stream.Receive() {
		out += string(stream.Msg().GetEvent().GetData().GetStdout())
	}
	child, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("no child pid in %q", out)
	}
	alive := func() bool {
		s, err := pc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: shell(fmt.Sprintf("kill -0 %d", child))}))
		if err != nil {
			t.Fatal(err)
		}
		r, err := collect(t, s)
		if err != nil {
			t.Fatal(err)
		}
		return r.end.GetExitCode() == 0
	}
	if !alive() {
		t.Fatal("the background child is not running before the kill")
	}
	if _, err := pc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	var end *pb.ProcessEvent_EndEvent
	for stream.Receive() {
		if e := stream.Msg().GetEvent().GetEnd(); e != nil {
			end = e
		}
	}
	if end == nil || end.GetExited() || end.GetExitCode() != -1 || !strings.HasPrefix(end.GetStatus(), "signal:") {
		t.Fatalf("end after kill: %v", end)
	}
	deadline := time.Now().Add(10 * time.Second)
	for alive() {
		if time.Now().After(deadline) {
			t.Fatalf("background child %d survived the kill of its parent", child)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Killing it again: the process is gone (the SDK's kill() → false).
	_, err = pc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGKILL}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("second kill: %v, want not_found", err)
	}
}

// TestProcessTimeout: the stream's deadline (the SDK's timeoutMs) kills the
// command server-side.
func TestProcessTimeout(t *testing.T) {
	h := newHarness(t)
	c := h.create("acme")
	pc := h.process(c, codecs[0].opts)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	stream, err := pc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: shell("sleep 30")}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = collect(t, stream)
	if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("stream ended with %v, want deadline_exceeded", err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		l, err := pc.List(context.Background(), connect.NewRequest(&pb.ListRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Msg.GetProcesses()) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command outlived its timeout: %v", l.Msg)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestFilesystem(t *testing.T) {
	h := newHarness(t)
	c := h.create("acme")
	ctx := context.Background()
	for _, codec := range codecs {
		t.Run(codec.name, func(t *testing.T) {
			fc := h.filesystem(c, codec.opts)
			dir := "/home/user/fs-" + codec.name
			mk, err := fc.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: dir + "/sub"}))
			if err != nil {
				t.Fatal(err)
			}
			if e := mk.Msg.GetEntry(); e.GetType() != fspb.FileType_FILE_TYPE_DIRECTORY || e.GetPath() != dir+"/sub" || e.GetName() != "sub" {
				t.Fatalf("MakeDir entry %v", e)
			}
			_, err = fc.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: dir + "/sub"}))
			if connect.CodeOf(err) != connect.CodeAlreadyExists {
				t.Fatalf("MakeDir of an existing dir: %v, want already_exists", err)
			}
			h.upload(c, dir+"/a.txt", "hello")
			st, err := fc.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: dir + "/a.txt"}))
			if err != nil {
				t.Fatal(err)
			}
			if e := st.Msg.GetEntry(); e.GetSize() != 5 || e.GetType() != fspb.FileType_FILE_TYPE_FILE || e.GetPermissions() != "-rw-r--r--" ||
				e.GetModifiedTime().AsTime().IsZero() {
				t.Fatalf("Stat entry %v", e)
			}
			if _, err := fc.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: dir + "/a.txt", Destination: dir + "/sub/b.txt"})); err != nil {
				t.Fatal(err)
			}
			ls, err := fc.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: dir, Depth: 2}))
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, e := range ls.Msg.GetEntries() {
				names = append(names, e.GetPath())
			}
			if strings.Join(names, ",") != dir+"/sub,"+dir+"/sub/b.txt" {
				t.Fatalf("ListDir depth 2: %v", names)
			}
			if _, err := fc.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: dir + "/sub"})); err != nil {
				t.Fatal(err)
			}
			_, err = fc.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: dir + "/sub/b.txt"}))
			if connect.CodeOf(err) != connect.CodeNotFound {
				t.Fatalf("Stat after Remove: %v, want not_found", err)
			}
			// A missing path is removed already, as envd's RemoveAll.
			if _, err = fc.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: dir + "/sub"})); err != nil {
				t.Fatalf("Remove of a missing path: %v, want success", err)
			}
		})
	}
}

func TestWatchDir(t *testing.T) {
	h := newHarness(t)
	c := h.create("acme")
	fc := h.filesystem(c, codecs[0].opts)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := fc.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "/home/user/w"})); err != nil {
		t.Fatal(err)
	}
	stream, err := fc.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: "/home/user/w", Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatalf("first watch event is not start: %v %v", stream.Msg(), stream.Err())
	}
	h.upload(c, "/home/user/w/new.txt", "x")
	want := map[string]fspb.EventType{"new.txt": fspb.EventType_EVENT_TYPE_CREATE}
	got := map[string]fspb.EventType{}
	for len(got) < len(want) && stream.Receive() {
		if ev := stream.Msg().GetFilesystem(); ev != nil {
			got[ev.GetName()] = ev.GetType()
		}
	}
	if got["new.txt"] != fspb.EventType_EVENT_TYPE_CREATE {
		t.Fatalf("watch events %v (err %v), want create of new.txt", got, stream.Err())
	}
	if _, err := fc.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "/home/user/w/new.txt"})); err != nil {
		t.Fatal(err)
	}
	for stream.Receive() {
		if ev := stream.Msg().GetFilesystem(); ev != nil && ev.GetName() == "new.txt" && ev.GetType() == fspb.EventType_EVENT_TYPE_REMOVE {
			return
		}
	}
	t.Fatalf("no remove event: %v", stream.Err())
}

// upload writes a file through POST /files (multipart, as the SDK does).
func (h *harness) upload(c created, p, content string) {
	h.t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, _ := mw.CreateFormFile("file", p)
	fw.Write([]byte(content))
	mw.Close()
	req, _ := http.NewRequest("POST", h.url+"/files?path="+url.QueryEscape(p), &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := h.client(c).Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"type":"file"`) {
		h.t.Fatalf("upload %s: %d %s", p, resp.StatusCode, b)
	}
}

func TestFilesREST(t *testing.T) {
	h := newHarness(t)
	c := h.create("acme")
	cl := h.client(c)
	get := func(q string) (int, string) {
		resp, err := cl.Get(h.url + "/files?" + q)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	t.Run("MultipartRelativePath", func(t *testing.T) {
		h.upload(c, "notes/a.txt", "multi")
		if st, b := get("path=" + url.QueryEscape("/home/user/notes/a.txt")); st != http.StatusOK || b != "multi" {
			t.Fatalf("GET: %d %q", st, b)
		}
	})
	t.Run("MultipartSeveralFiles", func(t *testing.T) {
		// writeFiles: no ?path=, each part's filename is its sandbox path.
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		for p, content := range map[string]string{"multi/b.txt": "bee", "/home/user/multi/deep/c.txt": "sea"} {
			fw, _ := mw.CreateFormFile("file", p)
			fw.Write([]byte(content))
		}
		mw.Close()
		req, _ := http.NewRequest("POST", h.url+"/files", &body)
		req.Header.Set("Content-Type", mw.FormDataContentType())
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || strings.Count(string(b), `"type":"file"`) != 2 {
			t.Fatalf("upload: %d %s", resp.StatusCode, b)
		}
		for p, want := range map[string]string{"/home/user/multi/b.txt": "bee", "/home/user/multi/deep/c.txt": "sea"} {
			if st, got := get("path=" + url.QueryEscape(p)); st != http.StatusOK || got != want {
				t.Errorf("GET %s: %d %q, want %q", p, st, got, want)
			}
		}
	})
	t.Run("OctetStreamGzip", func(t *testing.T) {
		var zb bytes.Buffer
		zw := gzipWriter(&zb)
		zw.Write([]byte("zipped"))
		zw.Close()
		req, _ := http.NewRequest("POST", h.url+"/files?path=/home/user/z.txt", &zb)
		req.Header.Set("Content-Type", "application/octet-stream")
		req.Header.Set("Content-Encoding", "gzip")
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		if st, b := get("path=/home/user/z.txt"); st != http.StatusOK || b != "zipped" {
			t.Fatalf("GET: %d %q", st, b)
		}
	})
	t.Run("MissingIs404", func(t *testing.T) {
		st, b := get("path=/home/user/none")
		if st != http.StatusNotFound || !strings.Contains(b, `"code":404`) {
			t.Fatalf("GET missing: %d %s", st, b)
		}
	})
	t.Run("Health", func(t *testing.T) {
		resp, err := cl.Get(h.url + "/health")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("status %d", resp.StatusCode)
		}
	})
	t.Run("RootUser", func(t *testing.T) {
		pc := processpbconnectWithUser(h, c, "root")
		s, err := pc.Start(context.Background(), connect.NewRequest(&pb.StartRequest{Process: shell("id -u; pwd")}))
		if err != nil {
			t.Fatal(err)
		}
		r, err := collect(t, s)
		if err != nil {
			t.Fatal(err)
		}
		// The fake driver runs every user as the test's uid; the user and
		// home still reach the agent.
		if !strings.HasSuffix(r.stdout, "/root\n") {
			t.Fatalf("root's command ran in %q", r.stdout)
		}
	})
}

// TestPolledWatcher covers CreateWatcher / GetWatcherEvents / RemoveWatcher
// (the Python SDK's synchronous watch).
func TestPolledWatcher(t *testing.T) {
	h := newHarness(t)
	c, other := h.create("acme"), h.create("acme")
	fc := h.filesystem(c, codecs[1].opts)
	ctx := context.Background()
	if _, err := fc.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "/home/user/pw"})); err != nil {
		t.Fatal(err)
	}
	cw, err := fc.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: "/home/user/pw"}))
	if err != nil {
		t.Fatal(err)
	}
	wid := cw.Msg.GetWatcherId()
	h.upload(c, "/home/user/pw/one.txt", "1")
	// inotify reports after the write returns: poll as a client does,
	// until the event is there (on a busy host that takes a while).
	var evs []*fspb.FilesystemEvent
	for deadline := time.Now().Add(10 * time.Second); len(evs) < 2 && time.Now().Before(deadline); {
		ev, err := fc.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: wid}))
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev.Msg.GetEvents()...)
		if len(evs) < 2 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	// The create and the write of the upload (as envd's in-place write
	// shows them).
	if len(evs) != 2 || evs[0].GetName() != "one.txt" || evs[0].GetType() != fspb.EventType_EVENT_TYPE_CREATE ||
		evs[1].GetName() != "one.txt" || evs[1].GetType() != fspb.EventType_EVENT_TYPE_WRITE {
		t.Fatalf("events %v, want the create and the write of one.txt", evs)
	}
	ev, err := fc.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: wid}))
	if err != nil || len(ev.Msg.GetEvents()) != 0 {
		t.Fatalf("second poll: %v %v, want no events", ev, err)
	}
	// Another sandbox's client cannot read this watcher.
	_, err = h.filesystem(other, codecs[1].opts).GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: wid}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("another sandbox polled the watcher: %v", err)
	}
	if _, err := fc.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: wid})); err != nil {
		t.Fatal(err)
	}
	_, err = fc.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: wid}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("poll after remove: %v, want not_found", err)
	}
}

// TestProcessStreamBreaksWithItsSandbox: a command running when its sandbox
// is killed does not end with an exit (-1, which the SDKs report as the
// command's failure): its stream breaks, as envd's does with its machine,
// and the sandbox's health answers 502, so the SDKs report the sandbox
// gone.
func TestProcessStreamBreaksWithItsSandbox(t *testing.T) {
	h := newHarness(t)
	c := h.create("acme")
	pc := h.process(c, codecs[0].opts)
	stream, err := pc.Start(context.Background(), connect.NewRequest(&pb.StartRequest{Process: shell(`echo started; sleep 60`)}))
	if err != nil {
		t.Fatal(err)
	}
	for stream.Receive() {
		if d := stream.Msg().GetEvent().GetData(); d != nil && strings.Contains(string(d.GetStdout()), "started") {
			break
		}
	}
	if st := h.call("acme", "DELETE", "/sandboxes/"+c.SandboxID, nil, nil); st != http.StatusNoContent {
		t.Fatalf("kill: status %d", st)
	}
	r, err := collect(t, stream)
	if r.end != nil || err == nil {
		t.Fatalf("stream of a killed sandbox's command: end %v, err %v; want a broken stream and no end event", r.end, err)
	}
	req, _ := http.NewRequest("GET", h.url+"/health", nil)
	resp, err := h.client(c).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("health of a killed sandbox: %d, want 502", resp.StatusCode)
	}
}

// TestListOrderStartedAfterTemplate: GET /v2/sandboxes' order (by start,
// newest first by default), startedAfter (inclusive) and template filters,
// paged by nextToken.
func TestListOrderStartedAfterTemplate(t *testing.T) {
	h := newHarness(t)
	var ids []string
	for range 3 {
		ids = append(ids, h.create("acme").SandboxID)
		time.Sleep(5 * time.Millisecond)
	}
	h.create("globex") // never seen by acme
	type listed struct {
		SandboxID  string    `json:"sandboxID"`
		StartedAt  time.Time `json:"startedAt"`
		TemplateID string    `json:"templateID"`
	}
	list := func(q string) []string {
		t.Helper()
		var out []listed
		if st := h.call("acme", "GET", "/v2/sandboxes?"+q, nil, &out); st != http.StatusOK {
			t.Fatalf("list %s: status %d", q, st)
		}
		var got []string
		for _, s := range out {
			got = append(got, s.SandboxID)
		}
		return got
	}
	if got := list("order=asc"); !slices.Equal(got, ids) {
		t.Fatalf("order=asc: %v, want %v", got, ids)
	}
	rev := slices.Clone(ids)
	slices.Reverse(rev)
	if got := list("order=desc"); !slices.Equal(got, rev) {
		t.Fatalf("order=desc: %v, want %v", got, rev)
	}
	var all []listed
	h.call("acme", "GET", "/v2/sandboxes?order=asc", nil, &all)
	second := all[1].StartedAt
	if got := list("order=asc&startedAfter=" + url.QueryEscape(second.Format(time.RFC3339Nano))); !slices.Equal(got, ids[1:]) {
		t.Fatalf("startedAfter the second's start: %v, want %v", got, ids[1:])
	}
	if got := list("template=base&order=asc"); !slices.Equal(got, ids) {
		t.Fatalf("template=base: %v, want %v", got, ids)
	}
	if got := list("template=unknown-template"); len(got) != 0 {
		t.Fatalf("template=unknown-template: %v, want none", got)
	}
	// Paged: two, then the rest.
	req, _ := http.NewRequest("GET", h.url+"/v2/sandboxes?order=asc&limit=2", nil)
	req.Header.Set("X-API-Key", h.key("acme"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	next := resp.Header.Get("X-Next-Token")
	if next == "" {
		t.Fatal("no X-Next-Token after a page of 2 of 3")
	}
	if got := list("order=asc&limit=2&nextToken=" + url.QueryEscape(next)); !slices.Equal(got, ids[2:]) {
		t.Fatalf("second page: %v, want %v", got, ids[2:])
	}
	if st := h.call("acme", "GET", "/v2/sandboxes?order=sideways", nil, nil); st != http.StatusBadRequest {
		t.Fatalf("order=sideways: %d, want 400", st)
	}
}
