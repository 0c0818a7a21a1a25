package mcp

// Unit tests: no daemon. A fake of the HTTP API (httptest) answers the few
// calls each test needs; daemon_test.go runs the same tools against the
// real daemon.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// fakeAPI answers like the daemon for sandbox sbx_ok (its handlers, by
// route), 404 sandbox_not_found for any other sandbox, and 401 for a key
// other than goodKey.
type fakeAPI struct {
	t        *testing.T
	srv      *httptest.Server
	handlers map[string]http.HandlerFunc // "METHOD /path" (after /v1/sandboxes/sbx_ok)
	infos    atomic.Int64                // GET /v1/info answered
	calls    atomic.Int64                // sandbox calls answered
	lastKey  atomic.Value                // the key of the last sandbox call
}

const (
	goodKey  = "ak_good"
	otherKey = "ak_other"
)

func newFakeAPI(t *testing.T) *fakeAPI {
	f := &fakeAPI{t: t, handlers: map[string]http.HandlerFunc{}}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	if key != goodKey && key != otherKey {
		writeError(w, http.StatusUnauthorized, api.CodeUnauthenticated, "invalid API key", 0)
		return
	}
	if r.URL.Path == "/v1/info" {
		f.infos.Add(1)
		json.NewEncoder(w).Encode(api.Info{Version: "fake"})
		return
	}
	f.calls.Add(1)
	f.lastKey.Store(key)
	rest, ok := strings.CutPrefix(r.URL.Path, "/v1/sandboxes/sbx_ok")
	h := f.handlers[r.Method+" "+rest]
	if !ok || h == nil || key != goodKey {
		writeError(w, http.StatusNotFound, api.CodeSandboxNotFound, "sandbox not found", 0)
		return
	}
	h(w, r)
}

func (f *fakeAPI) client(t testing.TB, key string) *client.Client {
	c, err := client.New(f.srv.URL, key)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (f *fakeAPI) session(t *testing.T, opts Options) *session {
	return connectInMemory(t, staticClient(f.client(t, goodKey)), opts)
}

func jsonHandler(v any) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { json.NewEncoder(w).Encode(v) }
}

var allTools = []string{ToolCreateSandbox, ToolRunCommand, ToolRunCode, ToolReadFile, ToolWriteFile, ToolListFiles, ToolKillSandbox}

// TestToolsAndSchemas: exactly the seven tools of issue 17, each with a
// description, an object input schema whose every property is described,
// and an output schema.
func TestToolsAndSchemas(t *testing.T) {
	f := newFakeAPI(t)
	s := f.session(t, Options{})
	res, err := s.cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
		if tool.Description == "" || tool.Title == "" {
			t.Errorf("%s: no description or title", tool.Name)
		}
		var in jsonschema.Schema
		remarshal(t, tool.InputSchema, &in)
		if in.Type != "object" || len(in.Properties) == 0 {
			t.Errorf("%s: input schema %+v", tool.Name, in)
		}
		if in.AdditionalProperties == nil || in.AdditionalProperties.Not == nil {
			t.Errorf("%s: input schema allows unknown properties", tool.Name)
		}
		for name, p := range in.Properties {
			if p.Description == "" {
				t.Errorf("%s: property %s has no description", tool.Name, name)
			}
		}
		if tool.Name != ToolCreateSandbox && !slices.Contains(in.Required, "sandbox_id") {
			t.Errorf("%s: sandbox_id is not required (required %v)", tool.Name, in.Required)
		}
		if tool.OutputSchema == nil {
			t.Errorf("%s: no output schema", tool.Name)
		}
	}
	slices.Sort(names)
	want := slices.Clone(allTools)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("tools %v, want %v", names, want)
	}
}

