// Package httpapi is airlock's HTTP API: routes, authentication, request ids, error mapping, streaming (SSE, WebSocket) and metrics.
//
// Handlers return errors; only this package turns an error's class into a
// status and an API error code (errors.go), with a client-safe message,
// while the full error goes to the log with the request id.
package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"sort"
	"strings"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/errdefs/edge"
)

// Config configures a Server.
type Config struct {
	// Sandboxes, Execs, Files, Networks, Previews, Accounting and
	// Templates are the services the routes serve (services.go).
	// Required.
	Sandboxes  Sandboxes
	Execs      Execs
	Files      Files
	Networks   TenantNetworks
	Previews   Previews
	Accounting Accounting
	Templates  Templates
	// Auth checks API keys. Required.
	Auth *auth.Authenticator
	// Metrics records request and exec metrics; nil makes a private one.
	Metrics *Metrics
	// Logger receives request logs; default slog.Default().
	Logger *slog.Logger
	// Version is reported by /v1/info.
	Version string
	// Host is the daemon's host slot, reported by /v1/info to admin keys.
	Host *api.HostInfo
	// MaxUploadBytes bounds a file upload or stdin body.
	MaxUploadBytes int64
	// Heartbeat is the SSE keep-alive interval (at most 15 s per API.md);
	// default 10 s.
	Heartbeat time.Duration
	// Audit receives authentication failures (the manager records the
	// rest) and is reported in the metrics; nil records none.
	Audit *audit.Recorder
	// AuthFailureDelay slows every answer to a wrong api key, so that keys
	// cannot be guessed quickly; default DefaultAuthFailureDelay, negative
	// for none.
	AuthFailureDelay time.Duration
	// Code runs code-interpreter cells (POST /v1/sandboxes/{id}/code and
	// the contexts routes); nil answers them with 501.
	Code CodeService
	// E2B serves the E2B-compatible control and sandbox planes on the same
	// listener (see e2b.go for which requests go to it); nil serves none.
	E2B http.Handler
}

// DefaultAuthFailureDelay is long enough to make guessing keys slow (and
// keys are 256 bits anyway), short enough that a client with a revoked
// key learns it promptly.
const DefaultAuthFailureDelay = 200 * time.Millisecond

// Server is the HTTP API.
type Server struct {
	cfg        Config
	sandboxes  Sandboxes
	execs      Execs
	files      Files
	networks   TenantNetworks
	previews   Previews
	accounting Accounting
	templates  Templates
	auth       *auth.Authenticator
	metrics    *Metrics
	log        *slog.Logger
	mux        *http.ServeMux
	routes     []string
	handler    http.Handler

	// streams is cancelled by CloseStreams: long-lived responses (SSE,
	// terminals) watch it so that shutdown does not wait for them.
	streams      context.Context
	closeStreams context.CancelFunc
}

// New returns a Server for cfg.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Heartbeat <= 0 || cfg.Heartbeat > 15*time.Second {
		cfg.Heartbeat = 10 * time.Second
	}
	if cfg.MaxUploadBytes <= 0 {
		cfg.MaxUploadBytes = 1 << 30
	}
	if cfg.AuthFailureDelay == 0 {
		cfg.AuthFailureDelay = DefaultAuthFailureDelay
	}
	s := &Server{
		cfg: cfg, auth: cfg.Auth, metrics: cfg.Metrics, log: cfg.Logger, mux: http.NewServeMux(),
		sandboxes: cfg.Sandboxes, execs: cfg.Execs, files: cfg.Files, networks: cfg.Networks,
		previews: cfg.Previews, accounting: cfg.Accounting, templates: cfg.Templates,
	}
	s.streams, s.closeStreams = context.WithCancel(context.Background())
	cfg.Metrics.watchSandboxes(cfg.Sandboxes)
	cfg.Metrics.watchAudit(cfg.Audit)
	s.register()
	s.handler = s.withRequest(s.e2bPlane(s.mux))
	return s
}

// CloseStreams ends every event stream and terminal (at shutdown; clients
// re-attach to the next daemon with Last-Event-ID).
func (s *Server) CloseStreams() { s.closeStreams() }

// streamContext returns a context that ends with the request, with
// CloseStreams, or when the key that opened the stream is revoked.
func (s *Server) streamContext(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(r.Context())
	stop := context.AfterFunc(s.streams, func() { cancel(errStreamShutdown) })
	unwatch := func() {}
	if p, ok := auth.FromContext(r.Context()); ok && p.KeyID != "" {
		var revoked <-chan struct{}
		revoked, unwatch = s.auth.Revoked(p.KeyID)
		go func() {
			select {
			case <-revoked:
				cancel(errStreamKeyRevoked)
			case <-ctx.Done():
			}
		}()
	}
	return ctx, func() { stop(); unwatch(); cancel(nil) }
}

// Why the server ends a stream (context.Cause of a streamContext): the
// stream's last event says so, so that a client can tell a daemon going
// away (re-attach later) from a key revoked (stop) from its own leaving.
var (
	errStreamShutdown   = errors.New("the daemon is shutting down; re-attach once it serves again")
	errStreamKeyRevoked = errors.New("the API key was revoked")
)

