package httpapi_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
)

// auditAll pages through GET /v1/audit?query with key and returns every
// event, checking that the pages join up.
func (h *harness) auditAll(key, query string, limit int) []api.AuditEvent {
	h.t.Helper()
	var out []api.AuditEvent
	cursor := ""
	for pages := 0; ; pages++ {
		q, _ := url.ParseQuery(query)
		if limit > 0 {
			q.Set("limit", strconv.Itoa(limit))
		}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		r := h.req("GET", "/v1/audit?"+q.Encode(), key, nil)
		h.expect(r, http.StatusOK, "")
		var l api.AuditList
		r.json(h.t, &l)
		if l.NextCursor == "" || (limit > 0 && len(l.Events) > limit) {
			h.t.Fatalf("page %+v", l)
		}
		out = append(out, l.Events...)
		if !l.HasMore {
			return out
		}
		cursor = l.NextCursor
		if pages > 1000 {
			h.t.Fatal("audit paging does not end")
		}
	}
}

// findEvent returns the first event of type typ of sandbox sbx.
func findEvent(evs []api.AuditEvent, typ, sbx string) (api.AuditEvent, bool) {
	for _, e := range evs {
		if e.Type == typ && e.SandboxID == sbx {
			return e, true
		}
	}
	return api.AuditEvent{}, false
}

