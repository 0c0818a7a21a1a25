package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/airlockhq/airlock/api"
)

// wsEcho is a WebSocket echo server in the Python standard library alone
// (the base template has python3, not the websockets module): it answers
// every text or binary message with "echo:" and the message.
const wsEcho = `
import socket, hashlib, base64, threading
def serve(c):
    try:
        data = b''
        while b'\r\n\r\n' not in data:
            d = c.recv(4096)
            if not d: return
            data += d
        key = [l.split(b':', 1)[1].strip() for l in data.split(b'\r\n') if l.lower().startswith(b'sec-websocket-key:')][0]
        acc = base64.b64encode(hashlib.sha1(key + b'258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest())
        c.sendall(b'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ' + acc + b'\r\n\r\n')
        buf = b''
        def need(n):
            nonlocal buf
            while len(buf) < n:
                d = c.recv(4096)
                if not d: raise EOFError
                buf += d
            out, buf = buf[:n], buf[n:]
            return out
        while True:
            h = need(2); op = h[0] & 15; n = h[1] & 127
            if n == 126: n = int.from_bytes(need(2), 'big')
            elif n == 127: n = int.from_bytes(need(8), 'big')
            mask = need(4) if h[1] & 128 else b'\0\0\0\0'
            p = bytes(b ^ mask[i % 4] for i, b in enumerate(need(n)))
            if op == 8:
                c.sendall(b'\x88\x00'); return
            if op in (1, 2):
                p = b'echo:' + p
                hdr = bytes([0x80 | op]) + (bytes([len(p)]) if len(p) < 126 else bytes([126]) + len(p).to_bytes(2, 'big'))
                c.sendall(hdr + p)
    except Exception:
        pass
    finally:
        c.close()
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', 8081)); s.listen()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
`