// streamEnd is the error body of the last event of a stream the server
// ends (ok false: the client left, nothing is sent).
func streamEnd(ctx context.Context, r *http.Request) (api.ErrorBody, bool) {
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errStreamShutdown):
		return errorBody(r, api.CodeUnavailable, cause.Error()), true
	case errors.Is(cause, errStreamKeyRevoked):
		return errorBody(r, api.CodeUnauthenticated, cause.Error()), true
	}
	return api.ErrorBody{}, false
}

// endSSE sends a stream's terminal `event: error` when the server, not the
// client, ended it.
func endSSE(ctx context.Context, r *http.Request, sw *sse) {
	if b, ok := streamEnd(ctx, r); ok {
		sw.event("error", "", b)
	}
}

// Handler returns the root handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Routes returns every registered route as "METHOD /path".
func (s *Server) Routes() []string {
	out := append([]string(nil), s.routes...)
	sort.Strings(out)
	return out
}

// handlerFunc is an authenticated handler that returns its error.
type handlerFunc func(w http.ResponseWriter, r *http.Request, p auth.Principal) error

func (s *Server) handle(pattern string, h http.Handler) {
	s.routes = append(s.routes, pattern)
	s.mux.Handle(pattern, h)
}

// authed wraps h with authentication; admin routes also demand an admin key.
func (s *Server) authed(h handlerFunc, adminOnly bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := s.auth.Authenticate(r.Context(), r)
		if err != nil {
			s.authFailed(r, err)
			s.writeError(w, r, err)
			return
		}
		if adminOnly && !p.Admin {
			s.writeError(w, r, errf(errdefs.ErrPermissionDenied, "this needs an admin key"))
			return
		}
		ctx := auth.WithPrincipal(r.Context(), p)
		if rs := stateFrom(ctx); rs != nil {
			rs.tenant = p.Tenant
		}
		ctx = withLogger(ctx, logFrom(ctx).With("tenant", p.Tenant))
		r = r.WithContext(ctx)
		if err := h(w, r, p); err != nil {
			s.writeError(w, r, err)
		}
	})
}

// open wraps an unauthenticated handler.
func (s *Server) open(h func(w http.ResponseWriter, r *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			s.writeError(w, r, err)
		}
	})
}

func (s *Server) register() {
	a := func(h handlerFunc) http.Handler { return s.authed(h, false) }
	admin := func(h handlerFunc) http.Handler { return s.authed(h, true) }

	s.handle("GET /healthz", s.open(s.healthz))
	s.handle("GET /readyz", s.open(s.readyz))
	s.handle("GET /metrics", admin(s.promMetrics))
	s.handle("GET /v1/info", a(s.info))

	s.handle("POST /v1/keys", admin(s.createKey))
	s.handle("GET /v1/keys", a(s.listKeys))
	s.handle("DELETE /v1/keys/{kid}", a(s.deleteKey))

	s.handle("POST /v1/sandboxes", a(s.createSandbox))
	s.handle("GET /v1/sandboxes", a(s.listSandboxes))
	s.handle("GET /v1/sandboxes/{id}", a(s.getSandbox))
	s.handle("DELETE /v1/sandboxes/{id}", a(s.deleteSandbox))
	s.handle("GET /v1/sandboxes/{id}/metrics", a(s.sandboxMetrics))
	s.handle("GET /v1/usage", a(s.usage))

	s.handle("POST /v1/sandboxes/{id}/exec", a(s.exec))
	s.handle("GET /v1/sandboxes/{id}/execs", a(s.listExecs))
	s.handle("GET /v1/sandboxes/{id}/execs/{eid}", a(s.getExec))
	s.handle("GET /v1/sandboxes/{id}/execs/{eid}/events", a(s.execEvents))
	s.handle("POST /v1/sandboxes/{id}/execs/{eid}/stdin", a(s.stdin))
	s.handle("POST /v1/sandboxes/{id}/execs/{eid}/signal", a(s.signal))
	s.handle("GET /v1/sandboxes/{id}/pty", a(s.pty))

	s.handle("PUT /v1/sandboxes/{id}/network", a(s.updateNetwork))

	// File writes are audited around their handlers.
	s.handle("PUT /v1/sandboxes/{id}/files", a(s.auditFiles(fileOpWrite, s.putFile)))
	s.handle("GET /v1/sandboxes/{id}/files", a(s.getFile))
	s.handle("GET /v1/sandboxes/{id}/fs/list", a(s.fsList))
	s.handle("GET /v1/sandboxes/{id}/fs/stat", a(s.fsStat))
	s.handle("POST /v1/sandboxes/{id}/fs/mkdir", a(s.auditFiles(fileOpMkdir, s.fsMkdir)))
	s.handle("POST /v1/sandboxes/{id}/fs/move", a(s.auditFiles(fileOpMove, s.fsMove)))
	s.handle("DELETE /v1/sandboxes/{id}/fs", a(s.auditFiles(fileOpRemove, s.fsRemove)))

	s.handle("POST /v1/templates", a(s.createTemplate))
	s.handle("GET /v1/templates", a(s.listTemplates))
	s.handle("GET /v1/templates/builds/{id}", a(s.getTemplateBuild))
	s.handle("GET /v1/templates/{name}", a(s.getTemplate))
	s.handle("DELETE /v1/templates/{name}", a(s.deleteTemplate))

	s.handle("GET /v1/audit", a(s.listAudit))
	s.handle("GET /v1/tenants/{tenant}/network", a(s.getTenantNetwork))
	s.handle("PUT /v1/tenants/{tenant}/network", admin(s.putTenantNetwork))
	s.handle("DELETE /v1/tenants/{tenant}/network", admin(s.deleteTenantNetwork))

	s.registerLifecycle(a)
	s.registerSnapshots(a)
	s.registerPools(a)
	s.registerCode(a)
	s.registerTenancy(a, admin)
	s.registerPreview(a)
	s.registerWatch(a)

	// Everything else: the API's error shape, 405 when only the method is
	// wrong.
	s.mux.Handle("/", s.open(s.notFound))
}

