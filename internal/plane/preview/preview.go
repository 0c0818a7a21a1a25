// Package preview is the preview plane: HTTP (and WebSocket) to a TCP port of a sandbox, routed by Host name on a listener of its own and guarded by the sandbox's preview token (service/previews hands the URLs and tokens out).
//
// A preview URL is http://<port>-<sandbox id>.<domain>:<listen port>/.
// The domain defaults to "localhost": browsers resolve every *.localhost
// name to loopback, and curl does with --resolve. A private preview wants
// the sandbox's token once, as ?token= (answered with a cookie for that
// one host and a redirect to the same URL without it) or on every request
// as the X-Airlock-Preview-Token header. Neither reaches the sandbox.
package preview

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/previews"
)

// Timing of the proxy.
const (
	// idleConnTimeout is how long an idle connection into a sandbox is kept
	// for reuse: a browser fetches a page's assets within seconds.
	idleConnTimeout = 30 * time.Second
	// dialTimeout bounds connecting inside the sandbox: it is local, so
	// seconds mean the sandbox is stuck.
	dialTimeout = 10 * time.Second
	// openAuditEvery is how often one client opening one preview is audited
	// again: per request would flood the trail with a page's assets.
	openAuditEvery = 10 * time.Minute
	// maxOpenSeen bounds the memory of recent opens.
	maxOpenSeen = 4096
)

// CookieName is the cookie a ?token= exchange sets, host-only: it goes
// back to that one preview host and no other.
const CookieName = "airlock_preview"

// Backend is the sandbox side of previews (service/previews).
type Backend interface {
	// PreviewTarget returns port of running sandbox id, or an error
	// wrapping errdefs.ErrNotFound when there is no such sandbox (with the
	// Target's Token still set, so that a holder of the token of a gone
	// sandbox is told "not found" and everyone else what a private port
	// answers).
	PreviewTarget(ctx context.Context, id string, port int) (previews.Target, error)
	// PreviewDial connects to port inside sandbox id.
	PreviewDial(ctx context.Context, id string, port int) (net.Conn, error)
	// PreviewActive marks a request to sandbox id as under way (activity
	// that keeps it from an idle pause) until done is called.
	PreviewActive(id string) (done func())
	// PreviewOpened is told that a client opened a preview, and how it was
	// allowed ("token", "cookie", "public"), for the audit trail.
	PreviewOpened(ctx context.Context, id string, port int, remote, via string)
}

// Config configures a Handler.
type Config struct {
	// Domain is the name preview hosts end with; default "localhost".
	Domain string
	// Backend finds and dials sandboxes. Required.
	Backend Backend
	// Logger logs proxy errors; default slog.Default().
	Logger *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Handler serves the preview listener.
type Handler struct {
	cfg   Config
	log   *slog.Logger
	proxy *httputil.ReverseProxy
	tr    *http.Transport

	mu   sync.Mutex
	seen map[string]time.Time // id/port/remote → last open audited
}

// New returns the handler of the preview listener. Close it to drop its
// idle connections into sandboxes.
func New(cfg Config) *Handler {
	if cfg.Domain == "" {
		cfg.Domain = "localhost"
	}
	cfg.Domain = strings.ToLower(strings.Trim(cfg.Domain, "."))
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	h := &Handler{cfg: cfg, log: cfg.Logger, seen: map[string]time.Time{}}
	h.tr = &http.Transport{
		DialContext:           h.dial,
		IdleConnTimeout:       idleConnTimeout,
		MaxIdleConnsPerHost:   8,
		ResponseHeaderTimeout: 0, // long polls and slow dev servers are fine
		ForceAttemptHTTP2:     false,
	}
	h.proxy = &httputil.ReverseProxy{
		Rewrite:      h.rewrite,
		Transport:    h.tr,
		ErrorHandler: h.proxyError,
		// Server-sent events and streamed responses flow at once.
		FlushInterval: -1,
	}
	return h
}

// Close drops idle connections into sandboxes.
func (h *Handler) Close() { h.tr.CloseIdleConnections() }

type ctxKey struct{}

type route struct {
	id   string
	port int
}

// ServeHTTP routes r by its Host to a sandbox port.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, port, ok := previews.ParseHost(r.Host, h.cfg.Domain)
	if !ok {
		http.Error(w, "not a preview url", http.StatusNotFound)
		return
	}
	t, err := h.cfg.Backend.PreviewTarget(r.Context(), id, port)
	if err != nil && !errdefs.IsNotFound(err) {
		h.log.Warn("preview lookup", "sandbox_id", id, "port", port, "err", err)
		http.Error(w, "preview unavailable", http.StatusBadGateway)
		return
	}
	if err != nil {
		// No such sandbox (gone, not running, never was): it answers as a
		// private port does, so that without its token nobody tells the
		// two apart; with it, the answer is "not found".
		t = previews.Target{Token: t.Token}
	}
	via := "public"
	if !t.Public {
		if q := r.URL.Query().Get("token"); q != "" {
			if !equal(q, t.Token) {
				http.Error(w, "wrong preview token", http.StatusUnauthorized)
				return
			}
			if !t.Exposed {
				http.Error(w, "preview not found", http.StatusNotFound)
				return
			}
			h.opened(r, id, port, "token")
			// Trade the token for a host-only cookie, and take it out of
			// the address bar (and of what the sandbox sees).
			http.SetCookie(w, &http.Cookie{
				Name: CookieName, Value: cookieValue(t.Token, r.Host), Path: "/",
				HttpOnly: true, SameSite: http.SameSiteLaxMode,
			})
			u := *r.URL
			qs := u.Query()
			qs.Del("token")
			u.RawQuery = qs.Encode()
			u.Scheme, u.Host = "", ""
			http.Redirect(w, r, u.RequestURI(), http.StatusFound)
			return
		}
		switch {
		case r.Header.Get(api.PreviewTokenHeader) != "":
			if !equal(r.Header.Get(api.PreviewTokenHeader), t.Token) {
				http.Error(w, "wrong preview token", http.StatusUnauthorized)
				return
			}
			via = "token"
		case hasCookie(r, t.Token, r.Host):
			via = "cookie"
		default:
			http.Error(w, "this preview needs its token (?token= or the "+api.PreviewTokenHeader+" header)", http.StatusUnauthorized)
			return
		}
	}
	if !t.Exposed {
		http.Error(w, "preview not found", http.StatusNotFound)
		return
	}
	h.opened(r, id, port, via)
	done := h.cfg.Backend.PreviewActive(id)
	defer done()
	r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, route{id, port}))
	h.proxy.ServeHTTP(w, r)
}

