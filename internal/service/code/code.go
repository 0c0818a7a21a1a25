// Package code is the code service: it runs code-interpreter cells in sandboxes' stateful contexts.
//
// A context is a kernel in the sandbox: ipykernel for python (spoken to with
// the Jupyter protocol by jupyter_client in a small bridge), node's vm module
// for javascript, a bash process for bash. Each kernel is driven by a bridge
// process (bridge.py, bridge.js) that takes JSON-line requests on its stdin
// and writes JSON-line events to a FIFO the daemon reads through the agent
// (see backend.go). Everything the bridge writes is the sandbox's,
// hence untrusted: lines are size-bounded and parsed strictly, and only
// known fields of known event types reach the client.
//
// Contexts live in the daemon's memory (not the store): a daemon restart
// loses them, and the next cell starts fresh kernels.
package code

import (
	"context"
	_ "embed"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
	"github.com/airlockhq/airlock/internal/redact"
	"github.com/airlockhq/airlock/internal/service/sandbox"
)

//go:embed bridge.py
var bridgePy string

//go:embed bridge.js
var bridgeJS string

// Defaults and limits.
const (
	// DefaultTimeout is a cell's limit when the request gives none (E2B's
	// default as well).
	DefaultTimeout = 300 * time.Second
	// MaxTimeout bounds timeout_s.
	MaxTimeout = 24 * time.Hour
	// MaxCodeBytes bounds a cell's source.
	MaxCodeBytes = 1 << 20
	// MaxEnvVars bounds the number of a cell's env variables, as a
	// sandbox's env is bounded at create.
	MaxEnvVars = 256
	// MaxEnvBytes bounds a cell's env (names plus values): it travels in
	// the cell's request line to the bridge, and the kernel copies it
	// twice (to set it and to restore what it replaced).
	MaxEnvBytes = 256 << 10
	// MaxContexts bounds the contexts of one sandbox: each is a kernel
	// process in the sandbox's memory.
	MaxContexts = 32
	// interruptGrace is how long a cell may run on after its interrupt
	// before its kernel is killed: enough for a KeyboardInterrupt to unwind,
	// short enough that a cell ignoring it does not hold the context.
	interruptGrace = 5 * time.Second
	// interruptRepeat is how often an interrupt is repeated until the cell
	// stops.
	interruptRepeat = time.Second
)

// Process is a started bridge (SandboxBackend's Start returns one).
type Process interface {
	// Events is the bridge's event stream; it ends when the bridge exits.
	Events() io.Reader
	// Done is closed when the bridge is gone.
	Done() <-chan struct{}
	// Send writes a request line to the bridge.
	Send(ctx context.Context, p []byte) error
	// Interrupt stops the running cell (SIGINT to the kernel).
	Interrupt(ctx context.Context) error
	// Close kills the bridge and its kernel.
	Close(ctx context.Context)
	// Redact masks the sandbox's secrets in text the kernel produced.
	Redact(s string) string
	// TextStream returns a redactor for one of a cell's output streams,
	// which masks a secret however its pieces come.
	TextStream() *redact.TextStream
}

// Backend is what the service needs of the sandboxes (SandboxBackend is
// the real one).
type Backend interface {
	// Start starts a bridge in running sandbox id, checking that p may use it.
	Start(ctx context.Context, p auth.Principal, id string, spec ProcessSpec) (Process, error)
	// Gone checks that p may use running sandbox id and returns a channel
	// closed when the sandbox stops being live.
	Gone(ctx context.Context, p auth.Principal, id string) (<-chan struct{}, error)
	// Audit records a cell.
	Audit(ctx context.Context, p auth.Principal, id string, d api.CodeAuditDetail)
	// Reset kills the code processes left in sandbox id by an earlier
	// daemon; the service calls it once per sandbox, before its first start.
	Reset(ctx context.Context, p auth.Principal, id string) error
}

