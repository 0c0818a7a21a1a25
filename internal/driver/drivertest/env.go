package drivertest

import (
	"context"
	"errors"
	"fmt"
	"io"
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
	"github.com/airlockhq/airlock/internal/reaper"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testutil"
)

// What every driver package's tests share: the test binary set up as the
// daemon is, the base template, data dirs, and the cold-start benchmarks.

// Main runs a driver package's tests (from its TestMain) as the daemon runs
// sandboxes: as root the test process is a child subreaper, so detached
// sandbox inits come back to it, which reaps them (and hostcheck sees any
// that survive); no goroutine may be left at the end.
func Main(m *testing.M) {
	if os.Geteuid() == 0 {
		if err := reaper.Enable(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	goleak.VerifyTestMain(m)
}

// BaseTemplate ensures the base template in the shared test cache
// (testutil.DataDir) and returns it.
func BaseTemplate(tb testing.TB) driver.Template {
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

// DataDir makes a driver data dir that sandbox uids can search (mode
// 0711), named after prefix, and removes it at the end of tb.
func DataDir(tb testing.TB, prefix string) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "airlock-"+prefix+"-")
	if err != nil {
		tb.Fatal(err)
	}
	os.Chmod(dir, 0o711)
	tb.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// BenchColdCreate measures create + start + first exec of `true` +
// destroy on d, to be read against BenchBareRun of its runtime in the same
// run. Each phase is reported as its own metric (ms/op) so that a
// regression points at its step.
func BenchColdCreate(b *testing.B, d driver.Driver, tmpl driver.Template) {
	ctx := context.Background()
	var phases [5]time.Duration // create, start, dial+hello, exec, destroy
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("sbx_bench%s%d", d.Name(), i)
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
		if _, err := runWait(ctx, c, agentproto.ExecRequest{ID: "ex_1", Argv: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
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

// BenchBareRun is a plain `<binary> <global…> run` of /bin/true on tmpl's
// top layer, as root without user namespace or limits: the floor a
// driver's cold start is compared with (runc; runsc with its platform and
// --network=none).
func BenchBareRun(b *testing.B, binary string, global []string, tmpl driver.Template) {
	dir := DataDir(b, "bare-"+filepath.Base(binary))
	bundle := filepath.Join(dir, "bundle")
	os.MkdirAll(bundle, 0o700)
	spec := fmt.Sprintf(`{"ociVersion":"1.0.2","process":{"user":{"uid":0,"gid":0},"args":["/bin/true"],"env":["PATH=/usr/bin:/bin"],"cwd":"/"},
"root":{"path":%q,"readonly":true},"mounts":[{"destination":"/proc","type":"proc","source":"proc"},{"destination":"/dev","type":"tmpfs","source":"tmpfs","options":["nosuid","mode=755"]}],
"linux":{"namespaces":[{"type":"pid"},{"type":"mount"},{"type":"ipc"},{"type":"uts"},{"type":"network"}]}}`, tmpl.Layers[len(tmpl.Layers)-1])
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(spec), 0o600); err != nil {
		b.Fatal(err)
	}
	root := filepath.Join(dir, "state")
	for i := 0; b.Loop(); i++ {
		args := append([]string{"--root", root}, global...)
		cmd := exec.Command(binary, append(args, "run", "--bundle", bundle, fmt.Sprintf("bare%d", i))...)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("%s run: %v\n%s", binary, err, out)
		}
	}
}

// Started creates and starts a sandbox of spec on d and returns a connected
// agent client; the sandbox is destroyed and the client closed at the end
// of t.
func Started(t *testing.T, d driver.Driver, spec driver.Spec) *agentclient.Client {
	t.Helper()
	ctx := context.Background()
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := d.Destroy(ctx, spec.ID); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	return StartAndDial(t, d, spec.ID)
}

// StartAndDial starts created sandbox id on d and returns a connected agent
// client, closed at the end of t.
func StartAndDial(t *testing.T, d driver.Driver, id string) *agentclient.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	conn, err := d.DialAgent(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	c, err := agentclient.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Output runs shell as root through c and returns its stdout.
func Output(t *testing.T, c *agentclient.Client, shell string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := c.Exec(ctx, agentproto.ExecRequest{ID: newID("ex_"), Shell: shell, User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var out strings.Builder
	for {
		ev, err := st.Next()
		if errors.Is(err, io.EOF) {
			return out.String()
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == agentproto.EventOutput && ev.Stream == agentproto.StreamStdout {
			out.Write(ev.Data)
		}
	}
}

// RunOn runs the suite (Run) on the driver open builds on a fresh data dir
// named after prefix, from the base template, with a second driver open
// builds on the same dir for the Recover case (a daemon restart) and the
// data dir as the teardown case's leak root.
func RunOn(t *testing.T, prefix string, open func(tb testing.TB, dataDir string) driver.Driver, opts ...Option) {
	tmpl := BaseTemplate(t)
	dataDir := DataDir(t, prefix)
	d := open(t, dataDir)
	opts = append([]Option{
		WithReopen(func(t *testing.T) driver.Driver { return open(t, dataDir) }),
		WithLeakRoots(dataDir),
	}, opts...)
	Run(t, d, tmpl, opts...)
}
