package exec

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/store"
)

// Timing of exec tracking.
const (
	// backstopGrace is how long after an exec's timeout the server steps in
	// if the agent has not ended it (the agent kills with SIGTERM and, after
	// its own grace, SIGKILL; this only covers an agent that failed).
	backstopGrace = 5 * time.Second
	// backstopKillWait is how long the server waits for its own SIGKILL to
	// end the exec before it records the timeout regardless.
	backstopKillWait = 5 * time.Second
	// maxReattach bounds how often one exec's stream is re-attached after
	// its connection dropped: an agent that keeps dropping it (its own
	// sandbox's root can make it) must not keep the daemon re-attaching
	// for ever; an honest one drops at most when its daemon restarts.
	maxReattach = 8
	// stdinChunk is the piece size of stdin forwarding.
	stdinChunk = 64 << 10
	// retainMaxBytes bounds the output an ended exec keeps in memory for
	// fast re-attach; a bigger one is served from the store right away, so
	// that many large execs cannot pile up in the daemon's memory.
	retainMaxBytes = 256 << 10
	// defaultExecRetention is how long an ended exec's events stay in
	// memory for fast re-attach; after that they are read back from the
	// store.
	defaultExecRetention = 2 * time.Minute
	// defaultDialTimeout bounds connecting to a recovered sandbox's agent.
	defaultDialTimeout = 30 * time.Second
)

// Observer is told the runtime, final status and duration of every exec
// (metrics). Calls are on hot paths: they must not block.
type Observer interface {
	ExecDone(runtime, status string, d time.Duration)
}

// EngineConfig configures an Engine.
type EngineConfig struct {
	// Settings hold the exec limits (max_exec_timeout_s,
	// max_exec_output_bytes).
	Settings config.Config
	// Store keeps the exec records and their output. Required.
	Store *store.Store
	// Audit receives an exec's event when its record is written; nil
	// records nothing.
	Audit *audit.Recorder
	// Observer, when set, is told of every exec's end.
	Observer Observer
	// Logger and Now default to slog.Default() and time.Now.
	Logger *slog.Logger
	Now    func() time.Time
	// ExecRetention and AgentDialTimeout override the defaults above
	// (tests shorten them).
	ExecRetention    time.Duration
	AgentDialTimeout time.Duration
}

// Engine follows the execs of every sandbox: one tracker per exec reads
// the agent's events, masks them, keeps them for subscribers and records
// the outcome. The sandbox lifecycle gives it the template start commands
// of creates and the sandboxes recovered after a restart
// (sandbox.Execs); Service is its side of the planes. Close it after the
// planes and before the sandbox lifecycle: its trackers end without
// recording, and the next daemon re-attaches to their execs.
type Engine struct {
	cfg      EngineConfig
	settings config.Config
	store    *store.Store
	audit    *audit.Recorder
	log      *slog.Logger
	now      func() time.Time

	mu        sync.Mutex
	sandboxes map[string]*sandboxExecs

	ctx      context.Context // lifetime of trackers; cancelled by Close
	cancel   context.CancelFunc
	shutdown chan struct{} // closed by Close: trackers stop without recording
	wg       sync.WaitGroup
	closed   sync.Once
}

// sandboxExecs is what the engine keeps of one sandbox: its execs' live
// trackers, and each user's default exec directory as the agent's results
// named it (defaultCwd).
type sandboxExecs struct {
	mu    sync.Mutex
	execs map[string]*tracker
	homes map[string]string
}

// NewEngine returns the Engine of cfg.
func NewEngine(cfg EngineConfig) *Engine {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ExecRetention <= 0 {
		cfg.ExecRetention = defaultExecRetention
	}
	if cfg.AgentDialTimeout <= 0 {
		cfg.AgentDialTimeout = defaultDialTimeout
	}
	e := &Engine{
		cfg: cfg, settings: cfg.Settings, store: cfg.Store, audit: cfg.Audit,
		log: cfg.Logger.With("component", "exec"), now: cfg.Now,
		sandboxes: map[string]*sandboxExecs{}, shutdown: make(chan struct{}),
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	return e
}

// Close stops following execs (they keep running in their sandboxes) and
// waits for the trackers, and for the records they are writing.
func (e *Engine) Close() {
	e.closed.Do(func() {
		close(e.shutdown)
		e.cancel()
		e.wg.Wait()
	})
}

// Forget drops what the engine keeps of sandbox id, which is gone
// (sandbox.Execs): its trackers have ended or are ending on their own, and
// a later read of its execs goes to the store.
func (e *Engine) Forget(id string) {
	e.mu.Lock()
	delete(e.sandboxes, id)
	e.mu.Unlock()
}

// of returns what the engine keeps of sandbox id, made on first use.
func (e *Engine) of(id string) *sandboxExecs {
	e.mu.Lock()
	defer e.mu.Unlock()
	se := e.sandboxes[id]
	if se == nil {
		se = &sandboxExecs{execs: map[string]*tracker{}}
		e.sandboxes[id] = se
	}
	return se
}

// tracker returns the live tracker of exec eid of sandbox id, nil if none.
func (e *Engine) tracker(id, eid string) *tracker {
	e.mu.Lock()
	se := e.sandboxes[id]
	e.mu.Unlock()
	if se == nil {
		return nil
	}
	se.mu.Lock()
	defer se.mu.Unlock()
	return se.execs[eid]
}

// isShutdown reports whether Close was called.
func (e *Engine) isShutdown() bool {
	select {
	case <-e.shutdown:
		return true
	default:
		return false
	}
}

// goBackground runs fn as tracked background work.
func (e *Engine) goBackground(fn func()) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		fn()
	}()
}

// defaultCwd returns the directory an exec of user without a cwd ran in:
// cwd when the agent named it (remembered for the user's next execs), else
// the one remembered, else "".
func (se *sandboxExecs) defaultCwd(user, cwd string) string {
	se.mu.Lock()
	defer se.mu.Unlock()
	if cwd == "" {
		return se.homes[user]
	}
	if se.homes == nil {
		se.homes = map[string]string{}
	}
	if _, known := se.homes[user]; known || len(se.homes) < 64 { // users of one sandbox: a handful
		se.homes[user] = cwd
	}
	return cwd
}
