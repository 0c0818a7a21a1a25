package mcp

// Against the real daemon (internal/testutil/daemontest): root, runc and
// the shared template cache; skipped with -short.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/testutil/daemontest"
)

// TestToolsOnDaemon drives every tool through the official Go MCP client
// against a real daemon: a code-interpreter sandbox with the tenant's
// defaults, files written, listed and read back (text, binary, an image),
// commands with exit codes, cut output, a timeout and a refused cwd, cells
// with a matplotlib chart (image content), a DataFrame (HTML), state kept
// between cells, an exception (tool error), and the kill.
func TestToolsOnDaemon(t *testing.T) {
	e := daemontest.Start(t, daemontest.Options{
		Templates: []string{"code-interpreter"},
		Configure: func(c *config.Config) {
			c.DefaultTimeoutS = 900
			c.DefaultResources.MemoryMB = 768
		},
	})
	s := connectInMemory(t, staticClient(e.Client(e.Key(t, "mcp-a"))), Options{Limits: Limits{StreamBytes: 4096}})

	var sb sandboxOut
	s.ok(ToolCreateSandbox, map[string]any{"template": "code-interpreter", "metadata": map[string]any{"by": "mcp-test"}}, &sb)
	if !strings.HasPrefix(sb.SandboxID, "sbx_") || sb.Template != "code-interpreter" || sb.State != api.StateRunning {
		t.Fatalf("created %+v", sb)
	}
	// The tenant's defaults applied: the server's memory and TTL.
	exp, err := time.Parse(time.RFC3339, sb.ExpiresAt)
	if d := time.Until(exp); err != nil || d < 800*time.Second || d > 900*time.Second || sb.Resources.MemoryMB != 768 {
		t.Errorf("defaults: expires in %v (%v), resources %+v", d, err, sb.Resources)
	}
	id := sb.SandboxID

	// Files: relative paths are the user's home.
	var w writeFileOut
	s.ok(ToolWriteFile, map[string]any{"sandbox_id": id, "path": "work/hello.py", "content": "print('hi from a file')\n"}, &w)
	if w.Path != "/home/user/work/hello.py" || w.Size != 24 {
		t.Errorf("write %+v", w)
	}
	bin := []byte{0, 1, 2, 0xff, 0xfe}
	s.ok(ToolWriteFile, map[string]any{"sandbox_id": id, "path": "/home/user/work/b.bin", "content": base64.StdEncoding.EncodeToString(bin), "encoding": "base64", "mode": "0600"}, nil)
	var l listFilesOut
	s.ok(ToolListFiles, map[string]any{"sandbox_id": id, "path": "work"}, &l)
	names := map[string]fileOut{}
	for _, e := range l.Entries {
		names[e.Name] = e
	}
	if names["hello.py"].Size != 24 || names["b.bin"].Mode != "0600" || names["b.bin"].Type != "file" || l.Total != 2 {
		t.Errorf("list %+v", l)
	}
	var r readFileOut
	s.ok(ToolReadFile, map[string]any{"sandbox_id": id, "path": "work/hello.py"}, &r)
	if r.Content != "print('hi from a file')\n" || r.Encoding != "utf-8" || r.Truncated {
		t.Errorf("read %+v", r)
	}
	r = readFileOut{}
	s.ok(ToolReadFile, map[string]any{"sandbox_id": id, "path": "work/b.bin"}, &r)
	if got, _ := base64.StdEncoding.DecodeString(r.Content); r.Encoding != "base64" || !bytes.Equal(got, bin) {
		t.Errorf("read binary %+v", r)
	}
	if code, _ := s.fails(ToolReadFile, map[string]any{"sandbox_id": id, "path": "work/nothing"}); code != api.CodeNotFound {
		t.Errorf("missing file: %s", code)
	}

	// Commands.
	var c runCommandOut
	s.ok(ToolRunCommand, map[string]any{"sandbox_id": id, "command": "python3 work/hello.py; echo oops >&2; exit 3"}, &c)
	if c.ExitCode == nil || *c.ExitCode != 3 || c.Status != "exited" || c.Stdout != "hi from a file\n" || c.Stderr != "oops\n" || c.Truncated {
		t.Errorf("command %+v", c)
	}
	c = runCommandOut{}
	s.ok(ToolRunCommand, map[string]any{"sandbox_id": id, "command": "head -c 100000 /dev/zero | tr '\\0' x; echo; echo END"}, &c)
	if !c.Truncated || !strings.HasPrefix(c.Stdout, "xxxx") || !strings.HasSuffix(c.Stdout, "x\nEND\n") ||
		!strings.Contains(c.Stdout, "bytes of stdout left out") || len(c.Stdout) > 4096+100 || c.Note == "" {
		t.Errorf("flood: truncated %v note %q, %d bytes: %.80q…%q", c.Truncated, c.Note, len(c.Stdout), c.Stdout, c.Stdout[max(0, len(c.Stdout)-80):])
	}
	c = runCommandOut{}
	s.ok(ToolRunCommand, map[string]any{"sandbox_id": id, "command": "echo start; sleep 30", "timeout_s": 1}, &c)
	if c.Status != "timeout" || c.Stdout != "start\n" {
		t.Errorf("timeout %+v", c)
	}
	if code, msg := s.fails(ToolRunCommand, map[string]any{"sandbox_id": id, "command": "pwd", "cwd": "/no/such/dir"}); code != api.CodeInvalidArgument {
		t.Errorf("bad cwd: %s: %s", code, msg)
	}

	// Code: a chart comes as image content with its data.
	var out runCodeOut
	res := s.ok(ToolRunCode, map[string]any{"sandbox_id": id, "code": "import matplotlib.pyplot as plt\n" +
		"plt.plot([1, 2, 3], [1, 4, 9], label='squares')\nplt.title('Squares')\nplt.savefig('chart.png')\nplt.show()\nprint('plotted')"}, &out)
	imgs := images(res)
	if len(imgs) != 1 || imgs[0].MIMEType != "image/png" || !bytes.HasPrefix(imgs[0].Data, []byte("\x89PNG")) {
		t.Fatalf("chart: %d images; %s", len(imgs), text(res))
	}
	var chart struct{ Type, Title string }
	if len(out.Results) != 1 || out.Results[0].Image == "" || out.Stdout != "plotted\n" {
		t.Fatalf("chart result %+v", out)
	}
	remarshal(t, out.Results[0].Chart, &chart)
	if chart.Type != "line" || chart.Title != "Squares" {
		t.Errorf("chart data %+v", chart)
	}
	// The saved figure reads back as an image.
	r = readFileOut{}
	res = s.ok(ToolReadFile, map[string]any{"sandbox_id": id, "path": "chart.png"}, &r)
	if imgs := images(res); len(imgs) != 1 || r.Encoding != "image" || r.MIMEType != "image/png" {
		t.Errorf("chart.png: %+v", r)
	}
	// A DataFrame: text and HTML; state persists between cells.
	out = runCodeOut{}
	s.ok(ToolRunCode, map[string]any{"sandbox_id": id, "code": "import pandas as pd\nx = 41\npd.DataFrame({'a': [1, 2]})"}, &out)
	if len(out.Results) != 1 || !out.Results[0].IsMainResult || !strings.Contains(out.Results[0].HTML, "<table") || out.Results[0].Text == "" {
		t.Errorf("dataframe %+v", out.Results)
	}
	out = runCodeOut{}
	s.ok(ToolRunCode, map[string]any{"sandbox_id": id, "code": "x + 1"}, &out)
	if len(out.Results) != 1 || out.Results[0].Text != "42" {
		t.Errorf("state: %+v", out.Results)
	}
	out = runCodeOut{}
	s.ok(ToolRunCode, map[string]any{"sandbox_id": id, "language": "javascript", "code": "[1, 2, 3].map(v => v * 2)"}, &out)
	if len(out.Results) != 1 || !strings.Contains(out.Results[0].Text, "2") || !strings.Contains(out.Results[0].Text, "6") {
		t.Errorf("javascript: %+v", out.Results)
	}
	// An exception is a tool error with the traceback.
	res = s.call(ToolRunCode, map[string]any{"sandbox_id": id, "code": "print('before')\n1 / 0"})
	out = runCodeOut{}
	remarshal(t, res.StructuredContent, &out)
	if !res.IsError || out.Error == nil || out.Error.Name != "ZeroDivisionError" || !strings.Contains(out.Error.Traceback, "1 / 0") || out.Stdout != "before\n" {
		t.Errorf("exception: error %v %+v", res.IsError, out)
	}

	// Kill: the sandbox is gone, killing again succeeds.
	var k killSandboxOut
	s.ok(ToolKillSandbox, map[string]any{"sandbox_id": id}, &k)
	if !k.Killed || k.SandboxID != id {
		t.Errorf("kill %+v", k)
	}
	// The API keeps a killed sandbox's record: it is stopped.
	if code, msg := s.fails(ToolRunCommand, map[string]any{"sandbox_id": id, "command": "true"}); code != api.CodeInvalidState {
		t.Errorf("after kill: %s: %s", code, msg)
	} else {
		t.Logf("a command after the kill: %s: %s", code, msg)
	}
	s.ok(ToolKillSandbox, map[string]any{"sandbox_id": id}, nil)
	if code, _ := s.fails(ToolCreateSandbox, map[string]any{"template": "no-such-template"}); code != api.CodeTemplateNotFound {
		t.Errorf("unknown template: %s", code)
	}
}

