// Package client is the Go SDK of airlock's HTTP API v1 (see api/openapi.yaml).
//
// A Sandbox is a handle on one sandbox: commands (their output returned
// also when streamed), background commands, files by paths relative to the
// sandbox user's home, the code interpreter, a terminal. Create makes one on
// the server in AIRLOCK_URL with the key in AIRLOCK_API_KEY:
//
//	sbx, err := client.Create(ctx, client.WithTemplate("base"))
//	if err != nil { … }
//	defer sbx.Close()
//	res, err := sbx.Run(ctx, "echo hi", client.WithTimeout(30*time.Second))
//	fmt.Print(res.Stdout)
//
// A Client is safe for concurrent use and has a method for every call of
// the API. Every call takes a context first and returns typed values from
// package api; a non-2xx answer comes back as an *APIError that errors.Is
// matches against this package's sentinels (ErrNotFound, ErrSandboxNotFound,
// ErrQuotaExceeded, …):
//
//	c, err := client.New("", "", client.FromEnv())
//	sbx, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base"})
//	res, err := c.Exec(ctx, sbx.ID, api.ExecRequest{Cmd: []string{"echo", "hi"}})
//
// The SDK is a module of its own, github.com/airlockhq/airlock/client,
// which requires github.com/airlockhq/airlock/api (the request and response
// types) and github.com/coder/websocket, and nothing of the daemon's:
//
//	go get github.com/airlockhq/airlock/client@latest
//
// Versions are tagged client/vX.Y.Z and api/vX.Y.Z; docs/sdk.md in the
// repository says how to build against a checkout.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// DefaultURL is the address `airlock serve` listens on unless told otherwise.
const DefaultURL = "http://127.0.0.1:7070"

// Environment variables read by FromEnv (and by the CLI).
const (
	EnvURL    = "AIRLOCK_URL"
	EnvAPIKey = "AIRLOCK_API_KEY"
)

const (
	// defaultStreamIdle is how long an SSE stream may stay silent before the
	// client calls it dead and re-attaches. The server sends a heartbeat at
	// least every 15 s, so three missed heartbeats mean the connection is gone
	// (a half-open TCP connection would otherwise hang a reader forever).
	defaultStreamIdle = 45 * time.Second
	// defaultResumeAttempts bounds consecutive re-attach attempts that make
	// no progress, so a server that is really gone ends the stream with an
	// error instead of a retry loop.
	defaultResumeAttempts = 5
	// maxErrorBody bounds how much of an error response is read: the error
	// body is small JSON, anything longer is not ours.
	maxErrorBody = 64 << 10
	// maxJSONBody bounds a decoded success response; the largest is an exec
	// result carrying captured output (64 MiB cap in the agent, base64 worst case).
	maxJSONBody = 128 << 20
)

// Client talks to one airlock server with one API key.
type Client struct {
	base           *url.URL
	apiKey         string
	hc             *http.Client
	userAgent      string
	streamIdle     time.Duration
	resumeAttempts int
	resumeBackoff  time.Duration
}

type settings struct {
	hc             *http.Client
	userAgent      string
	fromEnv        bool
	streamIdle     time.Duration
	resumeAttempts int
	resumeBackoff  time.Duration
}

// Option configures a Client.
type Option func(*settings)

// WithHTTPClient makes the Client send requests through hc (its Timeout, if
// any, also bounds streams: leave it zero and use contexts instead).
func WithHTTPClient(hc *http.Client) Option { return func(s *settings) { s.hc = hc } }

// WithUserAgent sets the User-Agent header of every request.
func WithUserAgent(ua string) Option { return func(s *settings) { s.userAgent = ua } }

// FromEnv fills an empty baseURL from AIRLOCK_URL and an empty apiKey from
// AIRLOCK_API_KEY. Arguments given to New win over the environment.
func FromEnv() Option { return func(s *settings) { s.fromEnv = true } }

// WithStreamIdleTimeout sets how long an event stream may stay silent
// (no event, no heartbeat) before the client drops it and re-attaches.
func WithStreamIdleTimeout(d time.Duration) Option {
	return func(s *settings) { s.streamIdle = d }
}

// WithResume sets how many consecutive re-attach attempts without progress a
// stream makes after its connection drops, and the pause before the first
// (doubled at each further attempt). attempts 0 disables re-attaching.
func WithResume(attempts int, backoff time.Duration) Option {
	return func(s *settings) { s.resumeAttempts, s.resumeBackoff = attempts, backoff }
}

