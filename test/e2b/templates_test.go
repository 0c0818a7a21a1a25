package e2btest

import (
	"bytes"
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/daemon"
	"github.com/airlockhq/airlock/internal/testutil/daemontest"
)

// templateScenarioTimeout bounds one scenario of templates.mjs: each build
// from base starts a build sandbox per RUN step (seconds each here).
const templateScenarioTimeout = 8 * time.Minute

// TestSDKTemplates runs each scenario of templates.mjs, the published SDK's
// Template() builder (e2b@2.51.0), against airlock's templates API: builds
// from E2B's base image and from templates, uploads of COPY's files, logs,
// exists, tags, sandboxes from the result, and the builds that cannot run
// here.
//
//	go test -race -run 'TestSDKTemplates/build' ./test/e2b/
func TestSDKTemplates(t *testing.T) {
	dir := nodeModules(t)
	d := daemontest.Start(t, daemontest.Options{Prefix: "airlock-e2bt-", Daemon: daemon.Options{NoNetwork: true}})
	key, other := d.Key(t, "e2b-templates"), d.Key(t, "e2b-templates-other")
	for _, name := range []string{"build", "background", "errors"} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), templateScenarioTimeout)
			defer cancel()
			cmd := exec.CommandContext(ctx, "node", "templates.mjs", name)
			cmd.Dir = dir
			cmd.Env = append(daemontest.CleanEnv(), "E2B_API_URL="+d.URL(), "E2B_SANDBOX_URL="+d.URL(),
				"E2B_API_KEY="+key, "OTHER_API_KEY="+other)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				t.Fatalf("scenario %s: %v\n%s", name, err, out.String())
			}
		})
	}
}
