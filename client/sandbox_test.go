package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
)

// fakeSandboxAPI plays the parts of the API the Sandbox handle uses, and
// records what it was asked. Execs are scripted by their shell string:
//
//	echo hi   stdout "hi\n" in two events, exit 0
//	fail      stdout "o", stderr "e", exit 3
//	slow      stdout "a", then status timeout (exec_timeout)
//	notfound  status error, exec_failed, exit 127
//	flood     a head, a jump in offsets (dropped bytes), truncated; the
//	          record (GET …/execs/ex_1) holds head and tail
//	cat       echoes stdin: the request's, or …/stdin until eof
//	hang      prints "started", then waits for SIGKILL: status killed, or
//	          for the client to leave
type fakeSandboxAPI struct {
	t   *testing.T
	srv *httptest.Server

	mu       sync.Mutex
	creates  []api.CreateSandboxRequest
	headers  []http.Header
	execs    []api.ExecRequest
	signals  []string
	calls    []string // METHOD path?query
	deletes  int
	code     []api.CodeRequest
	keys     []api.Key
	state    string
	stdin    chan string
	killed   chan struct{}
	killOnce sync.Once
}

func newFakeSandboxAPI(t *testing.T) *fakeSandboxAPI {
	f := &fakeSandboxAPI{t: t, state: api.StateRunning, stdin: make(chan string, 16), killed: make(chan struct{})}
	f.srv = httptest.NewServer(f.routes())
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeSandboxAPI) client(t *testing.T) *Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c, err := New(f.srv.URL, "ak_test", WithHTTPClient(&http.Client{Transport: tr}))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (f *fakeSandboxAPI) sandbox() api.Sandbox {
	return api.Sandbox{ID: "sbx_1", Tenant: "t1", Template: "base", Runtime: "gvisor", State: f.state}
}

