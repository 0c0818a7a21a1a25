// Package bench measures a running airlock server against local baselines (bare runc, fork/exec, cp) for `make bench`.
//
// Every figure is a ratio taken in one run on one host, because absolute
// numbers mean little across machines: create → first command result
// against a bare `runc run` of the same rootfs, an exec round trip against a
// local fork/exec, and file transfer throughput against a local cp. The
// targets are those of docs ARCHITECTURE ("Performance targets").
package bench

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// Config says what to measure and how often.
type Config struct {
	Client *client.Client
	// Template and Runtime of the sandboxes created ("" = server default).
	Template, Runtime string
	// CreateRuns, ExecRuns, FileRuns are the measured iterations of each part.
	CreateRuns, ExecRuns, FileRuns int
	// LayeredRuns is how many creates from a multi-layer template (and from
	// base, interleaved) are measured; 0 skips the case.
	LayeredRuns int
	// FileBytes is the size of the upload/download (100 MiB by default).
	FileBytes int64
	// IdleSandboxes is how many idle sandboxes the memory overhead is
	// measured on (10 by default; negative skips it). It needs the server on
	// this host and root, to read the sandboxes' processes.
	IdleSandboxes int
	// IdleSettle is how long they idle before the measurement (2 s).
	IdleSettle time.Duration
	// Rootfs is the template's root filesystem on this host, for the bare
	// runc baseline; "" skips that baseline.
	Rootfs string
	// RuncPath is the runc binary ("" = "runc" on PATH).
	RuncPath string
	// WorkDir holds the baselines' scratch files ("" = os.TempDir()).
	WorkDir string
	// CodeRuns is how many `1+1` cells are timed in a warm code
	// interpreter context (50 by default; negative skips it).
	CodeRuns int
	// NetworkRuns is how many creates with an allowlist network, and as
	// many with none, are timed (20 by default; negative skips it).
	NetworkRuns int
	// GVisor measures the gvisor runtime's cold create against a bare
	// runsc (on GVisorPlatform, "" = ptrace) when the server offers it.
	GVisor         bool
	GVisorPlatform string
	// CLI is the airlock binary whose start to first request is timed
	// ("" skips it); CLIProbe is the tiny static Go program timed beside it
	// (cmd/airlock-bench/probe; "" leaves the row without a baseline).
	CLI, CLIProbe string
	// CLIRuns is how many starts of each are timed (50 by default;
	// negative skips the case).
	CLIRuns int
	// Progress receives one line per phase ("" = io.Discard).
	Progress io.Writer
}

