package main

import (
	"bytes"
	"context"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/testutil/daemontest"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		in string
		ok bool
	}{
		{`{"total": 25}` + "\n", true},
		{`{"total": 24}`, false},
		{`{"total": 25, "extra": 1}`, false},
		{`{}`, false},
		{`null`, false},
		{`[25]`, false},
		{`{"total": "25"}`, false},
		{`{"total": 25} {"total": 25}`, false},
		{`{"total": 25}` + strings.Repeat(" ", maxOutput), false},
		{`Traceback (most recent call last):`, false},
	}
	for _, tt := range tests {
		if _, err := validate([]byte(tt.in)); (err == nil) != tt.ok {
			t.Errorf("validate(%.40q) = %v, want ok %v", tt.in, err, tt.ok)
		}
	}
}

// scriptModel is a model that wrote script.
type scriptModel string

func (m scriptModel) Script(context.Context, string) (string, error) { return string(m), nil }

// TestExample runs the example's flow against the real daemon: as a
// program (built, with AIRLOCK_URL and AIRLOCK_API_KEY in its environment)
// and in-process with models whose scripts fail in each way the flow
// checks; every run leaves no sandbox behind.
func TestExample(t *testing.T) {
	e := daemontest.Start(t, daemontest.Options{})
	key := e.Key(t, "example")
	tenant := e.Client(key)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	runtime := "runc"
	info, err := e.Admin().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range info.Drivers {
		if d.Name == "gvisor" && d.Health == "healthy" {
			runtime = "gvisor" // the example's own choice, where the host has it
		}
	}
	noneLeft := func(t *testing.T) {
		t.Helper()
		for sb, err := range tenant.Sandboxes(ctx, client.ListOptions{}) {
			if err != nil {
				t.Fatal(err)
			}
			if sb.State != api.StateStopped {
				t.Errorf("sandbox %s left %s", sb.ID, sb.State)
			}
		}
	}

	t.Run("program", func(t *testing.T) {
		bin := filepath.Join(t.TempDir(), "example")
		build := exec.Command("go", "build", "-o", bin, ".")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
		cmd := exec.CommandContext(ctx, bin, "-runtime", runtime)
		cmd.Env = append(daemontest.CleanEnv(), client.EnvURL+"="+e.URL(), client.EnvAPIKey+"="+key)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("example: %v\n%s", err, stderr.String())
		}
		if stdout.String() != "{\"total\":25}\n" || !strings.Contains(stderr.String(), "("+runtime+")") {
			t.Errorf("stdout %q stderr %q", stdout.String(), stderr.String())
		}
		noneLeft(t)
	})

	t.Setenv(client.EnvURL, e.URL())
	t.Setenv(client.EnvAPIKey, key)
	tests := []struct {
		name    string
		model   Model
		runtime string
		wantErr string
	}{
		{"wrong answer", scriptModel(`print('{"total": 24}')`), runtime, "unexpected task output"},
		{"not json", scriptModel(`print("twenty-five")`), runtime, "unexpected task output"},
		{"crash", scriptModel(`raise SystemExit("boom")`), runtime, "the task failed (exit 1"},
		{"too much output", scriptModel(`print("x" * 5000)`), runtime, "exceeds the application's limit"},
		{"runs as user", scriptModel(`import os, json; print(json.dumps({"total": 25 if os.getuid() == 1000 else 0}))`), runtime, ""},
		{"on runc", stubModel{}, "runc", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var log bytes.Buffer
			out, err := run(ctx, tt.model, tt.runtime, &log)
			switch {
			case tt.wantErr == "" && (err != nil || out.Total != 25):
				t.Errorf("run: %+v, %v", out, err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("run: %+v, %v; want an error with %q", out, err, tt.wantErr)
			}
			noneLeft(t)
		})
	}

	t.Run("timeout", func(t *testing.T) {
		// The command timeout is the server's: the sleeping task is killed
		// at it, and the sandbox is deleted after.
		defer func(d time.Duration) { commandTimeout = d }(commandTimeout)
		commandTimeout = 2 * time.Second
		_, err := run(ctx, scriptModel("import time\ntime.sleep(600)\n"), runtime, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "ran past 2s") {
			t.Errorf("run: %v", err)
		}
		noneLeft(t)
	})
}

// TestExampleUsesOnlyTheSDK: the example builds against the SDK's modules
// alone, as a user's program does (no airlock internal package).
func TestExampleUsesOnlyTheSDK(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		switch {
		case p == "github.com/airlockhq/airlock/examples/go",
			strings.HasPrefix(p, "github.com/airlockhq/airlock/client"),
			strings.HasPrefix(p, "github.com/airlockhq/airlock/api"),
			strings.HasPrefix(p, "github.com/coder/websocket"):
		default:
			t.Errorf("the example imports %s", p)
		}
	}
}