func (f *fakeSandboxAPI) callList() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func (f *fakeSandboxAPI) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateSandboxRequest
		if !decodeStrictT(w, r, &req) {
			return
		}
		f.mu.Lock()
		f.creates = append(f.creates, req)
		f.headers = append(f.headers, r.Header.Clone())
		s := f.sandbox()
		f.mu.Unlock()
		writeJSON(w, 201, s)
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "sbx_1" {
			writeAPIError(w, 404, api.CodeSandboxNotFound, "sandbox not found")
			return
		}
		f.mu.Lock()
		s := f.sandbox()
		f.mu.Unlock()
		writeJSON(w, 200, s)
	})
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.deletes++
		f.mu.Unlock()
		if r.PathValue("id") != "sbx_1" {
			writeAPIError(w, 404, api.CodeSandboxNotFound, "sandbox not found")
			return
		}
		w.WriteHeader(204)
	})
	state := func(to string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			f.mu.Lock()
			f.state = to
			s := f.sandbox()
			f.mu.Unlock()
			writeJSON(w, 200, s)
		}
	}
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", state(api.StatePaused))
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", state(api.StateRunning))
	mux.HandleFunc("POST /v1/sandboxes/{id}/timeout", func(w http.ResponseWriter, r *http.Request) {
		var req api.TimeoutRequest
		if !decodeStrictT(w, r, &req) {
			return
		}
		exp := time.Unix(1e9+req.TimeoutS, 0).UTC()
		s := f.sandbox()
		s.ExpiresAt = &exp
		writeJSON(w, 200, s)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", f.exec)
	mux.HandleFunc("GET /v1/sandboxes/{id}/execs/{eid}", func(w http.ResponseWriter, r *http.Request) {
		out, errs, code := "HEAD…TAIL", "", 0
		writeJSON(w, 200, api.ExecResult{ID: "ex_1", Status: api.ExecExited, ExitCode: &code, Stdout: &out, Stderr: &errs,
			Truncated: true, StdoutDroppedBytes: 1000})
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/execs/{eid}/signal", func(w http.ResponseWriter, r *http.Request) {
		var req api.SignalRequest
		if !decodeStrictT(w, r, &req) {
			return
		}
		f.mu.Lock()
		f.signals = append(f.signals, r.PathValue("eid")+":"+req.Signal)
		f.mu.Unlock()
		if req.Signal == "SIGKILL" {
			f.killOnce.Do(func() { close(f.killed) })
		}
		w.WriteHeader(204)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/execs/{eid}/stdin", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if len(b) > 0 {
			f.stdin <- string(b)
		}
		if r.URL.Query().Get("eof") == "true" {
			close(f.stdin)
		}
		writeJSON(w, 200, api.StdinWritten{Written: int64(len(b))})
	})
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		writeJSON(w, 201, api.FileWritten{Path: r.URL.Query().Get("path"), Size: int64(len(b))})
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "content of "+r.URL.Query().Get("path"))
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/fs/stat", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "sbx_1" {
			writeAPIError(w, 404, api.CodeSandboxNotFound, "sandbox not found")
			return
		}
		p := r.URL.Query().Get("path")
		if strings.HasSuffix(p, "missing") {
			writeAPIError(w, 404, api.CodeNotFound, "no such file or directory")
			return
		}
		writeJSON(w, 200, api.FileInfo{Path: p, Type: "file"})
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/fs/list", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, api.FileList{Entries: []api.FileInfo{{Path: r.URL.Query().Get("path") + "/a"}}})
	})
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/fs", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	mux.HandleFunc("POST /v1/sandboxes/{id}/fs/mkdir", func(w http.ResponseWriter, r *http.Request) {
		var req api.MkdirRequest
		if !decodeStrictT(w, r, &req) {
			return
		}
		writeJSON(w, 200, api.FileInfo{Path: req.Path, Type: "dir"})
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/fs/move", func(w http.ResponseWriter, r *http.Request) {
		var req api.MoveRequest
		if !decodeStrictT(w, r, &req) {
			return
		}
		writeJSON(w, 200, api.FileInfo{Path: req.To, Type: "file"})
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/code", func(w http.ResponseWriter, r *http.Request) {
		var req api.CodeRequest
		if !decodeStrictT(w, r, &req) {
			return
		}
		f.mu.Lock()
		f.code = append(f.code, req)
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		enc.Encode(api.CodeEvent{Type: api.CodeEventStdout, Text: "printed\n"})
		enc.Encode(api.CodeEvent{Type: api.CodeEventResult, IsMainResult: true, Text: "2"})
		enc.Encode(api.CodeEvent{Type: api.CodeEventError, Name: "ZeroDivisionError", Value: "division by zero", Traceback: "tb"})
		enc.Encode(api.CodeEvent{Type: api.CodeEventEnd, ExecutionCount: 4})
	})
	mux.HandleFunc("GET /v1/keys", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		keys := f.keys
		f.mu.Unlock()
		writeJSON(w, 200, api.KeyList{Keys: keys})
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		call := r.Method + " " + r.URL.Path
		if r.URL.RawQuery != "" {
			call += "?" + r.URL.RawQuery
		}
		f.calls = append(f.calls, call)
		f.mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer ak_test" {
			writeAPIError(w, 401, api.CodeUnauthenticated, "missing or unknown api key")
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func decodeStrictT(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeAPIError(w, 400, api.CodeInvalidArgument, "malformed request body: "+err.Error())
		return false
	}
	return true
}

