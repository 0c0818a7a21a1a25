package httpapi_test

import (
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/config"
)

var errBoom = errors.New("boom")

// TestMetricsSeriesSince: every sample lands in the sandbox's series in
// time order, and ?since= returns only the samples after it.
func TestMetricsSeriesSince(t *testing.T) {
	// A sample loop that never fires on its own: GET /v1/usage samples
	// every live sandbox, so the test decides when samples are taken.
	h := newHarness(t, withSampleInterval(time.Hour))
	sb := h.create("acme", api.CreateSandboxRequest{})
	key := h.key("acme")
	var times []time.Time
	for range 3 {
		h.clock.Advance(10 * time.Second)
		times = append(times, h.clock.Now())
		h.expect(h.req("GET", "/v1/usage", key, nil), http.StatusOK, "")
	}
	series := func(query string) api.SandboxMetrics {
		t.Helper()
		var mt api.SandboxMetrics
		r := h.req("GET", "/v1/sandboxes/"+sb.ID+"/metrics"+query, key, nil)
		h.expect(r, http.StatusOK, "")
		r.json(t, &mt)
		return mt
	}
	all := series("")
	if len(all.Series) != 3 {
		t.Fatalf("series has %d samples, want 3: %+v", len(all.Series), all.Series)
	}
	if all.SampleIntervalS != 3600 {
		t.Errorf("sample_interval_s %v, want 3600", all.SampleIntervalS)
	}
	for i, s := range all.Series {
		// Each sample is stamped by the manager's clock at the request.
		if s.Time.Before(times[i]) || (i+1 < len(times) && !s.Time.Before(times[i+1])) {
			t.Errorf("sample %d at %v, want in [%v, next request)", i, s.Time, times[i])
		}
		if s.CPUSeconds != 1.5 || s.MemoryBytes != 1<<20 || s.PIDs != 1 {
			t.Errorf("sample %d %+v, want the driver's counters", i, s)
		}
	}
	since := all.Series[0].Time.Format(time.RFC3339Nano)
	later := series("?since=" + url.QueryEscape(since))
	if len(later.Series) != 2 || !later.Series[0].Time.Equal(all.Series[1].Time) {
		t.Fatalf("since %s: %+v, want the last two samples", since, later.Series)
	}
	if got := series("?since=" + url.QueryEscape(all.Series[2].Time.Format(time.RFC3339Nano))); len(got.Series) != 0 {
		t.Fatalf("since the last sample: %+v, want none", got.Series)
	}
	h.expect(h.req("GET", "/v1/sandboxes/"+sb.ID+"/metrics?since=yesterday", key, nil), http.StatusBadRequest, api.CodeInvalidArgument)
	h.expect(h.req("GET", "/v1/sandboxes/"+sb.ID+"/metrics", h.key("other"), nil), http.StatusNotFound, api.CodeSandboxNotFound)
}

// promValue returns the value of the exposition line that starts with
// series (name and sorted labels), or -1 when it is absent.
func promValue(t *testing.T, body, series string) float64 {
	t.Helper()
	for line := range strings.SplitSeq(body, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("line %q: %v", line, err)
			}
			return v
		}
	}
	return -1
}

