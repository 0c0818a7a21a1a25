package e2btest

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/runc"
	"github.com/airlockhq/airlock/internal/hostcheck"
	"github.com/airlockhq/airlock/internal/hostslot"
	"github.com/airlockhq/airlock/internal/plane/e2b"
	"github.com/airlockhq/airlock/internal/plane/httpapi"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/service/code"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testutil"
)

// Timeouts of the suite's own waits.
const (
	// npmTimeout bounds `npm ci` of the two pinned packages (26 small
	// packages; seconds on a normal link).
	npmTimeout = 5 * time.Minute
	// templateTimeout bounds building a shipped template that the cache
	// lacks (debootstrap and apt: minutes).
	templateTimeout = 20 * time.Minute
	// scenarioTimeout bounds one SDK scenario; the slowest (runCode with a
	// matplotlib chart, whose first import builds the font cache) takes
	// well under a minute here.
	scenarioTimeout = 4 * time.Minute
)

var _ e2b.CodeService = (*code.Service)(nil)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// buildAgent is the static airlock-agent the sandboxes run.
func buildAgent(t testing.TB) string { return testutil.BuildAgent(t) }

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

// env is airlock's server with the E2B planes, the runc driver and the code
// interpreter, on 127.0.0.1.
type env struct {
	url string
	key string
	log *logBuffer
}

// logBuffer keeps the daemon log for a failing test.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func startEnv(t *testing.T) *env {
	t.Helper()
	if testing.Short() {
		t.Skip("the e2b SDK suite drives real sandboxes (root, runc, node); `make test` runs it")
	}
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "runc")
	tmpl := template.NewStore(filepath.Join(testutil.DataDir(), "templates"))
	if _, err := tmpl.Get("base", 0); err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), templateTimeout)
		defer cancel()
		var progress strings.Builder
		if _, err := tmpl.EnsureBase(ctx, &progress); err != nil {
			t.Fatalf("base template: %v\n%s", err, progress.String())
		}
	}
	dataDir, err := os.MkdirTemp("", "airlock-e2b-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dataDir, 0o711) // sandbox uids must search it
	// A host slot of its own: its cgroups and uid ranges are never those
	// of a daemon serving on this host.
	slot, err := hostslot.Acquire(dataDir, hostslot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(slot.Release) // last: after the cleanup below
	logs := &logBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	st, err := store.Open(context.Background(), filepath.Join(dataDir, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	authn := auth.New(st)
	if _, err := authn.Bootstrap(context.Background(), ""); err != nil {
		t.Fatal(err)
	}
	key, err := authn.CreateKey(context.Background(), "e2b-sdk", "sdk-suite", false)
	if err != nil {
		t.Fatal(err)
	}
	drv, err := runc.New(runc.Config{DataDir: dataDir, AgentPath: buildAgent(t), Logger: log,
		CgroupParent: slot.CgroupParent, UIDRangeStart: slot.RuncUIDStart, MaxSandboxes: hostslot.UIDRanges})
	if err != nil {
		t.Fatal(err)
	}
	if h := drv.Probe(context.Background()); h.State != driver.HealthHealthy {
		drv.Close()
		testutil.HostLacks(t, "runc driver not usable here: %s", h.Description)
	}
	settings := config.Default()
	settings.DataDir = dataDir
	svc, err := service.New(service.Config{Settings: settings, Store: st, Drivers: []driver.Driver{drv}, Templates: tmpl,
		Logger: log, TickInterval: 50 * time.Millisecond, SweepInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	eh := e2b.New(e2b.Config{Sandboxes: svc.Sandboxes, Execs: svc.Execs, Files: svc.Files, Ports: svc.Previews,
		Auth: authn, Code: svc.Code, Logger: log, MaxExecTimeout: time.Duration(settings.MaxExecTimeoutS) * time.Second})
	srv := httpapi.New(httpapi.Config{Auth: authn, Logger: log, Version: "e2b-suite", E2B: eh,
		Sandboxes: svc.Sandboxes, Execs: svc.Execs, Files: svc.Files, Networks: svc.Networks,
		Previews: svc.Previews, Accounting: svc.Accounting, Templates: svc.Templates, Code: svc.Code})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := &httptest.Server{Listener: ln, Config: &http.Server{Handler: srv.Handler()}}
	ts.Start()
	// From here on nothing new may stay behind: mounts, loop devices,
	// cgroups, processes, sandbox files.
	snap := hostcheck.Take(t, filepath.Join(dataDir, "sandboxes"))
	t.Cleanup(func() {
		ctx := context.Background()
		recs, _ := st.SandboxesInStates(ctx, api.StateStarting, api.StateRunning, api.StatePaused, api.StateStopping)
		for _, r := range recs {
			svc.Sandboxes.Delete(ctx, auth.Principal{Admin: true}, r.ID)
		}
		srv.CloseStreams()
		ts.CloseClientConnections()
		ts.Close()
		svc.Close()
		drv.Close()
		snap.AssertNoLeaks(t)
		st.Close()
		if t.Failed() {
			t.Logf("daemon log (tail):\n%s", tail(logs.String(), 64<<10))
		}
		os.RemoveAll(dataDir)
	})
	return &env{url: ts.URL, key: key.Secret, log: logs}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// TestSDK runs each scenario of scenarios.mjs with the published SDKs
// (e2b@2.51.0, @e2b/code-interpreter@2.8.0) against airlock:
//
//	go test -race -run 'TestSDK/commandsKill' ./test/e2b/
func TestSDK(t *testing.T) {
	dir := nodeModules(t)
	e := startEnv(t)
	scenarios := []struct {
		name string
		// template is a shipped template the scenario needs besides base.
		template string
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
		{name: "ports", template: "code-interpreter"},
		{name: "runCode", template: "code-interpreter"},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			if sc.template != "" {
				ensureShipped(t, sc.template)
			}
			ctx, cancel := context.WithTimeout(context.Background(), scenarioTimeout)
			defer cancel()
			cmd := exec.CommandContext(ctx, "node", "scenarios.mjs", sc.name)
			cmd.Dir = dir
			cmd.Env = append(cleanEnv(), "E2B_API_URL="+e.url, "E2B_SANDBOX_URL="+e.url, "E2B_API_KEY="+e.key)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				t.Fatalf("scenario %s: %v\n%s", sc.name, err, out.String())
			}
		})
	}
}

// cleanEnv is the environment without any E2B_ setting of the machine, so
// that nothing points the SDK elsewhere (and never at e2b.dev).
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "E2B_") && !strings.HasPrefix(kv, "HTTP_PROXY=") && !strings.HasPrefix(kv, "HTTPS_PROXY=") {
			out = append(out, kv)
		}
	}
	return out
}

// ensureShipped builds shipped template name into the cache unless its
// current recipe is there.
func ensureShipped(t *testing.T, name string) {
	t.Helper()
	tmpl := template.NewStore(filepath.Join(testutil.DataDir(), "templates"))
	ctx, cancel := context.WithTimeout(context.Background(), templateTimeout)
	defer cancel()
	var progress strings.Builder
	if _, _, err := tmpl.EnsureShipped(ctx, name, &progress); err != nil {
		t.Fatalf("template %s: %v\n%s", name, err, tail(progress.String(), 4096))
	}
}
