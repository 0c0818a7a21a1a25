package bench

import (
	"context"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeCLI makes this test binary a stand-in for `airlock exec` when it is
// run as one (MeasureCLIStart passes a clean environment, so the
// arguments say it): one POST to the sandbox's exec, as the CLI's first
// request is. It returns false for a normal test run.
func fakeCLI() bool {
	if len(os.Args) < 3 || os.Args[1] != "exec" || os.Args[2] != cliStartSandbox {
		return false
	}
	resp, err := http.Post(os.Getenv("AIRLOCK_URL")+"/v1/sandboxes/"+os.Args[2]+"/exec", "application/json", strings.NewReader("{}"))
	if err != nil {
		os.Exit(2)
	}
	resp.Body.Close()
	os.Exit(125) // as the CLI does for sandbox_not_found
	return true
}

func TestMeasureCLIStart(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The probe is run without arguments: a script gives it the CLI's.
	probe := filepath.Join(t.TempDir(), "probe")
	if err := os.WriteFile(probe, []byte("#!/bin/sh\nexec "+self+" exec "+cliStartSandbox+" -- true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cli, base, err := MeasureCLIStart(context.Background(), self, probe, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(cli) != 3 || len(base) != 3 {
		t.Fatalf("samples: cli %d, probe %d", len(cli), len(base))
	}
	for _, d := range append(cli, base...) {
		if d <= 0 || d > 10*time.Second {
			t.Errorf("sample %v", d)
		}
	}

	// A program that never sends a request is an error, not a hang.
	silent := filepath.Join(t.TempDir(), "silent")
	if err := os.WriteFile(silent, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, _, err := MeasureCLIStart(ctx, silent, "", 1); err == nil {
		t.Error("a CLI that sent nothing was measured")
	}
	if _, _, err := MeasureCLIStart(context.Background(), filepath.Join(t.TempDir(), "missing"), "", 1); err == nil {
		t.Error("a missing CLI was measured")
	}
}

func TestCLIStartRow(t *testing.T) {
	ms := func(n ...int) Samples {
		var s Samples
		for _, v := range n {
			s = append(s, time.Duration(v)*time.Millisecond)
		}
		return s
	}
	tests := []struct {
		name       string
		cli, probe Samples
		ok         bool
		ratio      float64
	}{
		{"within the ratio though above the aim", ms(30, 31, 29), ms(12, 12, 12), true, 30.0 / 12},
		{"past the ratio", ms(40, 41, 39), ms(12, 12, 12), false, 40.0 / 12},
		{"no probe: the aim, met", ms(8, 9, 7), nil, true, math.NaN()},
		{"no probe: the aim, missed", ms(11, 12, 13), nil, false, math.NaN()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			row := CLIStartRow(tt.cli, tt.probe)
			if row.OK == nil || *row.OK != tt.ok {
				t.Fatalf("OK = %v, want %v (%+v)", row.OK, tt.ok, row)
			}
			if math.IsNaN(tt.ratio) != math.IsNaN(row.Ratio) || (!math.IsNaN(tt.ratio) && math.Abs(row.Ratio-tt.ratio) > 1e-9) {
				t.Errorf("ratio = %v, want %v", row.Ratio, tt.ratio)
			}
		})
	}
	r := &Report{CLIStart: ms(30), CLIProbe: ms(12)}
	if !strings.Contains(r.Markdown(), "CLI start to first request") {
		t.Error("the report lacks the CLI start row")
	}
}
