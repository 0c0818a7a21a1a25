package runc

import (
	"testing"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/drivertest"
	"github.com/airlockhq/airlock/internal/testutil"
)

func TestMain(m *testing.M) { drivertest.Main(m) }

// rt is what this package's tests share with every runtime driver's.
var rt = drivertest.Runtime{Name: Name, Binary: "runc",
	Open: func(tb testing.TB, h drivertest.Host) driver.Driver { return newDriver(tb, h) }}

// newDriver builds a driver on h (its data dir, cgroup parent and runc
// uid ranges), closed at the end of tb.
func newDriver(tb testing.TB, h drivertest.Host) *Driver {
	tb.Helper()
	d, err := New(hostConfig(h, Config{AgentPath: testutil.BuildAgent(tb)}))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.Close() })
	return d
}

// hostConfig is cfg on h.
func hostConfig(h drivertest.Host, cfg Config) Config {
	cfg.DataDir, cfg.CgroupParent, cfg.UIDRangeStart = h.DataDir, h.CgroupParent, h.RuncUIDStart
	return cfg
}

func newHost(tb testing.TB) drivertest.Host { return rt.Host(tb) }

func requireHost(tb testing.TB) { rt.Require(tb) }

func TestConformance(t *testing.T) { rt.Conformance(t) }

// BenchmarkColdCreate measures create + start + first exec of `true` +
// destroy, to be read against BenchmarkBareRuncRun in the same run.
func BenchmarkColdCreate(b *testing.B) { rt.BenchColdCreate(b) }

// BenchmarkBareRuncRun is a plain `runc run` of /bin/true on the same
// template: the floor the driver's cold start is compared with.
func BenchmarkBareRuncRun(b *testing.B) { rt.BenchBareRun(b) }
