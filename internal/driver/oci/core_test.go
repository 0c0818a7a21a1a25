package oci

import (
	"context"
	"log/slog"
	"os/exec"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/drivertest"
	"github.com/airlockhq/airlock/internal/hostcheck"
	"github.com/airlockhq/airlock/internal/testutil"
)

func TestMain(m *testing.M) { drivertest.Main(m) }

// testDriver runs the core's bundles with runc as they are: the core's
// tests drive real sandboxes through it (the runc driver is this).
type testDriver struct{ *Core }

func (*testDriver) Name() string { return "runc" }
func (*testDriver) Capabilities() driver.Capabilities {
	return driver.Capabilities{Isolation: driver.IsolationContainer, Pause: true, DiskQuota: true, LayerCapture: true}
}
func (d *testDriver) Probe(ctx context.Context) driver.Health         { return d.ProbeHost(ctx) }
func (*testDriver) EditBundle(*specs.Spec, driver.Spec, string) error { return nil }
func (*testDriver) RunArgs(*State) ([]string, error)                  { return nil, nil }
func (*testDriver) Launch(cmd *exec.Cmd, _ *State) error              { return cmd.Run() }
func (*testDriver) Control(cmd *exec.Cmd, _ string) error             { return cmd.Run() }
func (d *testDriver) InitRunning(st *State, pid int, recovered bool) {
	if !recovered {
		d.LowerOOMScore(st.ID, pid)
	}
}
func (d *testDriver) KillAll(ctx context.Context, id string, pid int) error {
	return d.KillInit(ctx, id, pid)
}
func (*testDriver) ClearStopped(context.Context, string) error { return nil }

// testConfig is the core's config of the tests on h with runc: its data
// dir, cgroup parent and runc uid ranges.
func testConfig(h drivertest.Host) Config {
	return Config{Name: "runc", Binary: "runc", DataDir: h.DataDir, CgroupParent: h.CgroupParent, UIDRangeStart: h.RuncUIDStart,
		Logger: slog.New(slog.DiscardHandler)}
}

// newTestCore builds a driver on cfg, closed at the end of tb.
func newTestCore(tb testing.TB, cfg Config) *testDriver {
	tb.Helper()
	d := &testDriver{}
	c, err := New(cfg, d)
	if err != nil {
		tb.Fatal(err)
	}
	d.Core = c
	tb.Cleanup(func() { c.Close() })
	return d
}

// newCore builds a driver with runc and the test agent on h.
func newCore(tb testing.TB, h drivertest.Host) *testDriver {
	tb.Helper()
	cfg := testConfig(h)
	cfg.AgentPath = testutil.BuildAgent(tb)
	return newTestCore(tb, cfg)
}

func newHost(tb testing.TB) drivertest.Host { return drivertest.NewHost(tb, "oci") }

func requireHost(tb testing.TB) {
	tb.Helper()
	testutil.RequiresRoot(tb)
	testutil.RequiresBinary(tb, "runc")
}

func hostcheckTake(t *testing.T, roots ...string) hostcheck.Snapshot {
	return hostcheck.Take(t, roots...)
}
