package httpapi_test

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
)

// BenchmarkPoolClaimFirstResult: a create that claims a warm pool member
// and its first command's result, beside a cold create and its first
// result (the baseline), interleaved in one run on the real daemon (runc,
// base template). It reports each one's p50 and p90 in ms (claim-p50-ms,
// cold-p50-ms…; claim-create-p50-ms is the create's answer alone,
// next-exec-p50-ms a second command of the claimed sandbox: what an exec
// costs on the host now); ns/op is one claim and one cold create together, with
// the waits for the refill left out.
func BenchmarkPoolClaimFirstResult(b *testing.B) {
	e := newE2E(b)
	h := e.h
	h.putPool("acme", "warm", api.PutPoolRequest{Template: "base", Size: 2})
	h.waitPoolReady(b, "acme", "warm", 2)
	warm, cold := h.key("acme"), h.key("coldco") // coldco has no pool: its creates are cold
	var claimCreates, next []time.Duration
	run := func(key string, wantPool bool) time.Duration {
		start := time.Now()
		r := h.req("POST", "/v1/sandboxes", key, `{}`)
		h.expect(r, http.StatusCreated, "")
		if wantPool {
			claimCreates = append(claimCreates, time.Since(start))
		}
		var sb api.Sandbox
		r.json(b, &sb)
		h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/exec", key, api.ExecRequest{Cmd: []string{"true"}}), http.StatusOK, "")
		d := time.Since(start)
		if wantPool {
			s2 := time.Now()
			h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/exec", key, api.ExecRequest{Cmd: []string{"true"}}), http.StatusOK, "")
			next = append(next, time.Since(s2))
		}
		if (sb.Pool == "warm") != wantPool {
			b.Fatalf("create of %s: pool %q", sb.Tenant, sb.Pool)
		}
		b.StopTimer()
		h.expect(h.req("DELETE", "/v1/sandboxes/"+sb.ID, key, nil), http.StatusNoContent, "")
		return d
	}
	var claims, colds []time.Duration
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		h.waitPoolReady(b, "acme", "warm", 2)
		b.StartTimer()
		claims = append(claims, run(warm, true))
		b.StartTimer()
		colds = append(colds, run(cold, false))
		b.StartTimer()
	}
	b.StopTimer()
	pct := func(ds []time.Duration, p float64) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return float64(s[int(p*float64(len(s)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(claims, 0.5), "claim-p50-ms")
	b.ReportMetric(pct(claims, 0.9), "claim-p90-ms")
	b.ReportMetric(pct(claimCreates, 0.5), "claim-create-p50-ms")
	b.ReportMetric(pct(colds, 0.5), "cold-p50-ms")
	b.ReportMetric(pct(next, 0.5), "next-exec-p50-ms")
	b.ReportMetric(pct(colds, 0.9), "cold-p90-ms")
}
