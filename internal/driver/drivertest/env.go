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
	"github.com/airlockhq/airlock/internal/hostslot"
	"github.com/airlockhq/airlock/internal/reaper"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testutil"
)

// What every driver package's tests share: the test binary set up as the
// daemon is, the base template, data dirs on host slots of their own, the
// runtime drivers' common tests (Runtime), and the cold-start benchmarks.

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

// Host is a driver's data dir under test with the host slot claimed for
// it: a driver the tests make takes the slot's cgroup parent and uid
// ranges, so that its sandboxes never share a cgroup, a host uid or the
// parent's task budget with those of a daemon serving on this host, or of
// another test's driver.
type Host struct {
	DataDir string
	hostslot.Names
}

// NewHost makes a data dir (DataDir) and claims a host slot for it
// (hostslot.Acquire), released at the end of tb, before the dir is
// removed.
func NewHost(tb testing.TB, prefix string) Host {
	tb.Helper()
	dir := DataDir(tb, prefix)
	claim, err := hostslot.Acquire(dir, hostslot.Options{})
	if err != nil {
		tb.Fatalf("host slot for %s: %v", dir, err)
	}
	tb.Cleanup(claim.Release)
	return Host{DataDir: dir, Names: claim.Names}
}

// Runtime is what the tests of a runtime's driver package (runc, gvisor)
// have in common, said once: the binary they need, how the package makes
// its driver on a Host, and the flags of the bare run its cold start is
// compared with. Each package's own tests are its own files.
type Runtime struct {
	// Name is the driver's name: data dirs are named after it.
	Name string
	// Binary is the runtime's executable the tests need on PATH.
	Binary string
	// BareArgs are the runtime's flags of BenchBareRun.
	BareArgs []string
	// Open makes the package's driver on h, closed at the end of tb.
	Open func(tb testing.TB, h Host) driver.Driver
}

// Require skips tb unless it runs as root with the runtime's binary.
func (r Runtime) Require(tb testing.TB) {
	tb.Helper()
	testutil.RequiresRoot(tb)
	testutil.RequiresBinary(tb, r.Binary)
}

// Host is NewHost for the runtime's driver.
func (r Runtime) Host(tb testing.TB) Host {
	tb.Helper()
	return NewHost(tb, r.Name)
}

// Conformance runs the suite (Run) on the driver Open makes on a host of
// its own, from the base template, with a second driver on the same host
// for the Recover case (a daemon restart) and the data dir as the
// teardown case's leak root.
func (r Runtime) Conformance(t *testing.T, opts ...Option) {
	r.Require(t)
	tmpl := BaseTemplate(t)
	h := r.Host(t)
	d := r.Open(t, h)
	opts = append([]Option{
		WithReopen(func(t *testing.T) driver.Driver { return r.Open(t, h) }),
		WithLeakRoots(h.DataDir),
	}, opts...)
	Run(t, d, tmpl, opts...)
}

// BenchColdCreate is BenchColdCreate of the runtime's driver on a host of
// its own, to be read against BenchBareRun in the same run.
func (r Runtime) BenchColdCreate(b *testing.B) {
	r.Require(b)
	tmpl := BaseTemplate(b)
	BenchColdCreate(b, r.Open(b, r.Host(b)), tmpl)
}

// BenchBareRun is BenchBareRun of the runtime's binary with BareArgs.
func (r Runtime) BenchBareRun(b *testing.B) {
	r.Require(b)
	BenchBareRun(b, r.Binary, r.BareArgs, BaseTemplate(b), r.Host(b).CgroupParent)
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
// top layer, as root without user namespace or limits, in a cgroup under
// cgroupParent: the floor a driver's cold start is compared with (runc;
// runsc with its platform and --network=none).
func BenchBareRun(b *testing.B, binary string, global []string, tmpl driver.Template, cgroupParent string) {
	dir := DataDir(b, "bare-"+filepath.Base(binary))
	bundle := filepath.Join(dir, "bundle")
	os.MkdirAll(bundle, 0o700)
	root := filepath.Join(dir, "state")
	out, err := os.OpenFile(filepath.Join(dir, "output"), os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer out.Close()
	for i := 0; b.Loop(); i++ {
		spec := fmt.Sprintf(`{"ociVersion":"1.0.2","process":{"user":{"uid":0,"gid":0},"args":["/bin/true"],"env":["PATH=/usr/bin:/bin"],"cwd":"/"},
"root":{"path":%q,"readonly":true},"mounts":[{"destination":"/proc","type":"proc","source":"proc"},{"destination":"/dev","type":"tmpfs","source":"tmpfs","options":["nosuid","mode=755"]}],
"linux":{"cgroupsPath":%q,"namespaces":[{"type":"pid"},{"type":"mount"},{"type":"ipc"},{"type":"uts"},{"type":"network"}]}}`,
			tmpl.Layers[len(tmpl.Layers)-1], fmt.Sprintf("/%s/bare%d", cgroupParent, i))
		if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(spec), 0o600); err != nil {
			b.Fatal(err)
		}
		args := append([]string{"--root", root}, global...)
		cmd := exec.Command(binary, append(args, "run", "--bundle", bundle, fmt.Sprintf("bare%d", i))...)
		// A file, never a pipe, as the daemon gives a runtime: the
		// sandbox's processes inherit it, and a pipe would be waited on
		// until the last of them closes it.
		if err := out.Truncate(0); err != nil {
			b.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Run(); err != nil {
			msg, _ := os.ReadFile(out.Name())
			b.Fatalf("%s run: %v\n%s", binary, err, msg)
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
	return Dial(t, d, id)
}

// Dial connects to the agent of running sandbox id on d (after a Start or
// a Restore) and returns a client, closed at the end of t.
func Dial(t *testing.T, d driver.Driver, id string) *agentclient.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
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
