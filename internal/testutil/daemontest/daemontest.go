// Package daemontest runs the real daemon (daemon.Run, as `airlock serve`
// does) on 127.0.0.1 with a data dir of its own, for tests that drive the
// product from outside: the escape suite, the SDKs of every language, the
// MCP server, end-to-end tests. It is the one daemon harness of the suites.
//
// The data dir's templates/ is the shared template cache
// (testutil.DataDir()/templates), so that the base template and the other
// shipped templates are built once per machine. The daemon claims a host
// slot of its own (as every daemon does): its cgroups, uid ranges, nft
// table and subnet are never those of a daemon serving on this host.
//
// Everything an Env made is removed when its test ends, and a leak check
// then asserts that no mount, loop device, cgroup, sandbox file or process
// of it is left behind.
package daemontest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/daemon"
	"github.com/airlockhq/airlock/internal/hostcheck"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testutil"
)

// Timeouts of the harness's own waits.
const (
	// startWait bounds daemon.Run's start: it opens the store and probes
	// the runtimes, well under a second here; a minute covers a loaded CI
	// machine.
	startWait = time.Minute
	// callTimeout bounds one API call of the harness.
	callTimeout = 2 * time.Minute
	// cleanupTimeout bounds deleting what a test left behind.
	cleanupTimeout = 5 * time.Minute
	// templateTimeout bounds building a shipped template the cache lacks
	// (debootstrap and apt: minutes).
	templateTimeout = 20 * time.Minute
	// logTail is how much of the daemon's log a failing test shows.
	logTail = 256 << 10
)

// Options adjust the daemon an Env runs.
type Options struct {
	// Templates are shipped templates besides base that the tests need
	// (built into the shared cache unless their current recipe is there).
	Templates []string
	// Configure edits the daemon's configuration before it starts (the
	// data dir, listen address and agent are set already).
	Configure func(*config.Config)
	// Daemon is passed to daemon.Run; AdminKey, Stderr and Ready are the
	// harness's.
	Daemon daemon.Options
	// Prefix names the temp data dir (default "airlock-test-").
	Prefix string
}

// Env is one in-process `airlock serve`.
type Env struct {
	t        testing.TB
	cfg      config.Config
	opts     daemon.Options
	adminKey string
	tr       *http.Transport
	logs     *tailBuffer

	mu     sync.Mutex
	url    string
	cancel context.CancelFunc
	done   chan error
	keys   map[string]string // tenant → API key
}

// Start starts a daemon and stops it (deleting every sandbox first) when t
// ends. Outside root, on a machine without runc, or with -short it skips
// (a failure in CI: testutil.HostLacks).
func Start(t testing.TB, o Options) *Env {
	t.Helper()
	if testing.Short() {
		t.Skip("drives a real daemon with real sandboxes (root, runc); `make test` runs it")
	}
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "runc")
	cache := filepath.Join(testutil.DataDir(), "templates")
	EnsureTemplates(t, append([]string{"base"}, o.Templates...)...)
	prefix := o.Prefix
	if prefix == "" {
		prefix = "airlock-test-"
	}
	dataDir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	// Sandbox uids must search the data dir to reach their root.
	if err := os.Chmod(dataDir, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(cache, filepath.Join(dataDir, "templates")); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.DataDir, cfg.Listen, cfg.AgentPath, cfg.NoPrepare = dataDir, "127.0.0.1:0", testutil.BuildAgent(t), true
	cfg.LogLevel, cfg.ShutdownTimeoutS = "debug", 5
	if o.Configure != nil {
		o.Configure(&cfg)
	}
	e := &Env{
		t: t, cfg: cfg, opts: o.Daemon, adminKey: "ak_test_" + Token(),
		logs: &tailBuffer{max: logTail},
		tr:   http.DefaultTransport.(*http.Transport).Clone(),
		keys: map[string]string{},
	}
	e.Start()
	// After the drivers made their directories: from here on nothing new
	// may stay behind under them, and no process of ours.
	roots := []string{filepath.Join(dataDir, "sandboxes")}
	if _, err := os.Stat(filepath.Join(dataDir, "gvisor", "sandboxes")); err == nil {
		roots = append(roots, filepath.Join(dataDir, "gvisor", "sandboxes"))
	}
	snap := hostcheck.Take(t, roots...)
	t.Cleanup(func() {
		e.DeleteAll()
		if err := e.Stop(); err != nil {
			t.Errorf("daemon: %v", err)
		}
		snap.AssertNoLeaks(t)
		if t.Failed() {
			t.Logf("daemon log (tail):\n%s", e.logs.String())
		}
		os.RemoveAll(dataDir)
	})
	return e
}

// EnsureTemplates builds the shipped templates names into the shared cache
// unless their current recipes are there.
func EnsureTemplates(t testing.TB, names ...string) {
	t.Helper()
	tmpl := template.NewStore(filepath.Join(testutil.DataDir(), "templates"))
	for _, name := range names {
		ctx, cancel := context.WithTimeout(context.Background(), templateTimeout)
		var progress strings.Builder
		var err error
		if name == "base" {
			if _, err = tmpl.Get("base", 0); err != nil {
				_, err = tmpl.EnsureBase(ctx, &progress)
			}
		} else {
			_, _, err = tmpl.EnsureShipped(ctx, name, &progress)
		}
		cancel()
		if err != nil {
			t.Fatalf("template %s: %v\n%s", name, err, tail(progress.String(), 4096))
		}
	}
}

