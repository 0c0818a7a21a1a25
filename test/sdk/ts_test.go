package sdk_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/errdefs/edge"
	"github.com/airlockhq/airlock/internal/testutil"
	"github.com/airlockhq/airlock/internal/testutil/daemontest"
)

// Timeouts of the TypeScript SDK's tests.
const (
	// tsNPMTimeout bounds `npm ci` of the pinned dev dependencies
	// (typescript and @types/node: three packages, seconds on a normal link).
	tsNPMTimeout = 5 * time.Minute
	// tsToolTimeout bounds one tsc run (a few seconds here).
	tsToolTimeout = 3 * time.Minute
	// tsSuiteTimeout bounds one `node --test` run against the daemon: a few
	// dozen sandboxes, a code-interpreter kernel's first start and a chart
	// (whose first import builds matplotlib's font cache) take a minute or
	// two here; a loaded CI machine gets ample margin.
	tsSuiteTimeout = 12 * time.Minute
	// tsExampleTimeout bounds the example's run (one sandbox, one script).
	tsExampleTimeout = 3 * time.Minute
)

// tsErrorClasses is the TypeScript SDK's class for each API error code the
// server sends (sdk/ts/src/errors.ts). TestTSUnit hands the server's own
// table (internal/errdefs/edge) to the SDK's unit tests, which check that
// the SDK maps every code to this class; a code the server adds fails here
// until both say what it is.
var tsErrorClasses = map[string]string{
	api.CodeSandboxNotFound:       "SandboxNotFoundError",
	api.CodeExecNotFound:          "ExecNotFoundError",
	api.CodeTemplateNotFound:      "TemplateNotFoundError",
	api.CodeNotFound:              "NotFoundError",
	api.CodeTemplateUnsupported:   "TemplateUnsupportedError",
	api.CodeCapabilityUnsupported: "CapabilityUnsupportedError",
	api.CodeTemplateBuildFailed:   "TemplateBuildFailedError",
	api.CodeInvalidArgument:       "InvalidRequestError",
	api.CodeUnauthenticated:       "UnauthorizedError",
	api.CodePermissionDenied:      "PermissionDeniedError",
	api.CodeConflict:              "ConflictError",
	api.CodeInvalidState:          "InvalidStateError",
	api.CodePayloadTooLarge:       "PayloadTooLargeError",
	api.CodeQuotaExceeded:         "QuotaExceededError",
	api.CodeRateLimited:           "RateLimitedError",
	api.CodeCapacityExhausted:     "CapacityExhaustedError",
	api.CodeRuntimeUnavailable:    "RuntimeUnavailableError",
	api.CodeAgentUnavailable:      "AgentUnavailableError",
	api.CodeTemplateBuilding:      "TemplateBuildingError",
	api.CodeUnavailable:           "UnavailableError",
	api.CodeNotImplemented:        "NotImplementedError",
	api.CodeInternal:              "InternalError",
	api.CodeMethodNotAllowed:      "InvalidRequestError",
}

// tsCode is one row of the server's error table as the SDK's tests get it.
type tsCode struct {
	Code       string `json:"code"`
	Status     int    `json:"status"`
	Class      string `json:"class"`
	RetryAfter bool   `json:"retry_after"`
}

// tsServerCodes lists every (code, status) the HTTP API answers with and
// the class the SDK must make of it.
func tsServerCodes(t *testing.T) []tsCode {
	t.Helper()
	rows := append(append([]edge.Class{}, edge.Table...), edge.Internal, edge.Timeout, edge.MethodNotAllowed)
	var out []tsCode
	for _, row := range rows {
		cls, ok := tsErrorClasses[row.Code]
		if !ok {
			t.Fatalf("the server answers code %s (%d) and the TypeScript SDK has no class for it: add it to sdk/ts/src/errors.ts and tsErrorClasses", row.Code, row.Status)
		}
		c := tsCode{Code: row.Code, Status: row.Status, Class: cls, RetryAfter: row.RetryAfter > 0}
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}

// tsDirs returns the absolute sdk/ts and examples/ts directories.
func tsDirs(t *testing.T) (sdk, example string) {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "sdk", "ts"), filepath.Join(root, "examples", "ts")
}

// tsExec runs a command in dir with env and returns its output (stdout
// and stderr together) and exit code; it fails the test if the command
// cannot run or outlives timeout.
func tsExec(t *testing.T, timeout time.Duration, dir string, env []string, name string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, env
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %s in %s: no end within %v\n%s", name, strings.Join(args, " "), dir, timeout, out.String())
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("%s %s in %s: %v\n%s", name, strings.Join(args, " "), dir, err, out.String())
	}
	return out.String(), cmd.ProcessState.ExitCode()
}