// notFound answers unknown routes, telling a wrong method apart.
func (s *Server) notFound(w http.ResponseWriter, r *http.Request) error {
	var allowed []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete} {
		if m == r.Method {
			continue
		}
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pat := s.mux.Handler(probe); pat != "/" && pat != "" {
			allowed = append(allowed, m)
		}
	}
	if len(allowed) > 0 {
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		writeJSON(w, http.StatusMethodNotAllowed, errorBody(r, edge.MethodNotAllowed.Code, edge.MethodNotAllowed.Message))
		return nil
	}
	return errf(errdefs.ErrNotFound, "no such route")
}

// requestState is per-request data the middleware reads back after the
// handler ran.
type requestState struct {
	id     string
	tenant string
	// route names requests that no pattern of the mux matched but a
	// plane served (the E2B planes), for logs and metrics.
	route string
}

type ctxKey int

const (
	keyState ctxKey = iota
	keyLogger
)

func stateFrom(ctx context.Context) *requestState {
	rs, _ := ctx.Value(keyState).(*requestState)
	return rs
}

func requestIDFrom(ctx context.Context) string {
	if rs := stateFrom(ctx); rs != nil {
		return rs.id
	}
	return ""
}

func withLogger(ctx context.Context, l *slog.Logger) context.Context {
	return context.WithValue(ctx, keyLogger, l)
}

// logFrom returns the request's logger (request_id, tenant…).
func logFrom(ctx context.Context) *slog.Logger {
	if l, ok := ctx.Value(keyLogger).(*slog.Logger); ok {
		return l
	}
	return slog.Default()
}

// withRequest gives every request an id (X-Request-Id), a logger carrying
// it, a trace span, panic recovery, an access log line and latency metrics.
func (s *Server) withRequest(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rs := &requestState{id: auth.RandomID("req_", 10)}
		w.Header().Set("X-Request-Id", rs.id)
		log := s.log.With("request_id", rs.id)
		ctx, span := startRequestSpan(r)
		ctx = context.WithValue(ctx, keyState, rs)
		ctx = audit.WithRequestID(ctx, rs.id)
		ctx = withLogger(ctx, log)
		r = r.WithContext(ctx)
		rec := &statusRecorder{ResponseWriter: w}
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				log.Error("panic in handler", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
				if !rec.wrote {
					s.writeError(rec, r, errf(errdefs.ErrInternal, "internal error"))
				}
			}
			status := rec.status
			if status == 0 {
				status = http.StatusOK
			}
			route := r.Pattern
			if route == "" || route == "/" {
				route = "unmatched"
				if rs.route != "" {
					route = rs.route
				}
			}
			d := time.Since(start)
			s.metrics.observeRequest(r.Method, route, status, d)
			endRequestSpan(span, r.Method, route, status, rs)
			level := slog.LevelInfo
			if route == "GET /healthz" || route == "GET /readyz" || route == "GET /metrics" {
				level = slog.LevelDebug
			}
			log.Log(r.Context(), level, "request", "method", r.Method, "route", route, "status", status,
				"duration_ms", d.Milliseconds(), "tenant", rs.tenant, "bytes", rec.bytes)
		}()
		next.ServeHTTP(rec, r)
	})
}

// statusRecorder remembers the status and size of a response. Unwrap lets
// http.ResponseController (flush, hijack for WebSocket) reach the original.
type statusRecorder struct {
	http.ResponseWriter
	status int
	bytes  int64
	wrote  bool
}

func (s *statusRecorder) WriteHeader(code int) {
	if !s.wrote {
		s.status, s.wrote = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if !s.wrote {
		s.status, s.wrote = http.StatusOK, true
	}
	n, err := s.ResponseWriter.Write(b)
	s.bytes += int64(n)
	return n, err
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// Flush supports streaming through wrappers that only look for Flusher.
func (s *statusRecorder) Flush() {
	http.NewResponseController(s.ResponseWriter).Flush()
}
