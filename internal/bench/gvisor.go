package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/airlockhq/airlock/api"
)

// GVisorCreate measures a gvisor sandbox's cold create → first command
// result through the API, cfg.CreateRuns times after one unmeasured round,
// each sample followed by one bare `runsc run` of /bin/true in cfg.Rootfs
// on the same platform (see runscBaseline), so that both see the same
// load. The target is create ≤ 1.5× bare. bare is nil, with the reason in
// notes, when the baseline cannot run (no rootfs, not root, no runsc).
// runscPath "" means "runsc" on PATH; platform "" means ptrace.
func GVisorCreate(ctx context.Context, cfg Config, runscPath, platform string) (create, bare Samples, notes []string, err error) {
	cfg.defaults()
	if runscPath == "" {
		runscPath = "runsc"
	}
	if platform == "" {
		platform = "ptrace"
	}
	var b *baseline
	if cfg.Rootfs == "" {
		notes = append(notes, "bare runsc baseline skipped: no --rootfs given")
	} else if b, err = runscBaseline(ctx, runscPath, platform, cfg.Rootfs, cfg.WorkDir); err != nil {
		notes = append(notes, "bare runsc baseline failed: "+err.Error())
		b, err = nil, nil
	}
	defer func() { b.finish() }() // on an early return; nil once done

	creq := api.CreateSandboxRequest{Template: cfg.Template, Runtime: "gvisor"}
	trueReq := api.ExecRequest{Cmd: []string{"true"}}
	fmt.Fprintf(cfg.Progress, "gvisor create → first result, beside bare runsc: %d runs\n", cfg.CreateRuns)
	for i := -1; i < cfg.CreateRuns; i++ {
		start := time.Now()
		sbx, err := cfg.Client.CreateSandbox(ctx, creq)
		if err != nil {
			return nil, nil, notes, fmt.Errorf("creating gvisor sandbox: %w", err)
		}
		res, err := cfg.Client.Exec(ctx, sbx.ID, trueReq)
		d := time.Since(start)
		derr := deleteSandbox(ctx, cfg.Client, sbx.ID)
		if err != nil {
			return nil, nil, notes, fmt.Errorf("first command: %w", err)
		}
		if err := succeeded(res); err != nil {
			return nil, nil, notes, fmt.Errorf("first command: %w", err)
		}
		if derr != nil {
			return nil, nil, notes, derr
		}
		if i >= 0 {
			create = append(create, d)
		}
		b.sample(ctx, i >= 0)
	}
	bare, note := b.finish()
	if note != "" {
		notes = append(notes, note)
	}
	b = nil
	return create, bare, notes, nil
}

// runscBaseline times `runsc run` of /bin/true in rootfs with runsc's
// default spec, on platform, without a network stack (--network=none, as
// airlock runs a sandbox of network mode none): what a gVisor sandbox costs
// before anything airlock adds.
func runscBaseline(ctx context.Context, runscPath, platform, rootfs, workDir string) (*baseline, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("needs root")
	}
	if _, err := exec.LookPath(runscPath); err != nil {
		return nil, err
	}
	if fi, err := os.Stat(filepath.Join(rootfs, "bin", "true")); err != nil || fi.IsDir() {
		return nil, fmt.Errorf("rootfs %s has no /bin/true", rootfs)
	}
	dir, err := os.MkdirTemp(workDir, "airlock-bench-runsc-")
	if err != nil {
		return nil, err
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	group := "airlock-bench-" + hex.EncodeToString(b)
	cleanup := func() error {
		err := removeCgroups(group)
		return errors.Join(err, os.RemoveAll(dir))
	}
	bundle, state := filepath.Join(dir, "bundle"), filepath.Join(dir, "state")
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		cleanup()
		return nil, err
	}
	if out, err := exec.CommandContext(ctx, runscPath, "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		cleanup()
		return nil, fmt.Errorf("runsc spec: %v: %s", err, out)
	}
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		cleanup()
		return nil, err
	}
	i := 0
	return &baseline{
		name: "bare runsc",
		once: func(ctx context.Context) (time.Duration, error) {
			id := fmt.Sprintf("%s-%d", group, i)
			i++
			if err := writeSpec(filepath.Join(bundle, "config.json"), rootfs, "/"+group+"/"+id); err != nil {
				return 0, err
			}
			cmd := exec.CommandContext(ctx, runscPath, "--root", state, "--platform="+platform, "--network=none",
				"run", "--bundle", bundle, id)
			// Never a pipe: runsc hands its stdio to the container.
			cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, devnull, devnull
			start := time.Now()
			err := cmd.Run()
			d := time.Since(start)
			if err != nil {
				_ = exec.Command(runscPath, "--root", state, "delete", "--force", id).Run()
				return 0, fmt.Errorf("runsc run: %w", err)
			}
			return d, nil
		},
		close: func() error {
			devnull.Close()
			return cleanup()
		},
	}, nil
}