// TestBadInput: arguments that do not fit a schema are tool errors coded
// invalid_argument, the API is not called, and the session goes on.
func TestBadInput(t *testing.T) {
	f := newFakeAPI(t)
	s := f.session(t, Options{})
	cases := []struct {
		tool string
		args map[string]any
		want string // in the message
	}{
		{ToolRunCommand, map[string]any{"command": "true"}, "sandbox_id"},
		{ToolRunCommand, map[string]any{"sandbox_id": "sbx_ok", "command": ""}, "command"},
		{ToolRunCommand, map[string]any{"sandbox_id": "sbx_ok", "command": 42}, "command"},
		{ToolRunCommand, map[string]any{"sandbox_id": "sbx_ok", "command": "true", "bogus": 1}, "bogus"},
		{ToolRunCommand, map[string]any{"sandbox_id": "sbx_ok", "command": "true", "timeout_s": -1}, "timeout_s"},
		{ToolRunCode, map[string]any{"sandbox_id": "sbx_ok", "code": "1", "language": "cobol"}, "language"},
		{ToolReadFile, map[string]any{"sandbox_id": "sbx_ok", "path": "a", "max_bytes": 1 << 30}, "max_bytes"},
		{ToolReadFile, map[string]any{"sandbox_id": "sbx_ok", "path": "a", "offset": -5}, "offset"},
		{ToolWriteFile, map[string]any{"sandbox_id": "sbx_ok", "path": "a", "content": "x", "mode": "rwx"}, "mode"},
		{ToolWriteFile, map[string]any{"sandbox_id": "sbx_ok", "path": "a", "content": "!!", "encoding": "base64"}, "base64"},
		{ToolListFiles, map[string]any{"sandbox_id": "sbx_ok", "depth": 99}, "depth"},
		{ToolCreateSandbox, map[string]any{"env": "PATH=/x"}, "env"},
		{ToolCreateSandbox, map[string]any{"timeout_s": 1.5}, "timeout_s"},
		{ToolKillSandbox, map[string]any{}, "sandbox_id"},
	}
	for _, c := range cases {
		code, msg := s.fails(c.tool, c.args)
		if code != api.CodeInvalidArgument || !strings.Contains(msg, c.want) {
			t.Errorf("%s(%v): %s: %s, want invalid_argument naming %s", c.tool, c.args, code, msg, c.want)
		}
	}
	if n := f.calls.Load(); n != 0 {
		t.Errorf("the API was called %d times for arguments that do not fit", n)
	}
	// Raw JSON that is no object at all.
	ctx := context.Background()
	res, err := s.cs.CallTool(ctx, &sdk.CallToolParams{Name: ToolKillSandbox, Arguments: json.RawMessage(`[1,2]`)})
	if err != nil || !res.IsError || !strings.HasPrefix(text(res), "invalid_argument: ") {
		t.Errorf("array arguments: %v, %+v", err, res)
	}
	// The session still works.
	code, _ := s.fails(ToolKillSandbox, map[string]any{"sandbox_id": "sbx_gone"})
	if code != api.CodeSandboxNotFound {
		t.Errorf("after bad input: %s", code)
	}
}

// TestAPIErrorsAreToolErrors: an API error is a tool error starting with
// its code, with the hints a caller acts on.
func TestAPIErrorsAreToolErrors(t *testing.T) {
	f := newFakeAPI(t)
	f.handlers["POST "] = nil
	s := f.session(t, Options{})
	for _, tool := range allTools {
		args := map[string]any{"sandbox_id": "sbx_missing", "path": "/x", "command": "true", "code": "1", "content": ""}
		if tool == ToolCreateSandbox {
			continue
		}
		for k := range args {
			if !propertyOf(t, s, tool, k) {
				delete(args, k)
			}
		}
		code, msg := s.fails(tool, args)
		if code != api.CodeSandboxNotFound || msg != "sandbox not found" {
			t.Errorf("%s on a missing sandbox: %s: %s", tool, code, msg)
		}
	}
	// Retry-After and the build a create waits for are in the text.
	e := toolError(&client.APIError{StatusCode: 503, Code: api.CodeTemplateBuilding, Message: "template is being built", BuildID: "bld_1", RetryAfter: 30e9})
	if got := text(e); got != "template_building: template is being built (template build bld_1, retry after 30s)" {
		t.Errorf("template_building: %q", got)
	}
	// An unreachable server is unavailable.
	c, _ := client.New("http://127.0.0.1:1", goodKey)
	s2 := connectInMemory(t, staticClient(c), Options{})
	if code, _ := s2.fails(ToolKillSandbox, map[string]any{"sandbox_id": "sbx_ok"}); code != api.CodeUnavailable {
		t.Errorf("unreachable server: %s", code)
	}
}

func propertyOf(t *testing.T, s *session, tool, prop string) bool {
	res, err := s.cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range res.Tools {
		if tl.Name == tool {
			var in jsonschema.Schema
			remarshal(t, tl.InputSchema, &in)
			_, ok := in.Properties[prop]
			return ok
		}
	}
	return false
}

