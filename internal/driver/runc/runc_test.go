package runc

import (
	"testing"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/drivertest"
	"github.com/airlockhq/airlock/internal/testutil"
)

func TestMain(m *testing.M) { drivertest.Main(m) }

// newDriver builds a driver on dataDir, closed at the end of tb.
func newDriver(tb testing.TB, dataDir string) *Driver {
	tb.Helper()
	d, err := New(Config{DataDir: dataDir, AgentPath: testutil.BuildAgent(tb)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.Close() })
	return d
}

func newDataDir(tb testing.TB) string { return drivertest.DataDir(tb, Name) }

func requireHost(tb testing.TB) {
	tb.Helper()
	testutil.RequiresRoot(tb)
	testutil.RequiresBinary(tb, "runc")
}

func TestConformance(t *testing.T) {
	requireHost(t)
	drivertest.RunOn(t, Name, func(tb testing.TB, dir string) driver.Driver { return newDriver(tb, dir) })
}

// BenchmarkColdCreate measures create + start + first exec of `true` +
// destroy, to be read against BenchmarkBareRuncRun in the same run.
func BenchmarkColdCreate(b *testing.B) {
	requireHost(b)
	tmpl := drivertest.BaseTemplate(b)
	drivertest.BenchColdCreate(b, newDriver(b, newDataDir(b)), tmpl)
}

// BenchmarkBareRuncRun is a plain `runc run` of /bin/true on the same
// template: the floor the driver's cold start is compared with.
func BenchmarkBareRuncRun(b *testing.B) {
	requireHost(b)
	drivertest.BenchBareRun(b, "runc", nil, drivertest.BaseTemplate(b))
}
