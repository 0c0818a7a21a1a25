package mcp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// HTTPPath is where NewHTTPHandler's MCP endpoint is served.
const HTTPPath = "/mcp"

// Defaults of the HTTP transport.
const (
	// DefaultSessionTimeout closes a session that made no request for this
	// long (its sandboxes stay, until their own TTL).
	DefaultSessionTimeout = 30 * time.Minute
	// keyTrust is how long a key the API accepted is taken without asking
	// the API again; a revoked key is refused by the API itself at once,
	// and by this endpoint after at most this long.
	keyTrust = time.Minute
	// keyCacheMax bounds the accepted keys remembered.
	keyCacheMax = 4096
	// verifyTimeout bounds asking the API whether a key is valid.
	verifyTimeout = 10 * time.Second
	// maxRequestBody bounds one HTTP request's body (a write_file's
	// content travels in it, base64).
	maxRequestBody = 16 << 20
)

// HTTPOptions configure NewHTTPHandler.
type HTTPOptions struct {
	Options
	// BaseURL is the airlock API the sessions' calls go to ("" is
	// client.DefaultURL).
	BaseURL string
	// HTTPClient carries the API calls of every session (nil: one
	// transport shared by all keys).
	HTTPClient *http.Client
	// UserAgent is sent with the API calls.
	UserAgent string
	// SessionTimeout closes idle sessions (0: DefaultSessionTimeout).
	SessionTimeout time.Duration
}

// keyInfo is the TokenInfo.Extra entry that holds a request's API key.
const keyInfo = "airlock_api_key"

// NewHTTPHandler returns the streamable-HTTP MCP endpoint (at HTTPPath).
// Every request must carry `Authorization: Bearer <airlock API key>`: one
// without is 401, one whose key the API refuses is 401 too. A session is
// bound to the key that opened it (a request of another key naming it is
// 403), and its tool calls are made with that key, so sessions of
// different tenants never see each other's sandboxes. The process's own
// key, if any, is never used.
func NewHTTPHandler(o HTTPOptions) (*HTTPHandler, error) {
	hc := o.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	ua := o.UserAgent
	if ua == "" {
		ua = "airlock-mcp"
	}
	// Fail now on a bad URL, not at the first call.
	if _, err := client.New(o.BaseURL, "", client.WithHTTPClient(hc)); err != nil {
		return nil, err
	}
	newClient := func(key string) (*client.Client, error) {
		return client.New(o.BaseURL, key, client.WithHTTPClient(hc), client.WithUserAgent(ua))
	}
	srv := NewServer(func(_ context.Context, req *sdk.CallToolRequest) (*client.Client, error) {
		key := requestKey(req)
		if key == "" {
			return nil, &client.APIError{StatusCode: http.StatusUnauthorized, Code: api.CodeUnauthenticated, Message: "no API key for this session"}
		}
		return newClient(key)
	}, o.Options)
	timeout := o.SessionTimeout
	if timeout <= 0 {
		timeout = DefaultSessionTimeout
	}
	mcpHandler := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, &sdk.StreamableHTTPOptions{
		Logger:              o.Logger,
		SessionTimeout:      timeout,
		MaxRequestBodyBytes: maxRequestBody,
	})
	keys := &keyVerifier{newClient: newClient, ok: map[string]time.Time{}}
	// The SDK's bearer middleware puts the TokenInfo where the streamable
	// handler looks for the session's user: a session is bound to the
	// hash of its key. keys.middleware has checked the key before.
	bind := auth.RequireBearerToken(func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		return &auth.TokenInfo{UserID: keyID(token), Extra: map[string]any{keyInfo: token}}, nil
	}, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})
	mux := http.NewServeMux()
	mux.Handle(HTTPPath, keys.middleware(bind(mcpHandler)))
	return &HTTPHandler{Handler: http.NewCrossOriginProtection().Handler(mux), srv: srv}, nil
}