// TestPrometheusMetrics: the histograms, counters and gauges move with the
// creates, execs, agent calls and errors that happen through the API.
func TestPrometheusMetrics(t *testing.T) {
	h := newHarness(t, withSettings(func(c *config.Config) { c.MaxSandboxes = 7 }))
	key := h.key("acme")
	sb := h.create("acme", api.CreateSandboxRequest{})
	h.create("acme", api.CreateSandboxRequest{}) // stays running
	for range 2 {
		if res := h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"true"}}); res.Status != api.ExecExited {
			t.Fatalf("exec %+v", res)
		}
	}
	timeout := 0.2
	if res := h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"sleep", "5"}, TimeoutS: &timeout}); res.Status != api.ExecTimeout {
		t.Fatalf("exec with timeout %+v", res)
	}
	h.expect(h.req("GET", "/v1/sandboxes/sb_nope", key, nil), http.StatusNotFound, api.CodeSandboxNotFound)
	h.expect(h.req("GET", "/v1/sandboxes/sb_nope", key, nil), http.StatusNotFound, api.CodeSandboxNotFound)
	h.drv.Crash(sb.ID)
	eventually(t, "the crash to be noticed", func() bool { return h.state("acme", sb.ID).State == api.StateError })

	body := string(h.req("GET", "/metrics", h.admin, nil).body)
	for _, c := range []struct {
		series string
		want   float64 // -2: any value > 0
	}{
		{`airlock_create_duration_seconds_count{result="ok",runtime="runc"}`, 2},
		{`airlock_exec_duration_seconds_count{runtime="runc",status="exited"}`, 2},
		{`airlock_exec_duration_seconds_count{runtime="runc",status="timeout"}`, 1},
		{`airlock_api_errors_total{code="sandbox_not_found"}`, 2},
		{`airlock_sandbox_errors_total{code="sandbox_crashed"}`, 1},
		{`airlock_agent_call_duration_seconds_count`, -2},
		{`airlock_capacity_sandboxes`, 7},
		{`airlock_sandboxes{runtime="runc",state="running",template="base"}`, 1},
		{`airlock_capacity_used_sandboxes`, 1},
		{`airlock_http_request_duration_seconds_count{code="201",method="POST",route="POST /v1/sandboxes"}`, 2},
		{`airlock_http_request_duration_seconds_count{code="404",method="GET",route="GET /v1/sandboxes/{id}"}`, 2},
	} {
		got := promValue(t, body, c.series)
		if (c.want == -2 && got <= 0) || (c.want != -2 && got != c.want) {
			t.Errorf("%s = %v, want %v", c.series, got, c.want)
		}
	}
	// A sandbox in state error no longer counts as live.
	if got := promValue(t, body, `airlock_sandboxes{runtime="runc",state="error",template="base"}`); got != -1 {
		t.Errorf("error sandboxes counted as live: %v", got)
	}
	// A create that fails is counted as such.
	h.drv.FailNextCreate(errBoom)
	r := h.req("POST", "/v1/sandboxes", key, api.CreateSandboxRequest{})
	if r.StatusCode < 400 {
		t.Fatalf("failed create: status %d", r.StatusCode)
	}
	body = string(h.req("GET", "/metrics", h.admin, nil).body)
	if got := promValue(t, body, `airlock_create_duration_seconds_count{result="error",runtime="runc"}`); got != 1 {
		t.Errorf("failed creates %v, want 1", got)
	}
}

// TestE2BRequestsNamedInMetrics: requests that the E2B planes serve are
// counted under their plane, not as unmatched routes, and the API's own
// routes are unaffected.
func TestE2BRequestsNamedInMetrics(t *testing.T) {
	served := 0
	h := newHarness(t, withE2B(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served++
		w.WriteHeader(http.StatusNoContent)
	})))
	h.expect(h.req("GET", "/v2/sandboxes", "", nil), http.StatusNoContent, "")
	h.expect(h.req("GET", "/health", "", nil, "E2b-Sandbox-Id", "sbx_x"), http.StatusNoContent, "")
	h.expect(h.req("GET", "/v1/sandboxes", h.key("acme"), nil), http.StatusOK, "")
	if served != 2 {
		t.Fatalf("the E2B handler served %d requests, want 2", served)
	}
	body := string(h.req("GET", "/metrics", h.admin, nil).body)
	for _, series := range []string{
		`airlock_http_request_duration_seconds_count{code="204",method="GET",route="e2b control plane"}`,
		`airlock_http_request_duration_seconds_count{code="204",method="GET",route="e2b sandbox plane"}`,
		`airlock_http_request_duration_seconds_count{code="200",method="GET",route="GET /v1/sandboxes"}`,
	} {
		if got := promValue(t, body, series); got != 1 {
			t.Errorf("%s = %v, want 1", series, got)
		}
	}
}