func (f *fakeSandboxAPI) exec(w http.ResponseWriter, r *http.Request) {
	var req api.ExecRequest
	if !decodeStrictT(w, r, &req) {
		return
	}
	f.mu.Lock()
	f.execs = append(f.execs, req)
	f.mu.Unlock()
	if r.Header.Get("Accept") != "text/event-stream" {
		writeAPIError(w, 400, api.CodeInvalidArgument, "fake speaks sse only")
		return
	}
	cmd := strings.Join(req.Cmd, " ")
	if req.Shell != nil {
		cmd = *req.Shell
	}
	w.Header().Set("Content-Type", "text/event-stream")
	sseWrite(w, "start", api.ExecStarted{ID: "ex_1"})
	var off int64
	out := func(stream, data string) {
		sseWrite(w, stream, api.OutputEvent{Data: data, Offset: off})
		off += int64(len(data))
	}
	code := 0
	res := api.ExecResult{ID: "ex_1", Status: api.ExecExited, ExitCode: &code, DurationMS: 12}
	switch cmd {
	case "echo hi":
		out("stdout", "h")
		out("stdout", "i\n")
	case "fail":
		code = 3
		out("stdout", "o")
		out("stderr", "e")
	case "slow":
		out("stdout", "a")
		res = api.ExecResult{ID: "ex_1", Status: api.ExecTimeout, ErrorCode: api.ExecCodeTimeout}
	case "notfound":
		code = 127
		res = api.ExecResult{ID: "ex_1", Status: api.ExecError, ErrorCode: api.ExecCodeExecFailed, ExitCode: &code,
			Error: `exec: "notfound": executable file not found in $PATH`}
	case "flood":
		out("stdout", "HEAD")
		off += 1000 // dropped
		out("stdout", "TAIL-SAMPLE")
		res.Truncated = true
	case "cat":
		if req.Stdin != nil {
			out("stdout", *req.Stdin)
			break
		}
		for s := range f.stdin {
			out("stdout", s)
		}
	case "hang":
		out("stdout", "started\n")
		select {
		case <-f.killed:
			res = api.ExecResult{ID: "ex_1", Status: api.ExecKilled, Signal: "SIGKILL", ErrorCode: api.ExecCodeSignaled}
		case <-r.Context().Done():
			return
		}
	default:
		res = api.ExecResult{ID: "ex_1", Status: api.ExecError, Error: "unknown fake command " + cmd}
	}
	sseWrite(w, "exit", res)
}

func TestNewSandboxOptions(t *testing.T) {
	f := newFakeSandboxAPI(t)
	c := f.client(t)
	ctx := context.Background()
	sb, err := c.NewSandbox(ctx,
		WithTemplate("python@2"), WithRuntime("gvisor"), WithTTL(90*time.Second+time.Millisecond),
		WithEnv("A", "1"), WithEnv("B", "2"), WithSecret("OPENAI_KEY", "sk-x"), WithMetadata("user", "u-42"),
		WithCPU(0.5), WithMemoryMB(512), WithDiskMB(1024), WithNetwork("allowlist", "pypi.org"), WithNetwork("allowlist", "10.0.0.0/8:443"),
		WithIdempotencyKey("idem-1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID() != "sbx_1" || sb.Info().Runtime != "gvisor" || sb.Client() != c {
		t.Errorf("handle %s %+v", sb.ID(), sb.Info())
	}
	ttl := int64(91)
	want := api.CreateSandboxRequest{
		Template: "python@2", Runtime: "gvisor", TimeoutS: &ttl,
		Env: map[string]string{"A": "1", "B": "2"}, Secrets: map[string]string{"OPENAI_KEY": "sk-x"},
		Metadata:  map[string]string{"user": "u-42"},
		Resources: &api.Resources{CPU: 0.5, MemoryMB: 512, DiskMB: 1024},
		Network:   &api.Network{Mode: "allowlist", Allow: []string{"pypi.org", "10.0.0.0/8:443"}},
		// A template being built is waited for unless told otherwise.
		WaitForTemplate: true,
	}
	f.mu.Lock()
	got, hdr := f.creates[0], f.headers[0]
	f.mu.Unlock()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("create request\n got %+v\nwant %+v", got, want)
	}
	if hdr.Get("Idempotency-Key") != "idem-1" {
		t.Errorf("Idempotency-Key = %q", hdr.Get("Idempotency-Key"))
	}

	// The raw request is the base; options after it apply on top, and do
	// not write into the caller's maps.
	base := api.CreateSandboxRequest{Template: "node", Env: map[string]string{"K": "V"}, AutoPause: true}
	if _, err := c.NewSandbox(ctx, WithRequest(base), WithEnv("X", "y"), WithWaitForTemplate(false)); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	got = f.creates[1]
	f.mu.Unlock()
	if got.Template != "node" || !got.AutoPause || got.Env["K"] != "V" || got.Env["X"] != "y" || got.WaitForTemplate {
		t.Errorf("create from a raw request = %+v", got)
	}
	if len(base.Env) != 1 {
		t.Errorf("WithEnv wrote into the caller's request: %v", base.Env)
	}
}

