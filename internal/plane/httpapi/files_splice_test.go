package httpapi_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
)

func randomData(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// fileWrites returns the audited file writes by path.
func (h *harness) fileWrites() map[string]api.FileAuditDetail {
	h.t.Helper()
	out := map[string]api.FileAuditDetail{}
	for _, e := range h.auditAll(h.admin, "", 0) {
		if e.Type != api.AuditFileWrite {
			continue
		}
		var d api.FileAuditDetail
		if err := json.Unmarshal(e.Detail, &d); err != nil {
			h.t.Fatal(err)
		}
		out[d.Path] = d
	}
	return out
}

// TestUploadSpliced uploads files around the size from which the daemon
// takes the connection and splices the body to the agent: the bytes, the
// answer (status, request id, JSON) and what the audit trail and the request
// metrics record must not depend on the path taken; only the connection's
// reuse does.
func TestUploadSpliced(t *testing.T) {
	h := newHarness(t, withAudit())
	sb := h.create("acme", api.CreateSandboxRequest{})
	key := h.key("acme")
	base := "/v1/sandboxes/" + sb.ID
	tests := []struct {
		name    string
		size    int
		expect  bool // send Expect: 100-continue, as curl does
		spliced bool // large enough for the connection to be taken
	}{
		{"below_threshold", 1<<20 - 1, false, false},
		{"threshold", 1 << 20, false, true},
		{"odd_size", 3<<20 + 12345, false, true},
		{"expect_continue", 2 << 20, true, true},
	}
	ran := map[string]int{} // name → size, of the cases -run selected
	tr := &http.Transport{ExpectContinueTimeout: 30 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := randomData(t, tt.size)
			p := "/home/user/" + tt.name
			var got100 atomic.Bool
			ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{Got100Continue: func() { got100.Store(true) }})
			req, err := http.NewRequestWithContext(ctx, "PUT", h.url+base+"/files?path="+url.QueryEscape(p), bytes.NewReader(data))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+key)
			if tt.expect {
				req.Header.Set("Expect", "100-continue")
			}
			res, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(res.Body)
			res.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != http.StatusCreated || res.Header.Get("Content-Type") != "application/json" ||
				!strings.HasPrefix(res.Header.Get("X-Request-Id"), "req_") {
				t.Fatalf("status %d, headers %v, body %s", res.StatusCode, res.Header, body)
			}
			var fw api.FileWritten
			if err := json.Unmarshal(body, &fw); err != nil || fw.Path != p || fw.Size != int64(tt.size) {
				t.Fatalf("answer %s (%v)", body, err)
			}
			if res.Close != tt.spliced {
				t.Errorf("connection closed after the answer: %v, want %v", res.Close, tt.spliced)
			}
			if tt.expect && !got100.Load() {
				t.Error("no 100 Continue before the body")
			}
			r := h.req("GET", base+"/files?path="+url.QueryEscape(p), key, nil)
			h.expect(r, http.StatusOK, "")
			if !bytes.Equal(r.body, data) {
				t.Fatalf("downloaded %d bytes differ from the %d uploaded", len(r.body), len(data))
			}
			ran[tt.name] = tt.size
		})
	}
	writes := h.fileWrites()
	for name, size := range ran {
		if d := writes["/home/user/"+name]; !d.OK || d.Bytes != int64(size) || d.Op != "write" {
			t.Errorf("%s: audited %+v, want an ok write of %d bytes", name, d, size)
		}
	}
	metrics := string(h.req("GET", "/metrics", h.admin, nil).body)
	if got := promValue(t, metrics, `airlock_http_request_duration_seconds_count{code="201",method="PUT",route="PUT /v1/sandboxes/{id}/files"}`); got != float64(len(ran)) {
		t.Errorf("%v uploads with status 201 in the request metrics, want %d", got, len(ran))
	}
}