// TestAuditTrail drives a sandbox through its life over HTTP and checks
// that every step is in the trail with its request id and tenant, that the
// sandbox's secret appears in no form, and that tenants see only theirs.
func TestAuditTrail(t *testing.T) {
	h := newHarness(t, withAudit())
	const secret = "s3cr3t-Token-xyz"
	acme, evil := h.key("acme"), h.key("evil")
	reqID := map[string]string{} // step → X-Request-Id

	r := h.req("POST", "/v1/sandboxes", acme, api.CreateSandboxRequest{Secrets: map[string]string{"TOKEN": secret}, Metadata: map[string]string{"k": "v"}})
	h.expect(r, http.StatusCreated, "")
	var sb api.Sandbox
	r.json(t, &sb)
	reqID["create"] = r.Header.Get("X-Request-Id")

	r = h.req("POST", "/v1/sandboxes/"+sb.ID+"/exec", acme, api.ExecRequest{Cmd: []string{"sh", "-c", "echo $TOKEN " + secret + "; exit 3"}})
	h.expect(r, http.StatusOK, "")
	reqID["exec"] = r.Header.Get("X-Request-Id")

	b64 := base64.StdEncoding.EncodeToString([]byte(secret))
	r = h.req("PUT", "/v1/sandboxes/"+sb.ID+"/files?path=/home/user/"+url.QueryEscape(b64)+".txt", acme, "hello")
	h.expect(r, http.StatusCreated, "")
	reqID["write"] = r.Header.Get("X-Request-Id")
	r = h.req("POST", "/v1/sandboxes/"+sb.ID+"/fs/mkdir", acme, api.MkdirRequest{Path: "/home/user/d"})
	h.expect(r, http.StatusCreated, "")
	reqID["mkdir"] = r.Header.Get("X-Request-Id")
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/fs/move", acme, api.MoveRequest{From: "/home/user/d", To: "/home/user/e"}), http.StatusOK, "")
	h.expect(h.req("DELETE", "/v1/sandboxes/"+sb.ID+"/fs?path=/home/user/e&recursive=true", acme, nil), http.StatusNoContent, "")
	// A refused write is audited too, with its error code.
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/fs/move", acme, api.MoveRequest{From: "/home/user/nosuch", To: "/home/user/x"}), http.StatusNotFound, "")

	r = h.req("POST", "/v1/sandboxes/"+sb.ID+"/pause", acme, nil)
	h.expect(r, http.StatusOK, "")
	reqID["pause"] = r.Header.Get("X-Request-Id")
	r = h.req("POST", "/v1/sandboxes/"+sb.ID+"/resume", acme, nil)
	h.expect(r, http.StatusOK, "")
	reqID["resume"] = r.Header.Get("X-Request-Id")

	// A wrong key: audited without a tenant, and answered slowly.
	start := time.Now()
	r = h.req("GET", "/v1/sandboxes", "ak_"+strings.Repeat("q", 52), nil)
	h.expect(r, http.StatusUnauthorized, api.CodeUnauthenticated)
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("a wrong key was answered after %v, want the failure delay", d)
	}
	reqID["auth"] = r.Header.Get("X-Request-Id")

	// Another sandbox expires; another tenant works on its own.
	short := h.create("acme", api.CreateSandboxRequest{TimeoutS: i64(60)})
	foreign := h.create("evil", api.CreateSandboxRequest{})
	h.exec("evil", foreign.ID, api.ExecRequest{Cmd: []string{"true"}})
	h.clock.Advance(61 * time.Second)
	eventually(t, "expiry", func() bool { return h.state("acme", short.ID).State == api.StateStopped })

	r = h.req("DELETE", "/v1/sandboxes/"+sb.ID, acme, nil)
	h.expect(r, http.StatusNoContent, "")
	reqID["delete"] = r.Header.Get("X-Request-Id")

	var evs []api.AuditEvent
	eventually(t, "the exec events", func() bool {
		evs = h.auditAll(acme, "", 0)
		_, ok := findEvent(evs, api.AuditExec, sb.ID)
		return ok
	})

	t.Run("every_step_with_request_id", func(t *testing.T) {
		for _, want := range []struct{ typ, sbx, step string }{
			{api.AuditCreate, sb.ID, "create"}, {api.AuditExec, sb.ID, "exec"}, {api.AuditFileWrite, sb.ID, "write"},
			{api.AuditPause, sb.ID, "pause"}, {api.AuditResume, sb.ID, "resume"}, {api.AuditDelete, sb.ID, "delete"},
			{api.AuditExpiry, short.ID, ""},
		} {
			e, ok := findEvent(evs, want.typ, want.sbx)
			if !ok {
				t.Errorf("no %s event of %s", want.typ, want.sbx)
				continue
			}
			if e.Tenant != "acme" || e.Template != "base" || !strings.HasPrefix(e.ID, "aud_") || e.Time.IsZero() {
				t.Errorf("%s event %+v", want.typ, e)
			}
			if want.step != "" && (e.RequestID == "" || e.RequestID != reqID[want.step]) {
				t.Errorf("%s event request id %q, want %q", want.typ, e.RequestID, reqID[want.step])
			}
			if want.step == "" && e.RequestID != "" {
				t.Errorf("%s event has request id %q", want.typ, e.RequestID)
			}
		}
		for i := 1; i < len(evs); i++ {
			if evs[i].Time.Before(evs[i-1].Time.Add(-time.Second)) {
				t.Errorf("events out of order: %v before %v", evs[i-1].Time, evs[i].Time)
			}
		}
	})
	t.Run("exec_detail", func(t *testing.T) {
		e, _ := findEvent(evs, api.AuditExec, sb.ID)
		var d api.ExecAuditDetail
		if err := json.Unmarshal(e.Detail, &d); err != nil {
			t.Fatal(err)
		}
		if d.User != "user" || d.Status != api.ExecExited || d.ExitCode == nil || *d.ExitCode != 3 ||
			len(d.Cmd) != 3 || !strings.Contains(d.Cmd[2], "****") || !strings.HasPrefix(d.ExecID, "ex_") {
			t.Fatalf("exec detail %s", e.Detail)
		}
	})
	t.Run("file_writes", func(t *testing.T) {
		var ops []string
		for _, e := range evs {
			if e.Type != api.AuditFileWrite {
				continue
			}
			var d api.FileAuditDetail
			json.Unmarshal(e.Detail, &d)
			op := d.Op + " " + d.Path
			if d.To != "" {
				op += " " + d.To
			}
			if !d.OK {
				op += " " + d.Code
			}
			if d.Op == "write" && d.Bytes != 5 {
				t.Errorf("write of %d bytes recorded, want 5", d.Bytes)
			}
			if d.Op == "mkdir" && e.RequestID != reqID["mkdir"] {
				t.Errorf("mkdir request id %q", e.RequestID)
			}
			ops = append(ops, op)
		}
		masked := "/home/user/" + strings.Repeat("*", len(b64)) + ".txt"
		want := []string{"write " + masked, "mkdir /home/user/d", "move /home/user/d /home/user/e", "remove /home/user/e",
			"move /home/user/nosuch /home/user/x not_found"}
		if !slices.Equal(ops, want) {
			t.Fatalf("file events %q, want %q", ops, want)
		}
	})
	t.Run("no_secret_in_any_form", func(t *testing.T) {
		raw := h.req("GET", "/v1/audit?limit=1000", h.admin, nil).body
		for _, form := range []string{secret, b64, url.QueryEscape(b64), base64.RawURLEncoding.EncodeToString([]byte(secret))} {
			if bytes.Contains(raw, []byte(form)) {
				t.Errorf("the trail holds the secret as %q", form)
			}
		}
	})
	t.Run("tenant_scoping", func(t *testing.T) {
		for _, e := range evs {
			if e.Tenant != "acme" || e.SandboxID == foreign.ID || e.Type == api.AuditAuthFailure {
				t.Errorf("acme sees %+v", e)
			}
		}
		if got := h.auditAll(acme, "sandbox_id="+foreign.ID, 0); len(got) != 0 {
			t.Errorf("acme sees %d events of evil's sandbox", len(got))
		}
		mine := h.auditAll(evil, "", 0)
		if len(mine) == 0 {
			t.Fatal("evil sees nothing of its own")
		}
		for _, e := range mine {
			if e.Tenant != "evil" {
				t.Errorf("evil sees %+v", e)
			}
		}
		h.expect(h.req("GET", "/v1/audit?tenant=acme", evil, nil), http.StatusForbidden, api.CodePermissionDenied)
		all := h.auditAll(h.admin, "", 0)
		if _, ok := findEvent(all, api.AuditCreate, foreign.ID); !ok {
			t.Error("admin does not see evil's sandbox")
		}
		af, ok := findEvent(all, api.AuditAuthFailure, "")
		if !ok || af.Tenant != "" || af.RequestID != reqID["auth"] || !strings.Contains(string(af.Detail), `"reason":"invalid api key"`) ||
			!strings.Contains(string(af.Detail), `"key_prefix":"ak_qqqqqq"`) || strings.Contains(string(af.Detail), strings.Repeat("q", 7)) {
			t.Errorf("auth failure event %+v %s", af, af.Detail)
		}
		if got := h.auditAll(h.admin, "tenant=evil", 0); len(got) != len(mine) {
			t.Errorf("admin's tenant=evil gives %d events, evil sees %d", len(got), len(mine))
		}
	})
	t.Run("paging_and_filters", func(t *testing.T) {
		all := h.auditAll(h.admin, "", 0)
		paged := h.auditAll(h.admin, "", 3)
		if !slices.EqualFunc(all, paged, func(a, b api.AuditEvent) bool { return a.ID == b.ID }) {
			t.Fatalf("paging by 3 gives %d events, one page %d", len(paged), len(all))
		}
		for _, e := range h.auditAll(acme, "type=pause,resume", 2) {
			if e.Type != api.AuditPause && e.Type != api.AuditResume {
				t.Errorf("type filter let %s through", e.Type)
			}
		}
		last := all[len(all)-1].Time
		if got := h.auditAll(h.admin, "since="+url.QueryEscape(last.Add(time.Millisecond).Format(time.RFC3339Nano)), 0); len(got) != 0 {
			t.Errorf("since after the last event gives %d", len(got))
		}
		if got := h.auditAll(h.admin, "until="+url.QueryEscape(all[0].Time.Format(time.RFC3339Nano)), 0); len(got) != 0 {
			t.Errorf("until the first event gives %d", len(got))
		}
		for _, q := range []string{"type=bogus", "cursor=nope", "since=yesterday", "limit=5000"} {
			h.expect(h.req("GET", "/v1/audit?"+q, acme, nil), http.StatusBadRequest, api.CodeInvalidArgument)
		}
	})
	t.Run("ndjson_export", func(t *testing.T) {
		all := h.auditAll(h.admin, "", 0)
		r := h.req("GET", "/v1/audit", h.admin, nil, "Accept", "application/x-ndjson")
		if r.StatusCode != http.StatusOK || r.Header.Get("Content-Type") != "application/x-ndjson" {
			t.Fatalf("export: %d %s", r.StatusCode, r.Header.Get("Content-Type"))
		}
		var ids []string
		sc := bufio.NewScanner(bytes.NewReader(r.body))
		for sc.Scan() {
			var e api.AuditEvent
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			ids = append(ids, e.ID)
		}
		if len(ids) != len(all) || ids[0] != all[0].ID || ids[len(ids)-1] != all[len(all)-1].ID {
			t.Fatalf("export has %d events, list %d", len(ids), len(all))
		}
		r = h.req("GET", "/v1/audit?limit=2&type=exec", acme, nil, "Accept", "application/x-ndjson")
		if n := bytes.Count(r.body, []byte("\n")); n != 1 || !bytes.Contains(r.body, []byte(`"type":"exec"`)) {
			t.Fatalf("filtered export: %s", r.body)
		}
	})
}

