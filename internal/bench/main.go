package bench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/airlockhq/airlock/client"
)

// Main is airlock-bench: it parses args, runs the benchmark against the
// server and prints the markdown report on stdout. It returns the exit code:
// 0 when every judged target was met, 1 when one was not or a measurement
// failed (its row says so), 2 for an error that left no table.
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("airlock-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg        Config
		url, key   string
		fileMB     int64
		jsonOut    bool
		reportOnly bool
	)
	fs.StringVar(&url, "url", os.Getenv(client.EnvURL), "server URL (env AIRLOCK_URL, default "+client.DefaultURL+")")
	fs.StringVar(&key, "api-key", os.Getenv(client.EnvAPIKey), "API key (env AIRLOCK_API_KEY)")
	fs.StringVar(&cfg.Template, "template", "", "template of the sandboxes (server default)")
	fs.StringVar(&cfg.Runtime, "runtime", "", "runtime of the sandboxes (server default)")
	fs.IntVar(&cfg.CreateRuns, "create-runs", 20, "measured create → first result runs (and bare runc runs)")
	fs.IntVar(&cfg.ExecRuns, "exec-runs", 1000, "measured exec round trips (and fork/exec runs)")
	fs.IntVar(&cfg.FileRuns, "file-runs", 15, "measured upload/download runs (and cp runs)")
	fs.IntVar(&cfg.LayeredRuns, "layered-runs", 10, "measured creates from a multi-layer template and from base, interleaved (0 skips)")
	fs.Int64Var(&fileMB, "file-mb", 100, "size of the file transfer in MiB")
	fs.IntVar(&cfg.IdleSandboxes, "idle-sandboxes", 10, "idle sandboxes to measure memory on (negative: skip; needs root on the server's host)")
	fs.BoolVar(&cfg.GVisor, "gvisor", true, "measure the gvisor runtime's cold create against a bare runsc (skipped, with a note, when the server lacks it)")
	fs.StringVar(&cfg.GVisorPlatform, "gvisor-platform", "ptrace", "runsc platform of the bare baseline (the server's gvisor_platform)")
	fs.IntVar(&cfg.NetworkRuns, "network-runs", 20, "creates with an allowlist network and with none, interleaved (negative: skip)")
	fs.IntVar(&cfg.CodeRuns, "code-runs", 50, "`1+1` cells timed in a warm code-interpreter context (negative: skip)")
	fs.StringVar(&cfg.CLI, "cli", besideMe("airlock"), "the airlock binary whose start to first request is timed (\"\" skips it)")
	fs.StringVar(&cfg.CLIProbe, "cli-probe", besideMe("airlock-bench-probe"), "tiny static Go program timed beside it (cmd/airlock-bench/probe)")
	fs.IntVar(&cfg.CLIRuns, "cli-runs", 50, "measured CLI starts, and as many of the probe (negative: skip)")
	fs.DurationVar(&cfg.IdleSettle, "idle-settle", 2*time.Second, "how long the idle sandboxes idle before the measurement")
	fs.StringVar(&cfg.Rootfs, "rootfs", "", "the template's rootfs on this host, for the bare runc baseline (e.g. <data-dir>/templates/base/1/rootfs)")
	fs.StringVar(&cfg.RuncPath, "runc", "runc", "runc binary for the baseline")
	fs.StringVar(&cfg.WorkDir, "work-dir", "", "scratch directory for the baselines (default $TMPDIR)")
	fs.BoolVar(&jsonOut, "json", false, "print the raw samples as JSON instead of the table")
	fs.BoolVar(&reportOnly, "no-fail", false, "exit 0 even when a target is missed")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	c, err := client.New(url, key, client.WithUserAgent("airlock-bench"))
	if err != nil {
		fmt.Fprintf(stderr, "airlock-bench: %v\n", err)
		return 2
	}
	cfg.Client = c
	cfg.FileBytes = fileMB << 20
	cfg.Progress = stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r, err := Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "airlock-bench: %v\n", err)
		return 2
	}
	if jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			return 2
		}
	} else {
		fmt.Fprint(stdout, r.Markdown())
	}
	if !r.AllMet() && !reportOnly {
		return 1
	}
	return 0
}

// besideMe returns the path of name in this executable's directory when
// it exists there, else "".
func besideMe(name string) string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	p := filepath.Join(filepath.Dir(exe), name)
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}