func TestCreateFromEnv(t *testing.T) {
	f := newFakeSandboxAPI(t)
	t.Setenv(EnvURL, f.srv.URL)
	t.Setenv(EnvAPIKey, "ak_test")
	sb, err := Create(context.Background(), WithTemplate("base"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(envHTTP().CloseIdleConnections)
	if sb.ID() != "sbx_1" || sb.Client().BaseURL() != f.srv.URL {
		t.Errorf("Create from env: %s at %s", sb.ID(), sb.Client().BaseURL())
	}
	if _, err := Connect(context.Background(), "sbx_1"); err != nil {
		t.Errorf("Connect: %v", err)
	}
	if _, err := Connect(context.Background(), "sbx_gone"); !errors.Is(err, ErrSandboxNotFound) {
		t.Errorf("Connect to a missing sandbox: %v, want ErrSandboxNotFound", err)
	}
	t.Setenv(EnvAPIKey, "ak_wrong")
	if _, err := Create(context.Background()); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("Create with a wrong key: %v, want ErrUnauthenticated", err)
	}
}

func newTestSandbox(t *testing.T) (*fakeSandboxAPI, *Sandbox) {
	f := newFakeSandboxAPI(t)
	sb, err := f.client(t).ConnectSandbox(context.Background(), "sbx_1")
	if err != nil {
		t.Fatal(err)
	}
	return f, sb
}

func TestSandboxRun(t *testing.T) {
	f, sb := newTestSandbox(t)
	ctx := context.Background()
	res, err := sb.Run(ctx, "echo hi", WithTimeout(30*time.Second), WithUser("root"), WithCwd("proj"), WithEnv("A", "1"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "hi\n" || res.Stderr != "" || res.ExitCode != 0 || res.Status != api.ExecExited || res.ID != "ex_1" ||
		res.Duration != 12*time.Millisecond || res.Result == nil {
		t.Errorf("result %+v", res)
	}
	f.mu.Lock()
	req := f.execs[0]
	f.mu.Unlock()
	if req.Shell == nil || *req.Shell != "echo hi" || req.User != "root" || req.Cwd != "/home/user/proj" ||
		req.Env["A"] != "1" || req.TimeoutS == nil || *req.TimeoutS != 30 {
		t.Errorf("exec request %+v", req)
	}
	// A foreground command's stdin is given (empty) so that it is closed:
	// a command reading it must not wait for input no one sends.
	if req.Stdin == nil || *req.Stdin != "" {
		t.Errorf("stdin %v, want empty and given", req.Stdin)
	}

	if res.Err() != nil {
		t.Errorf("Err() of a zero exit: %v", res.Err())
	}
	// A non-zero exit is a result, not an error; Err says it.
	res, err = sb.RunArgs(ctx, []string{"fail"})
	if err != nil || res.ExitCode != 3 || res.Stdout != "o" || res.Stderr != "e" {
		t.Errorf("fail: %+v, %v", res, err)
	}
	if e := res.Err(); !errors.Is(e, ErrExitStatus) || errors.Is(e, ErrExecFailed) || e.Error() != "command exited with status 3 (exit_status)" {
		t.Errorf("Err() of exit 3: %v", e)
	}
	f.mu.Lock()
	req = f.execs[1]
	f.mu.Unlock()
	if !slices.Equal(req.Cmd, []string{"fail"}) || req.Shell != nil {
		t.Errorf("RunArgs request %+v", req)
	}
	if _, err := sb.RunArgs(ctx, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("empty argv: %v", err)
	}
}

func TestSandboxRunStreamsAndKeepsOutput(t *testing.T) {
	_, sb := newTestSandbox(t)
	var chunks []string
	res, err := sb.Run(context.Background(), "echo hi", OnStdout(func(s string) { chunks = append(chunks, s) }),
		OnStderr(func(s string) { t.Errorf("stderr %q", s) }))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(chunks, []string{"h", "i\n"}) {
		t.Errorf("streamed %q, want the two pieces in order", chunks)
	}
	if res.Stdout != "hi\n" {
		t.Errorf("a streamed run's result has stdout %q, want the whole output", res.Stdout)
	}
}

func TestSandboxRunEndsThatAreErrors(t *testing.T) {
	_, sb := newTestSandbox(t)
	ctx := context.Background()
	res, err := sb.Run(ctx, "slow", WithTimeout(time.Second))
	var ee *ExecError
	if !errors.Is(err, ErrExecTimeout) || !errors.As(err, &ee) || errors.Is(err, ErrExecKilled) {
		t.Fatalf("timeout: %v", err)
	}
	if res == nil || res.Stdout != "a" || res.Status != api.ExecTimeout || res.ExitCode != -1 || ee.Result != res {
		t.Errorf("timeout result %+v", res)
	}
	if err.Error() != "command timed out (exec_timeout)" {
		t.Errorf("message %q", err.Error())
	}
	// Like the other SDKs, only a timeout is an error of Run: a command
	// that could not start is a result (127), which Err explains.
	res, err = sb.Run(ctx, "notfound")
	if err != nil || res.ExitCode != 127 || res.Status != api.ExecError {
		t.Fatalf("not found: %+v, %v", res, err)
	}
	if e := res.Err(); !errors.Is(e, ErrExecFailed) || !strings.Contains(e.Error(), "not found in $PATH (exec_failed)") {
		t.Errorf("Err() of a missing command: %v", e)
	}
}

func TestSandboxRunTruncatedUsesTheRecord(t *testing.T) {
	f, sb := newTestSandbox(t)
	var streamed strings.Builder
	res, err := sb.Run(context.Background(), "flood", OnStdout(func(s string) { streamed.WriteString(s) }))
	if err != nil {
		t.Fatal(err)
	}
	// What streamed past the cap is a sample; the result is what the
	// server kept, head and tail.
	if streamed.String() != "HEADTAIL-SAMPLE" || res.Stdout != "HEAD…TAIL" || !res.Truncated {
		t.Errorf("streamed %q, result %q truncated %v", streamed.String(), res.Stdout, res.Truncated)
	}
	if !slices.Contains(f.callList(), "GET /v1/sandboxes/sbx_1/execs/ex_1") {
		t.Errorf("the record was not fetched: %v", f.callList())
	}
}

func TestSandboxRunCancelKills(t *testing.T) {
	f, sb := newTestSandbox(t)
	ctx, cancel := context.WithCancel(context.Background())
	res, err := sb.Run(ctx, "hang", OnStdout(func(string) { cancel() }))
	if res != nil || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled run: %+v, %v", res, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Equal(f.signals, []string{"ex_1:SIGKILL"}) {
		t.Errorf("signals %v: a run whose ctx ended must kill its command", f.signals)
	}
}

func TestSandboxStartStdinWaitKill(t *testing.T) {
	f, sb := newTestSandbox(t)
	ctx := context.Background()
	cmd, err := sb.Start(ctx, "cat")
	if err != nil {
		t.Fatal(err)
	}
	if cmd.ID() != "ex_1" {
		t.Errorf("id %q", cmd.ID())
	}
	f.mu.Lock()
	req := f.execs[0]
	f.mu.Unlock()
	if req.Stdin != nil {
		t.Errorf("a background command's stdin must stay open, request gave %q", *req.Stdin)
	}
	if err := cmd.SendStdin(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	if err := cmd.SendStdin(ctx, "def"); err != nil {
		t.Fatal(err)
	}
	if err := cmd.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := cmd.Wait(ctx)
	if err != nil || res.Stdout != "abcdef" {
		t.Errorf("cat: %+v, %v", res, err)
	}
	select {
	case <-cmd.Done():
	default:
		t.Error("Done is open after Wait returned")
	}

	var got strings.Builder
	started := make(chan struct{})
	cmd, err = sb.StartArgs(ctx, []string{"hang"}, OnStdout(func(s string) { got.WriteString(s); close(started) }))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	if _, err := cmd.Wait(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait past its ctx: %v", err)
	}
	cancel()
	if err := cmd.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	res, err = cmd.Wait(ctx)
	if err != nil || res.Status != api.ExecKilled || !errors.Is(res.Err(), ErrExecKilled) || res.Stdout != "started\n" || got.String() != "started\n" {
		t.Errorf("killed: %+v, %v (streamed %q)", res, err, got.String())
	}
}

func TestSandboxFilesRelativePaths(t *testing.T) {
	f, sb := newTestSandbox(t)
	ctx := context.Background()
	fs := sb.Files()
	if w, err := fs.Write(ctx, "task.py", []byte("print(1)"), WithMode(0o755)); err != nil || w.Path != "/home/user/task.py" || w.Size != 8 {
		t.Errorf("Write: %+v, %v", w, err)
	}
	if _, err := fs.WriteFrom(ctx, "/tmp/abs", strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	if b, err := fs.Read(ctx, "out/r.json"); err != nil || string(b) != "content of /home/user/out/r.json" {
		t.Errorf("Read: %q, %v", b, err)
	}
	if l, err := fs.List(ctx, ""); err != nil || len(l) != 1 || l[0].Path != "/home/user/a" {
		t.Errorf("List: %+v, %v", l, err)
	}
	if ok, err := fs.Exists(ctx, "task.py"); !ok || err != nil {
		t.Errorf("Exists(task.py) = %v, %v", ok, err)
	}
	if ok, err := fs.Exists(ctx, "missing"); ok || err != nil {
		t.Errorf("Exists(missing) = %v, %v", ok, err)
	}
	if err := fs.Remove(ctx, "out"); err != nil {
		t.Fatal(err)
	}
	if d, err := fs.MakeDir(ctx, "a/b"); err != nil || d.Path != "/home/user/a/b" {
		t.Errorf("MakeDir: %+v, %v", d, err)
	}
	if m, err := fs.Rename(ctx, "a", "/tmp/a"); err != nil || m.Path != "/tmp/a" {
		t.Errorf("Rename: %+v, %v", m, err)
	}
	want := []string{
		"PUT /v1/sandboxes/sbx_1/files?mode=0755&path=%2Fhome%2Fuser%2Ftask.py",
		"PUT /v1/sandboxes/sbx_1/files?path=%2Ftmp%2Fabs",
		"GET /v1/sandboxes/sbx_1/files?path=%2Fhome%2Fuser%2Fout%2Fr.json",
		"GET /v1/sandboxes/sbx_1/fs/list?depth=1&path=%2Fhome%2Fuser",
		"GET /v1/sandboxes/sbx_1/fs/stat?path=%2Fhome%2Fuser%2Ftask.py",
		"GET /v1/sandboxes/sbx_1/fs/stat?path=%2Fhome%2Fuser%2Fmissing",
		"DELETE /v1/sandboxes/sbx_1/fs?path=%2Fhome%2Fuser%2Fout&recursive=true",
		"POST /v1/sandboxes/sbx_1/fs/mkdir",
		"POST /v1/sandboxes/sbx_1/fs/move",
	}
	if got := f.callList()[1:]; !slices.Equal(got, want) { // after the connect
		t.Errorf("calls\n got %q\nwant %q", got, want)
	}
	// A missing sandbox is an error, not a missing file.
	gone := &Sandbox{c: sb.c, id: "sbx_gone"}
	if ok, err := gone.Files().Exists(ctx, "task.py"); ok || !errors.Is(err, ErrSandboxNotFound) {
		t.Errorf("Exists in a missing sandbox = %v, %v", ok, err)
	}
}

func TestSandboxLifecycle(t *testing.T) {
	f, sb := newTestSandbox(t)
	ctx := context.Background()
	if err := sb.Pause(ctx); err != nil || sb.Info().State != api.StatePaused {
		t.Errorf("Pause: %v, state %s", err, sb.Info().State)
	}
	if err := sb.Resume(ctx); err != nil || sb.Info().State != api.StateRunning {
		t.Errorf("Resume: %v, state %s", err, sb.Info().State)
	}
	if err := sb.SetTTL(ctx, 1500*time.Millisecond); err != nil || sb.Info().ExpiresAt == nil || sb.Info().ExpiresAt.Unix() != 1e9+2 {
		t.Errorf("SetTTL: %v, %+v", err, sb.Info().ExpiresAt)
	}
	if s, err := sb.Refresh(ctx); err != nil || s.ID != "sbx_1" {
		t.Errorf("Refresh: %+v, %v", s, err)
	}
	for range 3 {
		if err := sb.Close(); err != nil {
			t.Fatal(err)
		}
	}
	f.mu.Lock()
	n := f.deletes
	f.mu.Unlock()
	if n != 1 {
		t.Errorf("Close three times sent %d deletes, want 1", n)
	}
	// Killing a sandbox that is gone already succeeds.
	gone := &Sandbox{c: sb.c, id: "sbx_gone"}
	if err := gone.Kill(ctx); err != nil {
		t.Errorf("Kill of a gone sandbox: %v", err)
	}
}

func TestSandboxRunCode(t *testing.T) {
	f, sb := newTestSandbox(t)
	var out []string
	var results []api.CodeEvent
	ex, err := sb.RunCode(context.Background(), "1/0", WithLanguage("python"), WithCodeContext("ctx_1"),
		WithTimeout(2*time.Second), WithEnv("K", "V"), OnStdout(func(s string) { out = append(out, s) }),
		OnResult(func(ev api.CodeEvent) { results = append(results, ev) }))
	if err != nil {
		t.Fatal(err)
	}
	if ex.Stdout != "printed\n" || ex.Text() != "2" || ex.ExecutionCount != 4 || !slices.Equal(out, []string{"printed\n"}) || len(results) != 1 {
		t.Errorf("execution %+v, streamed %q, results %d", ex, out, len(results))
	}
	var ce *CodeError
	if err := ex.Err(); !errors.As(err, &ce) || ce.Name != "ZeroDivisionError" || err.Error() != "ZeroDivisionError: division by zero" {
		t.Errorf("Err() = %v", err)
	}
	f.mu.Lock()
	req := f.code[0]
	f.mu.Unlock()
	if req.Code != "1/0" || req.Language != "python" || req.ContextID == nil || *req.ContextID != "ctx_1" ||
		req.TimeoutS == nil || *req.TimeoutS != 2 || req.Env["K"] != "V" {
		t.Errorf("code request %+v", req)
	}
}

func TestTypedErrors(t *testing.T) {
	tests := []struct {
		status     int
		code       string
		retryAfter string
		is         []error
		isNot      []error
	}{
		{404, api.CodeSandboxNotFound, "", []error{ErrSandboxNotFound, ErrNotFound}, []error{ErrExecNotFound}},
		{404, api.CodeNotFound, "", []error{ErrNotFound}, []error{ErrSandboxNotFound}},
		{404, api.CodeTemplateNotFound, "", []error{ErrTemplateNotFound, ErrNotFound}, nil},
		{429, api.CodeQuotaExceeded, "7", []error{ErrQuotaExceeded}, []error{ErrRateLimited}},
		{429, api.CodeRateLimited, "1", []error{ErrRateLimited}, []error{ErrQuotaExceeded}},
		{503, api.CodeTemplateBuilding, "30", []error{ErrTemplateBuilding, ErrUnavailable}, nil},
		{400, api.CodeInvalidArgument, "", []error{ErrInvalidArgument}, []error{ErrTemplateBuilding}},
		{401, api.CodeUnauthenticated, "", []error{ErrUnauthenticated}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tt.retryAfter != "" {
					w.Header().Set("Retry-After", tt.retryAfter)
				}
				writeAPIError(w, tt.status, tt.code, "nope")
			})
			_, err := newTestClient(t, h).NewSandbox(context.Background())
			var ae *APIError
			if !errors.As(err, &ae) || ae.Code != tt.code || ae.StatusCode != tt.status || ae.RequestID != "req_1" {
				t.Fatalf("errors.As: %#v", err)
			}
			for _, target := range tt.is {
				if !errors.Is(err, target) {
					t.Errorf("errors.Is(%v, %v) = false", err, target)
				}
			}
			for _, target := range tt.isNot {
				if errors.Is(err, target) {
					t.Errorf("errors.Is(%v, %v) = true", err, target)
				}
			}
			if tt.retryAfter != "" {
				d, ok := RetryAfter(err)
				if !ok || d.String() != tt.retryAfter+"s" || ae.RetryAfter != d {
					t.Errorf("RetryAfter = %v, %v", d, ok)
				}
			}
		})
	}
}

func TestWhoAmI(t *testing.T) {
	f := newFakeSandboxAPI(t)
	c := f.client(t) // key ak_test
	rps := 5.0
	revoked := time.Now()
	tests := []struct {
		name    string
		keys    []api.Key
		want    *Identity
		wantErr bool
	}{
		{name: "one match", keys: []api.Key{
			{ID: "key_other", Tenant: "t1", Prefix: "ak_zzz"},
			{ID: "key_1", Tenant: "t1", Name: "ci", Prefix: "ak_te", RateLimitRPS: &rps},
		}, want: &Identity{URL: f.srv.URL, Tenant: "t1", KeyID: "key_1", KeyName: "ci", Prefix: "ak_te", RateLimitRPS: &rps}},
		{name: "the longest prefix wins", keys: []api.Key{
			{ID: "key_short", Tenant: "t1", Prefix: "ak_"},
			{ID: "key_admin", Tenant: "admin", Admin: true, Prefix: "ak_tes"},
		}, want: &Identity{URL: f.srv.URL, Tenant: "admin", Admin: true, KeyID: "key_admin", Prefix: "ak_tes"}},
		{name: "revoked keys do not count", keys: []api.Key{
			{ID: "key_old", Tenant: "t2", Prefix: "ak_test", RevokedAt: &revoked},
			{ID: "key_new", Tenant: "t1", Prefix: "ak_te"},
		}, want: &Identity{URL: f.srv.URL, Tenant: "t1", KeyID: "key_new", Prefix: "ak_te"}},
		{name: "same prefix, same tenant", keys: []api.Key{
			{ID: "key_a", Tenant: "t1", Prefix: "ak_te"}, {ID: "key_b", Tenant: "t1", Prefix: "ak_te"},
		}, want: &Identity{URL: f.srv.URL, Tenant: "t1", Prefix: "ak_te"}},
		{name: "same prefix, two tenants", keys: []api.Key{
			{ID: "key_a", Tenant: "t1", Prefix: "ak_te"}, {ID: "key_b", Tenant: "t2", Prefix: "ak_te"},
		}, wantErr: true},
		{name: "no match", keys: []api.Key{{ID: "key_a", Tenant: "t1", Prefix: "ak_x"}}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f.mu.Lock()
			f.keys = tt.keys
			f.mu.Unlock()
			got, err := c.WhoAmI(context.Background())
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	noKey, _ := New(f.srv.URL, "")
	if _, err := noKey.WhoAmI(context.Background()); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("WhoAmI without a key: %v", err)
	}
}