// TestUploadSplicedRefused checks large uploads refused once the
// connection is taken (the agent refuses the path, the sandbox is unknown)
// while the client is still sending: the client gets the API error, not a
// reset connection, and the refusal is audited with its status.
func TestUploadSplicedRefused(t *testing.T) {
	h := newHarness(t, withAudit())
	sb := h.create("acme", api.CreateSandboxRequest{})
	key := h.key("acme")
	data := randomData(t, 8<<20)
	tests := []struct {
		name   string
		path   string
		status int
		code   string
	}{
		{"permission_denied", "/v1/sandboxes/" + sb.ID + "/files?path=/root/x", http.StatusForbidden, api.CodePermissionDenied},
		{"unknown_sandbox", "/v1/sandboxes/sbx_nope/files?path=/home/user/x", http.StatusNotFound, api.CodeSandboxNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.req("PUT", tt.path, key, data)
			h.expect(r, tt.status, tt.code)
			if !r.Close {
				t.Error("a taken connection was left open")
			}
			// The request metrics saw the status the client got.
			metrics := string(h.req("GET", "/metrics", h.admin, nil).body)
			series := fmt.Sprintf(`airlock_http_request_duration_seconds_count{code="%d",method="PUT",route="PUT /v1/sandboxes/{id}/files"}`, tt.status)
			if got := promValue(t, metrics, series); got != 1 {
				t.Errorf("%s = %v, want 1", series, got)
			}
			if tt.code == api.CodePermissionDenied {
				if d, ok := h.fileWrites()["/root/x"]; !ok || d.OK || d.Code != tt.code {
					t.Errorf("refused write audited as %+v (found %v)", d, ok)
				}
			}
		})
	}
}

// TestUploadSplicedClientGone sends half of a large upload and hangs up:
// the upload fails, leaves no file, and is audited as failed with the bytes
// that came.
func TestUploadSplicedClientGone(t *testing.T) {
	h := newHarness(t, withAudit())
	sb := h.create("acme", api.CreateSandboxRequest{})
	key := h.key("acme")
	u, err := url.Parse(h.url)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	const announced, sent = 4 << 20, 3<<19 + 7
	head := fmt.Sprintf("PUT /v1/sandboxes/%s/files?path=/home/user/gone HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n",
		sb.ID, u.Host, key, announced)
	if _, err := conn.Write(append([]byte(head), randomData(t, sent)...)); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	eventually(t, "the failed upload to be audited", func() bool {
		_, ok := h.fileWrites()["/home/user/gone"]
		return ok
	})
	if d := h.fileWrites()["/home/user/gone"]; d.OK || d.Bytes != sent {
		t.Errorf("audited %+v, want a failed write of %d bytes", d, sent)
	}
	eventually(t, "the partial upload to go", func() bool {
		return h.req("GET", "/v1/sandboxes/"+sb.ID+"/fs/stat?path=/home/user/gone", key, nil).StatusCode == http.StatusNotFound
	})
}

// BenchmarkUpload100MiB uploads 100 MiB to an in-process agent over unix
// sockets (the fake driver), with a Content-Length (the connection is taken
// and the body spliced to the agent) and without one (chunked, read by
// net/http and copied to the agent). Client, daemon and agent share this
// process, so it compares the two paths, not the daemon with `cp`.
func BenchmarkUpload100MiB(b *testing.B) {
	h := newHarness(b, withMaxUpload(256<<20))
	sb := h.create("acme", api.CreateSandboxRequest{})
	key := h.key("acme")
	data := make([]byte, 100<<20)
	if _, err := rand.Read(data); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name  string
		sized bool
	}{{"conn_taken", true}, {"net_http", false}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				var body io.Reader = bytes.NewReader(data)
				if !bc.sized {
					body = struct{ io.Reader }{body} // no length: chunked
				}
				r := h.req("PUT", "/v1/sandboxes/"+sb.ID+"/files?path=/home/user/bench", key, body)
				if r.StatusCode != http.StatusCreated {
					b.Fatalf("status %d: %s", r.StatusCode, r.body)
				}
			}
		})
	}
}