// previewGet requests url (a preview URL) from the preview listener at
// addr, whatever its host name resolves to, without following redirects.
func previewGet(t *testing.T, addr, rawURL string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, rawURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", rawURL, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestE2EPreview(t *testing.T) {
	e := newE2E(t, e2ePreviews)
	h := e.h
	addr := e.previewAddr
	sb := h.create("acme", api.CreateSandboxRequest{})
	h.expect(h.req("PUT", "/v1/sandboxes/"+sb.ID+"/files?path=/home/user/www/index.html", h.key("acme"), "hello from the sandbox\n"), http.StatusCreated, "")
	h.expect(h.req("PUT", "/v1/sandboxes/"+sb.ID+"/files?path=/home/user/ws.py", h.key("acme"), wsEcho), http.StatusCreated, "")
	res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`(setsid python3 -m http.server 8080 --bind 127.0.0.1 -d /home/user/www >/dev/null 2>&1 &);
(setsid python3 /home/user/ws.py >/dev/null 2>&1 &);
for i in $(seq 100); do python3 -c 'import socket; socket.create_connection(("127.0.0.1", 8080)).close(); socket.create_connection(("127.0.0.1", 8081)).close()' 2>/dev/null && echo up && exit 0; sleep 0.1; done; echo down`)})
	if strp(res.Stdout) != "up\n" {
		t.Fatalf("servers in the sandbox: %+v %q", res, strp(res.Stderr))
	}

	// The daemon dials the sandbox's loopback (service/previews'
	// DialSandbox): a closed port is a clear error.
	ctx := context.Background()
	var closed api.Preview
	r := h.req("POST", "/v1/sandboxes/"+sb.ID+"/previews", h.key("acme"), api.PreviewRequest{Port: 9999})
	h.expect(r, http.StatusOK, "")
	r.json(t, &closed)
	if resp, body := previewGet(t, addr, closed.URL, map[string]string{api.PreviewTokenHeader: closed.Token}); resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "nothing answers on port 9999") {
		t.Fatalf("closed port: %d %q", resp.StatusCode, body)
	}
	h.expect(h.req("DELETE", "/v1/sandboxes/"+sb.ID+"/previews/9999", h.key("acme"), nil), http.StatusNoContent, "")

	// Expose 8080 privately.
	var pv api.Preview
	r = h.req("POST", "/v1/sandboxes/"+sb.ID+"/previews", h.key("acme"), api.PreviewRequest{Port: 8080})
	h.expect(r, http.StatusOK, "")
	r.json(t, &pv)
	_, lport, _ := net.SplitHostPort(addr)
	if want := "http://8080-" + sb.ID + ".localhost:" + lport + "/"; pv.URL != want || pv.Token == "" || pv.Public || pv.Port != 8080 {
		t.Fatalf("preview %+v, want url %s", pv, want)
	}
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/previews", h.key("other"), api.PreviewRequest{Port: 8080}), http.StatusNotFound, api.CodeSandboxNotFound)
	h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/previews", h.key("acme"), api.PreviewRequest{Port: 0}), http.StatusBadRequest, api.CodeInvalidArgument)

	tests := []struct {
		name   string
		hdr    map[string]string
		status int
		body   string
	}{
		{"NoToken", nil, http.StatusUnauthorized, "needs its token"},
		{"WrongToken", map[string]string{api.PreviewTokenHeader: pv.Token + "x"}, http.StatusUnauthorized, "wrong preview token"},
		{"HeaderToken", map[string]string{api.PreviewTokenHeader: pv.Token}, http.StatusOK, "hello from the sandbox"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := previewGet(t, addr, pv.URL, tc.hdr)
			if resp.StatusCode != tc.status || !strings.Contains(body, tc.body) {
				t.Fatalf("%d %q, want %d %q", resp.StatusCode, body, tc.status, tc.body)
			}
		})
	}
	// ?token= trades the token for a cookie of this host.
	resp, _ := previewGet(t, addr, pv.URL+"?token="+pv.Token, nil)
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/" || len(resp.Cookies()) != 1 {
		t.Fatalf("token exchange: %d %v", resp.StatusCode, resp.Header)
	}
	ck := resp.Cookies()[0]
	if _, body := previewGet(t, addr, pv.URL, map[string]string{"Cookie": ck.Name + "=" + ck.Value}); !strings.Contains(body, "hello from the sandbox") {
		t.Fatalf("with the cookie: %q", body)
	}

	// A public port needs no token; WebSocket upgrades pass through.
	var pub api.Preview
	r = h.req("POST", "/v1/sandboxes/"+sb.ID+"/previews", h.key("acme"), api.PreviewRequest{Port: 8081, Public: true})
	h.expect(r, http.StatusOK, "")
	r.json(t, &pub)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tr := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
	defer tr.CloseIdleConnections()
	ws, _, err := websocket.Dial(wctx, "ws"+strings.TrimPrefix(pub.URL, "http")+"socket", &websocket.DialOptions{HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatalf("websocket through the preview: %v", err)
	}
	for _, msg := range []string{"ping", strings.Repeat("x", 300)} {
		if err := ws.Write(wctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		_, back, err := ws.Read(wctx)
		if err != nil || string(back) != "echo:"+msg {
			t.Fatalf("echo %q %v", back, err)
		}
	}
	ws.Close(websocket.StatusNormalClosure, "")

	var list api.PreviewList
	h.req("GET", "/v1/sandboxes/"+sb.ID+"/previews", h.key("acme"), nil).json(t, &list)
	if len(list.Previews) != 2 || list.Previews[0].Port != 8080 || list.Previews[1].Port != 8081 || !list.Previews[1].Public {
		t.Fatalf("list %+v", list)
	}
	h.expect(h.req("DELETE", "/v1/sandboxes/"+sb.ID+"/previews/8080", h.key("acme"), nil), http.StatusNoContent, "")
	h.expect(h.req("DELETE", "/v1/sandboxes/"+sb.ID+"/previews/8080", h.key("acme"), nil), http.StatusNotFound, "")
	if resp, _ := previewGet(t, addr, pv.URL, map[string]string{api.PreviewTokenHeader: pv.Token}); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("removed preview: %d", resp.StatusCode)
	}

	// The audit trail says who exposed which port and who opened it.
	var actions []string
	for _, ev := range h.auditAll(h.key("acme"), "sandbox_id="+sb.ID, 0) {
		if ev.Type != api.AuditPreview {
			continue
		}
		var d api.PreviewAuditDetail
		if err := json.Unmarshal(ev.Detail, &d); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(ev.Detail), pv.Token) {
			t.Fatal("a preview token reached the audit trail")
		}
		actions = append(actions, fmt.Sprintf("%s:%d:%s", d.Action, d.Port, d.Via))
	}
	want := []string{"expose:9999:", "open:9999:token", "unexpose:9999:",
		"expose:8080:", "open:8080:token", "open:8080:cookie", "expose:8081:", "open:8081:public", "unexpose:8080:"}
	if strings.Join(actions, " ") != strings.Join(want, " ") {
		t.Fatalf("preview audit %v, want %v", actions, want)
	}
}

