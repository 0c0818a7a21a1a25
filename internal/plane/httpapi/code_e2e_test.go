package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"image/png"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/bench"
	"github.com/airlockhq/airlock/internal/plane/httpapi"
	"github.com/airlockhq/airlock/internal/service/code"
)

var _ httpapi.CodeService = (*code.Service)(nil)

// codeE2E is the real stack with the code interpreter, and one sandbox of
// the code-interpreter template.
type codeE2E struct {
	*e2e
	sb api.Sandbox
}

func newCodeE2E(t testing.TB) *codeE2E {
	t.Helper()
	// The code-interpreter template is built once per machine (a few
	// minutes: ipykernel, pandas, node…).
	e := newE2E(t, e2eTemplates("code-interpreter"))
	sb := e.h.create("acme", api.CreateSandboxRequest{Template: "code-interpreter", Resources: &api.Resources{MemoryMB: 1024}})
	return &codeE2E{e2e: e, sb: sb}
}

// code runs a cell and returns its events.
func (c *codeE2E) code(t testing.TB, req api.CodeRequest) []api.CodeEvent {
	t.Helper()
	r := c.h.req("POST", "/v1/sandboxes/"+c.sb.ID+"/code", c.h.key("acme"), req)
	c.h.expect(r, http.StatusOK, "")
	if ct := r.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Fatalf("content-type %q", ct)
	}
	var evs []api.CodeEvent
	sc := bufio.NewScanner(bytes.NewReader(r.body))
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var ev api.CodeEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %q: %v", sc.Bytes(), err)
		}
		evs = append(evs, ev)
	}
	if len(evs) == 0 || evs[len(evs)-1].Type != api.CodeEventEnd {
		t.Fatalf("cell %q: no end event: %s", req.Code, r.body)
	}
	return evs
}

func evStdout(evs []api.CodeEvent) string {
	var b strings.Builder
	for _, e := range evs {
		if e.Type == api.CodeEventStdout {
			b.WriteString(e.Text)
		}
	}
	return b.String()
}