// Start runs daemon.Run and waits until it serves. Start is called by the
// package's Start; call it again after Stop to restart on the same data dir
// (a new port): the daemon re-adopts every running sandbox.
func (e *Env) Start() {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan net.Addr, 1)
	done := make(chan error, 1)
	opts := e.opts
	opts.AdminKey, opts.Stderr = e.adminKey, e.logs
	opts.Ready = func(a net.Addr) { addrc <- a }
	go func() { done <- daemon.Run(ctx, e.cfg, opts) }()
	select {
	case a := <-addrc:
		e.mu.Lock()
		e.url, e.cancel, e.done = "http://"+a.String(), cancel, done
		e.mu.Unlock()
	case err := <-done:
		cancel()
		e.t.Fatalf("daemon exited at start: %v\n%s", err, e.logs.String())
	case <-time.After(startWait):
		cancel()
		e.t.Fatalf("daemon did not start within %v\n%s", startWait, e.logs.String())
	}
}

// Stop shuts the daemon down; sandboxes keep running, as across a real
// restart. Stopping a stopped daemon does nothing.
func (e *Env) Stop() error {
	e.mu.Lock()
	cancel, done := e.cancel, e.done
	e.cancel, e.done = nil, nil
	e.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	err := <-done
	e.tr.CloseIdleConnections()
	return err
}

// Restart stops the daemon and starts a new one on the same data dir.
func (e *Env) Restart() {
	e.t.Helper()
	if err := e.Stop(); err != nil {
		e.t.Fatalf("daemon stop: %v", err)
	}
	e.Start()
}

// URL is the API's base URL, http://127.0.0.1:port (it changes on Restart).
func (e *Env) URL() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.url
}

// Config is the configuration the daemon runs with.
func (e *Env) Config() config.Config { return e.cfg }

// DataDir is the daemon's data dir.
func (e *Env) DataDir() string { return e.cfg.DataDir }

// AdminKey is the daemon's admin API key.
func (e *Env) AdminKey() string { return e.adminKey }

// Logs is the tail of the daemon's log so far.
func (e *Env) Logs() string { return e.logs.String() }

// Transport is the HTTP transport the harness's clients share (closed
// idle on Stop).
func (e *Env) Transport() *http.Transport { return e.tr }

// Client returns an SDK client authenticated with key.
func (e *Env) Client(key string) *client.Client {
	c, err := client.New(e.URL(), key, client.WithHTTPClient(&http.Client{Transport: e.tr}))
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// Admin is a client with the admin key.
func (e *Env) Admin() *client.Client { return e.Client(e.adminKey) }

// Key returns an API key of tenant, created on first use.
func (e *Env) Key(t testing.TB, tenant string) string {
	t.Helper()
	e.mu.Lock()
	k, ok := e.keys[tenant]
	e.mu.Unlock()
	if ok {
		return k
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	created, err := e.Admin().CreateKey(ctx, api.CreateKeyRequest{Tenant: tenant, Name: "test"})
	if err != nil {
		t.Fatalf("creating a key for %s: %v", tenant, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if k, ok := e.keys[tenant]; ok {
		return k // a parallel caller won; its key is as good
	}
	e.keys[tenant] = created.Key
	return created.Key
}

// Keys returns every API key the harness made, the admin key first.
func (e *Env) Keys() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := []string{e.adminKey}
	for _, k := range e.keys {
		out = append(out, k)
	}
	return out
}

// DeleteAll deletes every sandbox still live (of a test that failed half
// way, or that left them to the harness).
func (e *Env) DeleteAll() {
	e.mu.Lock()
	running := e.cancel != nil
	e.mu.Unlock()
	if !running {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	c := e.Admin()
	// Pools first: their members are sandboxes no list shows, and a pool
	// left would refill them.
	pools, err := c.Pools(ctx)
	if err != nil {
		e.t.Errorf("listing pools at cleanup: %v", err)
	}
	for _, pl := range pools {
		if err := c.DeletePool(ctx, pl.Name, client.PoolOptions{Tenant: pl.Tenant}); err != nil && !errors.Is(err, client.ErrNotFound) {
			e.t.Errorf("deleting pool %s/%s at cleanup: %v", pl.Tenant, pl.Name, err)
		}
	}
	var ids []string
	for sb, err := range c.Sandboxes(ctx, client.ListOptions{}) {
		if err != nil {
			e.t.Errorf("listing sandboxes at cleanup: %v", err)
			break
		}
		ids = append(ids, sb.ID)
	}
	for _, id := range ids {
		if err := c.DeleteSandbox(ctx, id); err != nil && !errors.Is(err, client.ErrNotFound) {
			e.t.Errorf("deleting %s at cleanup: %v", id, err)
		}
	}
}

// Token returns a random hex string: secrets and markers that cannot occur
// by chance in anything a sandbox prints.
func Token() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// CleanEnv is os.Environ without what could point a client elsewhere
// (AIRLOCK_*, E2B_*, proxies): the environment to start an SDK's test
// process with, adding the harness's own AIRLOCK_URL and AIRLOCK_API_KEY.
func CleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(name, "AIRLOCK_") && name != "AIRLOCK_TEST_DATA_DIR",
			strings.HasPrefix(name, "E2B_"),
			strings.EqualFold(name, "HTTP_PROXY"), strings.EqualFold(name, "HTTPS_PROXY"),
			strings.EqualFold(name, "ALL_PROXY"):
			continue
		}
		out = append(out, kv)
	}
	return out
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (w *tailBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if len(w.b) > w.max {
		w.b = append(w.b[:0], w.b[len(w.b)-w.max:]...)
	}
	return len(p), nil
}

func (w *tailBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