// New returns a Client for the server at baseURL (e.g. "http://127.0.0.1:7070")
// authenticating with apiKey. An empty baseURL means DefaultURL (or
// AIRLOCK_URL with FromEnv).
func New(baseURL, apiKey string, opts ...Option) (*Client, error) {
	s := settings{
		userAgent:      "airlock-go",
		streamIdle:     defaultStreamIdle,
		resumeAttempts: defaultResumeAttempts,
		resumeBackoff:  200 * time.Millisecond,
	}
	for _, o := range opts {
		o(&s)
	}
	if s.fromEnv {
		if baseURL == "" {
			baseURL = os.Getenv(EnvURL)
		}
		if apiKey == "" {
			apiKey = os.Getenv(EnvAPIKey)
		}
	}
	if baseURL == "" {
		baseURL = DefaultURL
	}
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil {
		return nil, fmt.Errorf("parsing base url: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("base url %q: scheme must be http or https", baseURL)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("base url %q: missing host", baseURL)
	}
	if strings.ContainsAny(apiKey, "\r\n") {
		return nil, errors.New("api key contains a line break")
	}
	if s.hc == nil {
		// No client-wide Timeout: exec streams and file transfers legitimately
		// last long; callers bound calls with their context.
		tr := http.DefaultTransport.(*http.Transport).Clone()
		// Request bodies go out in large writes (see bulkConn): uploads
		// cost the client and the daemon less.
		tr.DialContext = bulkDialer(tr.DialContext)
		s.hc = &http.Client{Transport: tr}
	}
	if s.resumeBackoff <= 0 {
		s.resumeBackoff = 200 * time.Millisecond
	}
	return &Client{
		base:           u,
		apiKey:         apiKey,
		hc:             s.hc,
		userAgent:      s.userAgent,
		streamIdle:     s.streamIdle,
		resumeAttempts: s.resumeAttempts,
		resumeBackoff:  s.resumeBackoff,
	}, nil
}

// BaseURL returns the server address the Client talks to.
func (c *Client) BaseURL() string { return c.base.String() }

// CallOption adjusts one request.
type CallOption func(*http.Request)

// WithIdempotencyKey sets the Idempotency-Key header: a retried create with
// the same key returns the sandbox of the first call instead of a new one.
func WithIdempotencyKey(key string) CallOption {
	return func(r *http.Request) { r.Header.Set("Idempotency-Key", key) }
}

// WithHeader sets an extra header on one request.
func WithHeader(name, value string) CallOption {
	return func(r *http.Request) { r.Header.Set(name, value) }
}

// sandboxPath joins /v1/sandboxes/{id} with further escaped segments.
func sandboxPath(id string, rest ...string) string {
	var b strings.Builder
	b.WriteString("/v1/sandboxes/")
	b.WriteString(url.PathEscape(id))
	for _, r := range rest {
		b.WriteByte('/')
		b.WriteString(r)
	}
	return b.String()
}

// newRequest builds a request for path (already escaped) and query.
func (c *Client) newRequest(ctx context.Context, method, path string, query url.Values, body io.Reader) (*http.Request, error) {
	u := c.endpoint(path)
	if len(query) > 0 {
		u.RawQuery = query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return nil, fmt.Errorf("building request: %w", err)
	}
	c.authorize(req.Header)
	return req, nil
}

// endpoint returns the server URL of path (already escaped).
func (c *Client) endpoint(path string) url.URL {
	u := *c.base
	u.RawPath = c.base.EscapedPath() + path
	if p, err := url.PathUnescape(u.RawPath); err == nil {
		u.Path = p
	}
	return u
}

func (c *Client) authorize(h http.Header) {
	if c.apiKey != "" {
		h.Set("Authorization", "Bearer "+c.apiKey)
	}
	if c.userAgent != "" {
		h.Set("User-Agent", c.userAgent)
	}
}

// send performs req and turns a non-2xx response into an *APIError (closing
// its body). On success the caller owns resp.Body.
func (c *Client) send(req *http.Request) (*http.Response, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctxErr := req.Context().Err(); ctxErr != nil {
			return nil, fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, context.Cause(req.Context()))
		}
		return nil, &TransportError{Method: req.Method, URL: redactURL(req.URL), Err: err}
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	return nil, decodeError(resp)
}

// doJSON sends in (if not nil) as JSON and decodes a 2xx body into out (if not nil).
func (c *Client) doJSON(ctx context.Context, method, path string, query url.Values, in, out any, opts ...CallOption) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encoding request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := c.newRequest(ctx, method, path, query, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	for _, o := range opts {
		o(req)
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return decodeBody(resp, out)
}

// decodeBody decodes a JSON success body into out, or drains it when out is nil.
func decodeBody(resp *http.Response, out any) error {
	if out == nil {
		// Draining lets the transport reuse the connection.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
		return nil
	}
	dec := json.NewDecoder(io.LimitReader(resp.Body, maxJSONBody))
	if err := dec.Decode(out); err != nil {
		return fmt.Errorf("decoding %s response: %w", resp.Request.URL.Path, err)
	}
	return nil
}

// TransportError is a request that got no HTTP answer (connection refused,
// reset, DNS…). It matches ErrUnavailable.
type TransportError struct {
	Method string
	URL    string
	Err    error
}

// Error implements error.
func (e *TransportError) Error() string {
	msg := e.Err.Error()
	var ue *url.Error
	if errors.As(e.Err, &ue) {
		msg = ue.Err.Error()
	}
	return fmt.Sprintf("cannot reach %s: %s", e.URL, msg)
}

// Unwrap returns the underlying network error.
func (e *TransportError) Unwrap() error { return e.Err }

// Is reports ErrUnavailable for every transport failure.
func (e *TransportError) Is(target error) bool { return target == ErrUnavailable }

// Temporary reports whether retrying might help (always true: the server may come back).
func (e *TransportError) Temporary() bool { return true }

// redactURL keeps scheme and host only: query strings may hold paths the
// caller considers private, and errors end up in logs.
func redactURL(u *url.URL) string {
	return u.Scheme + "://" + u.Host
}

// isNetErr reports whether err came from the connection rather than the server.
func isNetErr(err error) bool {
	var te *TransportError
	var ne net.Error
	return errors.As(err, &te) || errors.As(err, &ne) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}
