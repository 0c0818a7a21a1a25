package httpapi_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/config"
)

// TestExecRecordRetention: exec records with their cwd outlive the
// sandbox's delete and are purged after the configured retention. (The
// fake driver's agent runs on the host's filesystem, so the default cwd is
// whatever it is there; TestE2ERuncExecRecordCwd checks it is the home.)
func TestExecRecordRetention(t *testing.T) {
	h := newHarness(t, withSettings(func(c *config.Config) { c.RecordRetentionS = 3600 }))
	key := h.key("acme")
	sb := h.create("acme", api.CreateSandboxRequest{})
	recs := checkExecCwd(t, h, sb.ID, true)
	check := func(when string) {
		t.Helper()
		for _, r := range recs {
			if got := getExecWithCwd(t, h, sb.ID, r.id, r.want); got.Cwd != r.want {
				t.Errorf("%s: exec %s recorded cwd %q, want %q", when, r.id, got.Cwd, r.want)
			}
		}
	}
	h.expect(h.req("DELETE", "/v1/sandboxes/"+sb.ID, key, nil), http.StatusNoContent, "")
	eventually(t, "the delete", func() bool { return h.state("acme", sb.ID).State == api.StateStopped })
	check("after delete")
	var list api.ExecList
	r := h.req("GET", "/v1/sandboxes/"+sb.ID+"/execs", key, nil)
	h.expect(r, http.StatusOK, "")
	r.json(t, &list)
	if len(list.Execs) != len(recs) {
		t.Fatalf("after delete: %d exec records, want %d", len(list.Execs), len(recs))
	}

	// Within the retention a restart (which purges) keeps them.
	h.clock.Advance(30 * time.Minute)
	h.restart()
	check("within retention")
	// Past it they are gone, with the sandbox's record.
	h.clock.Advance(time.Hour)
	h.restart()
	// The purge runs in the manager's loop right after start: wait for it.
	eventually(t, "the purge of expired exec records", func() bool {
		return h.req("GET", "/v1/sandboxes/"+sb.ID+"/execs/"+recs[0].id, key, nil).StatusCode == http.StatusNotFound
	})
	h.expect(h.req("GET", "/v1/sandboxes/"+sb.ID+"/execs/"+recs[0].id, key, nil), http.StatusNotFound, "")
	h.expect(h.req("GET", "/v1/sandboxes/"+sb.ID, key, nil), http.StatusNotFound, api.CodeSandboxNotFound)
}

// TestE2ERuncExecRecordCwd: in a real sandbox an exec without a cwd is
// recorded with the directory it really ran in (what pwd printed).
func TestE2ERuncExecRecordCwd(t *testing.T) {
	e := newE2E(t)
	sb := e.h.create("acme", api.CreateSandboxRequest{})
	recs := checkExecCwd(t, e.h, sb.ID, true)
	if recs[0].want != "/home/user" {
		t.Errorf("the default user ran in %q, want /home/user", recs[0].want)
	}
	for _, r := range recs {
		if got := getExecWithCwd(t, e.h, sb.ID, r.id, r.want); got.Cwd != r.want {
			t.Errorf("exec %s recorded cwd %q, it ran in %q", r.id, got.Cwd, r.want)
		}
	}
}

type cwdRec struct{ id, want string }

// checkExecCwd runs pwd without a cwd (twice, only when withDefault) and
// with cwd /tmp, and returns the execs with the directory each printed.
// The exec's own answer names the directory already: the agent's result
// says it, so the first exec of a user needs no extra call to learn it.
func checkExecCwd(t *testing.T, h *harness, id string, withDefault bool) []cwdRec {
	t.Helper()
	pwd := func(req api.ExecRequest) cwdRec {
		t.Helper()
		res := h.exec("acme", id, req)
		if res.Status != api.ExecExited {
			t.Fatalf("pwd: %+v", res)
		}
		ran := strings.TrimSuffix(strp(res.Stdout), "\n")
		if res.Cwd != ran {
			t.Errorf("exec %s answered cwd %q, it ran in %q", res.ID, res.Cwd, ran)
		}
		return cwdRec{res.ID, ran}
	}
	var recs []cwdRec
	if withDefault {
		recs = append(recs, pwd(api.ExecRequest{Cmd: []string{"pwd"}}), pwd(api.ExecRequest{Cmd: []string{"pwd"}}))
		if recs[0].want == "" || recs[0].want != recs[1].want {
			t.Fatalf("default cwd printed %q then %q", recs[0].want, recs[1].want)
		}
	}
	r := pwd(api.ExecRequest{Cmd: []string{"pwd"}, Cwd: "/tmp"})
	if r.want != "/tmp" {
		t.Fatalf("pwd with cwd /tmp printed %q", r.want)
	}
	return append(recs, r)
}

// getExecWithCwd reads exec eid's record, waiting a little for its cwd to
// become want (the record is completed just after the answer).
func getExecWithCwd(t *testing.T, h *harness, id, eid, want string) api.ExecResult {
	t.Helper()
	get := func() api.ExecResult {
		var res api.ExecResult
		r := h.req("GET", "/v1/sandboxes/"+id+"/execs/"+eid, h.key("acme"), nil)
		h.expect(r, http.StatusOK, "")
		r.json(t, &res)
		return res
	}
	deadline := time.Now().Add(5 * time.Second)
	got := get()
	for got.Cwd != want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		got = get()
	}
	return got
}
