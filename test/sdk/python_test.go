package sdk_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/errdefs/edge"
	"github.com/airlockhq/airlock/internal/testutil"
	"github.com/airlockhq/airlock/internal/testutil/daemontest"
)

// Timeouts of the Python runs.
const (
	// pyUnitTimeout bounds the SDK's pure unit tests (well under a second).
	pyUnitTimeout = 2 * time.Minute
	// pySuiteTimeout bounds the SDK's suite against the daemon: a few dozen
	// sandboxes, the first code cell of a code-interpreter sandbox (kernel
	// start, matplotlib's font cache) the slowest part; about a minute here.
	pySuiteTimeout = 10 * time.Minute
	// pyExampleTimeout bounds one run of the example (one base sandbox).
	pyExampleTimeout = 3 * time.Minute
)

// sdkDir is sdk/python of this tree.
func sdkDir(t *testing.T) string {
	t.Helper()
	d, err := filepath.Abs(filepath.Join("..", "..", "sdk", "python"))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// python returns the python3 on PATH (a failure in CI: `make deps` installs it).
func python(t *testing.T) string {
	t.Helper()
	return testutil.RequiresBinary(t, "python3")
}

// runPython runs python3 args in dir with env and returns its combined
// output, failing the test (with that output) when it exits non-zero.
func runPython(t *testing.T, timeout time.Duration, dir string, env []string, args ...string) string {
	t.Helper()
	out, err := tryPython(t, timeout, dir, env, args...)
	if err != nil {
		t.Fatalf("python3 %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func tryPython(t *testing.T, timeout time.Duration, dir string, env []string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, python(t), args...)
	cmd.Dir = dir
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("python3 %s: no end within %v\n%s", strings.Join(args, " "), timeout, out.String())
	}
	return out.String(), err
}

// pyEnv is the environment of a Python child: no AIRLOCK_*/E2B_*/proxy
// variables of ours, no bytecode written into the tree, the given
// PYTHONPATH and extra variables.
func pyEnv(pythonPath string, extra ...string) []string {
	env := []string{"PYTHONDONTWRITEBYTECODE=1", "PYTHONPATH=" + pythonPath, "PYTHONUNBUFFERED=1"}
	for _, kv := range daemontest.CleanEnv() {
		if !strings.HasPrefix(kv, "PYTHONPATH=") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// unittestOK fails unless out is a unittest run that ran tests, all of
// which passed, none skipped: a skipped SDK test would hide a broken call.
func unittestOK(t *testing.T, out string) {
	t.Helper()
	m := regexp.MustCompile(`(?m)^Ran (\d+) tests? in`).FindStringSubmatch(out)
	if m == nil || m[1] == "0" {
		t.Fatalf("unittest ran no test:\n%s", out)
	}
	if !regexp.MustCompile(`(?m)^OK$`).MatchString(out) {
		t.Fatalf("unittest did not pass (skipped tests count as failures here):\n%s", out)
	}
	t.Logf("python unittest: ran %s tests, OK", m[1])
}

// TestPythonUnit runs the SDK's unit tests, which need no daemon: error
// mapping, SSE parsing, WebSocket framing against an in-process server, the
// stdlib build backend.
func TestPythonUnit(t *testing.T) {
	dir := sdkDir(t)
	out := runPython(t, pyUnitTimeout, dir, pyEnv(dir), "-m", "unittest", "discover", "-s", "tests", "-t", "tests", "-p", "test_unit*.py", "-v")
	unittestOK(t, out)
}

// TestPythonErrorCodes: every API error code the server sends maps in the
// Python SDK to a class of its own (not the base class for unknown codes),
// of the same kind as the Go SDK's (not found, conflict, …), and retryable
// exactly when the server's answer is.
func TestPythonErrorCodes(t *testing.T) {
	type row struct {
		Code      string `json:"code"`
		Status    int    `json:"status"`
		Kind      string `json:"kind"`
		Retryable bool   `json:"retryable"`
	}
	// The Python classes each Go SDK class corresponds to.
	kinds := []struct {
		goClass error
		pyKind  string
	}{
		{client.ErrInvalidArgument, "InvalidRequest"},
		{client.ErrUnauthenticated, "Unauthorized"},
		{client.ErrPermissionDenied, "PermissionDenied"},
		{client.ErrNotFound, "NotFound"},
		{client.ErrInvalidState, "InvalidState"},
		{client.ErrConflict, "Conflict"},
		{client.ErrTooLarge, "PayloadTooLarge"},
		{client.ErrQuotaExceeded, "QuotaExceeded"},
		{client.ErrRateLimited, "RateLimited"},
		{client.ErrCapacityExhausted, "CapacityExhausted"},
		{client.ErrRuntimeUnavailable, "RuntimeUnavailable"},
		{client.ErrUnavailable, "Unavailable"},
		{client.ErrNotImplemented, "NotSupported"},
		{client.ErrInternal, "InternalError"},
	}
	var in []row
	seen := map[string]bool{}
	for _, c := range append(append([]edge.Class{}, edge.Table...), edge.Internal, edge.Timeout, edge.MethodNotAllowed) {
		ae := &client.APIError{StatusCode: c.Status, Code: c.Code}
		kind := ""
		for _, k := range kinds {
			if ae.Class() == k.goClass {
				kind = k.pyKind
				break
			}
		}
		if kind == "" {
			t.Fatalf("code %s: the Go SDK's class %v has no Python counterpart in this test", c.Code, ae.Class())
		}
		// A code several rows share is its least specific row's (as in
		// TestSDKAgrees); the status may differ (runtime_unavailable is
		// 400 or 503): each (code, status) is checked.
		key := fmt.Sprint(c.Code, c.Status)
		if seen[key] {
			continue
		}
		seen[key] = true
		in = append(in, row{Code: c.Code, Status: c.Status, Kind: kind, Retryable: edge.Retryable(c.Status)})
	}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	const check = `
import json, sys
import airlock
from airlock._errors import CODE_CLASSES, error_for
bad = []
for r in json.loads(sys.stdin.read()):
    if r["code"] not in CODE_CLASSES:
        bad.append("%s: unknown to the SDK (it would be the base class)" % r["code"])
        continue
    e = error_for(r["code"], r["status"])
    want = getattr(airlock, r["kind"])
    if not isinstance(e, want):
        bad.append("%s %d: %s, want a kind of %s" % (r["code"], r["status"], type(e).__name__, r["kind"]))
    if e.retryable != r["retryable"]:
        bad.append("%s %d: retryable %s in the SDK, %s on the server" % (r["code"], r["status"], e.retryable, r["retryable"]))
    if not isinstance(e, airlock.AirlockError):
        bad.append("%s: not an AirlockError" % r["code"])
print("\n".join(bad) or "ok")
`
	dir := sdkDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), pyUnitTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, python(t), "-c", check)
	cmd.Dir, cmd.Env, cmd.Stdin = dir, pyEnv(dir), bytes.NewReader(b)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "ok" {
		t.Fatalf("the Python SDK disagrees with the server's error table:\n%s", got)
	}
}

// installSDK installs sdk/python with pip, offline (no index: the package's
// own build backend needs nothing), into a temp dir, and returns it: the
// suite and the example then run against the installed package, as a user
// has it. Without pip (Debian's python3 without python3-pip) the source
// directory is used.
func installSDK(t *testing.T) string {
	t.Helper()
	dir := sdkDir(t)
	if _, err := tryPython(t, pyUnitTimeout, dir, pyEnv(""), "-m", "pip", "--version"); err != nil {
		t.Logf("no pip: the SDK runs from %s", dir)
		return dir
	}
	// pip builds in a copy when the tree is read-only; --target keeps it
	// out of the system's site-packages.
	target := t.TempDir()
	runPython(t, pySuiteTimeout, t.TempDir(), pyEnv("", "PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_NO_CACHE_DIR=1"),
		"-m", "pip", "install", "--no-index", "--no-deps", "--target", target, dir)
	// The package must come from there, not from the tree.
	got := strings.TrimSpace(runPython(t, pyUnitTimeout, t.TempDir(), pyEnv(target), "-c", "import airlock; print(airlock.__file__)"))
	if !strings.HasPrefix(got, target+string(filepath.Separator)) {
		t.Fatalf("installed SDK imports from %s, not from the pip target %s", got, target)
	}
	for _, f := range []string{"py.typed", "_ws.py", "_async.py"} {
		if _, err := os.Stat(filepath.Join(target, "airlock", f)); err != nil {
			t.Fatalf("the installed package lacks %s: %v", f, err)
		}
	}
	return target
}

// TestPythonSDK runs the SDK's suite (tests/test_daemon*.py) and the example
// (examples/python) against a real daemon with the code-interpreter
// template, as one tenant, with another tenant's key for the isolation
// checks. The SDK is installed with pip first.
func TestPythonSDK(t *testing.T) {
	python(t)
	e := daemontest.Start(t, daemontest.Options{Templates: []string{"code-interpreter"}})
	key, other := e.Key(t, "py-sdk"), e.Key(t, "py-other")
	pkg := installSDK(t)
	env := pyEnv(pkg, "AIRLOCK_URL="+e.URL(), "AIRLOCK_API_KEY="+key, "AIRLOCK_TEST_OTHER_KEY="+other)
	tests := filepath.Join(sdkDir(t), "tests")

	t.Run("unittest", func(t *testing.T) {
		// The top-level dir is tests/ itself: sdk/python (the source) is
		// not put on sys.path, so the installed copy is what runs.
		out := runPython(t, pySuiteTimeout, t.TempDir(), env, "-m", "unittest", "discover", "-s", tests, "-t", tests, "-p", "test_daemon*.py", "-v")
		unittestOK(t, out)
	})

	example := filepath.Join(sdkDir(t), "..", "..", "examples", "python", "agent_flow.py")
	exampleEnv := pyEnv(pkg, "AIRLOCK_URL="+e.URL(), "AIRLOCK_API_KEY="+key)
	noneLeft := func(t *testing.T) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var left []string
		for sb, err := range e.Client(key).Sandboxes(ctx, client.ListOptions{}) {
			if err != nil {
				t.Fatal(err)
			}
			if sb.State != "stopped" {
				left = append(left, sb.ID+" "+sb.State)
			}
		}
		if len(left) > 0 {
			t.Fatalf("the example left sandboxes behind: %v", left)
		}
	}

	t.Run("example", func(t *testing.T) {
		out := runPython(t, pyExampleTimeout, t.TempDir(), exampleEnv, example)
		// The validated output of the task, as the example prints it.
		if !strings.Contains(out, `{"total": 25}`) {
			t.Fatalf("example output lacks the task's result {\"total\": 25}:\n%s", out)
		}
		noneLeft(t)
	})

	t.Run("example-timeout", func(t *testing.T) {
		// A task whose script never ends: the command's timeout kills it,
		// the example reports the failure and still deletes its sandbox.
		out, err := tryPython(t, pyExampleTimeout, t.TempDir(), exampleEnv, example, "--timeout", "2", "loop forever")
		var ee *exec.ExitError
		if err == nil || !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("example with a task that does not end: %v, want exit status 1\n%s", err, out)
		}
		if !strings.Contains(out, "timed out") {
			t.Fatalf("example did not report the timeout:\n%s", out)
		}
		noneLeft(t)
	})

	t.Run("example-bad-output", func(t *testing.T) {
		// A script whose output is not the expected JSON shape is refused.
		out, err := tryPython(t, pyExampleTimeout, t.TempDir(), exampleEnv, example, "print a greeting")
		var ee *exec.ExitError
		if err == nil || !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("example with output of the wrong shape: %v, want exit status 1\n%s", err, out)
		}
		if !slices.ContainsFunc(strings.Split(out, "\n"), func(l string) bool { return strings.Contains(l, "unexpected task output") }) {
			t.Fatalf("example did not refuse the output:\n%s", out)
		}
		noneLeft(t)
	})
}
