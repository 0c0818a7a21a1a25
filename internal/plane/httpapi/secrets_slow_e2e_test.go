package httpapi_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/store"
)

// TestSlowSecretE2E: a real runc sandbox prints its secret one byte every
// 30 ms. Through the HTTP API it is masked in the exec's JSON result, its
// SSE stream, a re-attach after the end, the stored record, a terminal and
// a code cell. On the code before the fix, each of these showed the secret
// in plain: a held prefix went out after 20 ms and the rest was no longer
// recognised.
func TestSlowSecretE2E(t *testing.T) {
	c := newCodeE2E(t)
	h := c.h
	const secret = "Zq9x-Vw7K-Lp3M-Tj8R-y2Nb"
	stars := strings.Repeat("*", len(secret))
	sb := h.create("acme", api.CreateSandboxRequest{Template: "code-interpreter", Secrets: map[string]string{"API_TOKEN": secret}})
	key := h.key("acme")
	base := "/v1/sandboxes/" + sb.ID
	slow := `import os, sys, time
for ch in os.environ["API_TOKEN"]:
    sys.stdout.write(ch); sys.stdout.flush(); time.sleep(0.03)
`
	argv := []string{"python3", "-c", slow}
	plain := func(t *testing.T, where, s string) {
		t.Helper()
		// Not the secret, nor any 4 bytes of it.
		for i := 0; i+4 <= len(secret); i++ {
			if strings.Contains(s, secret[i:i+4]) {
				t.Fatalf("%s shows %q of the secret: %q", where, secret[i:i+4], s)
			}
		}
	}

	var eid string
	t.Run("JSON", func(t *testing.T) {
		r := h.req("POST", base+"/exec", key, api.ExecRequest{Cmd: argv})
		h.expect(r, http.StatusOK, "")
		var res api.ExecResult
		r.json(t, &res)
		eid = res.ID
		if res.Stdout == nil || *res.Stdout != stars {
			t.Fatalf("exec JSON %s, want stdout %q", r.body, stars)
		}
		plain(t, "exec JSON", string(r.body))
	})
	t.Run("SSE", func(t *testing.T) {
		_, events, _ := h.sse("POST", base+"/exec", key, api.ExecRequest{Cmd: argv})
		out, exit := outputOf(t, events)
		if out["stdout"] != stars || exit.Status != api.ExecExited {
			t.Fatalf("SSE output %q, exit %+v", out, exit)
		}
		for _, e := range events {
			plain(t, "SSE event", e.data)
		}
	})
	t.Run("ReattachAndRecord", func(t *testing.T) {
		if eid == "" {
			t.Fatal("the JSON case started no exec")
		}
		_, events, _ := h.sse("GET", base+"/execs/"+eid+"/events", key, nil)
		if out, _ := outputOf(t, events); out["stdout"] != stars {
			t.Fatalf("re-attach output %q", out)
		}
		r := h.req("GET", base+"/execs/"+eid, key, nil)
		h.expect(r, http.StatusOK, "")
		plain(t, "GET exec", string(r.body))
		// What the store keeps, byte for byte (the daemon's store, opened
		// beside it).
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := store.Open(ctx, filepath.Join(c.dataDir, "airlock.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		var blob []byte
		for {
			rec, err := st.GetExec(ctx, sb.ID, eid)
			if err == nil && rec.EndedAt != nil {
				if blob, err = st.ExecOutput(ctx, eid); err != nil {
					t.Fatal(err)
				}
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("record never finished: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if got := storedText(t, blob); got != stars {
			t.Fatalf("stored output %q, want %q", got, stars)
		}
	})
	t.Run("PTY", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		u := "ws" + strings.TrimPrefix(h.url, "http") + base + "/pty?cmd=python3&cmd=-c&cmd=" + url.QueryEscape(slow)
		conn, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + key}}})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.CloseNow()
		var out strings.Builder
		for {
			typ, data, err := conn.Read(ctx)
			if websocket.CloseStatus(err) == websocket.StatusNormalClosure {
				break
			}
			if err != nil {
				t.Fatalf("read: %v (output so far %q)", err, out.String())
			}
			if typ == websocket.MessageBinary {
				out.Write(data)
			} else {
				var exit map[string]api.ExecResult
				if err := json.Unmarshal(data, &exit); err != nil {
					t.Fatalf("text frame %q: %v", data, err)
				}
			}
		}
		plain(t, "terminal", out.String())
		if !strings.Contains(out.String(), stars) {
			t.Fatalf("terminal output %q does not hold the masked secret", out.String())
		}
	})
	t.Run("CodeCell", func(t *testing.T) {
		cell := &codeE2E{e2e: c.e2e, sb: sb}
		evs := cell.code(t, api.CodeRequest{Code: slow, Language: "python"})
		if got := evStdout(evs); got != stars {
			t.Fatalf("cell stdout %q, want %q (%+v)", got, stars, evs)
		}
		evs = cell.code(t, api.CodeRequest{Code: `for ((i=0; i<${#API_TOKEN}; i++)); do printf %s "${API_TOKEN:i:1}"; sleep 0.03; done`, Language: "bash"})
		if got := evStdout(evs); got != stars {
			t.Fatalf("bash cell stdout %q, want %q (%+v)", got, stars, evs)
		}
	})
	t.Run("Audit", func(t *testing.T) {
		r := h.req("GET", "/v1/audit?sandbox_id="+sb.ID, key, nil)
		h.expect(r, http.StatusOK, "")
		plain(t, "audit", string(r.body))
	})
}

// storedText concatenates the data of an exec's stored output events (a
// stream byte, a uvarint offset, a uvarint length and the bytes each).
func storedText(t *testing.T, b []byte) string {
	t.Helper()
	var out strings.Builder
	for len(b) > 0 {
		_, k := binary.Uvarint(b[1:])
		if k <= 0 {
			t.Fatalf("bad stored output %q", b)
		}
		b = b[1+k:]
		l, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < l {
			t.Fatalf("bad stored output %q", b)
		}
		out.Write(b[k : k+int(l)])
		b = b[k+int(l):]
	}
	return out.String()
}
