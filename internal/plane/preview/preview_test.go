package preview

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/previews"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeBackend has sandboxes whose ports are real listeners on loopback.
type fakeBackend struct {
	mu      sync.Mutex
	targets map[string]previews.Target // "id/port"
	addrs   map[string]string          // "id/port" → listener address
	known   map[string]bool            // sandbox ids
	opened  []string
	dials   int
	active  map[string]int   // id → requests under way (PreviewActive)
	dialErr map[string]error // id → what its dial fails with
}

func (b *fakeBackend) PreviewTarget(_ context.Context, id string, port int) (previews.Target, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.known[id] {
		return previews.Target{Token: "tok-" + id}, errdefs.ErrNotFound
	}
	t, ok := b.targets[fmt.Sprintf("%s/%d", id, port)]
	if !ok {
		return previews.Target{Token: "tok-" + id}, nil
	}
	return t, nil
}

func (b *fakeBackend) PreviewDial(ctx context.Context, id string, port int) (net.Conn, error) {
	b.mu.Lock()
	addr := b.addrs[fmt.Sprintf("%s/%d", id, port)]
	b.dials++
	err := b.dialErr[id]
	b.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

func (b *fakeBackend) PreviewActive(id string) func() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.active == nil {
		b.active = map[string]int{}
	}
	b.active[id]++
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.active[id]--
	}
}

func (b *fakeBackend) activeOf(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.active[id]
}

func (b *fakeBackend) PreviewOpened(_ context.Context, id string, port int, _, via string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.opened = append(b.opened, fmt.Sprintf("%s/%d/%s", id, port, via))
}

// echoApp answers what it saw of the request, and echoes WebSocket
// messages.
func echoApp() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ws" {
			c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
			if err != nil {
				return
			}
			defer c.CloseNow()
			for {
				typ, msg, err := c.Read(r.Context())
				if err != nil {
					return
				}
				if err := c.Write(r.Context(), typ, append([]byte("echo:"), msg...)); err != nil {
					return
				}
			}
		}
		fmt.Fprintf(w, "path=%s query=%s token=%q cookie=%q", r.URL.Path, r.URL.RawQuery,
			r.Header.Get(api.PreviewTokenHeader), r.Header.Get("Cookie"))
	})
}

type rig struct {
	b      *fakeBackend
	h      *Handler
	srv    *httptest.Server
	client *http.Client
}

func newRig(t *testing.T) *rig {
	t.Helper()
	app1 := httptest.NewServer(echoApp())
	t.Cleanup(app1.Close)
	app2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "second sandbox") }))
	t.Cleanup(app2.Close)
	b := &fakeBackend{
		known: map[string]bool{"sbx_a": true, "sbx_b": true},
		targets: map[string]previews.Target{
			"sbx_a/8080": {Token: "tok-sbx_a", Exposed: true},
			"sbx_a/9000": {Token: "tok-sbx_a", Exposed: true, Public: true},
			"sbx_b/8080": {Token: "tok-sbx_b", Exposed: true, Public: true},
		},
		addrs: map[string]string{
			"sbx_a/8080": app1.Listener.Addr().String(),
			"sbx_a/9000": app1.Listener.Addr().String(),
			"sbx_b/8080": app2.Listener.Addr().String(),
		},
	}
	h := New(Config{Backend: b})
	t.Cleanup(h.Close)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{
		Transport: tr,
		// Redirects are checked by hand.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return &rig{b: b, h: h, srv: srv, client: client}
}

