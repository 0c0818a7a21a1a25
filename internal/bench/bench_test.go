package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testutil"
)

func TestMain(m *testing.M) {
	if fakeCLI() {
		return
	}
	goleak.VerifyTestMain(m)
}

func TestPercentile(t *testing.T) {
	ms := func(ns ...int) Samples {
		var s Samples
		for _, n := range ns {
			s = append(s, time.Duration(n)*time.Millisecond)
		}
		return s
	}
	tests := []struct {
		name string
		s    Samples
		q    float64
		want time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one", ms(7), 99, 7 * time.Millisecond},
		{"median of odd", ms(5, 1, 3), 50, 3 * time.Millisecond},
		{"median of even takes the lower", ms(4, 1, 3, 2), 50, 2 * time.Millisecond},
		{"p99 of 100 is the 99th", ms(seq(100)...), 99, 99 * time.Millisecond},
		{"p99 of 10 is the max", ms(seq(10)...), 99, 10 * time.Millisecond},
		{"p100", ms(3, 9, 1), 100, 9 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			orig := append(Samples(nil), tt.s...)
			if got := tt.s.Percentile(tt.q); got != tt.want {
				t.Errorf("Percentile(%v) = %v, want %v", tt.q, got, tt.want)
			}
			for i := range orig {
				if orig[i] != tt.s[i] {
					t.Fatal("Percentile reordered its receiver")
				}
			}
		})
	}
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = n - i // descending: sorting matters
	}
	return out
}

func flat(d time.Duration, n int) Samples {
	s := make(Samples, n)
	for i := range s {
		s[i] = d
	}
	return s
}

func TestRowsJudgeTargets(t *testing.T) {
	ms := time.Millisecond
	good := &Report{
		Create: flat(50*ms, 10), BareRunc: flat(30*ms, 10),
		Exec: flat(2*ms, 100), ForkExec: flat(1*ms, 100),
		Upload: flat(200*ms, 3), Download: flat(300*ms, 3), LocalCp: flat(100*ms, 3),
		FileBytes: 100 << 20,
	}
	rows := good.Rows()
	want := []struct {
		ratio float64
		ok    bool
	}{{50.0 / 30, true}, {2, true}, {1, true}, {0.5, true}, {1.0 / 3, false}}
	if len(rows) != len(want)+1 {
		t.Fatalf("%d rows", len(rows))
	}
	if idle := rows[len(want)]; idle.OK != nil || idle.Airlock != "n/a" {
		t.Errorf("idle row judged without a measurement: %+v", idle)
	}
	for i, w := range want {
		if math.Abs(rows[i].Ratio-w.ratio) > 1e-9 || rows[i].OK == nil || *rows[i].OK != w.ok {
			t.Errorf("row %d (%s): ratio %v ok %v, want %v %v", i, rows[i].Metric, rows[i].Ratio, deref(rows[i].OK), w.ratio, w.ok)
		}
	}
	if good.AllMet() {
		t.Error("AllMet with a download at 1/3 of cp")
	}

	// A long tail fails p99 ≤ 3× p50.
	tail := &Report{Exec: append(flat(time.Millisecond, 98), 10*time.Millisecond, 10*time.Millisecond), ForkExec: flat(time.Millisecond, 5)}
	if r := tail.Rows()[2]; r.OK == nil || *r.OK || r.Ratio != 10 {
		t.Errorf("tail row = %+v", r)
	}

	// Without baselines nothing is judged, and the table says n/a.
	bare := &Report{Create: flat(ms, 3), Exec: flat(ms, 3), Upload: flat(ms, 1), Download: flat(ms, 1), FileBytes: 1 << 20,
		Notes: []string{"bare runc baseline skipped: no --rootfs given"}}
	for i, r := range bare.Rows() {
		if i != 2 && (r.OK != nil || !math.IsNaN(r.Ratio)) {
			t.Errorf("row %s judged without a baseline: %+v", r.Metric, r)
		}
	}
	md := bare.Markdown()
	for _, s := range []string{"| metric | airlock | baseline | ratio | target | met |", "| n/a |", "- bare runc baseline skipped"} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q:\n%s", s, md)
		}
	}
	if !bare.AllMet() {
		t.Error("unjudged rows must not fail AllMet")
	}
}