// Config configures a Service.
type Config struct {
	Backend Backend
	Logger  *slog.Logger
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

// Service keeps the contexts of every sandbox and runs cells in them. It is
// safe for concurrent use; cells of one context run one at a time, in the
// order they arrive.
type Service struct {
	be  Backend
	log *slog.Logger
	now func() time.Time

	mu        sync.Mutex
	sandboxes map[string]*sandboxCtxs
	closed    bool
	wg        sync.WaitGroup
	stop      chan struct{}
}

// sandboxCtxs are one sandbox's contexts.
type sandboxCtxs struct {
	// ready is closed once leftovers of an earlier daemon are gone.
	ready    chan struct{}
	contexts map[string]*kctx
	defaults map[string]string // language → context id
}

// New returns a Service.
func New(cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Service{be: cfg.Backend, log: cfg.Logger, now: cfg.Now,
		sandboxes: map[string]*sandboxCtxs{}, stop: make(chan struct{})}
}

// Close kills every kernel and waits for the service's goroutines.
func (s *Service) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.stop)
	var all []*kctx
	for _, sc := range s.sandboxes {
		for _, k := range sc.contexts {
			all = append(all, k)
		}
	}
	s.sandboxes = map[string]*sandboxCtxs{}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, k := range all {
		k.shutdown(ctx)
	}
	s.wg.Wait()
}

// errContextNotFound is the one error for a context that does not exist
// or belongs to another sandbox.
var errContextNotFound = &errdefs.Public{Msg: "context not found", Err: errdefs.ErrNotFound}

func invalid(format string, args ...any) error {
	return &errdefs.Public{Msg: fmt.Sprintf(format, args...), Err: errdefs.ErrInvalidArgument}
}

// envNameRE is what an env name may be: the same rule as an exec's env.
var envNameRE = lazyregexp.New(`^[A-Za-z_][A-Za-z0-9_]{0,255}$`)