func evOf(evs []api.CodeEvent, typ string) []api.CodeEvent {
	var out []api.CodeEvent
	for _, e := range evs {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

func mainResult(evs []api.CodeEvent) *api.CodeEvent {
	for _, e := range evOf(evs, api.CodeEventResult) {
		if e.IsMainResult {
			return &e
		}
	}
	return nil
}

func timeoutS(v float64) *float64 { return &v }

// TestE2ECodeDataAnalysis is the seed documents' case: upload a CSV, run
// pandas and matplotlib, get a PNG chart and a small JSON result back.
func TestE2ECodeDataAnalysis(t *testing.T) {
	c := newCodeE2E(t)
	h := c.h
	csv := "city,temp\nParis,14\nOslo,6\nRome,19\nCairo,27\n"
	h.expect(h.req("PUT", "/v1/sandboxes/"+c.sb.ID+"/files?path=/home/user/data.csv", h.key("acme"), csv), http.StatusCreated, "")
	evs := c.code(t, api.CodeRequest{Code: `
import pandas as pd, matplotlib.pyplot as plt
df = pd.read_csv("/home/user/data.csv")
fig, ax = plt.subplots(figsize=(4, 3), dpi=100)
df.plot.bar(x="city", y="temp", ax=ax)
from IPython.display import JSON, display
display(JSON({"mean": float(df.temp.mean()), "max_city": df.loc[df.temp.idxmax(), "city"]}))
df.describe()
`})
	if errs := evOf(evs, api.CodeEventError); len(errs) > 0 {
		t.Fatalf("errors: %+v", errs)
	}
	var pngEv, jsonEv *api.CodeEvent
	for _, e := range evOf(evs, api.CodeEventResult) {
		switch {
		case e.PNG != "":
			pngEv = &e
		case e.JSON != nil:
			jsonEv = &e
		}
	}
	if pngEv == nil || pngEv.IsMainResult {
		t.Fatalf("no figure (left open at the end of the cell) as PNG: %+v", evs)
	}
	raw, err := base64.StdEncoding.DecodeString(pngEv.PNG)
	if err != nil || !bytes.HasPrefix(raw, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("png: %v %q", err, raw[:min(8, len(raw))])
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(raw))
	if err != nil || cfg.Width < 300 || cfg.Width > 500 || cfg.Height < 200 || cfg.Height > 400 {
		t.Fatalf("png config %+v %v (want about 400x300)", cfg, err)
	}
	if jsonEv == nil {
		t.Fatalf("no JSON result: %+v", evs)
	}
	var got struct {
		Mean    float64 `json:"mean"`
		MaxCity string  `json:"max_city"`
	}
	if err := json.Unmarshal(jsonEv.JSON, &got); err != nil || got.Mean != 16.5 || got.MaxCity != "Cairo" {
		t.Fatalf("json %s: %v", jsonEv.JSON, err)
	}
	mr := mainResult(evs)
	if mr == nil || !strings.Contains(mr.HTML, "<table") || !strings.Contains(mr.Text, "mean") {
		t.Fatalf("DataFrame result: %+v", mr)
	}
	// The cell is audited, its output is not.
	// (Filtering by type=code needs audit.ValidType to know it.)
	var list api.AuditList
	r := h.req("GET", "/v1/audit?sandbox_id="+c.sb.ID, h.key("acme"), nil)
	h.expect(r, http.StatusOK, "")
	r.json(t, &list)
	var codeEv *api.AuditEvent
	for i, e := range list.Events {
		if e.Type == api.AuditCode {
			codeEv = &list.Events[i]
		}
	}
	if codeEv == nil {
		t.Fatalf("no code audit event in %+v", list.Events)
	}
	var d api.CodeAuditDetail
	json.Unmarshal(codeEv.Detail, &d)
	if !strings.Contains(d.Code, "read_csv") || d.Language != "python" || d.Status != "ok" || strings.Contains(string(codeEv.Detail), "Cairo") {
		t.Fatalf("audit detail %s", codeEv.Detail)
	}
}

func TestE2ECodePython(t *testing.T) {
	c := newCodeE2E(t)
	t.Run("state", func(t *testing.T) {
		c.code(t, api.CodeRequest{Code: "x = 41"})
		if r := mainResult(c.code(t, api.CodeRequest{Code: "x + 1"})); r == nil || r.Text != "42" {
			t.Fatalf("x+1: %+v", r)
		}
	})
	t.Run("stdout-stderr", func(t *testing.T) {
		evs := c.code(t, api.CodeRequest{Code: "import sys; print('out'); print('err', file=sys.stderr)"})
		if evStdout(evs) != "out\n" || len(evOf(evs, api.CodeEventStderr)) != 1 || evOf(evs, api.CodeEventStderr)[0].Text != "err\n" {
			t.Fatalf("streams: %+v", evs)
		}
	})
	t.Run("error", func(t *testing.T) {
		evs := c.code(t, api.CodeRequest{Code: "1/0"})
		errs := evOf(evs, api.CodeEventError)
		if len(errs) != 1 || errs[0].Name != "ZeroDivisionError" || !strings.Contains(errs[0].Traceback, "1/0") ||
			strings.Contains(errs[0].Traceback, "\x1b[") {
			t.Fatalf("error: %+v", errs)
		}
	})
	t.Run("display", func(t *testing.T) {
		evs := c.code(t, api.CodeRequest{Code: "from IPython.display import display, HTML\ndisplay(HTML('<b>hi</b>'))\ndisplay(3)"})
		rs := evOf(evs, api.CodeEventResult)
		if len(rs) != 2 || rs[0].IsMainResult || rs[0].HTML != "<b>hi</b>" || rs[1].Text != "3" {
			t.Fatalf("display: %+v", rs)
		}
	})
	t.Run("plt-show", func(t *testing.T) {
		evs := c.code(t, api.CodeRequest{Code: "import matplotlib.pyplot as plt\nplt.plot([1,2,3])\nplt.show()\nprint('after')"})
		rs := evOf(evs, api.CodeEventResult)
		if len(rs) != 1 || rs[0].PNG == "" || evStdout(evs) != "after\n" {
			t.Fatalf("plt.show: %+v", evs)
		}
	})
	t.Run("timeout-keeps-state", func(t *testing.T) {
		start := time.Now()
		evs := c.code(t, api.CodeRequest{Code: "import time\ntime.sleep(30)", TimeoutS: timeoutS(1)})
		if errs := evOf(evs, api.CodeEventError); len(errs) == 0 || errs[0].Name != "KeyboardInterrupt" {
			t.Fatalf("timeout: %+v", evs)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("timeout took %s", d)
		}
		if r := mainResult(c.code(t, api.CodeRequest{Code: "x + 1"})); r == nil || r.Text != "42" {
			t.Fatalf("after timeout: %+v", r)
		}
	})
	t.Run("kernel-death", func(t *testing.T) {
		evs := c.code(t, api.CodeRequest{Code: "import os; os._exit(1)"})
		if errs := evOf(evs, api.CodeEventError); len(errs) != 1 || errs[0].Name != api.CodeErrorKernelDied {
			t.Fatalf("death: %+v", evs)
		}
		evs = c.code(t, api.CodeRequest{Code: "'x' in globals()"})
		if r := mainResult(evs); r == nil || r.Text != "False" || len(evOf(evs, api.CodeEventStderr)) == 0 {
			t.Fatalf("after death: %+v", evs)
		}
	})
}

func TestE2ECodeContexts(t *testing.T) {
	c := newCodeE2E(t)
	h := c.h
	key := h.key("acme")
	base := "/v1/sandboxes/" + c.sb.ID
	var js, sh, py api.CodeContext
	r := h.req("POST", base+"/contexts", key, api.CodeContextRequest{Language: "javascript"})
	h.expect(r, http.StatusCreated, "")
	r.json(t, &js)
	r = h.req("POST", base+"/contexts", key, api.CodeContextRequest{Language: "bash", Cwd: "/tmp"})
	h.expect(r, http.StatusCreated, "")
	r.json(t, &sh)
	r = h.req("POST", base+"/contexts", key, api.CodeContextRequest{Cwd: "/etc"})
	h.expect(r, http.StatusCreated, "")
	r.json(t, &py)

	t.Run("javascript", func(t *testing.T) {
		c.code(t, api.CodeRequest{Code: "const a = 40; let b = 2;", ContextID: &js.ID})
		evs := c.code(t, api.CodeRequest{Code: "console.log('hi'); a + b", ContextID: &js.ID})
		if r := mainResult(evs); r == nil || r.Text != "42" || evStdout(evs) != "hi\n" {
			t.Fatalf("js: %+v", evs)
		}
	})
	t.Run("bash", func(t *testing.T) {
		c.code(t, api.CodeRequest{Code: "V=7; cd /usr", ContextID: &sh.ID})
		if got := evStdout(c.code(t, api.CodeRequest{Code: "echo $V $PWD", ContextID: &sh.ID})); got != "7 /usr\n" {
			t.Fatalf("bash: %q", got)
		}
	})
	t.Run("python-cwd", func(t *testing.T) {
		if r := mainResult(c.code(t, api.CodeRequest{Code: "import os; os.getcwd()", ContextID: &py.ID})); r == nil || r.Text != "'/etc'" {
			t.Fatalf("cwd: %+v", r)
		}
	})
	t.Run("list", func(t *testing.T) {
		var l api.CodeContextList
		h.req("GET", base+"/contexts", key, nil).json(t, &l)
		if len(l.Contexts) != 3 || l.Contexts[0].ID != js.ID || l.Contexts[1].Language != "bash" {
			t.Fatalf("list %+v", l)
		}
	})
	t.Run("restart", func(t *testing.T) {
		h.expect(h.req("POST", base+"/contexts/"+sh.ID+"/restart", key, nil), http.StatusOK, "")
		if got := evStdout(c.code(t, api.CodeRequest{Code: "echo ${V:-gone}", ContextID: &sh.ID})); got != "gone\n" {
			t.Fatalf("after restart: %q", got)
		}
	})
	t.Run("delete", func(t *testing.T) {
		h.expect(h.req("DELETE", base+"/contexts/"+js.ID, key, nil), http.StatusNoContent, "")
		h.expect(h.req("POST", base+"/code", key, api.CodeRequest{Code: "1", ContextID: &js.ID}), http.StatusNotFound, api.CodeNotFound)
	})
	t.Run("bad-input", func(t *testing.T) {
		h.expect(h.req("POST", base+"/code", key, api.CodeRequest{Code: "1", Language: "cobol"}), http.StatusBadRequest, api.CodeInvalidArgument)
		h.expect(h.req("POST", base+"/contexts", key, api.CodeContextRequest{Language: "cobol"}), http.StatusBadRequest, api.CodeInvalidArgument)
		h.expect(h.req("POST", base+"/code", key, api.CodeRequest{Code: strings.Repeat("x", 2<<20)}), http.StatusRequestEntityTooLarge, api.CodePayloadTooLarge)
		h.expect(h.req("POST", base+"/code", h.key("other"), api.CodeRequest{Code: "1"}), http.StatusNotFound, api.CodeSandboxNotFound)
		h.expect(h.req("DELETE", base+"/contexts/ctx_nope", key, nil), http.StatusNotFound, api.CodeNotFound)
	})
	t.Run("kernel-cannot-start", func(t *testing.T) {
		// Permanent failures are 4xx saying what to change, never a
		// retryable 503.
		permanent := func(r resp, code, want string) {
			t.Helper()
			h.expect(r, http.StatusBadRequest, code)
			if msg := r.apiErr(t).Message; !strings.Contains(msg, want) {
				t.Errorf("message %q lacks %q", msg, want)
			}
			if ra := r.Header.Get("Retry-After"); ra != "" {
				t.Errorf("a permanent failure says Retry-After %q", ra)
			}
		}
		permanent(h.req("POST", base+"/contexts", key, api.CodeContextRequest{Language: "bash", Cwd: "/no/such/dir"}),
			api.CodeInvalidArgument, "/no/such/dir")
		// The base template has no Jupyter (it has node since revision
		// 3): python there is refused, saying why.
		plain := h.create("acme", api.CreateSandboxRequest{})
		permanent(h.req("POST", "/v1/sandboxes/"+plain.ID+"/code", key, api.CodeRequest{Code: "1", Language: "python"}),
			api.CodeTemplateUnsupported, "jupyter_client")
		var l api.CodeContextList
		h.req("GET", base+"/contexts", key, nil).json(t, &l)
		if len(l.Contexts) != 2 {
			t.Errorf("a context that could not start was kept: %+v", l)
		}
	})
}

// BenchmarkE2ECodeCell measures a trivial cell in a warm context through the
// HTTP API and the SDK, as `make bench` does (target: p50 < 20 ms).
func BenchmarkE2ECodeCell(b *testing.B) {
	c := newCodeE2E(b)
	cl, err := client.New(c.h.url, c.h.key("acme"))
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	s, err := bench.MeasureCode(context.Background(), cl, "code-interpreter", max(b.N, 20))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(s.Percentile(50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(s.Percentile(99).Microseconds())/1000, "p99-ms")
}

func TestE2ECodeSecretsAndLeftovers(t *testing.T) {
	c := newCodeE2E(t)
	h := c.h
	const secret = "tok-very-secret-4711"
	sb := h.create("acme", api.CreateSandboxRequest{Template: "code-interpreter", Secrets: map[string]string{"API_TOKEN": secret}})
	other := &codeE2E{e2e: c.e2e, sb: sb}
	t.Run("secrets-masked", func(t *testing.T) {
		evs := other.code(t, api.CodeRequest{Code: "import os\nt = os.environ['API_TOKEN']\nprint(t)\nt", Language: "python"})
		out := evStdout(evs)
		if out == "" || strings.Contains(out, secret) {
			t.Fatalf("stdout %q", out)
		}
		if r := mainResult(evs); r == nil || strings.Contains(r.Text, secret) {
			t.Fatalf("result %+v", r)
		}
		evs = other.code(t, api.CodeRequest{Code: "echo tok-very-secret-4711", Language: "bash"})
		if out := evStdout(evs); strings.Contains(out, secret) {
			t.Fatalf("bash stdout %q", out)
		}
		var list api.AuditList
		r := h.req("GET", "/v1/audit?sandbox_id="+sb.ID, h.key("acme"), nil)
		h.expect(r, http.StatusOK, "")
		r.json(t, &list)
		n := 0
		for _, e := range list.Events {
			if e.Type == api.AuditCode {
				n++
				if strings.Contains(string(e.Detail), secret) {
					t.Fatalf("secret in audit: %s", e.Detail)
				}
			}
		}
		if n != 2 {
			t.Fatalf("%d code audit events, want 2", n)
		}
	})
	t.Run("leftovers-of-an-earlier-daemon", func(t *testing.T) {
		// Contexts live in the daemon's memory: after a restart, the code
		// service kills the kernels the last daemon left before it starts
		// its own.
		pid := mainResult(c.code(t, api.CodeRequest{Code: "import os\nos.getpid()"}))
		if pid == nil || pid.Text == "" {
			t.Fatalf("kernel pid: %+v", pid)
		}
		alive := func() string {
			res := h.exec("acme", c.sb.ID, api.ExecRequest{Shell: sh("kill -0 " + pid.Text + " 2>/dev/null && echo alive || echo gone")})
			return strings.TrimSpace(strp(res.Stdout))
		}
		if got := alive(); got != "alive" {
			t.Fatalf("the kernel before the restart: %s", got)
		}
		c.stop()
		c.start()
		if r := mainResult(c.code(t, api.CodeRequest{Code: "2+2"})); r == nil || r.Text != "4" {
			t.Fatalf("first cell after the restart: %+v", r)
		}
		// Killed before the new kernel started; reaped by the agent a
		// moment later.
		eventually(t, "the last daemon's kernel to be gone", func() bool { return alive() == "gone" })
	})
}
