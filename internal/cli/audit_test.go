package cli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
)

// fakeAudit serves GET /v1/audit from a list that tests append to, paged
// by a cursor that is the index of the next event, like the server's.
type fakeAudit struct {
	mu      sync.Mutex
	events  []api.AuditEvent
	queries []string
}

func (f *fakeAudit) add(typ, sbx string, detail string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.events)
	f.events = append(f.events, api.AuditEvent{
		ID: fmt.Sprintf("aud_%d", n), Time: time.Date(2026, 1, 2, 3, 4, n, 0, time.UTC), Type: typ,
		SandboxID: sbx, RequestID: "req_" + strconv.Itoa(n), Detail: json.RawMessage(detail),
	})
}

func (f *fakeAudit) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/audit" || r.Header.Get("Authorization") != "Bearer ak_good" {
		http.Error(w, `{"error":{"code":"not_found","message":"no"}}`, 404)
		return
	}
	q := r.URL.Query()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queries = append(f.queries, r.URL.RawQuery)
	from, _ := strconv.Atoi(q.Get("cursor"))
	limit := 2 // small pages: the CLI must follow cursors
	var page []api.AuditEvent
	i := from
	for ; i < len(f.events) && len(page) < limit; i++ {
		if t := q.Get("type"); t != "" && !slices.Contains(strings.Split(t, ","), f.events[i].Type) {
			continue
		}
		page = append(page, f.events[i])
	}
	more := false
	for j := i; j < len(f.events); j++ {
		if t := q.Get("type"); t == "" || slices.Contains(strings.Split(t, ","), f.events[j].Type) {
			more = true
		}
	}
	if page == nil {
		page = []api.AuditEvent{}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(api.AuditList{Events: page, NextCursor: strconv.Itoa(i), HasMore: more})
}

func newFakeAudit(t *testing.T) (*fakeAudit, string) {
	f := &fakeAudit{}
	f.add(api.AuditCreate, "sbx_1", `{"template":"base"}`)
	f.add(api.AuditExec, "sbx_1", `{"exec_id":"ex_1","cmd":["python3","-c","print(1)"],"user":"user","status":"exited","exit_code":0,"duration_ms":12}`)
	f.add(api.AuditEgress, "sbx_1", `{"kind":"tls","domain":"denied.test","ip":"203.0.113.11","port":443,"allowed":false,"reason":"not_allowed"}`)
	f.add(api.AuditFileWrite, "sbx_1", `{"op":"write","path":"/home/user/a.txt","bytes":5,"ok":true}`)
	f.add(api.AuditAuthFailure, "", `{"reason":"invalid api key"}`)
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv.URL
}

func TestAuditPrintsEveryPage(t *testing.T) {
	_, url := newFakeAudit(t)
	tests := []struct {
		name  string
		args  []string
		lines []string // substrings, one per output line, in order
	}{
		{"table", []string{"audit"}, []string{
			"create         sbx_1", "exec           sbx_1                        req_1                user: python3 -c print(1) → exited 0 (12 ms)",
			"tls denied.test 203.0.113.11:443 denied (not_allowed)", "write /home/user/a.txt (5 B)", "auth_failure   -",
		}},
		{"type_filter", []string{"audit", "--type", "egress,exec"}, []string{"exec", "egress"}},
		{"limit", []string{"audit", "--limit", "3"}, []string{"create", "exec", "egress"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runCLI(t, url, tt.args...)
			if r.code != 0 {
				t.Fatalf("exit %d: %s", r.code, r.stderr)
			}
			lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
			if len(lines) != len(tt.lines) {
				t.Fatalf("%d lines, want %d:\n%s", len(lines), len(tt.lines), r.stdout)
			}
			for i, want := range tt.lines {
				if !strings.Contains(lines[i], want) {
					t.Errorf("line %d %q lacks %q", i, lines[i], want)
				}
			}
		})
	}
}

func TestAuditJSONLines(t *testing.T) {
	_, url := newFakeAudit(t)
	r := runCLI(t, url, "audit", "-o", "json", "--sandbox", "sbx_1")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var ids []string
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var e api.AuditEvent
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		ids = append(ids, e.ID)
	}
	if !slices.Equal(ids, []string{"aud_0", "aud_1", "aud_2", "aud_3", "aud_4"}) {
		t.Fatalf("ids %v", ids)
	}
}

func TestAuditFollow(t *testing.T) {
	f, url := newFakeAudit(t)
	run := &cliRun{interrupts: make(chan os.Signal, 1), out: &syncBuffer{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		run.run(t, url, "audit", "--follow", "--since", "1h", "--type", "exec")
	}()
	run.out.waitFor("python3 -c print(1)")
	f.add(api.AuditExec, "sbx_2", `{"exec_id":"ex_2","cmd":["echo","later"],"user":"root","status":"exited","exit_code":0}`)
	run.out.waitFor("echo later")
	run.interrupts <- os.Interrupt
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("follow did not end on interrupt")
	}
	if run.code != exitInterrupted || strings.Count(run.stdout, "\n") != 2 {
		t.Fatalf("exit %d, output:\n%s", run.code, run.stdout)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, q := range f.queries {
		if !strings.Contains(q, "since=") || !strings.Contains(q, "type=exec") {
			t.Errorf("query %q lost the filters", q)
		}
	}
}

func TestAuditUsageErrors(t *testing.T) {
	_, url := newFakeAudit(t)
	for _, args := range [][]string{
		{"audit", "--since", "yesterday"},
		{"audit", "--follow", "--limit", "3"},
		{"audit", "--limit", "-1"},
	} {
		if r := runCLI(t, url, args...); r.code != exitError || !strings.Contains(r.stderr, "(usage)") {
			t.Errorf("%v: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
}

func TestSandboxNetworkAndRegistryFlags(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		b, _ := json.Marshal(body)
		got = append(got, r.Method+" "+r.URL.Path+" "+string(b))
		w.Header().Set("Content-Type", "application/json")
		var n api.Network
		if nb, ok := body["network"]; ok {
			b, _ = json.Marshal(nb)
		}
		json.Unmarshal(b, &n)
		w.WriteHeader(map[string]int{"POST": 201, "PUT": 200}[r.Method])
		json.NewEncoder(w).Encode(api.Sandbox{ID: "sbx_1", State: "running", Network: n})
	}))
	defer srv.Close()
	if r := runCLI(t, srv.URL, "sandbox", "create", "--network", "allowlist", "--registry", "pypi", "--offline"); r.code != 0 || r.stdout != "sbx_1\n" {
		t.Fatalf("create: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	r := runCLI(t, srv.URL, "sandbox", "network", "sbx_1", "--network", "allowlist", "--allow", "pypi.org", "--registry", "debian")
	if r.code != 0 || r.stdout != "sbx_1 network allowlist allow=pypi.org registries=debian\n" {
		t.Fatalf("network: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, srv.URL, "sandbox", "network", "sbx_1"); r.code != exitError || !strings.Contains(r.stderr, "--network is required") {
		t.Fatalf("network without a mode: exit %d %q", r.code, r.stderr)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{
		`POST /v1/sandboxes {"network":{"mode":"allowlist","offline":true,"registries":["pypi"]}}`,
		`PUT /v1/sandboxes/sbx_1/network {"allow":["pypi.org"],"mode":"allowlist","registries":["debian"]}`,
	}
	if len(got) != 2 || !strings.HasPrefix(got[0], "POST /v1/sandboxes ") || !strings.Contains(got[0], `"network":{"mode":"allowlist","offline":true,"registries":["pypi"]}`) || got[1] != want[1] {
		t.Fatalf("requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
