package server_test

import (
	"net/http"
	"os/exec"
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
//	go test -run '^$' -bench 'ExecEchoAPI(Un)?[Mm]etered' -count 6 ./internal/server/
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
	e := newE2E(b, e2eUnmetered)
	sb := e.h.create("acme", api.CreateSandboxRequest{})
	benchExec(b, e.h, sb.ID)
}

// BenchmarkExecEchoRuncMetered: see BenchmarkExecEchoRuncUnmetered.
func BenchmarkExecEchoRuncMetered(b *testing.B) {
	e := newE2E(b, e2eSampleEvery(time.Second))
	sb := e.h.create("acme", api.CreateSandboxRequest{})
	benchExec(b, e.h, sb.ID)
}

// BenchmarkExecEchoRunc: the same through a real runc sandbox (root only).
func BenchmarkExecEchoRunc(b *testing.B) {
	e := newE2E(b)
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