// TestE2EPreviewManagedNetwork reaches a sandbox whose namespace the
// network backend made (mode allowlist: a veth, nftables, no route from the
// host to its loopback) through that namespace's bind mount.
func TestE2EPreviewManagedNetwork(t *testing.T) {
	w := newWorld(t)
	e := newE2E(t, e2eWorld(w), e2ePreviews)
	h := e.h
	addr := e.previewAddr
	sb := h.create("acme", api.CreateSandboxRequest{Network: &api.Network{Mode: "allowlist", Allow: []string{"allowed.test"}}})
	h.expect(h.req("PUT", "/v1/sandboxes/"+sb.ID+"/files?path=/home/user/www/index.html", h.key("acme"), "managed network\n"), http.StatusCreated, "")
	res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`(setsid python3 -m http.server 3000 --bind 127.0.0.1 -d /home/user/www >/dev/null 2>&1 &);
for i in $(seq 100); do python3 -c 'import socket; socket.create_connection(("127.0.0.1", 3000)).close()' 2>/dev/null && echo up && exit 0; sleep 0.1; done; echo down`)})
	if strp(res.Stdout) != "up\n" {
		t.Fatalf("server in the sandbox: %+v %q", res, strp(res.Stderr))
	}
	var pv api.Preview
	r := h.req("POST", "/v1/sandboxes/"+sb.ID+"/previews", h.key("acme"), api.PreviewRequest{Port: 3000, Public: true})
	h.expect(r, http.StatusOK, "")
	r.json(t, &pv)
	resp, body := previewGet(t, addr, pv.URL, nil)
	if resp.StatusCode != http.StatusOK || body != "managed network\n" {
		t.Fatalf("public preview: %d %q", resp.StatusCode, body)
	}
}

// TestE2EPreviewAutoResume: a paused sandbox's preview resumes it when its
// lifecycle has auto_resume (the server inside answers as before the
// pause); without auto_resume the preview answers 503 and the sandbox
// stays paused.
func TestE2EPreviewAutoResume(t *testing.T) {
	e := newE2E(t, e2ePreviews)
	h := e.h
	key := h.key("acme")
	sb := h.create("acme", api.CreateSandboxRequest{Lifecycle: &api.Lifecycle{AutoResume: boolp(true)}})
	h.expect(h.req("PUT", "/v1/sandboxes/"+sb.ID+"/files?path=/home/user/www/index.html", key, "awake again\n"), http.StatusCreated, "")
	res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`(setsid python3 -m http.server 8080 --bind 127.0.0.1 -d /home/user/www >/dev/null 2>&1 &);
for i in $(seq 100); do python3 -c 'import socket; socket.create_connection(("127.0.0.1", 8080)).close()' 2>/dev/null && echo up && exit 0; sleep 0.1; done; echo down`)})
	if strp(res.Stdout) != "up\n" {
		t.Fatalf("server in the sandbox: %+v %q", res, strp(res.Stderr))
	}
	var pv api.Preview
	r := h.req("POST", "/v1/sandboxes/"+sb.ID+"/previews", key, api.PreviewRequest{Port: 8080})
	h.expect(r, http.StatusOK, "")
	r.json(t, &pv)
	tok := map[string]string{api.PreviewTokenHeader: pv.Token}
	pause := func() {
		t.Helper()
		h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/pause", key, api.PauseRequest{Memory: api.PauseMemoryKeep}), http.StatusOK, "")
		if st := h.state("acme", sb.ID).State; st != api.StatePaused {
			t.Fatalf("after pause: %s", st)
		}
	}

	pause()
	if resp, body := previewGet(t, e.previewAddr, pv.URL, tok); resp.StatusCode != http.StatusOK || body != "awake again\n" {
		t.Fatalf("preview of a paused sandbox with auto_resume: %d %q", resp.StatusCode, body)
	}
	if st := h.state("acme", sb.ID).State; st != api.StateRunning {
		t.Fatalf("after the preview request: %s, want running", st)
	}

	h.expect(h.req("PATCH", "/v1/sandboxes/"+sb.ID, key, api.PatchSandboxRequest{Lifecycle: &api.Lifecycle{AutoResume: boolp(false)}}), http.StatusOK, "")
	pause()
	if resp, body := previewGet(t, e.previewAddr, pv.URL, tok); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "not running") {
		t.Fatalf("preview of a paused sandbox without auto_resume: %d %q", resp.StatusCode, body)
	}
	// Without the token it answers as any private port does.
	if resp, _ := previewGet(t, e.previewAddr, pv.URL, nil); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("paused sandbox's private preview without its token: %d", resp.StatusCode)
	}
	if st := h.state("acme", sb.ID).State; st != api.StatePaused {
		t.Fatalf("after a refused preview request: %s, want paused", st)
	}
}
