// Package testutil holds helpers shared by airlock's tests: skips with a reason
// for tests that need root or host binaries, and the host leak check.
package testutil

import (
	"os"
	"os/exec"
	"testing"
)

// RequiresRoot skips the test unless it runs as root.
func RequiresRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("requires root (run `make test` as root)")
	}
}

// RequiresBinary skips the test unless name is on PATH.
func RequiresBinary(tb testing.TB, name string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		tb.Skipf("requires %s on PATH (`make deps` installs it)", name)
	}
	return p
}

// RequiresKVM skips the test unless /dev/kvm can be opened.
func RequiresKVM(tb testing.TB) {
	tb.Helper()
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		tb.Skipf("requires /dev/kvm: %v", err)
	}
	f.Close()
}

// DataDir is the per-machine cache that root tests share (above all the base
// template, whose debootstrap build takes a minute): AIRLOCK_TEST_DATA_DIR,
// default /var/lib/airlock-test. It survives between runs, so CI pays for
// the build once per machine.
func DataDir() string {
	if d := os.Getenv("AIRLOCK_TEST_DATA_DIR"); d != "" {
		return d
	}
	return "/var/lib/airlock-test"
}
