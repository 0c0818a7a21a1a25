package gvisor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/drivertest"
	"github.com/airlockhq/airlock/internal/reaper"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testutil"
)

func TestMain(m *testing.M) {
	// As in the daemon: detached sandboxes come back to this process,
	// which reaps them.
	if os.Geteuid() == 0 {
		if err := reaper.Enable(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	goleak.VerifyTestMain(m)
}

// buildAgent is the static airlock-agent the sandboxes run.
func buildAgent(tb testing.TB) string { return testutil.BuildAgent(tb) }

// baseTemplate ensures the base template in the shared test cache.
func baseTemplate(tb testing.TB) driver.Template {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var progress strings.Builder
	tmpl, err := template.NewStore(filepath.Join(testutil.DataDir(), "templates")).EnsureBase(ctx, &progress)
	if err != nil {
		tb.Fatalf("base template: %v\n%s", err, progress.String())
	}
	return tmpl
}

// newDataDir makes a driver data dir that sandbox uids can search and
// removes it at the end.
func newDataDir(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "airlock-gvisor-")
	if err != nil {
		tb.Fatal(err)
	}
	os.Chmod(dir, 0o711)
	tb.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// newDriver builds a driver on dataDir, closed at the end of tb.
func newDriver(tb testing.TB, dataDir string) *Driver {
	tb.Helper()
	d, err := New(Config{DataDir: dataDir, AgentPath: buildAgent(tb)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.Close() })
	return d
}

func requireHost(tb testing.TB) {
	tb.Helper()
	testutil.RequiresRoot(tb)
	testutil.RequiresBinary(tb, "runsc")
}

func TestConformance(t *testing.T) {
	requireHost(t)
	tmpl := baseTemplate(t)
	dataDir := newDataDir(t)
	d := newDriver(t, dataDir)
	drivertest.Run(t, d, tmpl,
		drivertest.WithReopen(func(t *testing.T) driver.Driver { return newDriver(t, dataDir) }),
		drivertest.WithLeakRoots(dataDir),
		drivertest.WithTeardownCount(20),
	)
}

// BenchmarkColdCreate measures create + start + first exec of `true` +
// destroy, to be read against BenchmarkBareRunscRun in the same run (the
// target is ≤ 1.5×). Each phase is its own metric (ms/op).
func BenchmarkColdCreate(b *testing.B) {
	requireHost(b)
	tmpl := baseTemplate(b)
	d := newDriver(b, newDataDir(b))
	ctx := context.Background()
	var phases [5]time.Duration // create, start, dial+hello, exec, destroy
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("sbx_gbench%d", i)
		t0 := time.Now()
		if _, err := d.Create(ctx, driver.Spec{ID: id, Template: tmpl}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := d.Start(ctx, id); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		conn, err := d.DialAgent(dctx, id)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		c, err := agentclient.New(conn)
		if err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		st, err := c.Exec(ctx, agentproto.ExecRequest{ID: "ex_1", Argv: []string{"true"}})
		if err != nil {
			b.Fatal(err)
		}
		for {
			if _, err := st.Next(); err != nil {
				break
			}
		}
		st.Close()
		c.Close()
		t4 := time.Now()
		if err := d.Destroy(ctx, id); err != nil {
			b.Fatal(err)
		}
		t5 := time.Now()
		for j, p := range [][2]time.Time{{t0, t1}, {t1, t2}, {t2, t3}, {t3, t4}, {t4, t5}} {
			phases[j] += p[1].Sub(p[0])
		}
	}
	n := float64(b.N) * float64(time.Millisecond)
	for j, name := range []string{"create", "start", "dial", "exec", "destroy"} {
		b.ReportMetric(float64(phases[j])/n, name+"-ms/op")
	}
}

// BenchmarkBareRunscRun is a plain `runsc --platform=ptrace run` of
// /bin/true on the same template, as root without user namespace or limits:
// the floor the driver's cold start is compared with.
func BenchmarkBareRunscRun(b *testing.B) {
	requireHost(b)
	tmpl := baseTemplate(b)
	dir := newDataDir(b)
	bundle := filepath.Join(dir, "bundle")
	os.MkdirAll(bundle, 0o700)
	spec := fmt.Sprintf(`{"ociVersion":"1.0.2","process":{"user":{"uid":0,"gid":0},"args":["/bin/true"],"env":["PATH=/usr/bin:/bin"],"cwd":"/"},
"root":{"path":%q,"readonly":true},"mounts":[{"destination":"/proc","type":"proc","source":"proc"},{"destination":"/dev","type":"tmpfs","source":"tmpfs","options":["nosuid","mode=755"]}],
"linux":{"namespaces":[{"type":"pid"},{"type":"mount"},{"type":"ipc"},{"type":"uts"},{"type":"network"}]}}`, tmpl.Layers[len(tmpl.Layers)-1])
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(spec), 0o600); err != nil {
		b.Fatal(err)
	}
	root := filepath.Join(dir, "runsc")
	for i := 0; b.Loop(); i++ {
		cmd := exec.Command("runsc", "--root", root, "--platform=ptrace", "--network=none", "run", "--bundle", bundle, fmt.Sprintf("gbare%d", i))
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("runsc run: %v\n%s", err, out)
		}
	}
}
