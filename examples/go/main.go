// Command example is the agent flow of an airlock backend, in Go: create a
// sandbox, check the runtime it got, write the script a model wrote, run it
// as the unprivileged user with a timeout, validate its JSON output before
// trusting it, and always delete the sandbox. The model call is stubbed: a
// fixed script, so that the path can be checked before a model is added.
//
//	export AIRLOCK_URL=http://127.0.0.1:7070 AIRLOCK_API_KEY=ak_…
//	go run ./examples/go -runtime gvisor
//
// The API key stays in this backend: nothing of it reaches the sandbox.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/airlockhq/airlock/client"
)

// Limits of the flow: the sandbox's life, and how much output the
// application accepts (more is an error, not a thing to parse).
const (
	sandboxTTL = 2 * time.Minute
	maxOutput  = 4096
)

// commandTimeout bounds the task; the server enforces it even if this
// backend is gone (a variable so that the test need not wait 30 s).
var commandTimeout = 30 * time.Second

// Model writes the code for a task. A real one calls an LLM; the backend
// treats what it returns as untrusted.
type Model interface {
	Script(ctx context.Context, task string) (string, error)
}

// stubModel returns a fixed script: a sum whose answer is known.
type stubModel struct{}

func (stubModel) Script(context.Context, string) (string, error) {
	return "import json\nvalues = [12, 8, 5]\nprint(json.dumps({'total': sum(values)}))\n", nil
}

// Output is the shape the task's result must have.
type Output struct {
	Total int `json:"total"`
}

func main() {
	runtime := flag.String("runtime", "gvisor", "the runtime the task requires: runc, gvisor or microvm")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), sandboxTTL)
	defer cancel()
	out, err := run(ctx, stubModel{}, *runtime, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
	json.NewEncoder(os.Stdout).Encode(out)
}

// run does the task in a fresh sandbox of runtime (on AIRLOCK_URL with
// AIRLOCK_API_KEY), logging its steps to log, and deletes the sandbox
// whatever happens.
func run(ctx context.Context, model Model, runtime string, log io.Writer) (_ *Output, err error) {
	sb, err := client.Create(ctx, client.WithTemplate("base"), client.WithRuntime(runtime), client.WithTTL(sandboxTTL))
	if err != nil {
		return nil, fmt.Errorf("creating a sandbox: %w", err)
	}
	// On a context of its own: a cancelled ctx must not leave it running.
	defer func() {
		if cerr := sb.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("deleting the sandbox: %w", cerr)
		}
	}()
	fmt.Fprintf(log, "sandbox %s (%s)\n", sb.ID(), sb.Info().Runtime)
	// The server never falls back to another runtime, but check what the
	// task got rather than what it asked for.
	if got := sb.Info().Runtime; got != runtime {
		return nil, fmt.Errorf("the task requires the %s runtime, the sandbox has %s", runtime, got)
	}

	script, err := model.Script(ctx, "sum 12, 8 and 5; print {\"total\": N} as JSON")
	if err != nil {
		return nil, fmt.Errorf("asking the model: %w", err)
	}
	if _, err := sb.Files().Write(ctx, "task.py", []byte(script)); err != nil {
		return nil, fmt.Errorf("writing the script: %w", err)
	}
	// An argv, no shell: nothing of the script's name is interpreted.
	res, err := sb.RunArgs(ctx, []string{"python3", "task.py"},
		client.WithUser("user"), client.WithTimeout(commandTimeout))
	if errors.Is(err, client.ErrExecTimeout) {
		return nil, fmt.Errorf("the task ran past %s", commandTimeout)
	}
	if err != nil {
		return nil, fmt.Errorf("running the task: %w", err)
	}
	if res.ExitCode != 0 || res.Truncated {
		return nil, fmt.Errorf("the task failed (exit %d, truncated %v): %.200s", res.ExitCode, res.Truncated, res.Stderr)
	}
	return validate([]byte(res.Stdout))
}

// validate parses the task's stdout as the one shape the application
// accepts: a JSON object with exactly the field total, whose value is 25.
// A zero exit alone does not prove the answer right.
func validate(stdout []byte) (*Output, error) {
	if len(stdout) > maxOutput {
		return nil, fmt.Errorf("the task's output (%d bytes) exceeds the application's limit", len(stdout))
	}
	dec := json.NewDecoder(bytes.NewReader(stdout))
	dec.DisallowUnknownFields()
	var out struct {
		Total *int `json:"total"`
	}
	if err := dec.Decode(&out); err != nil {
		return nil, fmt.Errorf("unexpected task output: %w", err)
	}
	if dec.More() {
		return nil, errors.New("unexpected task output: more than one JSON value")
	}
	if out.Total == nil || *out.Total != 25 {
		return nil, fmt.Errorf("unexpected task output: %q", bytes.TrimSpace(stdout))
	}
	return &Output{Total: *out.Total}, nil
}