// tsRun is tsExec of a command that must succeed.
func tsRun(t *testing.T, timeout time.Duration, dir string, env []string, name string, args ...string) string {
	t.Helper()
	out, code := tsExec(t, timeout, dir, env, name, args...)
	if code != 0 {
		t.Fatalf("%s %s in %s: exit status %d\n%s", name, strings.Join(args, " "), dir, code, out)
	}
	return out
}

// tsNPMCI installs dir's pinned packages (package-lock.json) with `npm ci`
// unless node_modules holds them already. The registry may be out of
// reach: a skip there, a failure in CI, which must be able to install them.
func tsNPMCI(t *testing.T, dir string) {
	t.Helper()
	testutil.RequiresBinary(t, "npm")
	if tsInstalled(dir) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), tsNPMTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir, cmd.Env = dir, daemontest.CleanEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		testutil.HostLacks(t, "npm ci in %s failed (%v):\n%s", dir, err, out)
	}
}

// tsInstalled reports whether node_modules has every package of dir's
// package-lock.json at its locked version (links included).
func tsInstalled(dir string) bool {
	raw, err := os.ReadFile(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		return false
	}
	var lock struct {
		Packages map[string]struct {
			Version string `json:"version"`
			Link    bool   `json:"link"`
		} `json:"packages"`
	}
	if json.Unmarshal(raw, &lock) != nil {
		return false
	}
	for p, pkg := range lock.Packages {
		if !strings.HasPrefix(p, "node_modules/") {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(dir, p, "package.json"))
		if err != nil {
			return false
		}
		var got struct {
			Version string `json:"version"`
		}
		if json.Unmarshal(raw, &got) != nil || (!pkg.Link && got.Version != pkg.Version) {
			return false
		}
	}
	return true
}

// tsTests lists the test files under dir (relative to the SDK's directory).
func tsTests(t *testing.T, sdk, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(filepath.Join(sdk, dir), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".test.mjs") {
			rel, _ := filepath.Rel(sdk, p)
			files = append(files, rel)
		}
		return err
	})
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files under %s (%v)", filepath.Join(sdk, dir), err)
	}
	return files
}

// tsSummary is the closing counts of node's TAP output, for the log.
func tsSummary(out string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		for _, p := range []string{"# tests ", "# pass ", "# fail ", "# skipped ", "# todo "} {
			if strings.HasPrefix(l, p) {
				keep = append(keep, strings.TrimPrefix(l, "# "))
			}
		}
	}
	return strings.Join(keep, ", ")
}

// tsNoSkips fails the test when node skipped a test: a test skips only
// when it runs without a daemon, and here it has one.
func tsNoSkips(t *testing.T, out string) {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "# skipped ") && strings.TrimSpace(strings.TrimPrefix(l, "# skipped ")) != "0" {
			t.Fatalf("node skipped tests with a daemon there:\n%s", out)
		}
	}
}

// TestTSUnit runs the SDK's tests that need no daemon (error mapping
// against the server's own table, SSE and NDJSON parsing, WebSocket
// framing and handshake, stream re-attach) on the committed build.
func TestTSUnit(t *testing.T) {
	testutil.RequiresBinary(t, "node")
	sdk, _ := tsDirs(t)
	codes, err := json.Marshal(tsServerCodes(t))
	if err != nil {
		t.Fatal(err)
	}
	env := append(daemontest.CleanEnv(), "AIRLOCK_TEST_ERROR_CODES="+string(codes))
	args := append([]string{"--test"}, tsTests(t, sdk, "test/unit")...)
	out := tsRun(t, tsToolTimeout, sdk, env, "node", args...)
	t.Logf("node --test test/unit: %s", tsSummary(out))
	if !strings.Contains(out, "# fail 0") {
		t.Fatalf("node reported failures:\n%s", out)
	}
}