// TestRunCommandBounded: the command result is bounded as asked of the
// API (max_output_bytes), with a marker where bytes were dropped, and
// base64 output is decoded.
func TestRunCommandBounded(t *testing.T) {
	f := newFakeAPI(t)
	var got api.ExecRequest
	f.handlers["POST /exec"] = func(w http.ResponseWriter, r *http.Request) {
		json.NewDecoder(r.Body).Decode(&got)
		limit := int(*got.MaxOutputBytes)
		// What the API sends back for 1000 bytes of stdout past the cap.
		out := strings.Repeat("h", limit/2) + strings.Repeat("t", limit/2)
		errb := base64.StdEncoding.EncodeToString([]byte("bad \xff byte"))
		json.NewEncoder(w).Encode(api.ExecResult{
			Status: "exited", ExitCode: ptr(3), Stdout: ptr(base64.StdEncoding.EncodeToString([]byte(out))), Stderr: &errb,
			Encoding: "base64", Truncated: true, StdoutDroppedBytes: 1000,
		})
	}
	s := f.session(t, Options{Limits: Limits{StreamBytes: 100}})
	var out runCommandOut
	s.ok(ToolRunCommand, map[string]any{"sandbox_id": "sbx_ok", "command": "yes"}, &out)
	if got.Shell == nil || *got.Shell != "yes" || got.TimeoutS == nil || *got.TimeoutS != defaultCommandTimeoutS || *got.MaxOutputBytes != 100 {
		t.Errorf("exec request %+v", got)
	}
	want := strings.Repeat("h", 50) + marker(1000, "stdout") + strings.Repeat("t", 50)
	if out.Stdout != want || !out.Truncated || out.Note == "" || *out.ExitCode != 3 {
		t.Errorf("result %+v", out)
	}
	if out.Stderr != "bad \uFFFD byte" {
		t.Errorf("stderr %q", out.Stderr)
	}
}

// TestRunCodeBounded: streams, texts, results and images of a cell are
// bounded; PNGs become image content; an exception makes a tool error
// that still carries the output.
func TestRunCodeBounded(t *testing.T) {
	f := newFakeAPI(t)
	png := "\x89PNG\r\n\x1a\n" + strings.Repeat("p", 100)
	var events []api.CodeEvent
	f.handlers["POST /code"] = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		for _, ev := range events {
			json.NewEncoder(w).Encode(ev)
		}
	}
	lim := Limits{StreamBytes: 64, TextBytes: 40, Images: 2, ImageBytes: 200}
	s := f.session(t, Options{Limits: lim})
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	for i := 0; i < 1000; i++ {
		events = append(events, api.CodeEvent{Type: api.CodeEventStdout, Text: fmt.Sprintf("line %04d\n", i)})
	}
	events = append(events,
		api.CodeEvent{Type: api.CodeEventResult, PNG: b64(png), Chart: json.RawMessage(`{"type":"line"}`)},
		api.CodeEvent{Type: api.CodeEventResult, PNG: b64(strings.Repeat("x", 300))}, // over ImageBytes
		api.CodeEvent{Type: api.CodeEventResult, JPEG: b64("\xff\xd8\xff jpeg")},
		api.CodeEvent{Type: api.CodeEventResult, PNG: b64(png)}, // over Images
		api.CodeEvent{Type: api.CodeEventResult, IsMainResult: true, Text: strings.Repeat("é", 100), HTML: "<b>x</b>", JSON: json.RawMessage(`{"a":1}`)},
		api.CodeEvent{Type: api.CodeEventEnd, ExecutionCount: 7},
	)
	var out runCodeOut
	res := s.ok(ToolRunCode, map[string]any{"sandbox_id": "sbx_ok", "code": "plot()"}, &out)
	if !strings.HasPrefix(out.Stdout, "line 0000\n") || !strings.HasSuffix(out.Stdout, "line 0999\n") || len(out.Stdout) > 64+60 || !strings.Contains(out.Stdout, "left out") {
		t.Errorf("stdout %q", out.Stdout)
	}
	imgs := images(res)
	if len(imgs) != 2 || string(imgs[0].Data) != png || imgs[0].MIMEType != "image/png" || imgs[1].MIMEType != "image/jpeg" {
		t.Fatalf("images %+v", imgs)
	}
	if len(out.Results) != 5 || out.Results[0].Image == "" || out.Results[0].Chart == nil ||
		out.Results[1].Image != "" || !strings.Contains(out.Results[1].Note, "more than the 200 left") ||
		!strings.Contains(out.Results[3].Note, "at most 2 images") {
		t.Errorf("results %+v", out.Results)
	}
	main := out.Results[4]
	if !main.IsMainResult || !utf8.ValidString(main.Text) || !strings.Contains(main.Text, "left out") || main.HTML != "<b>x</b>" || main.Note == "" {
		t.Errorf("main result %+v", main)
	}
	if out.ExecutionCount != 7 || len(out.Notes) == 0 {
		t.Errorf("count %d notes %v", out.ExecutionCount, out.Notes)
	}
	// The call's total: results past it are left out with a note.
	events = []api.CodeEvent{
		{Type: api.CodeEventResult, Text: strings.Repeat("a", 200)},
		{Type: api.CodeEventResult, Text: strings.Repeat("b", 200)},
		{Type: api.CodeEventResult, Text: strings.Repeat("c", 200)},
		{Type: api.CodeEventEnd},
	}
	out = runCodeOut{}
	f.session(t, Options{Limits: Limits{TextBytes: 400, TotalBytes: 300}}).ok(ToolRunCode, map[string]any{"sandbox_id": "sbx_ok", "code": "x"}, &out)
	if len(out.Results) != 3 || len(out.Results[0].Text) != 200 || !strings.Contains(out.Results[1].Text, "left out") ||
		len(out.Results[1].Text) > 100+50 || out.Results[2].Text != "" || !strings.Contains(out.Results[2].Note, "spent") {
		t.Errorf("over the call's total: %+v", out.Results)
	}
	// An exception: a tool error with the output and the traceback.
	events = []api.CodeEvent{
		{Type: api.CodeEventStdout, Text: "before\n"},
		{Type: api.CodeEventError, Name: "ZeroDivisionError", Value: "division by zero", Traceback: strings.Repeat("frame\n", 100)},
		{Type: api.CodeEventEnd, ExecutionCount: 8},
	}
	res = s.call(ToolRunCode, map[string]any{"sandbox_id": "sbx_ok", "code": "1/0"})
	if !res.IsError {
		t.Fatalf("a failing cell is not a tool error: %s", text(res))
	}
	remarshal(t, res.StructuredContent, &out)
	if out.Error == nil || out.Error.Name != "ZeroDivisionError" || out.Stdout != "before\n" || len(out.Error.Traceback) > 64+60 {
		t.Errorf("failing cell %+v", out)
	}
}

