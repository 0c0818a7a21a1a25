package gvisor

import (
	"testing"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/drivertest"
	"github.com/airlockhq/airlock/internal/testutil"
)

func TestMain(m *testing.M) { drivertest.Main(m) }

// rt is what this package's tests share with every runtime driver's.
var rt = drivertest.Runtime{Name: Name, Binary: "runsc", BareArgs: []string{"--platform=" + PlatformPtrace, "--network=none"},
	Open: func(tb testing.TB, h drivertest.Host) driver.Driver { return newDriver(tb, h) }}

// newDriver builds a driver on h (its data dir, cgroup parent and gVisor
// uid ranges), closed at the end of tb.
func newDriver(tb testing.TB, h drivertest.Host) *Driver {
	tb.Helper()
	d, err := New(Config{DataDir: h.DataDir, AgentPath: testutil.BuildAgent(tb), CgroupParent: h.CgroupParent, UIDRangeStart: h.GVisorUIDStart})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.Close() })
	return d
}

func newHost(tb testing.TB) drivertest.Host { return rt.Host(tb) }

func requireHost(tb testing.TB) { rt.Require(tb) }

func TestConformance(t *testing.T) { rt.Conformance(t, drivertest.WithTeardownCount(20)) }

// BenchmarkColdCreate measures create + start + first exec of `true` +
// destroy, to be read against BenchmarkBareRunscRun in the same run (the
// target is ≤ 1.5×).
func BenchmarkColdCreate(b *testing.B) { rt.BenchColdCreate(b) }

// BenchmarkBareRunscRun is a plain `runsc --platform=ptrace run` of
// /bin/true on the same template: the floor the driver's cold start is
// compared with.
func BenchmarkBareRunscRun(b *testing.B) { rt.BenchBareRun(b) }