// TestAuditCrashAndFailedCreate: a crash and a failed create are error
// events with their codes.
func TestAuditCrashAndFailedCreate(t *testing.T) {
	h := newHarness(t, withAudit())
	sb := h.create("acme", api.CreateSandboxRequest{})
	h.drv.Crash(sb.ID)
	eventually(t, "the crash", func() bool { return h.state("acme", sb.ID).State == api.StateError })
	h.drv.FailNextStart(errors.New("runc: exec failed"))
	r := h.req("POST", "/v1/sandboxes", h.key("acme"), api.CreateSandboxRequest{})
	h.expect(r, http.StatusInternalServerError, api.CodeInternal)
	evs := h.auditAll(h.key("acme"), "type=error", 0)
	if len(evs) != 2 {
		t.Fatalf("error events %+v", evs)
	}
	if evs[0].SandboxID != sb.ID || !strings.Contains(string(evs[0].Detail), `"code":"sandbox_crashed"`) {
		t.Errorf("crash event %+v %s", evs[0], evs[0].Detail)
	}
	if evs[1].RequestID != r.Header.Get("X-Request-Id") || !strings.Contains(string(evs[1].Detail), `"op":"create"`) {
		t.Errorf("failed create event %+v %s", evs[1], evs[1].Detail)
	}
}

// TestAuditMetrics: the writer's counters are exported.
func TestAuditMetrics(t *testing.T) {
	h := newHarness(t, withAudit())
	h.create("acme", api.CreateSandboxRequest{})
	h.auditAll(h.admin, "", 0) // flushes
	body := string(h.req("GET", "/metrics", h.admin, nil).body)
	for _, want := range []string{"airlock_audit_events_written_total 1", "airlock_audit_events_dropped_total 0", "airlock_audit_queue_length 0"} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}
