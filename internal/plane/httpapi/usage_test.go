package httpapi_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
)

// TestUsageAccruesRunningAndPausedSeconds checks that usage counts the
// seconds a sandbox spent in each state, once, and is tenant-scoped.
func TestUsageAccruesRunningAndPausedSeconds(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{})
	h.clock.Advance(100 * time.Second)
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/pause", h.key("acme"), nil), http.StatusOK, "")
	h.clock.Advance(50 * time.Second)

	var rep api.UsageReport
	h.req("GET", "/v1/usage", h.key("acme"), nil).json(t, &rep)
	// A second report must not count the same seconds again.
	h.req("GET", "/v1/usage", h.key("acme"), nil).json(t, &rep)
	if len(rep.Groups) != 1 || rep.Groups[0].Key != sb.ID || rep.Groups[0].Tenant != "acme" {
		t.Fatalf("groups %+v", rep.Groups)
	}
	u := rep.Total
	// Real time passes too (create, requests): allow a few seconds.
	if u.RunningS < 100 || u.RunningS > 105 || u.PausedS < 50 || u.PausedS > 55 {
		t.Fatalf("running %v paused %v, want ~100 and ~50", u.RunningS, u.PausedS)
	}
	if want := u.RunningS * sb.Resources.CPU; u.VCPUAllocatedS < want-1e-6 || u.VCPUAllocatedS > want+1e-6 {
		t.Fatalf("vcpu allocated %v, want %v", u.VCPUAllocatedS, want)
	}

	var other api.UsageReport
	h.req("GET", "/v1/usage", h.key("other"), nil).json(t, &other)
	if len(other.Groups) != 0 || other.Total.RunningS != 0 {
		t.Fatalf("another tenant sees %+v", other)
	}
	h.expect(h.req("GET", "/v1/usage?tenant=acme", h.key("other"), nil), http.StatusForbidden, "")
	h.expect(h.req("GET", "/v1/usage?group_by=week", h.key("acme"), nil), http.StatusBadRequest, "")
	var all api.UsageReport
	h.req("GET", "/v1/usage?group_by=template", h.admin, nil).json(t, &all)
	if len(all.Groups) != 1 || all.Groups[0].Key == "" {
		t.Fatalf("admin by template %+v", all.Groups)
	}
}