// TestReadFileBounded: text is cut at max_bytes on a character boundary,
// with next_offset; binary is base64; an image is image content; a
// directory is refused.
func TestReadFileBounded(t *testing.T) {
	f := newFakeAPI(t)
	files := map[string]string{
		"/home/user/t.txt": "abc" + strings.Repeat("é", 10),
		"/home/user/b.bin": "\x00\x01\x02\xff",
		"/home/user/i.png": "\x89PNG\r\n\x1a\nIMAGE",
	}
	f.handlers["GET /fs/stat"] = func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Query().Get("path")
		if p == "/home/user" {
			json.NewEncoder(w).Encode(api.FileInfo{Path: p, Type: "dir"})
			return
		}
		json.NewEncoder(w).Encode(api.FileInfo{Path: p, Type: "file", Size: int64(len(files[p]))})
	}
	f.handlers["GET /files"] = func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, files[r.URL.Query().Get("path")])
	}
	s := f.session(t, Options{Limits: Limits{ImageBytes: 64}})
	var out readFileOut
	s.ok(ToolReadFile, map[string]any{"sandbox_id": "sbx_ok", "path": "t.txt", "max_bytes": 6}, &out) // relative: the home
	// "abc" + é (2 bytes) = 5 bytes; the 6th is half an é: left for the next read.
	if out.Content != "abcé" || out.Encoding != "utf-8" || out.Bytes != 5 || !out.Truncated || out.NextOffset != 5 || out.Size != 23 {
		t.Errorf("first read %+v", out)
	}
	out = readFileOut{}
	s.ok(ToolReadFile, map[string]any{"sandbox_id": "sbx_ok", "path": "/home/user/t.txt", "offset": 5, "max_bytes": 100}, &out)
	if out.Content != strings.Repeat("é", 9) || out.Truncated || out.NextOffset != 0 {
		t.Errorf("second read %+v", out)
	}
	out = readFileOut{}
	s.ok(ToolReadFile, map[string]any{"sandbox_id": "sbx_ok", "path": "/home/user/b.bin"}, &out)
	if out.Encoding != "base64" || out.Content != base64.StdEncoding.EncodeToString([]byte(files["/home/user/b.bin"])) {
		t.Errorf("binary %+v", out)
	}
	out = readFileOut{}
	res := s.ok(ToolReadFile, map[string]any{"sandbox_id": "sbx_ok", "path": "/home/user/i.png"}, &out)
	if imgs := images(res); len(imgs) != 1 || string(imgs[0].Data) != files["/home/user/i.png"] || out.Encoding != "image" {
		t.Errorf("image %+v %+v", out, imgs)
	}
	if code, msg := s.fails(ToolReadFile, map[string]any{"sandbox_id": "sbx_ok", "path": "/home/user"}); code != api.CodeInvalidArgument || !strings.Contains(msg, "list_files") {
		t.Errorf("directory: %s: %s", code, msg)
	}
}

