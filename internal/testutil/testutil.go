// Package testutil holds helpers shared by airlock's tests: skips with a reason
// for tests that need root or host binaries, and the host leak check.
//
// A skip is only ever for what the host lacks, never for a product failure:
// a template that does not build, a driver that probes unhealthy on a host
// that has everything, a spec file that is gone all fail the test. And in CI
// (CI=true), where the suite runs as root on a host `make deps` provisioned,
// lacking a provisioned thing fails too (HostLacks), so a broken provisioning
// cannot turn the root tests into a row of skips.
package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// CI reports whether the suite runs in CI: CI=true (or 1), as CI services
// set it.
func CI() bool {
	v := os.Getenv("CI")
	return v == "true" || v == "1"
}

// HostLacks skips the test because the host lacks something `make test`
// provides (root, a package of `make deps`, a healthy runtime, the network
// for the pinned SDKs); the message says what. In CI, outside -short (where
// `make unit` skips root tests by design), it fails instead.
func HostLacks(tb testing.TB, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if CI() && !testing.Short() {
		tb.Fatalf("%s (CI=true: the CI host must provide it)", msg)
	}
	tb.Skip(msg)
}

// RequiresRoot skips the test unless it runs as root (see HostLacks).
func RequiresRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		HostLacks(tb, "requires root (run `make test` as root)")
	}
}

// RequiresBinary skips the test unless name is on PATH (see HostLacks).
func RequiresBinary(tb testing.TB, name string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		HostLacks(tb, "requires %s on PATH (`make deps` installs it)", name)
	}
	return p
}

// RequiresKVM skips the test unless /dev/kvm can be opened, in CI too: KVM
// is a property of the machine, which `make deps` cannot provide.
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
