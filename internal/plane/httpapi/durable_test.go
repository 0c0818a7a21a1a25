package httpapi_test

import (
	"net/http"
	"testing"

	"github.com/airlockhq/airlock/api"
)

// TestDurableFieldsRefusedUntilServed: the durable sandboxes' fields are in
// the contract before their services exist. Each is refused with
// capability_unsupported, never accepted and ignored: a create "from a
// snapshot" that silently started from the template, or a pause to disk
// that silently kept the RAM, would lose what the caller relies on.
func TestDurableFieldsRefusedUntilServed(t *testing.T) {
	h := newHarness(t)
	for name, req := range map[string]api.CreateSandboxRequest{
		"snapshot": {Snapshot: "snap_aaaaaaaaaaaaaaaaaaaaaaaa"},
	} {
		t.Run(name, func(t *testing.T) {
			h.expect(h.req("POST", "/v1/sandboxes", h.key("t1"), req), http.StatusBadRequest, api.CodeCapabilityUnsupported)
		})
	}
	// on_timeout kill is what every sandbox does: accepted.
	sb := h.create("t1", api.CreateSandboxRequest{Lifecycle: &api.Lifecycle{OnTimeout: api.OnTimeoutKill}})
	path := "/v1/sandboxes/" + sb.ID + "/pause"
	h.expect(h.req("POST", path, h.key("t1"), `{"memory":"swap"}`), http.StatusBadRequest, api.CodeInvalidArgument)
	h.expect(h.req("POST", path, h.key("t1"), api.PauseRequest{Memory: api.PauseMemoryKeep}), http.StatusOK, "")
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/resume", h.key("t1"), nil), http.StatusOK, "")
	h.expect(h.req("POST", path, h.key("t1"), nil), http.StatusOK, "")
}