// TestKeyScopingOnDaemon: over streamable HTTP, each session acts with
// its own key: tenant B's session cannot see, use or kill tenant A's
// sandbox (the same error as a sandbox that never existed), B's quota
// applies to B, and requests without a key the daemon accepts are 401.
func TestKeyScopingOnDaemon(t *testing.T) {
	e := daemontest.Start(t, daemontest.Options{})
	h, err := NewHTTPHandler(HTTPOptions{BaseURL: e.URL(), HTTPClient: &http.Client{Transport: e.Transport()}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() { srv.Close(); h.Close() })
	url := srv.URL + HTTPPath
	keyA, keyB := e.Key(t, "mcp-a"), e.Key(t, "mcp-b")
	a, b := connectHTTP(t, url, keyA), connectHTTP(t, url, keyB)

	var sb sandboxOut
	a.ok(ToolCreateSandbox, map[string]any{}, &sb)
	idA := sb.SandboxID
	const missing = "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa"
	for _, tool := range []string{ToolRunCommand, ToolRunCode, ToolReadFile, ToolWriteFile, ToolListFiles, ToolKillSandbox} {
		args := func(id string) map[string]any {
			m := map[string]any{"sandbox_id": id}
			switch tool {
			case ToolRunCommand:
				m["command"] = "touch /tmp/b-was-here"
			case ToolRunCode:
				m["code"] = "1"
			case ToolReadFile:
				m["path"] = "/etc/hostname"
			case ToolWriteFile:
				m["path"], m["content"] = "/tmp/b-was-here", "x"
			}
			return m
		}
		code, msg := b.fails(tool, args(idA))
		code2, msg2 := b.fails(tool, args(missing))
		if code != api.CodeSandboxNotFound || code2 != code || strings.ReplaceAll(msg, idA, "ID") != strings.ReplaceAll(msg2, missing, "ID") {
			t.Errorf("%s by tenant B on A's sandbox: %s: %s; on a missing one: %s: %s", tool, code, msg, code2, msg2)
		}
	}
	// A's sandbox is untouched.
	var c runCommandOut
	a.ok(ToolRunCommand, map[string]any{"sandbox_id": idA, "command": "test ! -e /tmp/b-was-here && echo alive"}, &c)
	if c.Stdout != "alive\n" {
		t.Errorf("A's sandbox after B: %+v", c)
	}

	// B's quota is B's: one sandbox, then quota_exceeded.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.Admin().SetTenantQuotas(ctx, "mcp-b", api.QuotaOverride{Sandboxes: ptr(1)}); err != nil {
		t.Fatal(err)
	}
	b.ok(ToolCreateSandbox, map[string]any{}, nil)
	if code, _ := b.fails(ToolCreateSandbox, map[string]any{}); code != api.CodeQuotaExceeded {
		t.Errorf("B over its quota: %s", code)
	}
	a.ok(ToolRunCommand, map[string]any{"sandbox_id": idA, "command": "true"}, nil)

	// No key, or one the daemon refuses: 401 before any MCP.
	for _, key := range []string{"", "ak_not_a_key"} {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body api.ErrorBody
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || body.Error.Code != api.CodeUnauthenticated {
			t.Errorf("key %q: %d %+v", key, resp.StatusCode, body)
		}
	}
}