// TestTSBuild checks that the committed dist/ is what tsc makes of src/
// (users install the package without building it) and that the shipped
// .d.ts type-check a program that uses the SDK's whole surface.
func TestTSBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("installs the pinned TypeScript from the npm registry; `make test` runs it")
	}
	testutil.RequiresBinary(t, "node")
	sdk, _ := tsDirs(t)
	tsNPMCI(t, sdk)
	out := t.TempDir()
	env := daemontest.CleanEnv()
	tsRun(t, tsToolTimeout, sdk, env, "node", "node_modules/typescript/bin/tsc", "-p", "tsconfig.json", "--outDir", out)
	built := map[string]bool{}
	err := filepath.WalkDir(out, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(out, p)
		built[rel] = true
		want, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		got, err := os.ReadFile(filepath.Join(sdk, "dist", rel))
		if err != nil {
			t.Errorf("dist/%s is missing: run `npm run build` in sdk/ts and commit dist/", rel)
			return nil
		}
		if !bytes.Equal(got, want) {
			t.Errorf("dist/%s is not what tsc builds from src/: run `npm run build` in sdk/ts and commit dist/", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(filepath.Join(sdk, "dist"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !built[e.Name()] {
			t.Errorf("dist/%s is built from no source: remove it", e.Name())
		}
	}
	tsRun(t, tsToolTimeout, sdk, env, "node", "node_modules/typescript/bin/tsc", "-p", "test/types/tsconfig.json")
}

// tsEnv starts a daemon for the SDK's tests and returns the environment of
// their node process: the server and a tenant's key, plus the keys some
// tests need (an admin's, a tenant's with a quota of one sandbox, one with
// a request rate limit).
func tsEnv(t *testing.T) (*daemontest.Env, []string) {
	t.Helper()
	testutil.RequiresBinary(t, "node")
	e := daemontest.Start(t, daemontest.Options{Templates: []string{"code-interpreter"}, Prefix: "airlock-ts-"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	one := 1
	if _, err := e.Admin().SetTenantQuotas(ctx, "ts-quota", api.QuotaOverride{Sandboxes: &one}); err != nil {
		t.Fatalf("setting the quota tenant's quota: %v", err)
	}
	rps, burst := 0.01, 2
	rated, err := e.Admin().CreateKey(ctx, api.CreateKeyRequest{Tenant: "ts-rate", Name: "rate", RateLimitRPS: &rps, RateLimitBurst: &burst})
	if err != nil {
		t.Fatalf("creating the rate-limited key: %v", err)
	}
	return e, append(daemontest.CleanEnv(),
		"AIRLOCK_URL="+e.URL(),
		"AIRLOCK_API_KEY="+e.Key(t, "ts-sdk"),
		"AIRLOCK_TEST_OTHER_KEY="+e.Key(t, "ts-other"),
		"AIRLOCK_TEST_QUOTA_KEY="+e.Key(t, "ts-quota"),
		"AIRLOCK_TEST_RATE_KEY="+rated.Key,
		"AIRLOCK_TEST_DAEMON=1",
	)
}

// TestTSSDK runs the SDK's tests against a real daemon (runc sandboxes,
// the code-interpreter template): every call of the SDK's surface.
func TestTSSDK(t *testing.T) {
	_, env := tsEnv(t)
	sdk, _ := tsDirs(t)
	args := append([]string{"--test"}, tsTests(t, sdk, "test/daemon")...)
	out := tsRun(t, tsSuiteTimeout, sdk, env, "node", args...)
	t.Logf("node --test test/daemon: %s", tsSummary(out))
	if !strings.Contains(out, "# fail 0") {
		t.Fatalf("node reported failures:\n%s", out)
	}
	tsNoSkips(t, out)
}

// TestTSExample runs examples/ts (the agent flow of the seed documents,
// the model call stubbed) against a real daemon, as a user would run it:
// a task whose script prints the expected JSON, one that loops past its
// timeout and one whose output is not JSON; none leaves a sandbox behind.
func TestTSExample(t *testing.T) {
	e, env := tsEnv(t)
	_, example := tsDirs(t)
	// The example depends on the SDK by path: npm ci links it, offline.
	tsNPMCI(t, example)

	out := tsRun(t, tsExampleTimeout, example, env, "node", "agent.mjs")
	if out != "{\"total\":25}\n" {
		t.Fatalf("the example printed %q, want its validated result {\"total\":25}", out)
	}
	out, code := tsExec(t, tsExampleTimeout, example, env, "node", "agent.mjs", "loop forever", "--timeout", "2")
	if code != 1 || !strings.Contains(out, "task timed out after 2s and was killed") {
		t.Fatalf("a looping task: exit %d, output %q; want 1 and the timeout", code, out)
	}
	out, code = tsExec(t, tsExampleTimeout, example, env, "node", "agent.mjs", "say hello")
	if code != 1 || !strings.Contains(out, "unexpected task output: not JSON") {
		t.Fatalf("a task whose output is not JSON: exit %d, output %q; want 1 and the refusal", code, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for sb, err := range e.Admin().Sandboxes(ctx, client.ListOptions{}) {
		if err != nil {
			t.Fatal(err)
		}
		t.Errorf("the example left sandbox %s (%s) behind", sb.ID, sb.State)
	}
}