// TestWriteAndListBounded: write_file decodes base64 and refuses content
// over its bound before calling the API; list_files lists at most Entries.
func TestWriteAndListBounded(t *testing.T) {
	f := newFakeAPI(t)
	var body []byte
	var mode string
	f.handlers["PUT /files"] = func(w http.ResponseWriter, r *http.Request) {
		body, _ = io.ReadAll(r.Body)
		mode = r.URL.Query().Get("mode")
		json.NewEncoder(w).Encode(api.FileWritten{Path: r.URL.Query().Get("path"), Size: int64(len(body))})
	}
	var entries []api.FileInfo
	for i := range 10 {
		entries = append(entries, api.FileInfo{Name: fmt.Sprint(i), Type: "file"})
	}
	f.handlers["GET /fs/list"] = jsonHandler(api.FileList{Entries: entries})
	s := f.session(t, Options{Limits: Limits{WriteBytes: 8, Entries: 3}})
	var w writeFileOut
	s.ok(ToolWriteFile, map[string]any{"sandbox_id": "sbx_ok", "path": "x", "content": base64.StdEncoding.EncodeToString([]byte{0, 1, 2}), "encoding": "base64", "mode": "0755"}, &w)
	if !bytes.Equal(body, []byte{0, 1, 2}) || w.Size != 3 || mode != "0755" {
		t.Errorf("write: %q mode %q %+v", body, mode, w)
	}
	calls := f.calls.Load()
	if code, _ := s.fails(ToolWriteFile, map[string]any{"sandbox_id": "sbx_ok", "path": "x", "content": "123456789"}); code != api.CodePayloadTooLarge {
		t.Errorf("large write: %s", code)
	}
	if f.calls.Load() != calls {
		t.Error("a write over the bound reached the API")
	}
	var l listFilesOut
	s.ok(ToolListFiles, map[string]any{"sandbox_id": "sbx_ok"}, &l)
	if len(l.Entries) != 3 || l.Total != 10 || !l.Truncated || l.Path != "/home/user" {
		t.Errorf("list %+v", l)
	}
}

// TestHTTPAuth: the HTTP endpoint refuses requests without a key or with
// one the API refuses (401), binds a session to its key (another key
// naming it is 403), and makes each session's calls with its own key.
func TestHTTPAuth(t *testing.T) {
	f := newFakeAPI(t)
	h, err := NewHTTPHandler(HTTPOptions{BaseURL: f.srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() { srv.Close(); h.Close() })
	url := srv.URL + HTTPPath
	initBody := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	post := func(key, session, body string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	for _, key := range []string{"", "ak_wrong"} {
		resp := post(key, "", initBody)
		var body api.ErrorBody
		json.NewDecoder(resp.Body).Decode(&body)
		if resp.StatusCode != http.StatusUnauthorized || body.Error.Code != api.CodeUnauthenticated || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("key %q: %d %+v", key, resp.StatusCode, body)
		}
	}
	// A session of goodKey; another valid key cannot use it.
	resp := post(goodKey, "", initBody)
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || sid == "" {
		t.Fatalf("initialize: %d, session %q", resp.StatusCode, sid)
	}
	if resp := post(otherKey, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); resp.StatusCode != http.StatusForbidden {
		t.Errorf("another key on the session: %d", resp.StatusCode)
	}
	// Keys are verified once, then trusted for a while.
	infos := f.infos.Load()
	a := connectHTTP(t, url, goodKey)
	b := connectHTTP(t, url, otherKey)
	if n := f.infos.Load() - infos; n > 1 {
		t.Errorf("%d key checks for two sessions of two keys (one of them known)", n)
	}
	f.handlers["DELETE "] = func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }
	a.ok(ToolKillSandbox, map[string]any{"sandbox_id": "sbx_ok"}, nil)
	if f.lastKey.Load() != goodKey {
		t.Errorf("session a called with %v", f.lastKey.Load())
	}
	// The fake answers otherKey's calls on sbx_ok as another tenant's.
	if code, _ := b.fails(ToolKillSandbox, map[string]any{"sandbox_id": "sbx_ok"}); code != api.CodeSandboxNotFound {
		t.Errorf("session b: %s", code)
	}
	if f.lastKey.Load() != otherKey {
		t.Errorf("session b called with %v", f.lastKey.Load())
	}
}