func (r *rig) get(t *testing.T, host, path string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, r.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

func TestAccess(t *testing.T) {
	r := newRig(t)
	tests := []struct {
		name   string
		host   string
		hdr    map[string]string
		status int
		body   string
	}{
		{"NoToken", "8080-sbx_a.localhost", nil, http.StatusUnauthorized, "needs its token"},
		{"WrongHeaderToken", "8080-sbx_a.localhost", map[string]string{api.PreviewTokenHeader: "tok-sbx_b"}, http.StatusUnauthorized, "wrong preview token"},
		{"HeaderToken", "8080-sbx_a.localhost", map[string]string{api.PreviewTokenHeader: "tok-sbx_a"}, http.StatusOK, `path=/x query= token="" cookie=""`},
		{"Public", "9000-sbx_a.localhost:1234", nil, http.StatusOK, "path=/x"},
		{"OtherSandboxPublic", "8080-sbx_b.localhost", nil, http.StatusOK, "second sandbox"},
		{"UnknownSandbox", "8080-sbx_zz.localhost", nil, http.StatusUnauthorized, "needs its token"},
		{"UnknownSandboxWrongToken", "8080-sbx_zz.localhost", map[string]string{api.PreviewTokenHeader: "tok-sbx_a"}, http.StatusUnauthorized, "wrong preview token"},
		{"UnknownSandboxItsToken", "8080-sbx_zz.localhost", map[string]string{api.PreviewTokenHeader: "tok-sbx_zz"}, http.StatusNotFound, "preview not found"},
		{"PortNotExposedNoToken", "7000-sbx_a.localhost", nil, http.StatusUnauthorized, "needs its token"},
		{"PortNotExposedWithToken", "7000-sbx_a.localhost", map[string]string{api.PreviewTokenHeader: "tok-sbx_a"}, http.StatusNotFound, "preview not found"},
		{"OtherDomain", "8080-sbx_a.example.com", nil, http.StatusNotFound, "not a preview url"},
		{"NotAPreviewHost", "localhost", nil, http.StatusNotFound, "not a preview url"},
		{"CaseInsensitiveHost", "8080-SBX_A.LOCALHOST", map[string]string{api.PreviewTokenHeader: "tok-sbx_a"}, http.StatusOK, "path=/x"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := r.get(t, tc.host, "/x", tc.hdr)
			if resp.StatusCode != tc.status || !strings.Contains(body, tc.body) {
				t.Fatalf("got %d %q, want %d containing %q", resp.StatusCode, body, tc.status, tc.body)
			}
		})
	}
}

// TestUnknownAnswersAsPrivate: without the sandbox's token, a sandbox
// that does not exist (or no longer runs) answers exactly as a private port
// of a running one, whatever credential is tried; before, it was a 404
// where a running sandbox gave 401, which told which ids exist.
func TestUnknownAnswersAsPrivate(t *testing.T) {
	r := newRig(t)
	emptyCookie := CookieName + "=" + cookieValue("", "8080-sbx_zz.localhost")
	for _, tc := range []struct {
		name string
		hdr  map[string]string
		path string
	}{
		{"NoToken", nil, "/x"},
		{"WrongHeader", map[string]string{api.PreviewTokenHeader: "tok-sbx_b"}, "/x"},
		{"WrongQuery", nil, "/x?token=tok-sbx_b"},
		{"WrongCookie", map[string]string{"Cookie": CookieName + "=00"}, "/x"},
		{"CookieOfTheEmptyToken", map[string]string{"Cookie": emptyCookie}, "/x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			known, kb := r.get(t, "8080-sbx_a.localhost", tc.path, tc.hdr)
			unknown, ub := r.get(t, "8080-sbx_zz.localhost", tc.path, tc.hdr)
			if known.StatusCode != http.StatusUnauthorized || unknown.StatusCode != known.StatusCode || ub != kb ||
				unknown.Header.Get("Content-Type") != known.Header.Get("Content-Type") {
				t.Fatalf("running sandbox: %d %q; unknown one: %d %q", known.StatusCode, kb, unknown.StatusCode, ub)
			}
		})
	}
}

func TestTokenQuerySetsCookieAndRedirects(t *testing.T) {
	r := newRig(t)
	host := "8080-sbx_a.localhost"
	resp, _ := r.get(t, host, "/page?a=1&token=wrong", nil)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong query token: status %d", resp.StatusCode)
	}
	resp, _ = r.get(t, host, "/page?a=1&token=tok-sbx_a", nil)
	if resp.StatusCode != http.StatusFound {
		t.Fatalf("status %d, want 302", resp.StatusCode)
	}
	if loc := resp.Header.Get("Location"); loc != "/page?a=1" {
		t.Fatalf("redirect to %q, want the url without the token", loc)
	}
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == CookieName {
			cookie = c
		}
	}
	if cookie == nil || !cookie.HttpOnly || cookie.Domain != "" || strings.Contains(cookie.Value, "tok-sbx_a") {
		t.Fatalf("cookie %+v: want host-only, httponly, not the raw token", cookie)
	}
	cv := CookieName + "=" + cookie.Value + "; theme=dark"
	resp, body := r.get(t, host, "/page?a=1", map[string]string{"Cookie": cv})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("with cookie: %d %s", resp.StatusCode, body)
	}
	// The app sees its own cookies, never airlock's.
	if !strings.Contains(body, `cookie="theme=dark"`) {
		t.Fatalf("app saw %s", body)
	}
	// The cookie is bound to its host: another port of the same sandbox
	// (a different origin) does not accept it.
	resp, _ = r.get(t, "9001-sbx_a.localhost", "/", map[string]string{"Cookie": cv})
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("cookie of another host: status %d, want 401", resp.StatusCode)
	}
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	if want := []string{"sbx_a/8080/token", "sbx_a/8080/cookie"}; strings.Join(r.b.opened, ",") != strings.Join(want, ",") {
		t.Fatalf("opened %v, want %v", r.b.opened, want)
	}
}