// HTTPHandler is the streamable-HTTP endpoint (NewHTTPHandler).
type HTTPHandler struct {
	http.Handler
	srv *sdk.Server
}

// Close ends every session (their sandboxes stay, until their own TTL).
// Call it once the HTTP server stopped taking requests.
func (h *HTTPHandler) Close() {
	for ss := range h.srv.Sessions() {
		ss.Close()
	}
}

// requestKey is the API key of the HTTP request a tool call came in.
func requestKey(req *sdk.CallToolRequest) string {
	if req == nil || req.Extra == nil || req.Extra.TokenInfo == nil {
		return ""
	}
	k, _ := req.Extra.TokenInfo.Extra[keyInfo].(string)
	return k
}

// keyID names a key without revealing it: sessions are bound to it.
func keyID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// keyVerifier refuses requests without a key the API accepts.
type keyVerifier struct {
	newClient func(key string) (*client.Client, error)
	mu        sync.Mutex
	ok        map[string]time.Time // keyID → accepted until
}

func (v *keyVerifier) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, found := bearer(r.Header.Get("Authorization"))
		if !found {
			writeError(w, http.StatusUnauthorized, api.CodeUnauthenticated, "missing Authorization: Bearer <airlock API key>", 0)
			return
		}
		if err := v.verify(r.Context(), key); err != nil {
			var ae *client.APIError
			switch {
			case errors.As(err, &ae) && ae.Code == api.CodeUnauthenticated:
				writeError(w, http.StatusUnauthorized, api.CodeUnauthenticated, "the airlock server refused this API key", 0)
			case errors.As(err, &ae) && ae.StatusCode >= 400 && ae.StatusCode < 500:
				writeError(w, ae.StatusCode, ae.Code, ae.Message, ae.RetryAfter)
			default:
				writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "the airlock server did not answer; try again", 5*time.Second)
			}
			return
		}
		next.ServeHTTP(w, r)
	})
}

// bearer returns the token of an "Authorization: Bearer <token>" header.
func bearer(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(h), " ")
	tok = strings.TrimSpace(tok)
	if !ok || !strings.EqualFold(scheme, "bearer") || tok == "" || strings.ContainsAny(tok, " \t") {
		return "", false
	}
	return tok, true
}

// verify asks the API whether key is valid, unless it said so within
// keyTrust.
func (v *keyVerifier) verify(ctx context.Context, key string) error {
	id := keyID(key)
	now := time.Now()
	v.mu.Lock()
	until, cached := v.ok[id]
	v.mu.Unlock()
	if cached && now.Before(until) {
		return nil
	}
	c, err := v.newClient(key)
	if err != nil {
		return &client.APIError{StatusCode: http.StatusUnauthorized, Code: api.CodeUnauthenticated, Message: "malformed API key"}
	}
	ctx, cancel := context.WithTimeout(ctx, verifyTimeout)
	defer cancel()
	if _, err := c.Info(ctx); err != nil {
		return err
	}
	v.mu.Lock()
	if len(v.ok) >= keyCacheMax {
		clear(v.ok)
	}
	v.ok[id] = now.Add(keyTrust)
	v.mu.Unlock()
	return nil
}

// writeError answers with the API's error body.
func writeError(w http.ResponseWriter, status int, code, msg string, retry time.Duration) {
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="airlock"`)
	}
	if retry > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(int(retry.Seconds())))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	var body api.ErrorBody
	body.Error.Code, body.Error.Message = code, msg
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(body)
}

// ListenAndServe serves h on addr until ctx ends, then closes its
// sessions; ready (if not nil) is told the address once it listens.
func ListenAndServe(ctx context.Context, addr string, h *HTTPHandler, ready func(net.Addr)) error {
	defer h.Close()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	// Sessions' event streams never end by themselves: closing the
	// sessions ends them, so that Shutdown does not wait for them.
	srv.RegisterOnShutdown(h.Close)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	if ready != nil {
		ready(ln.Addr())
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	// Give requests a moment, then close what is left.
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	<-done
	return nil
}