// validateEnv checks a cell's env. Messages name the variable, never its
// value: values may be secrets.
func validateEnv(env map[string]string) error {
	if len(env) > MaxEnvVars {
		return invalid("env has more than %d variables", MaxEnvVars)
	}
	size := 0
	for k, v := range env {
		if !envNameRE.MatchString(k) {
			return invalid("env name %q is not a valid variable name", truncate(k, 64))
		}
		if k == sandbox.ExecIDEnv {
			return invalid("env name %s is reserved", k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return invalid("env value of %s contains a NUL byte", k)
		}
		size += len(k) + len(v)
	}
	if size > MaxEnvBytes {
		return &errdefs.Public{Msg: fmt.Sprintf("env is larger than %d bytes", MaxEnvBytes), Err: errdefs.ErrTooLarge}
	}
	return nil
}

// validCwd reports whether cwd is an absolute path the agent can take.
func validCwd(cwd string) bool {
	return strings.HasPrefix(cwd, "/") && len(cwd) <= 4096 && strings.IndexByte(cwd, 0) < 0
}

// Languages lists the languages contexts may have.
func Languages() []string {
	return []string{api.LanguagePython, api.LanguageJavaScript, api.LanguageBash}
}

func normLanguage(l string) (string, error) {
	switch strings.ToLower(strings.TrimSpace(l)) {
	case "", "python", "python3", "py":
		return api.LanguagePython, nil
	case "javascript", "js", "node", "nodejs":
		return api.LanguageJavaScript, nil
	case "bash", "sh", "shell":
		return api.LanguageBash, nil
	}
	return "", invalid("unknown language %q (use python, javascript or bash)", truncate(l, 32))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// sandbox authorises p on sandbox id and returns its contexts, creating the
// entry (and its watcher) on first use.
func (s *Service) sandbox(ctx context.Context, p auth.Principal, id string) (*sandboxCtxs, error) {
	gone, err := s.be.Gone(ctx, p, id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, &errdefs.Public{Msg: "server is shutting down", Err: errdefs.ErrUnavailable}
	}
	if sc, ok := s.sandboxes[id]; ok {
		s.mu.Unlock()
		select {
		case <-sc.ready:
			return sc, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	sc := &sandboxCtxs{ready: make(chan struct{}), contexts: map[string]*kctx{}, defaults: map[string]string{}}
	s.sandboxes[id] = sc
	s.wg.Add(1) // under s.mu: Close waits only after it set closed
	s.mu.Unlock()
	// Kernels an earlier daemon started are unreachable (contexts live in
	// memory): free their memory before this service starts its own.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	if err := s.be.Reset(rctx, p, id); err != nil {
		s.log.Warn("killing leftover kernels", "sandbox_id", id, "err", err)
	}
	cancel()
	close(sc.ready)
	go func() {
		defer s.wg.Done()
		select {
		case <-gone:
		case <-s.stop:
			return
		}
		// The sandbox's processes died with it; drop what is left.
		s.mu.Lock()
		if s.sandboxes[id] == sc {
			delete(s.sandboxes, id)
		}
		ks := make([]*kctx, 0, len(sc.contexts))
		for _, k := range sc.contexts {
			ks = append(ks, k)
		}
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, k := range ks {
			k.shutdown(ctx)
		}
	}()
	return sc, nil
}

// newContext adds a context to sc; call with s.mu held.
func (s *Service) newContext(sc *sandboxCtxs, sandboxID, lang, cwd string, dflt bool) (*kctx, error) {
	if len(sc.contexts) >= MaxContexts {
		return nil, &errdefs.Public{Msg: fmt.Sprintf("a sandbox has at most %d contexts", MaxContexts), Err: errdefs.ErrQuotaExceeded}
	}
	k := newKctx(s, sandboxID, auth.RandomID("ctx_", 12), lang, cwd, dflt)
	sc.contexts[k.id] = k
	if dflt {
		sc.defaults[lang] = k.id
	}
	return k, nil
}

// CreateContext makes a context in sandbox id and starts its kernel, so
// that a bad language setup or cwd shows here rather than at the first cell.
func (s *Service) CreateContext(ctx context.Context, p auth.Principal, id string, req api.CodeContextRequest) (api.CodeContext, error) {
	lang, err := normLanguage(req.Language)
	if err != nil {
		return api.CodeContext{}, err
	}
	if req.Cwd != "" && !validCwd(req.Cwd) {
		return api.CodeContext{}, invalid("cwd must be an absolute path")
	}
	sc, err := s.sandbox(ctx, p, id)
	if err != nil {
		return api.CodeContext{}, err
	}
	s.mu.Lock()
	k, err := s.newContext(sc, id, lang, req.Cwd, false)
	s.mu.Unlock()
	if err != nil {
		return api.CodeContext{}, err
	}
	if err := k.withLock(ctx, func() error { _, err := k.ensure(ctx, p); return err }); err != nil {
		s.remove(id, k.id)
		return api.CodeContext{}, err
	}
	return k.view(), nil
}

// ListContexts returns sandbox id's contexts, oldest first.
func (s *Service) ListContexts(ctx context.Context, p auth.Principal, id string) ([]api.CodeContext, error) {
	sc, err := s.sandbox(ctx, p, id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	ks := make([]*kctx, 0, len(sc.contexts))
	for _, k := range sc.contexts {
		ks = append(ks, k)
	}
	s.mu.Unlock()
	out := make([]api.CodeContext, 0, len(ks))
	for _, k := range ks {
		out = append(out, k.view())
	}
	slices.SortFunc(out, func(a, b api.CodeContext) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// lookup finds context cid of sandbox id.
func (s *Service) lookup(ctx context.Context, p auth.Principal, id, cid string) (*kctx, error) {
	sc, err := s.sandbox(ctx, p, id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := sc.contexts[cid]
	if !ok {
		return nil, errContextNotFound
	}
	return k, nil
}

// remove drops context cid of sandbox id from the maps.
func (s *Service) remove(id, cid string) *kctx {
	s.mu.Lock()
	defer s.mu.Unlock()
	sc := s.sandboxes[id]
	if sc == nil {
		return nil
	}
	k := sc.contexts[cid]
	delete(sc.contexts, cid)
	for l, d := range sc.defaults {
		if d == cid {
			delete(sc.defaults, l)
		}
	}
	return k
}

// DeleteContext kills context cid's kernel (a running cell ends with a
// KernelDied error) and forgets it. A default context is made afresh by
// the next cell of its language.
func (s *Service) DeleteContext(ctx context.Context, p auth.Principal, id, cid string) error {
	if _, err := s.lookup(ctx, p, id, cid); err != nil {
		return err
	}
	if k := s.remove(id, cid); k != nil {
		k.shutdown(context.WithoutCancel(ctx))
	}
	return nil
}

// RestartContext replaces context cid's kernel with a fresh one (state is
// lost). A running cell is not waited for: its kernel is killed and it
// ends with a KernelDied error (a restart is what one asks for when a
// cell hangs).
func (s *Service) RestartContext(ctx context.Context, p auth.Principal, id, cid string) (api.CodeContext, error) {
	k, err := s.lookup(ctx, p, id, cid)
	if err != nil {
		return api.CodeContext{}, err
	}
	k.kill(context.WithoutCancel(ctx))
	err = k.withLock(ctx, func() error {
		k.kill(context.WithoutCancel(ctx))
		_, err := k.ensure(ctx, p)
		return err
	})
	if err != nil {
		return api.CodeContext{}, err
	}
	return k.view(), nil
}

// RunRequest is a cell to run (the HTTP request's body).
type RunRequest = api.CodeRequest

// Run runs a cell in sandbox id and calls emit with each event as it comes,
// ending with an end event. The cell runs in req.ContextID, or in the
// sandbox's default context of req.Language (created on first use).
//
// Errors before the cell started (bad request, unknown sandbox or context,
// a kernel that cannot start) are returned and nothing is emitted. Once the
// cell runs, problems of the cell (exceptions, a timeout, a dying kernel)
// are error events followed by end, and Run returns nil; an error from emit
// (the client left) interrupts the cell and is returned.
func (s *Service) Run(ctx context.Context, p auth.Principal, id string, req RunRequest, emit func(api.CodeEvent) error) error {
	if len(req.Code) > MaxCodeBytes {
		return &errdefs.Public{Msg: fmt.Sprintf("code is larger than %d bytes", MaxCodeBytes), Err: errdefs.ErrTooLarge}
	}
	if strings.IndexByte(req.Code, 0) >= 0 {
		return invalid("code contains a NUL byte")
	}
	if err := validateEnv(req.Env); err != nil {
		return err
	}
	timeout := DefaultTimeout
	if req.TimeoutS != nil {
		t := *req.TimeoutS
		if t < 0 || t > MaxTimeout.Seconds() || t != t {
			return invalid("timeout_s must be between 0 and %d", int(MaxTimeout.Seconds()))
		}
		timeout = time.Duration(t * float64(time.Second))
		if t == 0 {
			timeout = 0 // no limit
		}
	}
	var lang string
	if req.Language != "" || req.ContextID == nil || *req.ContextID == "" {
		l, err := normLanguage(req.Language)
		if err != nil {
			return err
		}
		lang = l
	}
	var k *kctx
	if req.ContextID != nil && *req.ContextID != "" {
		var err error
		if k, err = s.lookup(ctx, p, id, *req.ContextID); err != nil {
			return err
		}
		if req.Language != "" && lang != k.lang {
			return invalid("context %s is %s, not %s", k.id, k.lang, lang)
		}
	} else {
		sc, err := s.sandbox(ctx, p, id)
		if err != nil {
			return err
		}
		s.mu.Lock()
		if cid, ok := sc.defaults[lang]; ok {
			k = sc.contexts[cid]
		}
		if k == nil {
			k, err = s.newContext(sc, id, lang, "", true)
		}
		s.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return k.run(ctx, p, cell{code: req.Code, env: req.Env}, timeout, emit)
}
