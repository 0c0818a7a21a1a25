package testutil

import (
	"fmt"
	"runtime"
	"testing"
)

// recorder is a testing.TB that records how a helper ended the test.
type recorder struct {
	testing.TB
	how, msg string
}

func (r *recorder) Helper() {}
func (r *recorder) Skip(args ...any) {
	r.how, r.msg = "skip", fmt.Sprint(args...)
	runtime.Goexit()
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.how, r.msg = "fail", fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestHostLacks: a missing host capability is a skip with its reason, and a
// failure in CI (outside -short), where make test must provide it.
func TestHostLacks(t *testing.T) {
	for _, tc := range []struct{ ci, want string }{{"", "skip"}, {"false", "skip"}, {"true", "fail"}, {"1", "fail"}} {
		t.Run("CI="+tc.ci, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			r := &recorder{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				HostLacks(r, "requires %s", "runc")
			}()
			<-done
			want := tc.want
			if testing.Short() {
				want = "skip" // make unit skips root tests by design
			}
			if r.how != want || r.msg == "" {
				t.Fatalf("HostLacks with CI=%q: %s %q, want %s", tc.ci, r.how, r.msg, want)
			}
		})
	}
}