func TestIdleRow(t *testing.T) {
	tests := []struct {
		name     string
		rss, pss int64
		ok       bool
	}{
		{"under", 5 << 20, 3 << 20, true},
		{"at", 8 << 20, 4 << 20, true},
		{"over", 8<<20 + 1, 4 << 20, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Report{Idle: &IdleMemory{Sandboxes: 10, Procs: 10, RSSBytes: tt.rss, PSSBytes: tt.pss}}
			rows := r.Rows()
			row := rows[len(rows)-1]
			if row.OK == nil || *row.OK != tt.ok || !strings.Contains(row.Metric, "mean of 10") {
				t.Fatalf("row %+v, want ok %v", row, tt.ok)
			}
			if want := fmt.Sprintf("RSS %.1f MiB, PSS %.1f MiB", float64(tt.rss)/(1<<20), float64(tt.pss)/(1<<20)); row.Airlock != want {
				t.Errorf("airlock %q, want %q", row.Airlock, want)
			}
			if r.AllMet() != tt.ok {
				t.Errorf("AllMet = %v", r.AllMet())
			}
		})
	}
}

// TestSandboxProcesses reads a fake /proc: two sandboxes' processes found by
// their cgroups (v1 and v2 lines), memory summed from smaps_rollup.
func TestSandboxProcesses(t *testing.T) {
	root := t.TempDir()
	procs := map[string]struct{ cgroup, smaps string }{
		"10":   {"12:memory:/airlock/sbx_a\n11:pids:/airlock/sbx_a\n0::/\n", "Rss:  4096 kB\nPss:  1024 kB\nShared_Clean: 3072 kB\n"},
		"11":   {"12:memory:/airlock/sbx_a/child\n0::/\n", "Rss: 1024 kB\nPss: 512 kB\n"},
		"20":   {"0::/airlock/sbx_b\n", "Rss: 2048 kB\nPss: 2048 kB\n"},
		"30":   {"12:memory:/airlock/sbx_ab\n0::/user.slice\n", "Rss: 9 kB\nPss: 9 kB\n"},
		"self": {"0::/\n", ""},
	}
	for pid, p := range procs {
		dir := filepath.Join(root, pid)
		os.MkdirAll(dir, 0o755)
		os.WriteFile(filepath.Join(dir, "cgroup"), []byte(p.cgroup), 0o644)
		os.WriteFile(filepath.Join(dir, "smaps_rollup"), []byte(p.smaps), 0o644)
	}
	old := procRoot
	procRoot = root
	t.Cleanup(func() { procRoot = old })

	pids, err := sandboxPids([]string{"sbx_a", "sbx_b", "sbx_c"})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(pids["sbx_a"])
	if !slices.Equal(pids["sbx_a"], []int{10, 11}) || !slices.Equal(pids["sbx_b"], []int{20}) || len(pids["sbx_c"]) != 0 {
		t.Fatalf("pids = %v", pids)
	}
	rss, pss, err := processMemory(10)
	if err != nil || rss != 4096<<10 || pss != 1024<<10 {
		t.Fatalf("processMemory = %d %d %v", rss, pss, err)
	}
	if _, _, err := processMemory(99); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing process: %v", err)
	}
	os.WriteFile(filepath.Join(root, "20", "smaps_rollup"), []byte("Rss: lots kB\nPss: 1 kB\n"), 0o644)
	if _, _, err := processMemory(20); err == nil {
		t.Error("garbage smaps_rollup parsed")
	}
}

func deref(b *bool) any {
	if b == nil {
		return nil
	}
	return *b
}

// fakeServer plays the few API calls the bench makes and counts them.
type fakeServer struct {
	mu              sync.Mutex
	live            map[string]bool
	created, execs  int
	uploaded, reads int64
	removed         int
	failExec        bool
	data            []byte
	// gvisorStatus and gvisorCode answer a create of runtime gvisor
	// (0: created like any other).
	gvisorStatus int
	gvisorCode   string
}

