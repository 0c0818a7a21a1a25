package bench

import (
	"context"
	"fmt"

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
	fmt.Fprintf(cfg.Progress, "gvisor create → first result, beside bare runsc: %d runs\n", cfg.CreateRuns)
	for i := -1; i < cfg.CreateRuns; i++ {
		d, err := coldCreate(ctx, cfg.Client, creq)
		if err != nil {
			return nil, nil, notes, err
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
	return ociBaseline(ctx, "runsc", runscPath, []string{"--platform=" + platform, "--network=none"}, rootfs, workDir)
}
