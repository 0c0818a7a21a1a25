package httpapi_test

import (
	"net/http"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
)

// benchExec measures the JSON exec round trip of `echo hi` through the API.
func benchExec(b *testing.B, h *harness, id string) {
	b.Helper()
	req := api.ExecRequest{Cmd: []string{"echo", "hi"}}
	b.ResetTimer()
	for b.Loop() {
		r := h.req("POST", "/v1/sandboxes/"+id+"/exec", h.key("acme"), req)
		if r.StatusCode != http.StatusOK {
			b.Fatalf("status %d: %s", r.StatusCode, r.body)
		}
	}
}

// BenchmarkExecEchoAPI: API → manager → in-process agent over a socketpair.
func BenchmarkExecEchoAPI(b *testing.B) {
	h := newHarness(b)
	sb := h.create("acme", api.CreateSandboxRequest{})
	benchExec(b, h, sb.ID)
}

// BenchmarkExecEchoAPIAudited: the same with the audit trail recording
// every exec (its cost against BenchmarkExecEchoAPI).
func BenchmarkExecEchoAPIAudited(b *testing.B) {
	h := newHarness(b, withAudit())
	sb := h.create("acme", api.CreateSandboxRequest{})
	benchExec(b, h, sb.ID)
}

// BenchmarkExecEchoAPIUnmetered and BenchmarkExecEchoAPIMetered are the
// overhead pair of issue #7: the same exec round trip with no Prometheus
// observer, no audit trail and no sampling, against all three on (and
// sampling every second, twenty times the default's rate, so any cost it
// has on the exec path shows). Run them interleaved:
//
//	go test -run '^$' -bench 'ExecEchoAPI(Un)?[Mm]etered' -count 6 ./internal/plane/httpapi/
func BenchmarkExecEchoAPIUnmetered(b *testing.B) {
	h := newHarness(b, withoutObserver(), withSampleInterval(time.Hour))
	sb := h.create("acme", api.CreateSandboxRequest{})
	benchExec(b, h, sb.ID)
}

// BenchmarkExecEchoAPIMetered: see BenchmarkExecEchoAPIUnmetered.
func BenchmarkExecEchoAPIMetered(b *testing.B) {
	h := newHarness(b, withAudit(), withSampleInterval(time.Second))
	sb := h.create("acme", api.CreateSandboxRequest{})
	benchExec(b, h, sb.ID)
}

// BenchmarkExecEchoRuncUnmetered and BenchmarkExecEchoRuncMetered are the
// same pair through a real runc sandbox (root only).
func BenchmarkExecEchoRuncUnmetered(b *testing.B) {
	e := newBenchStack(b, stackUnmetered)
	sb := e.h.create("acme", api.CreateSandboxRequest{})
	benchExec(b, e.h, sb.ID)
}

// BenchmarkExecEchoRuncMetered: see BenchmarkExecEchoRuncUnmetered.
func BenchmarkExecEchoRuncMetered(b *testing.B) {
	e := newBenchStack(b, stackSampleEvery(time.Second))
	sb := e.h.create("acme", api.CreateSandboxRequest{})
	benchExec(b, e.h, sb.ID)
}

// BenchmarkExecMeteringOverhead is issue #7's measure of what metering and
// audit cost an exec: two daemons' worth of server, manager and runc
// driver in one process, one with the Prometheus observer, the audit trail
// and sampling every second (five times the default rate), one with none of
// them, and `echo hi` sent to each in turn so that both see the same host
// load. It reports the p50 of each and their ratio (metered/unmetered;
// the target is at most 1.05). make bench runs it and writes the row.
func BenchmarkExecMeteringOverhead(b *testing.B) {
	un := newBenchStack(b, stackUnmetered)
	me := newBenchStack(b, stackSampleEvery(time.Second))
	sbUn := un.h.create("acme", api.CreateSandboxRequest{})
	sbMe := me.h.create("acme", api.CreateSandboxRequest{})
	req := api.ExecRequest{Cmd: []string{"echo", "hi"}}
	one := func(h *harness, id string) time.Duration {
		start := time.Now()
		r := h.req("POST", "/v1/sandboxes/"+id+"/exec", h.key("acme"), req)
		d := time.Since(start)
		if r.StatusCode != http.StatusOK {
			b.Fatalf("status %d: %s", r.StatusCode, r.body)
		}
		return d
	}
	// Warm both paths (first exec, connection pools) before sampling.
	for range 20 {
		one(un.h, sbUn.ID)
		one(me.h, sbMe.ID)
	}
	var dUn, dMe []time.Duration
	i := 0
	b.ResetTimer()
	for b.Loop() {
		// Alternate which goes first, so neither always follows the other.
		if i%2 == 0 {
			dUn = append(dUn, one(un.h, sbUn.ID))
			dMe = append(dMe, one(me.h, sbMe.ID))
		} else {
			dMe = append(dMe, one(me.h, sbMe.ID))
			dUn = append(dUn, one(un.h, sbUn.ID))
		}
		i++
	}
	b.StopTimer()
	pUn, pMe := median(dUn), median(dMe)
	b.ReportMetric(float64(pUn.Microseconds()), "unmetered-p50-µs")
	b.ReportMetric(float64(pMe.Microseconds()), "metered-p50-µs")
	if pUn > 0 {
		b.ReportMetric(float64(pMe)/float64(pUn), "metered/unmetered")
	}
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkExecEchoRunc: the same through a real runc sandbox (root only).
func BenchmarkExecEchoRunc(b *testing.B) {
	e := newBenchStack(b)
	sb := e.h.create("acme", api.CreateSandboxRequest{})
	benchExec(b, e.h, sb.ID)
}

// BenchmarkForkExecEcho is the baseline: a plain local fork/exec.
func BenchmarkForkExecEcho(b *testing.B) {
	for b.Loop() {
		if err := exec.Command("/bin/echo", "hi").Run(); err != nil {
			b.Fatal(err)
		}
	}
}
