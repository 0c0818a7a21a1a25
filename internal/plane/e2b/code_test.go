package e2b_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/plane/e2b"
	"github.com/airlockhq/airlock/internal/service/sandbox"
)

// fakeCode is a code service that records who called it and answers with
// fixed events.
type fakeCode struct {
	mu    sync.Mutex
	calls []string // "tenant sandbox code", or "op tenant sandbox" for contexts
	envs  []map[string]string
}

func (f *fakeCode) called(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, s)
}

// seen returns the calls so far.
func (f *fakeCode) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fakeCode) Run(ctx context.Context, p auth.Principal, id string, req api.CodeRequest, emit func(api.CodeEvent) error) error {
	f.called(p.Tenant + " " + id + " " + req.Code)
	f.mu.Lock()
	f.envs = append(f.envs, req.Env)
	f.mu.Unlock()
	if req.Code == "bad" {
		return &sandbox.PublicError{Msg: "bad cell", Err: errdefs.ErrInvalidArgument}
	}
	for _, ev := range []api.CodeEvent{
		{Type: api.CodeEventStdout, Text: "hi\n"},
		{Type: api.CodeEventResult, IsMainResult: true, Text: "2", PNG: "iVBORw0KGgo=",
			Chart: json.RawMessage(`{"type":"line","title":"t","elements":[]}`), Data: json.RawMessage(`{"a":[1,2]}`)},
		{Type: api.CodeEventEnd, ExecutionCount: 4},
	} {
		if err := emit(ev); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeCode) CreateContext(ctx context.Context, p auth.Principal, id string, req api.CodeContextRequest) (api.CodeContext, error) {
	f.called("create " + p.Tenant + " " + id)
	return api.CodeContext{ID: "ctx1", Language: "python", Cwd: "/home/user", CreatedAt: time.Now()}, nil
}

func (f *fakeCode) ListContexts(ctx context.Context, p auth.Principal, id string) ([]api.CodeContext, error) {
	f.called("list " + p.Tenant + " " + id)
	return []api.CodeContext{{ID: "ctx1", Language: "python", Cwd: "/home/user"}}, nil
}

func (f *fakeCode) DeleteContext(ctx context.Context, p auth.Principal, id, cid string) error {
	f.called("delete " + p.Tenant + " " + id)
	return nil
}

func (f *fakeCode) RestartContext(ctx context.Context, p auth.Principal, id, cid string) (api.CodeContext, error) {
	f.called("restart " + p.Tenant + " " + id)
	return api.CodeContext{ID: cid}, nil
}

func TestCodePlane(t *testing.T) {
	fc := &fakeCode{}
	h := newHarness(t, withCode(fc))
	c := h.create("acme")
	doHdr := func(method, path, body string, hdr map[string]string) (*http.Response, string) {
		req, _ := http.NewRequest(method, h.url+path, strings.NewReader(body))
		req.Header.Set(e2b.HeaderSandboxID, c.SandboxID)
		req.Header.Set(e2b.HeaderSandboxPort, "49999")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var sb strings.Builder
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			sb.WriteString(sc.Text() + "\n")
		}
		return resp, sb.String()
	}
	do := func(method, path, body, token string) (*http.Response, string) {
		hdr := map[string]string{}
		if token != "" {
			hdr[e2b.HeaderAccessToken] = token
		}
		return doHdr(method, path, body, hdr)
	}
	t.Run("ExecuteNDJSON", func(t *testing.T) {
		resp, body := do("POST", "/execute", `{"code":"x+1"}`, c.EnvdAccessToken)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d %s", resp.StatusCode, body)
		}
		var types []string
		for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("line %q: %v", line, err)
			}
			types = append(types, m["type"].(string))
			if m["type"] == "result" && (m["text"] != "2" || m["png"] != "iVBORw0KGgo=" || m["is_main_result"] != true) {
				t.Fatalf("result line %v", m)
			}
			if ch, _ := m["chart"].(map[string]any); m["type"] == "result" && (ch == nil || ch["type"] != "line" || ch["title"] != "t") {
				t.Fatalf("result line's chart %v", m["chart"])
			}
			if d, _ := m["data"].(map[string]any); m["type"] == "result" && (d == nil || len(d["a"].([]any)) != 2) {
				t.Fatalf("result line's data %v", m["data"])
			}
			if m["type"] == "number_of_executions" && m["execution_count"] != float64(4) {
				t.Fatalf("count line %v", m)
			}
		}
		if strings.Join(types, ",") != "stdout,result,number_of_executions,end_of_execution" {
			t.Fatalf("line types %v", types)
		}
		if got := fc.seen()[len(fc.seen())-1]; got != "acme "+c.SandboxID+" x+1" {
			t.Fatalf("the cell ran as %q", got)
		}
	})
	t.Run("ExecuteEnvVars", func(t *testing.T) {
		resp, body := do("POST", "/execute", `{"code":"import os","env_vars":{"A":"1","B":"two words"}}`, c.EnvdAccessToken)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d %s", resp.StatusCode, body)
		}
		got := fc.envs[len(fc.envs)-1]
		if len(got) != 2 || got["A"] != "1" || got["B"] != "two words" {
			t.Fatalf("the cell got env %v", got)
		}
		if _, body := do("POST", "/execute", `{"code":"1"}`, c.EnvdAccessToken); fc.envs[len(fc.envs)-1] != nil {
			t.Fatalf("a cell without env_vars got %v (%s)", fc.envs[len(fc.envs)-1], body)
		}
	})
	t.Run("ExecuteEnvVarsNotStrings", func(t *testing.T) {
		n := len(fc.seen())
		resp, body := do("POST", "/execute", `{"code":"1","env_vars":{"A":1}}`, c.EnvdAccessToken)
		if resp.StatusCode != http.StatusBadRequest || len(fc.seen()) != n {
			t.Fatalf("status %d %s; calls %d → %d", resp.StatusCode, body, n, len(fc.seen()))
		}
	})
	t.Run("ExecuteNeedsToken", func(t *testing.T) {
		if resp, _ := do("POST", "/execute", `{"code":"x"}`, ""); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("status %d, want 401", resp.StatusCode)
		}
	})
	t.Run("ExecuteError", func(t *testing.T) {
		resp, body := do("POST", "/execute", `{"code":"bad"}`, c.EnvdAccessToken)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "bad cell") {
			t.Fatalf("status %d %s", resp.StatusCode, body)
		}
	})
	t.Run("ContextsWithTrafficToken", func(t *testing.T) {
		// @e2b/code-interpreter 2.8.0 sends only the traffic token (the
		// sandbox's trafficAccessToken) on these.
		sdk := map[string]string{"Content-Type": "application/json", e2b.HeaderTrafficToken: c.TrafficAccessToken}
		resp, body := doHdr("POST", "/contexts", `{"language":"python"}`, sdk)
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"id":"ctx1"`) {
			t.Fatalf("create: %d %s", resp.StatusCode, body)
		}
		resp, body = doHdr("GET", "/contexts", "", sdk)
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(body, `[{"id":"ctx1"`) {
			t.Fatalf("list: %d %s", resp.StatusCode, body)
		}
		if resp, _ := doHdr("POST", "/contexts/ctx1/restart", "", sdk); resp.StatusCode != http.StatusNoContent {
			t.Fatalf("restart: %d", resp.StatusCode)
		}
		if resp, _ := doHdr("DELETE", "/contexts/ctx1", "", sdk); resp.StatusCode != http.StatusNoContent {
			t.Fatalf("delete: %d", resp.StatusCode)
		}
	})
	t.Run("ContextsNeedAToken", func(t *testing.T) {
		n := len(fc.seen())
		for _, rt := range [][2]string{{"POST", "/contexts"}, {"GET", "/contexts"}, {"POST", "/contexts/ctx1/restart"}, {"DELETE", "/contexts/ctx1"}} {
			if resp, body := do(rt[0], rt[1], "", ""); resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("%s %s without a token: %d %s", rt[0], rt[1], resp.StatusCode, body)
			}
		}
		if got := fc.seen(); len(got) != n {
			t.Fatalf("the code service was called: %v", got[n:])
		}
	})
}

func TestCodePlaneWithoutService(t *testing.T) {
	h := newHarness(t)
	c := h.create("acme")
	req, _ := http.NewRequest("POST", h.url+"/execute", strings.NewReader(`{"code":"1"}`))
	req.Header.Set(e2b.HeaderSandboxID, c.SandboxID)
	req.Header.Set(e2b.HeaderSandboxPort, "49999")
	req.Header.Set(e2b.HeaderAccessToken, c.EnvdAccessToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotImplemented {
		t.Fatalf("status %d, want 501", resp.StatusCode)
	}
}