func (f *fakeServer) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateSandboxRequest
		json.NewDecoder(r.Body).Decode(&req)
		if req.Runtime == "gvisor" && f.gvisorStatus != 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(f.gvisorStatus)
			fmt.Fprintf(w, `{"error":{"code":%q,"message":"runsc broke | twice\nfor good"}}`, f.gvisorCode)
			return
		}
		f.mu.Lock()
		f.created++
		id := fmt.Sprintf("sbx_%d", f.created)
		f.live[id] = true
		f.mu.Unlock()
		w.WriteHeader(201)
		json.NewEncoder(w).Encode(api.Sandbox{ID: id, State: "running"})
	})
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		delete(f.live, r.PathValue("id"))
		f.mu.Unlock()
		w.WriteHeader(204)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", func(w http.ResponseWriter, r *http.Request) {
		var req api.ExecRequest
		json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		f.execs++
		fail := f.failExec
		f.mu.Unlock()
		code := 0
		res := api.ExecResult{ID: "ex_1", Status: "exited", ExitCode: &code}
		if fail {
			code = 1
		}
		if req.Cmd[0] == "echo" {
			out := strings.Join(req.Cmd[1:], " ") + "\n"
			res.Stdout = &out
		}
		json.NewEncoder(w).Encode(res)
	})
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.uploaded += int64(len(b))
		f.data = b
		f.mu.Unlock()
		w.WriteHeader(201)
		json.NewEncoder(w).Encode(api.FileWritten{Path: r.URL.Query().Get("path"), Size: int64(len(b))})
	})
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/fs", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.removed++
		f.mu.Unlock()
		w.WriteHeader(204)
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		b := f.data
		f.reads++
		f.mu.Unlock()
		w.Write(b)
	})
	return mux
}

