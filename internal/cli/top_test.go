package cli

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
)

// fakeTop serves the two routes `airlock top` reads: the sandbox list and
// each sandbox's metrics series.
func fakeTop(t *testing.T, sandboxes []api.Sandbox, metrics map[string]api.SandboxMetrics) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		fwriteJSON(w, 200, api.SandboxList{Sandboxes: sandboxes})
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/metrics", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer ak_good" {
			fwriteJSON(w, 401, api.ErrorBody{Error: api.ErrorDetail{Code: api.CodeUnauthenticated, Message: "bad key"}})
			return
		}
		if _, err := time.Parse(time.RFC3339Nano, r.URL.Query().Get("since")); err != nil {
			t.Errorf("top asked for metrics without a valid since: %q", r.URL.RawQuery)
		}
		mt, ok := metrics[r.PathValue("id")]
		if !ok {
			fwriteJSON(w, 404, api.ErrorBody{Error: api.ErrorDetail{Code: api.CodeSandboxNotFound, Message: "gone"}})
			return
		}
		fwriteJSON(w, 200, mt)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestTopOnce: one frame, busiest first, with CPU from the last two
// samples, memory, PIDs and age; stopped sandboxes and ones that vanish
// between the list and their metrics are left out.
func TestTopOnce(t *testing.T) {
	now := time.Now()
	sbx := func(id, state string, age time.Duration) api.Sandbox {
		return api.Sandbox{ID: id, Tenant: "t1", Template: "base", State: state, CreatedAt: now.Add(-age)}
	}
	series := func(cpu0, cpu1 float64) []api.MetricsSample {
		return []api.MetricsSample{
			{Time: now.Add(-15 * time.Second), CPUSeconds: 0},
			{Time: now.Add(-10 * time.Second), CPUSeconds: cpu0},
			{Time: now.Add(-5 * time.Second), CPUSeconds: cpu1},
		}
	}
	url := fakeTop(t, []api.Sandbox{
		sbx("sb_idle", api.StateRunning, 90*time.Minute),
		sbx("sb_busy", api.StateRunning, 2*time.Minute),
		sbx("sb_paused", api.StatePaused, time.Hour),
		sbx("sb_stopped", api.StateStopped, time.Hour),
		sbx("sb_gone", api.StateRunning, time.Hour),
	}, map[string]api.SandboxMetrics{
		// 2.5 cpu-seconds in 5 s: 50% of a core.
		"sb_busy":    {Metrics: api.Metrics{MemoryBytes: 256 << 20, PIDs: 12}, Series: series(1, 3.5)},
		"sb_idle":    {Metrics: api.Metrics{MemoryBytes: 3 << 20, PIDs: 2}, Series: series(1, 1.05)},
		"sb_paused":  {Metrics: api.Metrics{MemoryBytes: 1 << 20, PIDs: 1}, Series: series(0, 0)[:1]},
		"sb_stopped": {Metrics: api.Metrics{MemoryBytes: 1 << 20, PIDs: 1}},
	})
	r := runCLI(t, url, "top", "--once")
	if r.code != 0 {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "3 sandboxes") {
		t.Errorf("header: %q", r.stdout)
	}
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	var rows []string
	for _, l := range lines {
		if strings.HasPrefix(l, "sb_") {
			rows = append(rows, strings.Join(strings.Fields(l), " "))
		}
	}
	want := []*regexp.Regexp{
		regexp.MustCompile(`^sb_busy t1 base running 50\.0 256(\.0)? ?MiB 12 2m0s$`),
		regexp.MustCompile(`^sb_idle t1 base running 1\.0 3(\.0)? ?MiB 2 1h30m0s$`),
		regexp.MustCompile(`^sb_paused t1 base paused - 1(\.0)? ?MiB 1 1h0m0s$`),
	}
	if len(rows) != len(want) {
		t.Fatalf("rows %q, want %d", rows, len(want))
	}
	for i, re := range want {
		if !re.MatchString(rows[i]) {
			t.Errorf("row %d %q, want %v", i, rows[i], re)
		}
	}
	if strings.Contains(r.stdout, "\x1b[") {
		t.Errorf("--once wrote terminal escapes: %q", r.stdout)
	}
}

// TestTopJSON: -o json prints the rows as one JSON array (and, as --once,
// one frame), cpu_percent null while unknown.
func TestTopJSON(t *testing.T) {
	now := time.Now()
	url := fakeTop(t, []api.Sandbox{
		{ID: "sb_a", Tenant: "t1", Template: "base", State: api.StateRunning, CreatedAt: now.Add(-time.Minute)},
		{ID: "sb_b", Tenant: "t2", Template: "python", State: api.StateRunning, CreatedAt: now},
	}, map[string]api.SandboxMetrics{
		"sb_a": {Metrics: api.Metrics{MemoryBytes: 1 << 20, PIDs: 3}, Series: []api.MetricsSample{
			{Time: now.Add(-10 * time.Second), CPUSeconds: 1}, {Time: now.Add(-5 * time.Second), CPUSeconds: 3.5}}},
		"sb_b": {Metrics: api.Metrics{MemoryBytes: 2 << 20, PIDs: 1}},
	})
	for _, args := range [][]string{{"top", "--once", "-o", "json"}, {"top", "-o", "json"}} {
		r := runCLI(t, url, args...)
		if r.code != 0 {
			t.Fatalf("%v: exit %d: %s", args, r.code, r.stderr)
		}
		var rows []map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
			t.Fatalf("%v: stdout is not a JSON array: %v\n%s", args, err, r.stdout)
		}
		if len(rows) != 2 || rows[0]["id"] != "sb_a" || rows[0]["cpu_percent"] != 50.0 || rows[0]["memory_bytes"] != float64(1<<20) ||
			rows[0]["pids"] != 3.0 || rows[1]["id"] != "sb_b" || rows[1]["cpu_percent"] != nil || rows[1]["tenant"] != "t2" {
			t.Errorf("%v: rows %v", args, rows)
		}
	}
}
