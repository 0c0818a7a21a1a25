package build

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/gvisor"
	"github.com/airlockhq/airlock/internal/driver/runc"
	"github.com/airlockhq/airlock/internal/hostcheck"
	"github.com/airlockhq/airlock/internal/hostslot"
	"github.com/airlockhq/airlock/internal/reaper"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testutil"
)

func TestMain(m *testing.M) {
	// As in the daemon: detached container inits come back to this
	// process, which reaps them.
	if os.Geteuid() == 0 {
		if err := reaper.Enable(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	goleak.VerifyTestMain(m)
}

// buildAgent is the static airlock-agent the build sandboxes run.
func buildAgent(tb testing.TB) string { return testutil.BuildAgent(tb) }

// countingDriver counts the sandboxes a builder creates.
type countingDriver struct {
	Driver
	creates atomic.Int32
}

func (d *countingDriver) Create(ctx context.Context, spec driver.Spec) (*driver.Handle, error) {
	d.creates.Add(1)
	return d.Driver.Create(ctx, spec)
}

// env is a builder on a real runc driver, a fresh store and a template
// store whose base is the shared test cache's.
type env struct {
	b       *Builder
	st      *store.Store
	tmpl    *template.Store
	drv     *countingDriver
	runc    *runc.Driver
	dataDir string
}

// newEnv needs root, runc and debootstrap (or a cached base).
func newEnv(t testing.TB, mutate func(*Config)) *env { return newEnvOn(t, runc.Name, mutate) }

// newEnvOn is newEnv with build sandboxes on the driver named runtime
// (runc or gvisor); the sandboxes the tests start from built templates
// run on runc.
func newEnvOn(t testing.TB, runtime string, mutate func(*Config)) *env {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "runc")
	if runtime == gvisor.Name {
		testutil.RequiresBinary(t, "runsc")
	}
	ctx := context.Background()
	shared := filepath.Join(testutil.DataDir(), "templates")
	var progress strings.Builder
	bctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	if _, err := template.NewStore(shared).EnsureBase(bctx, &progress); err != nil {
		t.Fatalf("base template: %v\n%s", err, progress.String())
	}
	dataDir, err := os.MkdirTemp("", "airlock-build-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dataDir, 0o711)
	t.Cleanup(func() { os.RemoveAll(dataDir) })
	// A host slot of its own: its cgroups and uid ranges are never those
	// of a daemon serving on this host, nor of another test's.
	slot, err := hostslot.Acquire(dataDir, hostslot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(slot.Release)
	tdir := filepath.Join(dataDir, "templates")
	if err := os.MkdirAll(tdir, 0o700); err != nil {
		t.Fatal(err)
	}
	// The base comes from the shared cache, without copying 200 MB.
	if err := os.Symlink(filepath.Join(shared, "base"), filepath.Join(tdir, "base")); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, filepath.Join(dataDir, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	rd, err := runc.New(runc.Config{DataDir: dataDir, AgentPath: buildAgent(t), CgroupParent: slot.CgroupParent,
		UIDRangeStart: slot.RuncUIDStart, MaxSandboxes: 16,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var bd Driver = rd
	closeBD := func() {}
	if runtime == gvisor.Name {
		gd, err := gvisor.New(gvisor.Config{DataDir: filepath.Join(dataDir, "gvisor"), AgentPath: buildAgent(t),
			CgroupParent: slot.CgroupParent, UIDRangeStart: slot.GVisorUIDStart, MaxSandboxes: 16,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		bd, closeBD = gd, func() { gd.Close() }
	}
	// Sandboxes (build sandboxes included) must leave nothing: no mount,
	// loop device, cgroup or file. The template store keeps its layers.
	leaks := hostcheck.Take(t, append(hostcheck.CgroupRoots(slot.CgroupParent),
		filepath.Join(dataDir, "sandboxes"), filepath.Join(dataDir, "gvisor", "sandboxes"))...)
	tmpl := template.NewStore(tdir)
	cd := &countingDriver{Driver: bd}
	cfg := Config{
		Store: st, Templates: tmpl, Driver: cd,
		Resources:  driver.Resources{CPU: 1, MemoryMB: 512, DiskMB: 256, PIDs: 256},
		LayerGrace: -1, GCInterval: -1, Logger: slog.New(slog.DiscardHandler),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.Close()
		closeBD()
		rd.Close()
		st.Close()
		leaks.AssertNoLeaks(t)
	})
	return &env{b: b, st: st, tmpl: tmpl, drv: cd, runc: rd, dataDir: dataDir}
}

// build submits req (tenant t1 unless set) and waits for its end.
func (e *env) build(t testing.TB, req Request) (api.TemplateBuildStarted, api.TemplateBuild) {
	t.Helper()
	if req.Tenant == "" {
		req.Tenant = "t1"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	st, err := e.b.Submit(ctx, req)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	res, err := e.b.Wait(ctx, st.BuildID)
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	return st, res
}

// mustBuild builds and fails the test unless the build succeeded.
func (e *env) mustBuild(t testing.TB, req Request) api.TemplateBuildStarted {
	t.Helper()
	st, res := e.build(t, req)
	if res.Status != api.BuildReady {
		t.Fatalf("build %s: %s: %s\nlog:\n%s", st.BuildID, res.Status, res.Error, res.Log)
	}
	return st
}

// sandbox starts a sandbox of template ref for tenant and returns an agent
// client; it is destroyed at the end of the test.
func (e *env) sandbox(t testing.TB, tenant, ref string) (*agentclient.Client, template.Resolved) {
	t.Helper()
	c, r, destroy := e.startSandbox(t, tenant, ref)
	t.Cleanup(func() {
		c.Close()
		destroy()
	})
	return c, r
}

var sandboxSeq atomic.Int64

// startSandbox starts a sandbox of template ref; the caller destroys it.
func (e *env) startSandbox(t testing.TB, tenant, ref string) (*agentclient.Client, template.Resolved, func()) {
	t.Helper()
	name, version, err := ParseRef(ref)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r, err := e.b.Resolve(ctx, tenant, name, version)
	if err != nil {
		t.Fatalf("Resolve(%s): %v", ref, err)
	}
	id := fmt.Sprintf("sbx_test%d", sandboxSeq.Add(1))
	destroy := func() {
		if err := e.runc.Destroy(context.Background(), id); err != nil {
			t.Errorf("destroying %s: %v", id, err)
		}
	}
	if _, err := e.runc.Create(ctx, driver.Spec{ID: id, Template: r.Template,
		Resources: driver.Resources{CPU: 1, MemoryMB: 256, DiskMB: 64, PIDs: 128}}); err != nil {
		t.Fatal(err)
	}
	if err := e.runc.Start(ctx, id); err != nil {
		destroy()
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := e.runc.DialAgent(dctx, id)
	if err != nil {
		destroy()
		t.Fatal(err)
	}
	c, err := agentclient.New(conn)
	if err != nil {
		destroy()
		t.Fatal(err)
	}
	return c, r, destroy
}

// run runs a shell command in a sandbox and returns its combined output
// and exit code.
func run(t testing.TB, c *agentclient.Client, user string, env map[string]string, script string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := c.Exec(ctx, agentproto.ExecRequest{ID: fmt.Sprintf("ex_%d", time.Now().UnixNano()), Shell: script, User: user, Env: env, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var out bytes.Buffer
	for {
		ev, err := st.Next()
		if err != nil {
			t.Fatalf("exec %q: %v", script, err)
		}
		if ev.Type == agentproto.EventExit {
			return out.String(), ev.Result.ExitCode
		}
		out.Write(ev.Data)
	}
}

// contextTar writes files (name → content; a trailing / makes a
// directory, "->target" a symlink) as a tar file and returns its path.
func contextTar(t testing.TB, files map[string]string) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, name := range sortedKeys(files) {
		data := files[name]
		hdr := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg, ModTime: time.Unix(1700000000, 0)}
		switch {
		case strings.HasSuffix(name, "/"):
			hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeDir, 0o755, 0
		case strings.HasPrefix(data, "->"):
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeSymlink, strings.TrimPrefix(data, "->"), 0
		case strings.HasPrefix(name, "bin/"):
			hdr.Mode = 0o755
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			tw.Write([]byte(data))
		}
	}
	tw.Close()
	f, err := os.CreateTemp("", "ctx-*.tar")
	if err != nil {
		t.Fatal(err)
	}
	f.Write(buf.Bytes())
	f.Close()
	t.Cleanup(func() { os.Remove(f.Name()) })
	return f.Name()
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
