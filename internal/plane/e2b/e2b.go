// Package e2b serves the E2B SDKs' protocols on airlock: the control plane (/sandboxes…), the envd-compatible sandbox plane (Connect process and filesystem services, /files, /health) and the code-interpreter plane (/execute, /contexts).
//
// An agent written against the stock `e2b` / `@e2b/code-interpreter`
// packages moves to airlock by setting E2B_API_URL and E2B_SANDBOX_URL to
// airlock's URL and E2B_API_KEY to an airlock key (docs/e2b.md). Both planes
// share airlock's listener: sandbox-plane requests carry the E2b-Sandbox-Id
// and E2b-Sandbox-Port headers (IsSandboxPlane), control-plane requests use
// paths that do not collide with /v1/ (IsControlPlane).
//
// Everything goes through airlock's services, so tenancy, audit, secrets redaction,
// limits and process-tree kills are airlock's own. The sandbox plane is
// authenticated by per-sandbox tokens issued at create (X-Access-Token for
// everything, E2B-Traffic-Access-Token for the sandbox's ports and the code
// interpreter), HMACs of the sandbox id under a daemon key: nothing is
// stored, and a token is useless for any other sandbox.
package e2b

//go:generate sh -c "cd ../../../proto/gen && go run . -root ../.."

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/auth"
)

// Protocol constants of the SDKs.
const (
	// HeaderSandboxID and HeaderSandboxPort route a sandbox-plane request.
	HeaderSandboxID   = "E2b-Sandbox-Id"
	HeaderSandboxPort = "E2b-Sandbox-Port"
	// HeaderAccessToken carries the envdAccessToken issued at create.
	HeaderAccessToken = "X-Access-Token"
	// HeaderTrafficToken carries the trafficAccessToken issued at create,
	// which opens the sandbox's ports (the code interpreter's included)
	// but not envd.
	HeaderTrafficToken = "E2b-Traffic-Access-Token"
	// EnvdPort is envd's port (process, filesystem, /files, /health).
	EnvdPort = 49983
	// JupyterPort is the code interpreter's port (/execute, /contexts).
	JupyterPort = 49999
	// EnvdVersion is the envd version we report. The SDKs gate features on
	// it (js-sdk src/envd/versions.ts), and airlock serves each one up to
	// it: stdin (0.3.0), the default user (0.4.0), CloseStdin (0.5.2),
	// octet-stream uploads (0.5.7), per-file metadata as user.e2b.* xattrs
	// (0.6.2), the entry of a watch event (0.6.3), and watches that allow
	// network mounts (0.6.4: a sandbox has none, so the flag changes
	// nothing).
	EnvdVersion = "0.6.4"
)

// CodeService runs code-interpreter cells; *interp.Service implements it.
// Without one the code plane answers 501.
type CodeService interface {
	// Run runs one cell in sandbox id, calling emit for each event in order.
	Run(ctx context.Context, p auth.Principal, id string, req api.CodeRequest, emit func(api.CodeEvent) error) error
	// CreateContext makes a new interpreter context.
	CreateContext(ctx context.Context, p auth.Principal, id string, req api.CodeContextRequest) (api.CodeContext, error)
	// ListContexts lists the sandbox's contexts.
	ListContexts(ctx context.Context, p auth.Principal, id string) ([]api.CodeContext, error)
	// DeleteContext removes a context and its kernel.
	DeleteContext(ctx context.Context, p auth.Principal, id, cid string) error
	// RestartContext restarts a context's kernel (its state is lost).
	RestartContext(ctx context.Context, p auth.Principal, id, cid string) (api.CodeContext, error)
}

// Config configures a Handler.
type Config struct {
	// Sandboxes, Execs and Files are the services the planes translate
	// to (services.go). Required.
	Sandboxes Sandboxes
	Execs     Execs
	Files     Files
	// Ports reaches sandbox ports (getHost traffic); nil answers 502.
	Ports Ports
	// Templates serves E2B's templates API; nil answers it with 501.
	Templates Templates
	// Auth checks the X-API-KEY of control-plane calls. Required.
	Auth *auth.Authenticator
	// Code runs code-interpreter cells; nil answers /execute with 501.
	Code CodeService
	// Logger receives errors; default slog.Default().
	Logger *slog.Logger
	// TokenKey derives the per-sandbox access tokens. Keep it stable across
	// restarts (e.g. a file in the data dir) so that issued tokens stay
	// valid; nil makes a random one, valid until the daemon stops.
	TokenKey []byte
	// MaxUploadBytes bounds a POST /files body; default 1 GiB.
	MaxUploadBytes int64
	// Audit receives authentication failures; nil records none.
	Audit *audit.Recorder
	// AuthFailureDelay slows every answer to a wrong key or token (as the
	// API does); default 200 ms, negative for none.
	AuthFailureDelay time.Duration
	// Keepalive is how often an idle stream gets a keep-alive event;
	// default 15 s (under the SDK's and proxies' idle limits).
	Keepalive time.Duration
	// MaxExecTimeout caps a command's timeout (the daemon's
	// max_exec_timeout_s); default 24 h.
	MaxExecTimeout time.Duration
}