func newBenchClient(t *testing.T, h http.Handler) *client.Client {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c, err := client.New(srv.URL, "k", client.WithHTTPClient(&http.Client{Transport: tr}))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRunAgainstFakeServer(t *testing.T) {
	f := &fakeServer{live: map[string]bool{}}
	c := newBenchClient(t, f.handler())
	self, err := os.Executable() // a stand-in CLI: see fakeCLI
	if err != nil {
		t.Fatal(err)
	}
	r, err := Run(context.Background(), Config{Client: c, CreateRuns: 3, ExecRuns: 7, FileRuns: 2, FileBytes: 1 << 20,
		IdleSandboxes: 2, IdleSettle: time.Millisecond, CodeRuns: -1, NetworkRuns: -1, WorkDir: t.TempDir(),
		CLI: self, CLIRuns: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.CLIStart) != 2 || r.CLIProbe != nil {
		t.Errorf("CLI start samples %d, probe %v", len(r.CLIStart), r.CLIProbe)
	}
	if len(r.Create) != 3 || len(r.Exec) != 7 || len(r.Upload) != 2 || len(r.Download) != 2 {
		t.Errorf("samples: create %d exec %d up %d down %d", len(r.Create), len(r.Exec), len(r.Upload), len(r.Download))
	}
	if len(r.ForkExec) != 7 || len(r.LocalCp) != 2 || r.BareRunc != nil {
		t.Errorf("baselines: fork %d cp %d runc %v", len(r.ForkExec), len(r.LocalCp), r.BareRunc)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// 1 warm-up + 3 measured creates, + 1 for exec and files, + 2 idle.
	if f.created != 7 || len(f.live) != 0 {
		t.Errorf("created %d sandboxes, %d left", f.created, len(f.live))
	}
	// 4 `true` + 5 warm-up + 7 measured echos.
	if f.execs != 16 {
		t.Errorf("execs = %d, want 16", f.execs)
	}
	if f.uploaded != 2<<20 || f.reads != 2 || f.removed != 2 {
		t.Errorf("uploaded %d bytes, %d reads, %d removes", f.uploaded, f.reads, f.removed)
	}
	notes := strings.Join(r.Notes, "\n")
	if !strings.Contains(notes, "no --rootfs") || !strings.Contains(notes, "--cli-probe") {
		t.Errorf("notes %v", r.Notes)
	}
	// The fake server's sandboxes have no processes on this host: as root
	// that is a failed measurement, otherwise one that cannot be made.
	var idle Row
	for _, row := range r.Rows() {
		if strings.HasPrefix(row.Metric, "idle sandbox memory") {
			idle = row
		}
	}
	if os.Geteuid() == 0 {
		if r.Idle != nil || idle.OK == nil || *idle.OK || !strings.Contains(idle.Airlock, "failed: no process of sandbox") {
			t.Errorf("idle %+v, row %+v", r.Idle, idle)
		}
	} else if r.Idle != nil || idle.OK != nil || !strings.Contains(notes, "idle memory not measured: needs root") {
		t.Errorf("idle %+v, row %+v, notes %v", r.Idle, idle, r.Notes)
	}
}

// TestFailedRowIsReported checks that a measurement that fails is a row
// of its own that misses its target, with the error, and fails the run;
// and that a server without the runtime at all leaves the row out with a
// note instead.
func TestFailedRowIsReported(t *testing.T) {
	for _, tt := range []struct {
		name   string
		status int
		code   string
		failed bool
	}{
		{"create fails", http.StatusInternalServerError, "internal", true},
		{"runtime unhealthy", http.StatusServiceUnavailable, api.CodeRuntimeUnavailable, true},
		{"runtime absent", http.StatusBadRequest, api.CodeRuntimeUnavailable, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeServer{live: map[string]bool{}, gvisorStatus: tt.status, gvisorCode: tt.code}
			c := newBenchClient(t, f.handler())
			r, err := Run(context.Background(), Config{Client: c, CreateRuns: 1, ExecRuns: 1, FileRuns: 1, FileBytes: 1024,
				LayeredRuns: 0, IdleSandboxes: -1, CodeRuns: -1, NetworkRuns: -1, GVisor: true, WorkDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			var row *Row
			rows := r.Rows()
			for i := range rows {
				if strings.HasPrefix(rows[i].Metric, "gvisor create") {
					row = &rows[i]
				}
			}
			md := r.Markdown()
			if !tt.failed {
				if row != nil || !strings.Contains(strings.Join(r.Notes, "\n"), "no gvisor runtime") {
					t.Fatalf("row %+v, notes %v", row, r.Notes)
				}
				return
			}
			if row == nil {
				t.Fatalf("no gvisor row:\n%s", md)
			}
			if row.OK == nil || *row.OK || !strings.HasPrefix(row.Airlock, "failed: ") || !strings.Contains(row.Airlock, tt.code) {
				t.Errorf("row %+v", *row)
			}
			if r.AllMet() {
				t.Error("AllMet with a failed row")
			}
			// One table row: the error's line break and bar do not break it.
			for line := range strings.Lines(md) {
				if strings.Contains(line, "gvisor create") && (strings.Count(line, "|") != 7 || !strings.HasSuffix(line, "| no |\n")) {
					t.Errorf("table row %q", line)
				}
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if len(f.live) != 0 {
				t.Errorf("%d sandboxes left", len(f.live))
			}
		})
	}
}

func TestRunCleansUpOnFailure(t *testing.T) {
	f := &fakeServer{live: map[string]bool{}, failExec: true}
	c := newBenchClient(t, f.handler())
	_, err := Run(context.Background(), Config{Client: c, CreateRuns: 2, ExecRuns: 2, FileRuns: 1, FileBytes: 1024})
	if err == nil || !strings.Contains(err.Error(), "first command") {
		t.Fatalf("err = %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.live) != 0 {
		t.Errorf("%d sandboxes left after a failed run", len(f.live))
	}
}

func TestMainFlags(t *testing.T) {
	var out, errb strings.Builder
	if code := Main([]string{"--bogus"}, &out, &errb); code != 2 {
		t.Errorf("bad flag: exit %d", code)
	}
	if code := Main([]string{"--url", "ftp://x"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "scheme") {
		t.Errorf("bad url: exit %d, %q", code, errb.String())
	}
}

// TestBareRunc runs the real baseline; it needs root, runc and a built
// base template (AIRLOCK_TEST_DATA_DIR, as the other root tests).
func TestBareRunc(t *testing.T) {
	if testing.Short() {
		t.Skip("runs runc: not a -short test")
	}
	testutil.RequiresRoot(t)
	runc := testutil.RequiresBinary(t, "runc")
	// Built here if the cache lacks it: whether another package's root
	// tests ran first must not decide whether this one runs.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var progress strings.Builder
	tmpl, err := template.NewStore(filepath.Join(testutil.DataDir(), "templates")).EnsureBase(ctx, &progress)
	if err != nil || len(tmpl.Layers) == 0 {
		t.Fatalf("base template: %v %v\n%s", tmpl.Layers, err, progress.String())
	}
	before, _ := filepath.Glob("/sys/fs/cgroup/*/airlock-bench-*")
	s, err := bareRunc(context.Background(), runc, tmpl.Layers[0], t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 3 {
		t.Fatalf("%d samples", len(s))
	}
	for _, d := range s {
		if d <= 0 || d > time.Minute {
			t.Errorf("implausible runc run time %v", d)
		}
	}
	after, _ := filepath.Glob("/sys/fs/cgroup/*/airlock-bench-*")
	if len(after) > len(before) {
		t.Errorf("cgroups left behind: %v", after)
	}
}

func TestBareRuncRefusesBadRootfs(t *testing.T) {
	testutil.RequiresRoot(t)
	_, err := bareRunc(context.Background(), "runc", t.TempDir(), t.TempDir(), 1)
	if err == nil || !strings.Contains(err.Error(), "/bin/true") {
		t.Errorf("err = %v", err)
	}
}
