package e2btest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/airlockhq/airlock/internal/daemon"
	"github.com/airlockhq/airlock/internal/plane/e2b"
	"github.com/airlockhq/airlock/internal/service/code"
	"github.com/airlockhq/airlock/internal/testutil"
	"github.com/airlockhq/airlock/internal/testutil/daemontest"
)

// Timeouts of the suite's own waits.
const (
	// npmTimeout bounds `npm ci` of the two pinned packages (26 small
	// packages; seconds on a normal link).
	npmTimeout = 5 * time.Minute
	// scenarioTimeout bounds one SDK scenario; the slowest (runCode with a
	// matplotlib chart, whose first import builds the font cache) takes
	// well under a minute here.
	scenarioTimeout = 4 * time.Minute
)

var _ e2b.CodeService = (*code.Service)(nil)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// nodeModules installs the pinned SDKs (package-lock.json) with `npm ci`
// unless they are there, and returns the directory to run node in.
func nodeModules(t *testing.T) string {
	t.Helper()
	testutil.RequiresBinary(t, "node")
	testutil.RequiresBinary(t, "npm")
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	pkg := func(name string) string { return filepath.Join(dir, "node_modules", name, "package.json") }
	if _, err := os.Stat(pkg("e2b")); err == nil {
		if _, err := os.Stat(pkg("@e2b/code-interpreter")); err == nil {
			return dir
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), npmTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		// The registry may be out of reach (an offline host): a skip there,
		// a failure in CI, which must be able to install the pinned SDKs.
		testutil.HostLacks(t, "npm ci of the pinned e2b SDKs failed (%v):\n%s", err, out)
	}
	return dir
}

// env is airlock's daemon (internal/testutil/daemontest: the E2B planes,
// the runc driver and the code interpreter) on 127.0.0.1, and an API key of
// the suite's tenant.
type env struct {
	url string
	key string
}

func startEnv(t *testing.T) *env {
	t.Helper()
	// Two scenarios need the code-interpreter template (built into the
	// shared cache once per machine).
	d := daemontest.Start(t, daemontest.Options{Prefix: "airlock-e2b-", Templates: []string{"code-interpreter"},
		Daemon: daemon.Options{NoNetwork: true}})
	return &env{url: d.URL(), key: d.Key(t, "e2b-sdk")}
}

// TestSDK runs each scenario of scenarios.mjs with the published SDKs
// (e2b@2.51.0, @e2b/code-interpreter@2.8.0) against airlock:
//
//	go test -race -run 'TestSDK/commandsKill' ./test/e2b/
func TestSDK(t *testing.T) {
	dir := nodeModules(t)
	e := startEnv(t)
	// ports and runCode use the code-interpreter template (startEnv
	// builds it).
	scenarios := []struct {
		name string
	}{
		{name: "lifecycle"},
		{name: "twoSandboxes"},
		{name: "commandsForeground"},
		{name: "commandsBackground"},
		{name: "commandsStdin"},
		{name: "commandsTimeout"},
		{name: "commandsKill"},
		{name: "pty"},
		{name: "files"},
		{name: "filesWatch"},
		{name: "setTimeout"},
		{name: "pauseResume"},
		{name: "snapshots"},
		{name: "fork"},
		{name: "autoPause"},
		{name: "signedURLsAndMetadata"},
		{name: "ports"},
		{name: "runCode"},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), scenarioTimeout)
			defer cancel()
			cmd := exec.CommandContext(ctx, "node", "scenarios.mjs", sc.name)
			cmd.Dir = dir
			cmd.Env = append(daemontest.CleanEnv(), "E2B_API_URL="+e.url, "E2B_SANDBOX_URL="+e.url, "E2B_API_KEY="+e.key)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				t.Fatalf("scenario %s: %v\n%s", sc.name, err, out.String())
			}
		})
	}
}
