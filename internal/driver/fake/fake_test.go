package fake

import (
	"testing"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/drivertest"
)

func TestMain(m *testing.M) { drivertest.Main(m) }

// TestConformance runs the conformance suite against the fake, so that the
// tests above the drivers run on a driver that keeps the contract. The
// fake has no boundary (Isolation none), so the suite skips what needs one
// (the fork and memory bombs, disk fill, the timeout tree's process check,
// background processes, host files, cross-sandbox, users, pause, the CPU
// quota) and what it lacks (layer capture); it runs the probe, the
// contract's error classes, the output cap, stop and start, recovery by a
// "new" driver (the fake's sandboxes outlive a manager: the same instance)
// and teardown without leaks.
func TestConformance(t *testing.T) {
	dir := t.TempDir()
	d := New("fake", dir)
	t.Cleanup(func() { d.Close() })
	tmpl := driver.Template{Name: "fake", Version: 1, Layers: []string{t.TempDir()}}
	drivertest.Run(t, d, tmpl,
		drivertest.WithReopen(func(*testing.T) driver.Driver { return d }),
		drivertest.WithLeakRoots(dir),
	)
}