func TestWebSocketEcho(t *testing.T) {
	r := newRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hdr := http.Header{}
	hdr.Set(api.PreviewTokenHeader, "tok-sbx_a")
	hdr.Set("Host", "8080-sbx_a.localhost")
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(r.srv.URL, "http")+"/ws", &websocket.DialOptions{
		HTTPHeader: hdr, HTTPClient: &http.Client{Transport: hostRewriter{tr, "8080-sbx_a.localhost"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	for _, msg := range []string{"hello", "world"} {
		if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		_, got, err := c.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != "echo:"+msg {
			t.Fatalf("got %q", got)
		}
	}
	// The open WebSocket is activity of its sandbox (it keeps an idle
	// timeout from pausing it) until it closes.
	if n := r.b.activeOf("sbx_a"); n != 1 {
		t.Fatalf("requests under way in sbx_a with its WebSocket open: %d, want 1", n)
	}
	c.Close(websocket.StatusNormalClosure, "")
	deadline := time.Now().Add(5 * time.Second)
	for r.b.activeOf("sbx_a") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("requests under way in sbx_a after its WebSocket closed: %d", r.b.activeOf("sbx_a"))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestNotRunningIsUnavailable: a sandbox whose dial says it is not running
// (paused without auto_resume) is a 503 to whoever the preview lets in,
// not a bad gateway; a plain request is activity only while it runs.
func TestNotRunningIsUnavailable(t *testing.T) {
	r := newRig(t)
	r.b.mu.Lock()
	r.b.dialErr = map[string]error{"sbx_b": &errdefs.Public{Msg: "sandbox is paused", Err: errdefs.ErrInvalidState}}
	r.b.mu.Unlock()
	resp, body := r.get(t, "8080-sbx_b.localhost", "/", nil)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "not running") {
		t.Fatalf("paused sandbox's public port: %d %q", resp.StatusCode, body)
	}
	if resp, body = r.get(t, "8080-sbx_a.localhost", "/", map[string]string{api.PreviewTokenHeader: "tok-sbx_a"}); resp.StatusCode != http.StatusOK {
		t.Fatalf("running sandbox: %d %q", resp.StatusCode, body)
	}
	// The client may read the whole answer before the handler returns (and
	// its request stops being activity): wait for that, boundedly.
	deadline := time.Now().Add(5 * time.Second)
	for _, id := range []string{"sbx_a", "sbx_b"} {
		for r.b.activeOf(id) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("requests under way in %s after they ended: %d", id, r.b.activeOf(id))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// hostRewriter sets the Host of every request (websocket.Dial takes the
// host from the URL).
type hostRewriter struct {
	rt   http.RoundTripper
	host string
}

func (h hostRewriter) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Host = h.host
	return h.rt.RoundTrip(r)
}

func TestConnectionsNotSharedAcrossSandboxes(t *testing.T) {
	r := newRig(t)
	for range 3 {
		_, body := r.get(t, "8080-sbx_b.localhost", "/", nil)
		if body != "second sandbox" {
			t.Fatalf("sbx_b: %q", body)
		}
		// Same port, another sandbox: a pooled connection must not be reused.
		_, body = r.get(t, "8080-sbx_a.localhost", "/", map[string]string{api.PreviewTokenHeader: "tok-sbx_a"})
		if !strings.HasPrefix(body, "path=/") {
			t.Fatalf("sbx_a: %q", body)
		}
	}
}