// TestBounds covers the cutting helpers on their own.
func TestBounds(t *testing.T) {
	if s, cut := clip("short", 10, "x"); s != "short" || cut {
		t.Errorf("clip short: %q", s)
	}
	s, cut := clip(strings.Repeat("é", 20), 11, "x")
	if !cut || !utf8.ValidString(s) || !strings.Contains(s, "left out") {
		t.Errorf("clip: %q", s)
	}
	ht := newHeadTail(10)
	for range 100 {
		ht.WriteString("日本")
	}
	got, cut := ht.String("stdout")
	if !cut || !utf8.ValidString(got) || !strings.HasPrefix(got, "日\n[... 594 bytes") || !strings.HasSuffix(got, "\n本") {
		t.Errorf("headTail: %q", got)
	}
	ht = newHeadTail(10)
	ht.WriteString("0123456789")
	if got, cut := ht.String("x"); got != "0123456789" || cut {
		t.Errorf("headTail exact: %q", got)
	}
	if got, cut := keptStream("abcd", 7, 8, "x"); got != "abcd"+marker(7, "x") || !cut {
		t.Errorf("keptStream short: %q", got)
	}
	if got, _ := keptStream("ab\xffd", 0, 8, "x"); got != "ab\uFFFDd" {
		t.Errorf("keptStream invalid: %q", got)
	}
	for in, want := range map[string]string{"a\xc3": "a", "a\xe6\x97": "a", "aé": "aé", "\xe6\x97\xa5": "\xe6\x97\xa5", "": ""} {
		if got := string(trimPartialRune([]byte(in))); got != want {
			t.Errorf("trimPartialRune(%q) = %q", in, got)
		}
	}
}

// TestPanicIsToolError: a tool that panics fails its call, and the
// session goes on.
func TestPanicIsToolError(t *testing.T) {
	s := connectInMemory(t, func(context.Context, *sdk.CallToolRequest) (*client.Client, error) { panic("boom") }, Options{})
	if code, _ := s.fails(ToolKillSandbox, map[string]any{"sandbox_id": "sbx_ok"}); code != api.CodeInternal {
		t.Errorf("panic: %s", code)
	}
	if code, _ := s.fails(ToolKillSandbox, map[string]any{"sandbox_id": "sbx_ok"}); code != api.CodeInternal {
		t.Errorf("after a panic: %s", code)
	}
}

// TestServeAnswersBeforeEOF: a host that writes its requests and closes
// the input (printf … | airlock mcp) still gets every answer.
func TestServeAnswersBeforeEOF(t *testing.T) {
	f := newFakeAPI(t)
	f.handlers["DELETE "] = func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(300 * time.Millisecond) // the answer comes after the EOF
		w.WriteHeader(http.StatusNoContent)
	}
	in := strings.Join([]string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"kill_sandbox","arguments":{"sandbox_id":"sbx_ok"}}}`,
	}, "\n") + "\n"
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := Serve(ctx, f.client(t, goodKey), strings.NewReader(in), &out, Options{}); err != nil {
		t.Fatal(err)
	}
	var answers []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("stdout line %q: %v", line, err)
		}
		answers = append(answers, m)
	}
	if len(answers) != 2 || answers[1]["id"] != 2.0 || answers[1]["result"] == nil {
		t.Fatalf("answers %v", answers)
	}
	if res := answers[1]["result"].(map[string]any); res["isError"] == true {
		t.Errorf("kill_sandbox: %v", res)
	}
}
