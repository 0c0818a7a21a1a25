package httpapi_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/config"
)

// TestPreviewAPI covers the preview routes' contract on the fake driver:
// shapes, validation, tenancy, listing and removal. Reaching the port is
// TestE2EPreview's.
func TestPreviewAPI(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{})
	path := "/v1/sandboxes/" + sb.ID + "/previews"

	tests := []struct {
		name   string
		tenant string
		body   any
		status int
		code   string
	}{
		{"PortZero", "acme", api.PreviewRequest{Port: 0}, http.StatusBadRequest, api.CodeInvalidArgument},
		{"PortTooLarge", "acme", api.PreviewRequest{Port: 70000}, http.StatusBadRequest, api.CodeInvalidArgument},
		{"UnknownField", "acme", `{"port": 80, "bogus": 1}`, http.StatusBadRequest, api.CodeInvalidArgument},
		{"OtherTenant", "other", api.PreviewRequest{Port: 8080}, http.StatusNotFound, api.CodeSandboxNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h.expect(h.req("POST", path, h.key(tc.tenant), tc.body), tc.status, tc.code)
		})
	}

	var a, b, again api.Preview
	r := h.req("POST", path, h.key("acme"), api.PreviewRequest{Port: 8080})
	h.expect(r, http.StatusOK, "")
	r.json(t, &a)
	r = h.req("POST", path, h.key("acme"), api.PreviewRequest{Port: 3000, Public: true})
	h.expect(r, http.StatusOK, "")
	r.json(t, &b)
	if a.URL != "http://8080-"+sb.ID+".localhost:7071/" || a.Public || !strings.HasPrefix(a.Token, "apv_") {
		t.Fatalf("preview %+v", a)
	}
	if b.Token != a.Token || !b.Public || b.Port != 3000 {
		t.Fatalf("second preview %+v: one token per sandbox", b)
	}
	// Exposing again flips public.
	r = h.req("POST", path, h.key("acme"), api.PreviewRequest{Port: 8080, Public: true})
	h.expect(r, http.StatusOK, "")
	r.json(t, &again)
	if !again.Public || again.Token != a.Token {
		t.Fatalf("re-exposed %+v", again)
	}
	// Another sandbox has another token.
	sb2 := h.create("acme", api.CreateSandboxRequest{})
	var c api.Preview
	r = h.req("POST", "/v1/sandboxes/"+sb2.ID+"/previews", h.key("acme"), api.PreviewRequest{Port: 8080})
	h.expect(r, http.StatusOK, "")
	r.json(t, &c)
	if c.Token == a.Token {
		t.Fatal("two sandboxes share a preview token")
	}

	var list api.PreviewList
	h.req("GET", path, h.key("acme"), nil).json(t, &list)
	if len(list.Previews) != 2 || list.Previews[0].Port != 3000 || list.Previews[1].Port != 8080 || !list.Previews[1].Public {
		t.Fatalf("list %+v", list)
	}
	h.expect(h.req("GET", path, h.key("other"), nil), http.StatusNotFound, api.CodeSandboxNotFound)
	h.expect(h.req("DELETE", path+"/8080", h.key("other"), nil), http.StatusNotFound, api.CodeSandboxNotFound)
	h.expect(h.req("DELETE", path+"/abc", h.key("acme"), nil), http.StatusBadRequest, api.CodeInvalidArgument)
	h.expect(h.req("DELETE", path+"/8080", h.key("acme"), nil), http.StatusNoContent, "")
	h.expect(h.req("DELETE", path+"/8080", h.key("acme"), nil), http.StatusNotFound, "")
	h.req("GET", path, h.key("acme"), nil).json(t, &list)
	if len(list.Previews) != 1 || list.Previews[0].Port != 3000 {
		t.Fatalf("after delete %+v", list)
	}
}

func TestPreviewDisabled(t *testing.T) {
	h := newHarness(t, withSettings(func(c *config.Config) { c.PreviewListen = "" }))
	sb := h.create("acme", api.CreateSandboxRequest{})
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/previews", h.key("acme"), api.PreviewRequest{Port: 8080}), http.StatusNotImplemented, api.CodeNotImplemented)
}
