package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// CodeTarget is the target for a trivial cell in a warm context.
const CodeTarget = 20 * time.Millisecond

// codeWarmup is how many cells run before measuring: the first starts the
// kernel, the next few warm IPython's caches.
const codeWarmup = 5

// MeasureCode creates a sandbox of template (the code-interpreter template
// when ""), runs codeWarmup cells in its default python context, then
// times runs cells of `1+1` through the API (request to end event) and
// deletes the sandbox. It checks every answer is 2.
func MeasureCode(ctx context.Context, c *client.Client, template string, runs int) (_ Samples, err error) {
	if template == "" {
		template = "code-interpreter"
	}
	if runs <= 0 {
		runs = 50
	}
	sb, err := createWhenBuilt(ctx, c, api.CreateSandboxRequest{Template: template}, 15*time.Minute)
	if err != nil {
		return nil, fmt.Errorf("creating sandbox: %w", err)
	}
	defer func() {
		if derr := deleteSandbox(context.WithoutCancel(ctx), c, sb.ID); derr != nil && err == nil {
			err = derr
		}
	}()
	cell := api.CodeRequest{Code: "1+1"}
	samples := make(Samples, 0, runs)
	for i := 0; i < codeWarmup+runs; i++ {
		start := time.Now()
		ex, err := c.RunCode(ctx, sb.ID, cell, nil)
		d := time.Since(start)
		if err != nil {
			return nil, fmt.Errorf("running cell: %w", err)
		}
		if ex.Error != nil {
			return nil, fmt.Errorf("cell failed: %s: %s", ex.Error.Name, ex.Error.Value)
		}
		if ex.Text() != "2" {
			return nil, errors.New("cell `1+1` did not answer 2")
		}
		if i >= codeWarmup {
			samples = append(samples, d)
		}
	}
	return samples, nil
}

// CodeRow is the report row of MeasureCode's samples.
func CodeRow(s Samples) Row {
	judge := func(ok bool) *bool { return &ok }
	row := Row{Metric: metricCode, Target: "< 20 ms",
		Airlock: fmtP(s), Baseline: "absolute target", Ratio: math.NaN()}
	if len(s) > 0 {
		row.OK = judge(s.Percentile(50) < CodeTarget)
	}
	return row
}

// createWhenBuilt creates a sandbox, waiting while its template is being
// built on demand (a shipped template's first use answers unavailable with
// Retry-After until the build is done), at most wait.
func createWhenBuilt(ctx context.Context, c *client.Client, req api.CreateSandboxRequest, wait time.Duration) (*api.Sandbox, error) {
	deadline := time.Now().Add(wait)
	for {
		sb, err := c.CreateSandbox(ctx, req)
		if err == nil || !client.TemplateBuilding(err) || time.Now().After(deadline) {
			return sb, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Second):
		}
	}
}