// rewrite points the request at the sandbox and strips airlock's
// credentials from it.
func (h *Handler) rewrite(pr *httputil.ProxyRequest) {
	rt, _ := pr.In.Context().Value(ctxKey{}).(route)
	pr.Out.URL.Scheme = "http"
	// The address only keys the connection pool (one per sandbox and
	// port); dial finds the sandbox from the context.
	pr.Out.URL.Host = hex.EncodeToString([]byte(rt.id)) + "-" + strconv.Itoa(rt.port) + ".invalid"
	pr.Out.Host = pr.In.Host
	pr.Out.Header.Del(api.PreviewTokenHeader)
	stripCookie(pr.Out)
	pr.SetXForwarded()
}

func (h *Handler) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	rt, ok := ctx.Value(ctxKey{}).(route)
	if !ok {
		return nil, errors.New("preview: no route in context")
	}
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	return h.cfg.Backend.PreviewDial(ctx, rt.id, rt.port)
}

func (h *Handler) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	rt, _ := r.Context().Value(ctxKey{}).(route)
	if errors.Is(err, context.Canceled) {
		return
	}
	h.log.Info("preview proxy", "sandbox_id", rt.id, "port", rt.port, "err", err)
	if errors.Is(err, errdefs.ErrUnavailable) {
		http.Error(w, fmt.Sprintf("nothing answers on port %d in the sandbox", rt.port), http.StatusBadGateway)
		return
	}
	if errors.Is(err, errdefs.ErrInvalidState) {
		// Paused without auto_resume, or stopping: the client may retry
		// once the sandbox's owner resumes it.
		http.Error(w, "the sandbox is not running (paused without auto_resume, or stopping)", http.StatusServiceUnavailable)
		return
	}
	http.Error(w, "sandbox did not answer", http.StatusBadGateway)
}

// opened audits a client's use of a preview, once per openAuditEvery.
func (h *Handler) opened(r *http.Request, id string, port int, via string) {
	remote, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		remote = r.RemoteAddr
	}
	key := id + "/" + strconv.Itoa(port) + "/" + remote + "/" + via
	now := h.cfg.Now()
	h.mu.Lock()
	last, ok := h.seen[key]
	if ok && now.Sub(last) < openAuditEvery {
		h.mu.Unlock()
		return
	}
	if len(h.seen) >= maxOpenSeen {
		clear(h.seen)
	}
	h.seen[key] = now
	h.mu.Unlock()
	h.cfg.Backend.PreviewOpened(r.Context(), id, port, remote, via)
}

// cookieValue binds the cookie to its host, so that the raw token is never
// stored in the browser and a cookie of one preview host opens no other.
func cookieValue(token, host string) string {
	mac := hmac.New(sha256.New, []byte(token))
	mac.Write([]byte("airlock preview cookie\x00" + strings.ToLower(host)))
	return hex.EncodeToString(mac.Sum(nil))
}

func hasCookie(r *http.Request, token, host string) bool {
	if token == "" {
		return false // a cookie of the empty token is anyone's to make
	}
	want := cookieValue(token, host)
	for _, c := range r.CookiesNamed(CookieName) {
		if equal(c.Value, want) {
			return true
		}
	}
	return false
}

// stripCookie removes airlock's cookie from what goes to the sandbox.
func stripCookie(r *http.Request) {
	cs := r.Cookies()
	if len(cs) == 0 {
		return
	}
	r.Header.Del("Cookie")
	for _, c := range cs {
		if c.Name != CookieName {
			r.AddCookie(c)
		}
	}
}

// equal compares secrets in constant time; an empty one matches nothing.
func equal(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 && b != ""
}