func (c *Config) defaults() {
	// Enough runs that one disturbed sample on a shared host moves neither
	// a median nor (for execs) the p99 much.
	if c.CreateRuns <= 0 {
		c.CreateRuns = 20
	}
	if c.ExecRuns <= 0 {
		c.ExecRuns = 1000
	}
	if c.FileRuns <= 0 {
		c.FileRuns = 15
	}
	if c.FileBytes <= 0 {
		c.FileBytes = 100 << 20
	}
	if c.CodeRuns == 0 {
		c.CodeRuns = 50
	}
	if c.NetworkRuns == 0 {
		c.NetworkRuns = 20
	}
	if c.CLIRuns == 0 {
		c.CLIRuns = 50
	}
	if c.IdleSandboxes == 0 {
		c.IdleSandboxes = 10
	}
	if c.IdleSettle <= 0 {
		c.IdleSettle = 2 * time.Second
	}
	if c.RuncPath == "" {
		c.RuncPath = "runc"
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
}

// Samples are the durations of one measured operation.
type Samples []time.Duration

// Percentile returns the q-th percentile (0 < q ≤ 100) by nearest rank.
func (s Samples) Percentile(q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	sorted := slices.Clone(s)
	slices.Sort(sorted)
	rank := int(math.Ceil(q / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// Report is the outcome of one run: airlock's measurements and the
// baselines beside them. A missing baseline is nil with a reason in Notes.
type Report struct {
	Create, Exec, Upload, Download Samples
	BareRunc, ForkExec, LocalCp    Samples
	FileBytes                      int64
	// Layered is create → first result from a template of several layers
	// (base plus LayeredSteps RUN layers), interleaved with Create's runs of
	// the same count so both see the same host; nil when not measured.
	Layered, LayeredBase Samples
	LayeredLayers        int
	// Idle is the memory of idle sandboxes, nil when not measured.
	Idle *IdleMemory
	// Code is a trivial cell (`1+1`) in a warm code-interpreter context.
	Code Samples
	// Net and NetNone are create → first result with an allowlist network
	// and with none, interleaved; nil when not measured.
	Net, NetNone Samples
	// GVisor and BareRunsc are the gvisor runtime's cold create and a bare
	// `runsc run` of the same rootfs, interleaved; nil when not measured.
	GVisor, BareRunsc Samples
	// CLIStart is `airlock exec`'s start to its first request, CLIProbe a
	// tiny static Go program's, interleaved; nil when not measured.
	CLIStart, CLIProbe Samples
	// Failures are the measurements that were attempted and failed: each
	// is a row of its own that misses its target (see Rows), never a row
	// left out.
	Failures []Failure
	Notes    []string
}

// A Failure is a measurement that did not complete: its row's metric and
// the error.
type Failure struct {
	Metric string
	Err    string
}

// Metrics of the rows a failure can stand in for.
const (
	metricLayered = "create → first result from a %d-layer template"
	metricIdle    = "idle sandbox memory (agent + runtime), per sandbox"
	metricGVisor  = "gvisor create → first command result (cold)"
	metricNetwork = "network setup (allowlist) added to cold create, p50"
	metricCode    = "code cell `1+1` in a warm python context, p50"
	metricCLI     = "CLI start to first request (`airlock exec`), p50"
)

// fail records that the measurement of metric failed with err.
func (r *Report) fail(metric string, err error) {
	r.Failures = append(r.Failures, Failure{Metric: metric, Err: err.Error()})
}

// failure returns the failure recorded for metric, if any.
func (r *Report) failure(metric string) *Failure {
	for i := range r.Failures {
		if r.Failures[i].Metric == metric {
			return &r.Failures[i]
		}
	}
	return nil
}

// failedRow is the row of a measurement that failed: its error in place
// of the figure, its target missed.
func failedRow(f *Failure, target string) Row {
	no := false
	return Row{Metric: f.Metric, Airlock: "failed: " + oneLine(f.Err), Target: target, Ratio: math.NaN(), OK: &no}
}

// oneLine makes an error fit a table cell: one line, no column bars, at
// most 300 bytes.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	s = strings.ReplaceAll(s, "|", "/")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// Run measures. It creates and deletes its own sandboxes; a sandbox it made
// is deleted even when a measurement fails. Each baseline sample is taken
// right after the airlock sample it is compared with (see baseline).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.defaults()
	r := &Report{FileBytes: cfg.FileBytes}
	c := cfg.Client
	creq := api.CreateSandboxRequest{Template: cfg.Template, Runtime: cfg.Runtime}

	// Baselines that cannot be set up are noted, not fatal.
	var runc *baseline
	switch {
	case cfg.Rootfs == "":
		r.Notes = append(r.Notes, "bare runc baseline skipped: no --rootfs given")
	default:
		var err error
		if runc, err = runcBaseline(ctx, cfg.RuncPath, cfg.Rootfs, cfg.WorkDir); err != nil {
			r.Notes = append(r.Notes, "bare runc baseline failed: "+err.Error())
		}
	}
	defer func() { runc.finish() }() // on an early return; nil once done

	// (a) cold create → first command result. One unmeasured round first,
	// so that the template's pages are in the cache for every measured one.
	fmt.Fprintf(cfg.Progress, "create → first result, beside bare runc: %d runs\n", cfg.CreateRuns)
	for i := -1; i < cfg.CreateRuns; i++ {
		d, err := coldCreate(ctx, c, creq)
		if err != nil {
			return nil, err
		}
		if i >= 0 {
			r.Create = append(r.Create, d)
		}
		runc.sample(ctx, i >= 0)
	}
	var note string
	if r.BareRunc, note = runc.finish(); note != "" {
		r.Notes = append(r.Notes, note)
	}
	runc = nil

	// (a') a sandbox from a template of several layers starts as fast as
	// one from base: layers are mounted read-only and shared, never copied.
	if cfg.LayeredRuns > 0 {
		if err := measureLayered(ctx, cfg, r, creq); err != nil {
			r.Layered, r.LayeredBase = nil, nil
			r.fail(fmt.Sprintf(metricLayered, layeredSteps+1), err)
		}
	}

	// (b) and (c) in one sandbox.
	sbx, err := c.CreateSandbox(ctx, creq)
	if err != nil {
		return nil, fmt.Errorf("creating sandbox: %w", err)
	}
	defer deleteSandbox(ctx, c, sbx.ID)

	fmt.Fprintf(cfg.Progress, "exec echo hi, beside fork/exec: %d runs\n", cfg.ExecRuns)
	echo := api.ExecRequest{Cmd: []string{"echo", "hi"}}
	fork := forkExecBaseline()
	// A few unmeasured execs open and warm the keep-alive connection.
	for i := -5; i < cfg.ExecRuns; i++ {
		start := time.Now()
		res, err := c.Exec(ctx, sbx.ID, echo)
		d := time.Since(start)
		if err != nil {
			return nil, fmt.Errorf("exec: %w", err)
		}
		if err := succeeded(res); err != nil {
			return nil, err
		}
		if res.Stdout == nil || *res.Stdout != "hi\n" {
			return nil, fmt.Errorf("exec echo hi: unexpected output")
		}
		if i >= 0 {
			r.Exec = append(r.Exec, d)
		}
		fork.sample(ctx, i >= 0)
	}
	if r.ForkExec, note = fork.finish(); note != "" {
		r.Notes = append(r.Notes, note)
	}

	fmt.Fprintf(cfg.Progress, "upload and download %d MiB, beside cp: %d runs\n", cfg.FileBytes>>20, cfg.FileRuns)
	data := make([]byte, cfg.FileBytes)
	_, _ = rand.Read(data) // incompressible, like real artefacts
	cp, err := cpBaseline(cfg.WorkDir, data)
	if err != nil {
		r.Notes = append(r.Notes, "cp baseline failed: "+err.Error())
	}
	defer func() { cp.finish() }()
	const remote = "/home/user/airlock-bench.bin"
	for range cfg.FileRuns {
		start := time.Now()
		w, err := c.WriteFile(ctx, sbx.ID, remote, bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("upload: %w", err)
		}
		r.Upload = append(r.Upload, time.Since(start))
		if w.Size != cfg.FileBytes {
			return nil, fmt.Errorf("upload wrote %d bytes, want %d", w.Size, cfg.FileBytes)
		}
		start = time.Now()
		rc, err := c.ReadFile(ctx, sbx.ID, remote)
		if err != nil {
			return nil, fmt.Errorf("download: %w", err)
		}
		n, err := io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("download: %w", err)
		}
		r.Download = append(r.Download, time.Since(start))
		if n != cfg.FileBytes {
			return nil, fmt.Errorf("download read %d bytes, want %d", n, cfg.FileBytes)
		}
		// Removed outside the timing, as the cp baseline removes its
		// target: every upload, like every cp, then writes a new file.
		if err := c.Remove(ctx, sbx.ID, remote, false); err != nil {
			return nil, fmt.Errorf("removing the uploaded file: %w", err)
		}
		cp.sample(ctx, true)
	}
	if r.LocalCp, note = cp.finish(); note != "" {
		r.Notes = append(r.Notes, note)
	}
	cp = nil

	switch {
	case cfg.IdleSandboxes <= 0:
	case os.Geteuid() != 0:
		// The sandboxes' processes are root's to read.
		r.Notes = append(r.Notes, "idle memory not measured: needs root on the server's host")
	default:
		fmt.Fprintf(cfg.Progress, "idle memory: %d sandboxes\n", cfg.IdleSandboxes)
		r.Idle, err = idleOverhead(ctx, c, creq, cfg.IdleSandboxes, cfg.IdleSettle)
		if err != nil {
			r.Idle = nil
			r.fail(metricIdle, err)
		}
	}

	if cfg.NetworkRuns > 0 {
		fmt.Fprintf(cfg.Progress, "create with an allowlist network vs none: %d runs each\n", cfg.NetworkRuns)
		if r.Net, r.NetNone, err = MeasureNetwork(ctx, c, creq, cfg.NetworkRuns); err != nil {
			r.Net, r.NetNone = nil, nil
			r.fail(metricNetwork, err)
		}
	}

	if cfg.GVisor {
		var notes []string
		r.GVisor, r.BareRunsc, notes, err = GVisorCreate(ctx, cfg, "", cfg.GVisorPlatform)
		r.Notes = append(r.Notes, notes...)
		switch {
		case err == nil:
		case runtimeAbsent(err):
			// A server without gVisor has no such row to fill.
			r.GVisor, r.BareRunsc = nil, nil
			r.Notes = append(r.Notes, "gvisor create not measured: the server has no gvisor runtime: "+err.Error())
		default:
			r.GVisor, r.BareRunsc = nil, nil
			r.fail(metricGVisor, err)
		}
	}

	if cfg.CLIRuns > 0 && cfg.CLI != "" {
		fmt.Fprintf(cfg.Progress, "CLI start to first request, beside a tiny Go binary: %d runs each\n", cfg.CLIRuns)
		if r.CLIStart, r.CLIProbe, err = MeasureCLIStart(ctx, cfg.CLI, cfg.CLIProbe, cfg.CLIRuns); err != nil {
			r.CLIStart, r.CLIProbe = nil, nil
			r.fail(metricCLI, err)
		} else if cfg.CLIProbe == "" {
			r.Notes = append(r.Notes, "CLI start: no tiny Go binary to compare with (--cli-probe)")
		}
	}

	if cfg.CodeRuns > 0 {
		fmt.Fprintf(cfg.Progress, "code interpreter: %d cells of 1+1 (builds the code-interpreter template on first use)\n", cfg.CodeRuns)
		if r.Code, err = MeasureCode(ctx, c, "", cfg.CodeRuns); err != nil {
			r.Code = nil
			r.fail(metricCode, err)
		}
	}
	return r, nil
}

// coldCreate times a create and the first command's result (`true`), then
// deletes the sandbox (outside the timing); a failure of any step is the
// sample's.
func coldCreate(ctx context.Context, c *client.Client, req api.CreateSandboxRequest) (time.Duration, error) {
	start := time.Now()
	sbx, err := c.CreateSandbox(ctx, req)
	if err != nil {
		return 0, fmt.Errorf("creating %s sandbox: %w", cmp.Or(req.Runtime, "a"), err)
	}
	res, err := c.Exec(ctx, sbx.ID, api.ExecRequest{Cmd: []string{"true"}})
	d := time.Since(start)
	derr := deleteSandbox(ctx, c, sbx.ID)
	if err == nil {
		err = succeeded(res)
	}
	if err != nil {
		return 0, fmt.Errorf("first command: %w", err)
	}
	return d, derr
}

// deleteSandbox deletes on a context of its own: a measurement that failed
// because ctx ended must still not leave its sandbox behind.
func deleteSandbox(ctx context.Context, c *client.Client, id string) error {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := c.DeleteSandbox(dctx, id); err != nil {
		return fmt.Errorf("deleting sandbox %s: %w", id, err)
	}
	return nil
}

func succeeded(res *api.ExecResult) error {
	if res.Status != api.ExecExited || res.ExitCode == nil || *res.ExitCode != 0 {
		return fmt.Errorf("command ended with status %s: %s", res.Status, res.Error)
	}
	return nil
}

// Row is one line of the report table.
type Row struct {
	Metric   string
	Airlock  string // p50 (and p99) or throughput
	Baseline string
	Ratio    float64 // NaN when there is no baseline
	Target   string
	OK       *bool // nil when it cannot be judged
}

// layeredSteps is how many RUN layers the layered template adds to base.
const layeredSteps = 4

// measureLayered builds (or reuses, through the layer cache) a template of
// base plus layeredSteps RUN layers, then alternates creates from it and
// from the base template, so the two figures share the same host load.
func measureLayered(ctx context.Context, cfg Config, r *Report, base api.CreateSandboxRequest) error {
	c := cfg.Client
	var spec strings.Builder
	spec.WriteString("FROM base\n")
	for i := range layeredSteps {
		fmt.Fprintf(&spec, "RUN mkdir -p /opt/layer%d && seq 1 %d > /opt/layer%d/data\n", i, 1000*(i+1), i)
	}
	const name = "airlock-bench-layers"
	fmt.Fprintf(cfg.Progress, "building template %s (%d layers over base)\n", name, layeredSteps)
	started, err := c.BuildTemplate(ctx, api.TemplateBuildRequest{Name: name, Dockerfile: spec.String()}, client.BuildUploads{})
	if err != nil {
		return fmt.Errorf("building: %w", err)
	}
	b, err := c.FollowTemplateBuild(ctx, started.BuildID, io.Discard)
	if err != nil {
		return fmt.Errorf("building: %w", err)
	}
	if b.Status != "ready" {
		return fmt.Errorf("build %s: %s", b.Status, b.Error)
	}
	layered := base
	layered.Template = fmt.Sprintf("%s@%d", name, started.Version)
	one := func(req api.CreateSandboxRequest) (time.Duration, error) { return coldCreate(ctx, c, req) }
	fmt.Fprintf(cfg.Progress, "create from the layered template vs base: %d runs each\n", cfg.LayeredRuns)
	for i := -1; i < cfg.LayeredRuns; i++ {
		dl, err := one(layered)
		if err != nil {
			return err
		}
		db, err := one(base)
		if err != nil {
			return err
		}
		if i >= 0 {
			r.Layered = append(r.Layered, dl)
			r.LayeredBase = append(r.LayeredBase, db)
		}
	}
	r.LayeredLayers = layeredSteps + 1
	return nil
}

// Rows computes the report's table: each airlock figure against its
// baseline and target.
func (r *Report) Rows() []Row {
	judge := func(ok bool) *bool { return &ok }
	var rows []Row

	row := Row{Metric: "create → first command result (cold)", Target: "≤ 2× bare runc", Ratio: math.NaN(),
		Airlock: fmtP(r.Create)}
	if len(r.BareRunc) > 0 && len(r.Create) > 0 {
		row.Baseline = "bare `runc run /bin/true` " + ms(r.BareRunc.Percentile(50))
		row.Ratio = ratio(r.Create.Percentile(50), r.BareRunc.Percentile(50))
		row.OK = judge(row.Ratio <= 2)
	}
	rows = append(rows, row)

	if f := r.failure(fmt.Sprintf(metricLayered, layeredSteps+1)); f != nil {
		rows = append(rows, failedRow(f, "≈ base (≤ 1.25×)"))
	} else if len(r.Layered) > 0 && len(r.LayeredBase) > 0 {
		row = Row{Metric: fmt.Sprintf(metricLayered, r.LayeredLayers),
			Target: "≈ base (≤ 1.25×)", Airlock: fmtP(r.Layered),
			Baseline: "same from `base`, interleaved " + ms(r.LayeredBase.Percentile(50)),
			Ratio:    ratio(r.Layered.Percentile(50), r.LayeredBase.Percentile(50))}
		row.OK = judge(row.Ratio <= 1.25)
		rows = append(rows, row)
	}

	row = Row{Metric: "exec round trip (`echo hi`), p50", Target: "≤ 3× fork/exec", Ratio: math.NaN(), Airlock: fmtP(r.Exec)}
	if len(r.ForkExec) > 0 && len(r.Exec) > 0 {
		row.Baseline = "fork/exec `/bin/echo` " + ms(r.ForkExec.Percentile(50))
		row.Ratio = ratio(r.Exec.Percentile(50), r.ForkExec.Percentile(50))
		row.OK = judge(row.Ratio <= 3)
	}
	rows = append(rows, row)
	row = Row{Metric: "exec round trip, p99 / p50", Target: "≤ 3×", Ratio: math.NaN(), Airlock: fmtP(r.Exec)}
	if len(r.Exec) > 0 {
		row.Baseline = "its own p50"
		if len(r.ForkExec) > 0 {
			// The host's own jitter, for scale: on a shared machine the
			// local fork/exec has a tail too.
			row.Baseline += fmt.Sprintf(" (fork/exec's own p99/p50: %.2f×)", ratio(r.ForkExec.Percentile(99), r.ForkExec.Percentile(50)))
		}
		row.Ratio = ratio(r.Exec.Percentile(99), r.Exec.Percentile(50))
		row.OK = judge(row.Ratio <= 3)
	}
	rows = append(rows, row)

	for _, f := range []struct {
		name string
		s    Samples
	}{{"upload", r.Upload}, {"download", r.Download}} {
		row := Row{Metric: fmt.Sprintf("%s %d MiB", f.name, r.FileBytes>>20), Target: "≥ 0.5× cp", Ratio: math.NaN(),
			Airlock: mbps(r.FileBytes, f.s.Percentile(50))}
		if len(r.LocalCp) > 0 && len(f.s) > 0 {
			row.Baseline = "local `cp` " + mbps(r.FileBytes, r.LocalCp.Percentile(50))
			// Throughput ratio: the inverse of the time ratio.
			row.Ratio = ratio(r.LocalCp.Percentile(50), f.s.Percentile(50))
			row.OK = judge(row.Ratio >= 0.5)
		}
		rows = append(rows, row)
	}

	row = Row{Metric: metricIdle, Target: "≤ 8 MiB RSS", Ratio: math.NaN(), Airlock: "n/a"}
	if f := r.failure(metricIdle); f != nil {
		row = failedRow(f, row.Target)
	} else if m := r.Idle; m != nil {
		row.Metric = fmt.Sprintf("idle sandbox memory (agent + runtime), mean of %d", m.Sandboxes)
		row.Airlock = fmt.Sprintf("RSS %s, PSS %s", mib(m.RSSBytes), mib(m.PSSBytes))
		row.Baseline = fmt.Sprintf("%d processes in %d sandboxes", m.Procs, m.Sandboxes)
		row.OK = judge(m.RSSBytes <= idleTargetBytes)
	}
	rows = append(rows, row)
	if f := r.failure(metricGVisor); f != nil {
		rows = append(rows, failedRow(f, "≤ 1.5× bare runsc"))
	} else if len(r.GVisor) > 0 {
		row := Row{Metric: metricGVisor, Target: "≤ 1.5× bare runsc", Ratio: math.NaN(),
			Airlock: fmtP(r.GVisor)}
		if len(r.BareRunsc) > 0 {
			row.Baseline = "bare `runsc --platform=ptrace run /bin/true` " + ms(r.BareRunsc.Percentile(50))
			row.Ratio = ratio(r.GVisor.Percentile(50), r.BareRunsc.Percentile(50))
			row.OK = judge(row.Ratio <= 1.5)
		}
		rows = append(rows, row)
	}
	if f := r.failure(metricNetwork); f != nil {
		rows = append(rows, failedRow(f, "≤ 10 ms"))
	} else if len(r.Net) > 0 && len(r.NetNone) > 0 {
		rows = append(rows, NetworkRow(r.Net, r.NetNone))
	}
	if f := r.failure(metricCode); f != nil {
		rows = append(rows, failedRow(f, "< 20 ms"))
	} else if len(r.Code) > 0 {
		rows = append(rows, CodeRow(r.Code))
	}
	if f := r.failure(metricCLI); f != nil {
		rows = append(rows, failedRow(f, CLIStartRow(nil, nil).Target))
	} else if len(r.CLIStart) > 0 {
		rows = append(rows, CLIStartRow(r.CLIStart, r.CLIProbe))
	}
	return rows
}

// runtimeAbsent reports whether err is the server saying that the runtime
// asked for is not on its host at all (400 runtime_unavailable); the same
// code with 503 is a runtime that is there but failing, which is a failure.
func runtimeAbsent(err error) bool {
	var ae *client.APIError
	return errors.As(err, &ae) && ae.Code == api.CodeRuntimeUnavailable && ae.StatusCode == http.StatusBadRequest
}

// idleTargetBytes is ARCHITECTURE.md's idle overhead target.
const idleTargetBytes = 8 << 20

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// Markdown renders the report as a table plus notes.
func (r *Report) Markdown() string {
	var b strings.Builder
	b.WriteString("| metric | airlock | baseline | ratio | target | met |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	for _, row := range r.Rows() {
		ratio, met := "n/a", "n/a"
		if !math.IsNaN(row.Ratio) {
			ratio = fmt.Sprintf("%.2f×", row.Ratio)
		}
		if row.OK != nil {
			met = "no"
			if *row.OK {
				met = "yes"
			}
		}
		baseline := row.Baseline
		if baseline == "" {
			baseline = "n/a"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", row.Metric, row.Airlock, baseline, ratio, row.Target, met)
	}
	idle := 0
	if r.Idle != nil {
		idle = r.Idle.Sandboxes
	}
	fmt.Fprintf(&b, "\nruns: create %d, exec %d, files %d, idle sandboxes %d\n", len(r.Create), len(r.Exec), len(r.Upload), idle)
	for _, n := range r.Notes {
		b.WriteString("\n- " + n)
	}
	if len(r.Notes) > 0 {
		b.WriteString("\n")
	}
	return b.String()
}

// AllMet reports whether every judged target was met (unjudged rows do not count).
func (r *Report) AllMet() bool {
	for _, row := range r.Rows() {
		if row.OK != nil && !*row.OK {
			return false
		}
	}
	return true
}

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

func fmtP(s Samples) string {
	if len(s) == 0 {
		return "n/a"
	}
	return "p50 " + ms(s.Percentile(50)) + ", p99 " + ms(s.Percentile(99))
}

func mbps(n int64, d time.Duration) string {
	if d <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.0f MB/s", float64(n)/d.Seconds()/1e6)
}