// Handler serves the E2B planes. Create it with New.
type Handler struct {
	cfg       Config
	sandboxes Sandboxes
	execs     Execs
	files     Files
	ports     Ports
	log       *slog.Logger
	control   http.Handler
	envd      http.Handler
	code      http.Handler

	// procs maps each sandbox's E2B pids to airlock execs (process.go).
	procsMu sync.Mutex
	procs   map[string]*procTable

	// tmpl is the templates API's state (templates.go).
	tmpl *templateAPI
}

// New returns a Handler for cfg.
func New(cfg Config) *Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if len(cfg.TokenKey) == 0 {
		cfg.TokenKey = make([]byte, 32)
		rand.Read(cfg.TokenKey)
	}
	if cfg.MaxUploadBytes <= 0 {
		cfg.MaxUploadBytes = 1 << 30
	}
	if cfg.AuthFailureDelay == 0 {
		cfg.AuthFailureDelay = 200 * time.Millisecond
	}
	if cfg.Keepalive <= 0 {
		cfg.Keepalive = 15 * time.Second
	}
	if cfg.MaxExecTimeout <= 0 {
		cfg.MaxExecTimeout = 24 * time.Hour
	}
	h := &Handler{cfg: cfg, sandboxes: cfg.Sandboxes, execs: cfg.Execs, files: cfg.Files, ports: cfg.Ports,
		log: cfg.Logger, procs: map[string]*procTable{}}
	h.control = h.controlMux()
	h.envd = h.envdMux()
	h.code = h.codeMux()
	return h
}

// IsSandboxPlane reports whether r is addressed to a sandbox (envd, the code
// interpreter or another port) rather than to the API.
func IsSandboxPlane(r *http.Request) bool { return r.Header.Get(HeaderSandboxID) != "" }

// controlPrefixes are the control-plane paths the SDKs call. None starts with
// /v1/, so they never shadow airlock's own API.
var controlPrefixes = []string{"/sandboxes", "/v2/sandboxes", "/snapshots", "/templates", "/v2/templates", "/v3/templates", "/teams", "/volumes", "/secrets"}

// IsControlPlane reports whether r is an E2B control-plane call.
func IsControlPlane(r *http.Request) bool {
	for _, p := range controlPrefixes {
		if r.URL.Path == p || strings.HasPrefix(r.URL.Path, p+"/") {
			return true
		}
	}
	return false
}

// ServeHTTP routes r to the sandbox plane (by header) or the control plane.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if IsSignedFiles(r) && (!IsSandboxPlane(r) || r.Header.Get(HeaderAccessToken) == "") {
		h.serveSigned(w, r)
		return
	}
	if IsSandboxPlane(r) {
		h.serveSandbox(w, r)
		return
	}
	h.control.ServeHTTP(w, r)
}

// AccessToken returns the envd access token of sandbox id.
func (h *Handler) AccessToken(id string) string {
	mac := hmac.New(sha256.New, h.cfg.TokenKey)
	mac.Write([]byte("airlock-e2b-envd\x00" + id))
	return hex.EncodeToString(mac.Sum(nil))
}

// TrafficToken returns the traffic access token of sandbox id: what the
// SDKs send as E2B-Traffic-Access-Token to the sandbox's ports. It is a
// credential of its own (another HMAC label), so that it opens the ports
// and the code interpreter but no envd call (files, processes).
func (h *Handler) TrafficToken(id string) string {
	mac := hmac.New(sha256.New, h.cfg.TokenKey)
	mac.Write([]byte("airlock-e2b-traffic\x00" + id))
	return hex.EncodeToString(mac.Sum(nil))
}

// validToken reports in constant time whether tok is sandbox id's envd
// access token.
func (h *Handler) validToken(id, tok string) bool {
	return hmac.Equal([]byte(tok), []byte(h.AccessToken(id)))
}

// validTrafficToken reports in constant time whether tok is sandbox id's
// traffic access token.
func (h *Handler) validTrafficToken(id, tok string) bool {
	return hmac.Equal([]byte(tok), []byte(h.TrafficToken(id)))
}

// authFailed audits a failed authentication (a wrong or missing key or
// access token) and slows the answer down. Other errors of Authenticate
// (rate_limited, a store failure) are not the client guessing keys: they
// are neither audited nor slowed.
func (h *Handler) authFailed(r *http.Request, err error, plane string) {
	if !auth.IsUnauthenticated(err) {
		return
	}
	detail := map[string]string{"reason": "e2b " + plane + ": " + publicReason(err), "method": r.Method, "route": "e2b " + plane}
	if host, _, herr := net.SplitHostPort(r.RemoteAddr); herr == nil {
		detail["remote_addr"] = host
	}
	h.cfg.Audit.RecordDetail(audit.Event{Type: audit.TypeAuthFailure}, detail, nil)
	if d := h.cfg.AuthFailureDelay; d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
		}
	}
}

// publicReason is what an audit reader may see of an authentication error:
// never the key or token.
func publicReason(err error) string {
	if errors.Is(err, auth.ErrNoKey) {
		return "missing api key"
	}
	return "invalid credentials"
}

// sandboxPrincipal is who a sandbox-plane request acts as once its token
// checked out: the sandbox's own tenant.
func (h *Handler) sandboxPrincipal(ctx context.Context, id string) (auth.Principal, api.Sandbox, error) {
	sb, err := h.sandboxes.Get(ctx, auth.Principal{Admin: true}, id)
	if err != nil {
		return auth.Principal{}, api.Sandbox{}, err
	}
	return auth.Principal{Tenant: sb.Tenant, KeyID: "e2b-access-token"}, sb, nil
}
