package httpapi_test

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"testing"

	"github.com/airlockhq/airlock/api"
)

// previewPorts lists sandbox id's exposed ports through the API as
// "port:public" strings.
func (h *harness) previewPorts(tenant, id string) []string {
	h.t.Helper()
	var list api.PreviewList
	r := h.req("GET", "/v1/sandboxes/"+id+"/previews", h.key(tenant), nil)
	h.expect(r, http.StatusOK, "")
	r.json(h.t, &list)
	var out []string
	for _, p := range list.Previews {
		s := "private"
		if p.Public {
			s = "public"
		}
		out = append(out, strconv.Itoa(p.Port)+":"+s)
	}
	return out
}

// TestPreviewsSurviveRestart: exposed ports are kept across a daemon
// restart (the preview listener's backend finds them exposed again, with
// the same token), an unexposed one stays unexposed, and a deleted
// sandbox's ports do not come back.
func TestPreviewsSurviveRestart(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb := h.create("acme", api.CreateSandboxRequest{})
	gone := h.create("acme", api.CreateSandboxRequest{})
	path := "/v1/sandboxes/" + sb.ID + "/previews"
	var first api.Preview
	r := h.req("POST", path, h.key("acme"), api.PreviewRequest{Port: 8080})
	h.expect(r, http.StatusOK, "")
	r.json(t, &first)
	h.expect(h.req("POST", path, h.key("acme"), api.PreviewRequest{Port: 3000, Public: true}), http.StatusOK, "")
	h.expect(h.req("POST", path, h.key("acme"), api.PreviewRequest{Port: 5000}), http.StatusOK, "")
	h.expect(h.req("DELETE", path+"/5000", h.key("acme"), nil), http.StatusNoContent, "")
	h.expect(h.req("POST", "/v1/sandboxes/"+gone.ID+"/previews", h.key("acme"), api.PreviewRequest{Port: 8080}), http.StatusOK, "")
	h.expect(h.req("DELETE", "/v1/sandboxes/"+gone.ID, h.key("acme"), nil), http.StatusNoContent, "")

	h.restart()

	if got, want := h.previewPorts("acme", sb.ID), []string{"3000:public", "8080:private"}; !slices.Equal(got, want) {
		t.Fatalf("previews after restart %v, want %v", got, want)
	}
	tests := []struct {
		name            string
		id              string
		port            int
		exposed, public bool
		wantNotFoundSbx bool
	}{
		{"Private", sb.ID, 8080, true, false, false},
		{"Public", sb.ID, 3000, true, true, false},
		{"Unexposed", sb.ID, 5000, false, false, false},
		{"DeletedSandbox", gone.ID, 8080, false, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tg, err := h.svc.Previews.PreviewBackend().PreviewTarget(ctx, tc.id, tc.port)
			if tc.wantNotFoundSbx {
				if err == nil {
					t.Fatalf("target of a deleted sandbox: %+v", tg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tg.Exposed != tc.exposed || tg.Public != tc.public || tg.Token != first.Token {
				t.Fatalf("target %+v, want exposed=%v public=%v and the token from before the restart", tg, tc.exposed, tc.public)
			}
		})
	}

	// Unexposing after the restart sticks across the next one; deleting
	// the sandbox forgets the rest.
	h.expect(h.req("DELETE", path+"/3000", h.key("acme"), nil), http.StatusNoContent, "")
	h.restart()
	if got, want := h.previewPorts("acme", sb.ID), []string{"8080:private"}; !slices.Equal(got, want) {
		t.Fatalf("previews after the second restart %v, want %v", got, want)
	}
	h.expect(h.req("DELETE", "/v1/sandboxes/"+sb.ID, h.key("acme"), nil), http.StatusNoContent, "")
	for _, id := range []string{sb.ID, gone.ID} {
		if list, err := h.st.Previews(ctx, id); err != nil || len(list) != 0 {
			t.Fatalf("stored previews of deleted sandbox %s: %v %v", id, list, err)
		}
	}
}

// TestE2EPreviewSurvivesRestart: with real runc, a port exposed before the
// daemon went away answers at its preview URL after the restart, with the
// token handed out before it.
func TestE2EPreviewSurvivesRestart(t *testing.T) {
	e := newE2E(t, e2ePreviews)
	h := e.h
	addr := e.previewAddr
	sb := h.create("acme", api.CreateSandboxRequest{})
	h.expect(h.req("PUT", "/v1/sandboxes/"+sb.ID+"/files?path=/home/user/www/index.html", h.key("acme"), "served across restarts\n"), http.StatusCreated, "")
	res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`(setsid python3 -m http.server 8080 --bind 127.0.0.1 -d /home/user/www >/dev/null 2>&1 &);
for i in $(seq 100); do python3 -c 'import socket; socket.create_connection(("127.0.0.1", 8080)).close()' 2>/dev/null && echo up && exit 0; sleep 0.1; done; echo down`)})
	if strp(res.Stdout) != "up\n" {
		t.Fatalf("server in the sandbox: %+v %q", res, strp(res.Stderr))
	}
	var pv api.Preview
	r := h.req("POST", "/v1/sandboxes/"+sb.ID+"/previews", h.key("acme"), api.PreviewRequest{Port: 8080})
	h.expect(r, http.StatusOK, "")
	r.json(t, &pv)
	tok := map[string]string{api.PreviewTokenHeader: pv.Token}
	if resp, body := previewGet(t, addr, pv.URL, tok); resp.StatusCode != http.StatusOK || body != "served across restarts\n" {
		t.Fatalf("before restart: %d %q", resp.StatusCode, body)
	}

	e.stop() // the daemon goes away; the sandbox and its server keep running
	e.start()
	addr = e.previewAddr
	var list api.PreviewList
	h.req("GET", "/v1/sandboxes/"+sb.ID+"/previews", h.key("acme"), nil).json(t, &list)
	if len(list.Previews) != 1 || list.Previews[0].Port != 8080 || list.Previews[0].Token != pv.Token {
		t.Fatalf("previews after restart %+v, want port 8080 with the old token", list)
	}
	if resp, body := previewGet(t, addr, list.Previews[0].URL, tok); resp.StatusCode != http.StatusOK || body != "served across restarts\n" {
		t.Fatalf("after restart: %d %q", resp.StatusCode, body)
	}
	if resp, _ := previewGet(t, addr, list.Previews[0].URL, nil); resp.StatusCode == http.StatusOK {
		t.Fatal("a private preview answered without its token after the restart")
	}
}
