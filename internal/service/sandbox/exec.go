package sandbox

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
	"github.com/airlockhq/airlock/internal/redact"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/tracing"
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
)

var (
	userRE   = lazyregexp.New(`^[a-z_][a-z0-9_-]{0,31}$`)
	signalRE = lazyregexp.New(`^(SIG)?[A-Z][A-Z0-9+-]{1,15}$|^[0-9]{1,2}$`)
)

// ExecOptions are the transport-dependent parts of an exec.
type ExecOptions struct {
	// StdinOpen keeps stdin open after the request's stdin for WriteStdin
	// (async and streaming calls, PTYs).
	StdinOpen bool
	// PTYSize, when set with a PTY request, is the initial terminal size
	// (default 80×24).
	PTYSize *PTYSize
}

// Exec is a started command. Its output and result are followed by a
// tracker that outlives the request that started it.
type Exec struct {
	t *execTracker
}

// ID is the exec's id (ex_…).
func (e *Exec) ID() string { return e.t.id }

// Subscribe follows the exec's (redacted) output from offset from on.
func (e *Exec) Subscribe(from int64) *Subscription { return e.t.subscribe(from) }

// Wait blocks until the exec ends (or ctx is done) and returns its result
// with the captured output.
func (e *Exec) Wait(ctx context.Context) (api.ExecResult, error) {
	select {
	case <-e.t.done:
		return e.t.view(true), nil
	case <-ctx.Done():
		return api.ExecResult{}, ctx.Err()
	}
}

// Result returns the exec's result now (status running while it runs).
func (e *Exec) Result(withOutput bool) api.ExecResult { return e.t.view(withOutput) }

// validateExec checks req and returns the agent request without env.
func (m *Service) validateExec(req api.ExecRequest) (agentproto.ExecRequest, error) {
	var a agentproto.ExecRequest
	switch {
	case len(req.Cmd) > 0 && req.Shell != nil:
		return a, public(errInvalid, "give exactly one of cmd and shell, not both")
	case len(req.Cmd) == 0 && req.Shell == nil:
		return a, public(errInvalid, "give exactly one of cmd and shell")
	case req.Shell != nil && strings.TrimSpace(*req.Shell) == "":
		return a, public(errInvalid, "shell is empty")
	case len(req.Cmd) > 0 && req.Cmd[0] == "":
		return a, public(errInvalid, "cmd[0] is empty")
	}
	for _, arg := range req.Cmd {
		if strings.IndexByte(arg, 0) >= 0 {
			return a, public(errInvalid, "cmd contains a NUL byte")
		}
	}
	if req.Shell != nil {
		if strings.IndexByte(*req.Shell, 0) >= 0 {
			return a, public(errInvalid, "shell contains a NUL byte")
		}
		a.Shell = *req.Shell
	}
	a.Argv = req.Cmd
	if req.Cwd != "" {
		if !strings.HasPrefix(req.Cwd, "/") || strings.IndexByte(req.Cwd, 0) >= 0 {
			return a, public(errInvalid, "cwd must be an absolute path")
		}
		a.Cwd = req.Cwd
	}
	// An empty user is the sandbox's default (the template's USER, else
	// agentproto.DefaultUser), chosen by Exec.
	a.User = req.User
	if a.User != "" && !userRE.MatchString(a.User) {
		return a, public(errInvalid, "user %q is not a valid user name", truncate(a.User, 32))
	}
	for k, v := range req.Env {
		if err := validEnv(k, v); err != nil {
			return a, err
		}
	}
	if req.TimeoutS != nil {
		t := *req.TimeoutS
		if t < 0 || t > float64(m.settings.MaxExecTimeoutS) {
			return a, public(errInvalid, "timeout_s must be between 0 and %d", m.settings.MaxExecTimeoutS)
		}
		a.TimeoutMS = int64(t * 1000)
		if t > 0 && a.TimeoutMS == 0 {
			a.TimeoutMS = 1
		}
	}
	a.MaxOutputBytes = agentproto.DefaultMaxOutputBytes
	maxOut := min(m.settings.MaxExecOutputBytes, agentproto.HardMaxOutputBytes)
	a.MaxOutputBytes = min(a.MaxOutputBytes, maxOut)
	if req.MaxOutputBytes != nil {
		n := *req.MaxOutputBytes
		if n < 1 || n > maxOut {
			return a, public(errInvalid, "max_output_bytes must be between 1 and %d", maxOut)
		}
		a.MaxOutputBytes = n
	}
	if req.Stdin != nil {
		a.Stdin = []byte(*req.Stdin)
	}
	return a, nil
}

// Exec starts a command in sandbox id. The returned Exec is followed to its
// end whether or not the caller stays.
func (m *Service) Exec(ctx context.Context, p auth.Principal, id string, req api.ExecRequest, opts ExecOptions) (_ *Exec, err error) {
	// Spans hold ids only (no argv, env or output), so that tracing adds
	// no per-exec allocation beyond the span itself.
	ctx, span := tracing.StartSpan(ctx, "manager.exec", id)
	defer func() { tracing.EndSpan(span, err) }()
	areq, err := m.validateExec(req)
	if err != nil {
		return nil, err
	}
	sb, err := m.Running(ctx, p, id)
	if err != nil {
		return nil, err
	}
	select {
	case <-sb.ready:
		// The sandbox's tenant pays, whoever asks (an admin key too).
		if err := m.quotas.AdmitExec(ctx, sb.tenant); err != nil {
			return nil, err
		}
	default:
		// Create itself runs the template's start command: not the
		// tenant's exec, and not to be refused for its rate.
	}
	// The template's WORKDIR and USER are the defaults, as in docker exec;
	// the request's own values win.
	areq.User, areq.Cwd = sb.execDefaults(areq.User, areq.Cwd)
	areq.ID = auth.RandomID("ex_", 15)
	areq.StdinOpen = opts.StdinOpen
	if req.PTY {
		areq.PTY = &agentproto.PTYSize{Cols: 80, Rows: 24}
		if sz := opts.PTYSize; sz != nil {
			areq.PTY = &agentproto.PTYSize{Cols: sz.Cols, Rows: sz.Rows}
		}
	}
	// Environment: the sandbox's, then its secrets, then this call's.
	env := make(map[string]string, len(sb.env)+len(sb.secrets)+len(req.Env))
	maps.Copy(env, sb.env)
	maps.Copy(env, sb.secrets)
	maps.Copy(env, req.Env)
	areq.Env = env

	now := m.now().UTC()
	rec := store.Exec{
		ID: areq.ID, SandboxID: sb.id, Tenant: sb.tenant, User: areq.User,
		Cwd: areq.Cwd, PTY: req.PTY, Status: api.ExecRunning, StartedAt: now, Template: sb.Template(),
	}
	// A command line may carry a secret verbatim: the record keeps it masked.
	if req.Cmd != nil {
		rec.Argv = make([]string, len(req.Cmd))
		for i, a := range req.Cmd {
			rec.Argv[i] = sb.red.Redact(a)
		}
	}
	if req.Shell != nil {
		masked := sb.red.Redact(*req.Shell)
		rec.Shell = &masked
	}
	t := newTracker(m, sb, rec, time.Duration(areq.TimeoutMS)*time.Millisecond)
	t.out = agentproto.NewOutputLog(areq.MaxOutputBytes)
	// The OOM kill count around the exec's start: if it grew when the exec
	// died by SIGKILL, the kernel killed it for memory. Sampled alongside
	// the start (it reads cgroup files) rather than before it: a process
	// cannot outgrow its memory limit within the microseconds between.
	var oomWG sync.WaitGroup
	if oomKills := oomCounterOf(sb.drv); oomKills != nil {
		oomWG.Add(1)
		go func() {
			defer oomWG.Done()
			if n, err := oomKills(ctx, sb.id); err == nil {
				t.oomBase, t.oomKnown = n, true
			}
		}()
	}
	defer oomWG.Wait()
	if err := m.store.CreateExec(ctx, rec); err != nil {
		return nil, err
	}
	// The tracker's context, not the request's, holds the stream: the exec
	// is followed to its end even when the client leaves.
	tctx, cancel := context.WithCancel(m.ctx)
	var stream *agentclient.Stream
	err = sb.withAgent(ctx, func(c *agentclient.Client) error {
		s, err := c.Exec(tctx, areq)
		if errors.Is(err, errdefs.ErrAlreadyExists) {
			// A retry after a dropped connection: the first try got through.
			s, err = c.Attach(tctx, areq.ID, 0)
		}
		stream = s
		return err
	})
	clear(areq.Env)
	var refused *agentproto.Error
	if err != nil && errdefs.IsInvalidArgument(err) && errors.As(err, &refused) {
		// The agent refused the request (an unknown user, a cwd that is
		// not a directory): the caller's mistake, 400. The record says
		// the exec never ran.
		cancel()
		msg := sb.red.Redact(agentText(refused.Message, 200))
		end := m.now().UTC()
		rec.Status, rec.EndedAt, rec.Error, rec.ErrorCode = api.ExecError, &end, msg, api.ExecCodeExecFailed
		if ferr := m.finishExec(context.WithoutCancel(ctx), sb, rec, nil); ferr != nil {
			m.log.Warn("recording refused exec", "sandbox_id", sb.id, "exec_id", rec.ID, "err", ferr)
		}
		return nil, public(errInvalid, "%s", msg)
	}
	if err != nil {
		cancel()
		end := m.now().UTC()
		rec.Status, rec.EndedAt, rec.Error = api.ExecError, &end, "could not start: agent unreachable"
		rec.ErrorCode = api.ExecCodeAgentUnavailable
		if ferr := m.finishExec(context.WithoutCancel(ctx), sb, rec, nil); ferr != nil {
			m.log.Warn("recording failed exec", "sandbox_id", sb.id, "exec_id", rec.ID, "err", ferr)
		}
		var pe *PublicError
		if ctx.Err() != nil || errors.As(err, &pe) {
			// The client left, or the sandbox stopped meanwhile: say so.
			return nil, fmt.Errorf("starting exec: %w", err)
		}
		// The sandbox runs (m.running said so) but its agent did not take
		// the exec: the caller gets the exec record's code, not a generic
		// unavailable, and can tell it from a crash (the sandbox's state).
		// The cause is kept as text only: a dial or handshake timeout in it
		// must not make the edge call this a request timeout.
		return nil, &PublicError{Msg: "the sandbox agent is not answering", Err: fmt.Errorf("%w: starting exec: %v", ErrAgentUnavailable, err)}
	}
	sb.mu.Lock()
	sb.execs[t.id] = t
	sb.mu.Unlock()
	oomWG.Wait() // the tracker reads the baseline
	// exec.run lasts until the command ended, after the request may have
	// returned; it is a child of manager.exec all the same.
	_, runSpan := tracing.StartSpan(ctx, "exec.run", "")
	m.goBackground(func() {
		t.run(tctx, cancel, stream)
		runSpan.End()
	})
	return &Exec{t: t}, nil
}

// oomCounterOf returns the cheapest way drv offers to read a sandbox's OOM
// kill count, nil if it has none.
func oomCounterOf(drv driver.Driver) func(context.Context, string) (uint64, error) {
	if c, ok := drv.(driver.OOMCounter); ok {
		return c.OOMKills
	}
	if st, ok := drv.(driver.Stater); ok {
		return func(ctx context.Context, id string) (uint64, error) {
			s, err := st.Stats(ctx, id)
			return s.OOMKills, err
		}
	}
	return nil
}

// execTracker follows one exec: it reads the agent's events, redacts them,
// keeps them for subscribers and records the outcome.
type execTracker struct {
	m        *Service
	sb       *Live
	id       string
	timeout  time.Duration
	oomBase  uint64
	oomKnown bool

	mu      sync.Mutex
	rec     store.Exec
	out     *agentproto.OutputLog // redacted; each stream's head and tail, under the exec's cap
	nextOff int64                 // offset after the last byte received
	result  *api.ExecResult
	notify  chan struct{} // closed and replaced on every change
	done    chan struct{}
}

func newTracker(m *Service, sb *Live, rec store.Exec, timeout time.Duration) *execTracker {
	return &execTracker{
		m: m, sb: sb, id: rec.ID, rec: rec, timeout: timeout,
		out:    agentproto.NewOutputLog(min(m.settings.MaxExecOutputBytes, agentproto.HardMaxOutputBytes)),
		notify: make(chan struct{}), done: make(chan struct{}),
	}
}

// setOutputCap sets the per-stream cap of an exec followed again after a
// daemon restart (the agent's listing says it); call before run.
func (t *execTracker) setOutputCap(n int64) {
	if n > 0 {
		t.out = agentproto.NewOutputLog(min(n, agentproto.HardMaxOutputBytes))
	}
}

// emit appends redacted output.
func (t *execTracker) emit(cs []redact.Chunk) {
	if len(cs) == 0 {
		return
	}
	t.mu.Lock()
	for _, c := range cs {
		t.out.Add(c.Stream, c.Off, c.Data)
	}
	close(t.notify)
	t.notify = make(chan struct{})
	t.mu.Unlock()
}

// settle ends the exec's output: what is held goes out as the whole output
// says, and the bytes that a timed-out hold masked without their ever
// becoming part of a secret are given back in the events, which the record
// and every later reader get: the record is the whole output masked as
// one text.
func (t *execTracker) settle(red *redact.Stream) {
	t.emit(red.End())
	fix := red.Restore()
	t.mu.Lock()
	t.out.Rewrite(fix)
	t.mu.Unlock()
}

type streamItem struct {
	ev  agentproto.Event
	err error
}

// run follows the agent's stream until the exec ends.
func (t *execTracker) run(ctx context.Context, cancel context.CancelFunc, st *agentclient.Stream) {
	defer cancel()
	m, sb := t.m, t.sb
	items := make(chan streamItem)
	read := func(st *agentclient.Stream) {
		m.goBackground(func() {
			defer st.Close()
			for {
				ev, err := st.Next()
				select {
				case items <- streamItem{ev, err}:
				case <-ctx.Done():
					return
				}
				if err != nil || ev.Type == agentproto.EventExit {
					return
				}
			}
		})
	}
	read(st)

	red := redact.NewStream(sb.red)
	flush := time.NewTimer(time.Hour)
	flush.Stop()
	defer flush.Stop()
	armed := false
	var backstop <-chan time.Time
	if t.timeout > 0 {
		bt := time.NewTimer(t.timeout + backstopGrace)
		defer bt.Stop()
		backstop = bt.C
	}
	forced := false
	reattached := 0
	for {
		select {
		case it := <-items:
			if it.err != nil {
				// The stream goes on after a re-attach: what is held
				// goes out as a timed-out hold does.
				t.emit(red.Expire())
				armed = false
				flush.Stop()
				if m.isShutdown() {
					return // the next daemon re-attaches
				}
				select {
				case <-sb.gone:
					t.settle(red)
					t.finishGone()
					return
				default:
				}
				// An agent that broke the protocol would only do it again;
				// one that keeps dropping the stream is not followed for
				// ever (see maxReattach).
				if reattached++; errors.Is(it.err, agentclient.ErrProtocol) || reattached > maxReattach {
					if !m.checkAlive(sb) {
						t.finishGone()
						return
					}
					m.log.Warn("giving up on an exec's stream", "sandbox_id", sb.id, "exec_id", t.id, "reattached", reattached-1, "err", it.err)
					why := "lost connection to the sandbox agent"
					if errors.Is(it.err, agentclient.ErrProtocol) {
						why = "the sandbox agent broke the exec protocol"
					}
					t.finishLocal(api.ExecError, api.ExecCodeAgentUnavailable, why)
					return
				}
				// The connection dropped but the sandbox may live: re-attach
				// where we were.
				t.mu.Lock()
				from := t.nextOff
				t.mu.Unlock()
				var st2 *agentclient.Stream
				err := sb.withAgent(ctx, func(c *agentclient.Client) error {
					s, err := c.Attach(ctx, t.id, from)
					st2 = s
					return err
				})
				if err != nil {
					if m.isShutdown() {
						return
					}
					t.settle(red)
					select {
					case <-sb.gone:
						t.finishGone()
						return
					default:
					}
					// The agent is unreachable: a dead sandbox (its init
					// and the agent with it) is a crash, not a platform
					// fault; ask the runtime before telling them apart.
					if !m.checkAlive(sb) {
						t.finishGone()
						return
					}
					m.log.Warn("lost exec stream", "sandbox_id", sb.id, "exec_id", t.id, "err", err)
					t.finishLocal(api.ExecError, api.ExecCodeAgentUnavailable, "lost connection to the sandbox agent")
					return
				}
				read(st2)
				continue
			}
			if it.ev.Type == agentproto.EventExit {
				t.settle(red)
				res := agentproto.ExecResult{ID: t.id, Status: api.ExecError, ExitCode: -1, Error: "agent sent no result"}
				if it.ev.Result != nil {
					res = *it.ev.Result
				}
				if forced && res.Status != api.ExecOOM {
					res.Status = api.ExecTimeout
				}
				t.finish(res, "")
				return
			}
			t.mu.Lock()
			if end := it.ev.Offset + int64(len(it.ev.Data)); end > t.nextOff {
				t.nextOff = end
			}
			t.mu.Unlock()
			t.emit(red.Push(redact.Chunk{Stream: it.ev.Stream, Off: it.ev.Offset, Data: it.ev.Data}))
			// Arm the hold's timer once per hold, not on every chunk:
			// output that keeps coming must not postpone it forever.
			switch pending := red.Pending(); {
			case !pending && armed:
				flush.Stop()
				armed = false
			case pending && !armed:
				flush.Reset(redact.Hold)
				armed = true
			}
		case <-flush.C:
			// The rest did not come in time: the held bytes go out
			// masked, and the redactor still masks the rest of a secret
			// when it comes (see streamState).
			armed = false
			t.emit(red.Expire())
		case <-backstop:
			if sb.state() == api.StatePaused {
				// A frozen sandbox's exec cannot end; look again later.
				backstop = time.After(backstopGrace)
				continue
			}
			if !forced {
				forced = true
				m.log.Warn("exec outlived its timeout, killing it", "sandbox_id", sb.id, "exec_id", t.id)
				kctx, kcancel := context.WithTimeout(ctx, backstopKillWait)
				if c, err := sb.agent(kctx); err == nil {
					c.Signal(kctx, t.id, "SIGKILL")
				}
				kcancel()
				backstop = time.After(backstopKillWait)
				continue
			}
			t.settle(red)
			t.finishLocal(api.ExecTimeout, api.ExecCodeTimeout, "exec did not end after its timeout")
			return
		case <-sb.gone:
			t.settle(red)
			t.finishGone()
			return
		case <-m.shutdown:
			return
		}
	}
}

// finishGone ends the exec of a sandbox that stopped being live: a crash
// (status error, code sandbox_crashed, or agent_unavailable when the
// platform lost the agent) is told apart from a stop asked for (killed).
func (t *execTracker) finishGone() {
	switch code := t.sb.goneCode(); code {
	case api.SandboxCodeCrashed:
		t.finishLocal(api.ExecError, api.ExecCodeSandboxCrashed, "the sandbox crashed")
	case api.SandboxCodeAgentUnavailable:
		t.finishLocal(api.ExecError, api.ExecCodeAgentUnavailable, "lost connection to the sandbox agent")
	default:
		t.finishLocal(api.ExecKilled, api.ExecCodeSandboxStopped, "sandbox stopped")
	}
}

// finishLocal ends the exec without a result from the agent.
func (t *execTracker) finishLocal(status, code, why string) {
	t.mu.Lock()
	started := t.rec.StartedAt
	t.mu.Unlock()
	end := t.m.now().UTC()
	t.finish(agentproto.ExecResult{
		ID: t.id, Status: status, ExitCode: -1, StartedAt: started, EndedAt: end,
		DurationMS: end.Sub(started).Milliseconds(), Error: why,
	}, code)
}

// execCode is the error code of an exec that ended with status and no
// code given by whoever ended it. Status error comes from the agent only
// for a command that could not start (agentproto.ExecResult.Error); every
// other end without a process (a lost agent, a crash) passes its code.
func execCode(status string) string {
	switch status {
	case api.ExecTimeout:
		return api.ExecCodeTimeout
	case api.ExecOOM:
		return api.ExecCodeOOM
	case api.ExecKilled:
		return api.ExecCodeSignaled
	case api.ExecError:
		return api.ExecCodeExecFailed
	}
	return ""
}

// finish records the outcome and wakes everyone waiting. code is the
// error code ("" to derive it from the status).
func (t *execTracker) finish(res agentproto.ExecResult, code string) {
	m, sb := t.m, t.sb
	status := res.Status
	if code == "" && status == api.ExecError && res.StartedAt.IsZero() {
		// Not the agent's word on a start (it always stamps one): the
		// stand-in for an exit event without a result.
		code = api.ExecCodeAgentUnavailable
	}
	if status == api.ExecExited && agentproto.EndedBySIGKILL(res) && t.oomKnown {
		// The agent could not tell (no cgroup view inside): the host can,
		// by the same rule (agentproto.EndedBySIGKILL).
		if oomKills := oomCounterOf(sb.drv); oomKills != nil {
			ctx, cancel := context.WithTimeout(m.ctx, 5*time.Second)
			if n, err := oomKills(ctx, sb.id); err == nil && n > t.oomBase {
				status = api.ExecOOM
			}
			cancel()
		}
	}
	t.mu.Lock()
	rec := t.rec
	if rec.Cwd == "" {
		// The effective cwd, which the agent chose (the user's home, or
		// "/"): its result says it. An exec ended without the agent's
		// result (a lost agent, a stopped sandbox), or by an agent of an
		// older build, which says nothing, gets the one an earlier exec
		// of its user ran in, if any.
		rec.Cwd = sb.defaultCwd(rec.User, effectiveCwd(res.Cwd))
	}
	rec.Status = status
	if code == "" {
		code = execCode(status)
	}
	if res.ExitCode >= 0 && (status != api.ExecError || code == api.ExecCodeExecFailed) {
		// A command that could not start has the code a shell gives it
		// (127, 126) when the agent gave one.
		c := min(res.ExitCode, 255)
		rec.ExitCode = &c
	}
	rec.Signal = res.Signal
	// What was dropped: everything the agent counted (or, without its
	// word, received) that this log does not hold; the log holds the
	// agent's head and tail, with the exec's cap.
	o, p, e := t.out.Stats(agentproto.StreamStdout), t.out.Stats(agentproto.StreamPTY), t.out.Stats(agentproto.StreamStderr)
	rec.StdoutBytes = max(res.StdoutBytes, o.Added+p.Added)
	rec.StderrBytes = max(res.StderrBytes, e.Added)
	rec.StdoutDropped = rec.StdoutBytes - (o.Kept + p.Kept)
	rec.StderrDropped = rec.StderrBytes - e.Kept
	rec.Truncated = res.Truncated || rec.StdoutDropped > 0 || rec.StderrDropped > 0
	end := res.EndedAt
	if end.IsZero() {
		end = m.now().UTC()
	}
	if !res.StartedAt.IsZero() {
		// The agent's clock measured the process; keep the record's start
		// (the request time) but take the agent's duration.
		rec.DurationMS = res.DurationMS
	} else {
		rec.DurationMS = end.Sub(rec.StartedAt).Milliseconds()
	}
	end = end.UTC()
	rec.EndedAt = &end
	rec.Error = sb.red.Redact(agentText(res.Error, 500))
	rec.ErrorCode = code
	events := encodeEvents(piecesToChunks(t.out.Pieces()))
	// The result becomes visible at once with done, so that whoever sees
	// the exec ended also finds it ended everywhere (stdin, signal).
	t.rec = rec
	v := buildResult(rec, nil, false)
	t.result = &v
	close(t.notify)
	t.notify = make(chan struct{})
	close(t.done)
	t.mu.Unlock()

	// The record is written after the waiters have their answer: a SQLite
	// commit (and, now and then, a WAL checkpoint) is the largest part of
	// the daemon's own share of an exec round trip. Until it lands, this
	// tracker answers for the exec (findExec, ListExecs), and it is not
	// evicted before. The manager's Close waits for it (goBackground).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(m.ctx), 30*time.Second)
	if err := m.finishExec(ctx, sb, rec, events); err != nil {
		m.log.Error("recording exec result", "sandbox_id", sb.id, "exec_id", t.id, "err", err)
	}
	cancel()
	if o := m.cfg.Observer; o != nil {
		o.ExecDone(sb.drv.Name(), status, time.Duration(rec.DurationMS)*time.Millisecond)
	}
	m.log.Debug("exec ended", "sandbox_id", sb.id, "exec_id", t.id, "status", status, "duration_ms", rec.DurationMS)
	// Keep it in memory a while for fast re-attach, then the store serves it
	// (attached subscribers keep reading from the tracker they hold).
	evict := func() {
		sb.mu.Lock()
		if sb.execs[t.id] == t {
			delete(sb.execs, t.id)
		}
		sb.mu.Unlock()
	}
	if len(events) > retainMaxBytes {
		evict()
	} else {
		time.AfterFunc(m.cfg.ExecRetention, evict)
	}
}

// tracker returns the in-memory tracker of exec eid, nil if none.
func (sb *Live) tracker(eid string) *execTracker {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.execs[eid]
}

// ended returns the exec's result without output once it has ended.
func (t *execTracker) ended() (api.ExecResult, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.result == nil {
		return api.ExecResult{}, false
	}
	return buildResult(t.rec, nil, false), true
}

// view returns the exec's result, with its captured output if asked.
func (t *execTracker) view(withOutput bool) api.ExecResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	rec := t.rec
	if rec.EndedAt == nil {
		rec.DurationMS = t.m.now().Sub(rec.StartedAt).Milliseconds()
	}
	if !withOutput || rec.EndedAt == nil {
		return buildResult(rec, nil, false)
	}
	return buildResult(rec, t.out, true)
}

// buildResult turns a record (and its output) into the API's result.
func buildResult(rec store.Exec, output *agentproto.OutputLog, withOutput bool) api.ExecResult {
	r := api.ExecResult{
		ID: rec.ID, SandboxID: rec.SandboxID, Cmd: rec.Argv, Shell: rec.Shell, User: rec.User, Cwd: rec.Cwd,
		ExitCode: rec.ExitCode, Signal: rec.Signal, Status: rec.Status, Truncated: rec.Truncated,
		DurationMS: rec.DurationMS, StartedAt: rec.StartedAt, EndedAt: rec.EndedAt, Error: rec.Error,
		ErrorCode: rec.ErrorCode, StdoutDroppedBytes: rec.StdoutDropped, StderrDroppedBytes: rec.StderrDropped,
	}
	if !withOutput {
		return r
	}
	var out, errb []byte
	if output != nil {
		// An exec has a PTY or pipes, never both: stdout is one of them.
		out, _ = output.Stream(agentproto.StreamStdout)
		if pty, _ := output.Stream(agentproto.StreamPTY); len(pty) > 0 {
			out = append(out, pty...)
		}
		errb, _ = output.Stream(agentproto.StreamStderr)
	}
	so, se := string(out), string(errb)
	if !utf8.Valid(out) || !utf8.Valid(errb) {
		so, se = base64.StdEncoding.EncodeToString(out), base64.StdEncoding.EncodeToString(errb)
		r.Encoding = "base64"
	}
	r.Stdout, r.Stderr = &so, &se
	return r
}

// Event is one item of an exec's event stream as the API sends it.
type Event struct {
	// Type is EventOutput or EventExit.
	Type string
	// Stream is StreamStdout, StreamStderr or StreamPTY (output).
	Stream string
	// Offset is the position of Data in the exec's combined output.
	Offset int64
	Data   []byte
	// Result is set on the exit event (without output).
	Result *api.ExecResult
}

// Subscription follows an exec's events from an offset. Output that was
// dropped under the cap before the subscriber read it is skipped: the next
// event's offset says where the output resumes.
type Subscription struct {
	t        *execTracker
	next     int64
	sentExit bool
}

func (t *execTracker) subscribe(from int64) *Subscription {
	return &Subscription{t: t, next: max(from, 0)}
}

// Next returns the next event. When idle elapses first it returns ok=false
// (time for a heartbeat). After the exit event it returns io.EOF.
func (s *Subscription) Next(ctx context.Context, idle time.Duration) (ev Event, ok bool, err error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		t := s.t
		t.mu.Lock()
		if p, ok := t.out.Next(s.next, 0); ok {
			s.next = p.End()
			t.mu.Unlock()
			return Event{Type: agentproto.EventOutput, Stream: p.Stream, Offset: p.Off, Data: p.Data}, true, nil
		}
		if t.result != nil {
			res := *t.result
			t.mu.Unlock()
			if s.sentExit {
				return Event{}, false, io.EOF
			}
			s.sentExit = true
			return Event{Type: agentproto.EventExit, Result: &res}, true, nil
		}
		wait := t.notify
		t.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(idle)
		}
		select {
		case <-wait:
		case <-timer.C:
			return Event{}, false, nil
		case <-ctx.Done():
			return Event{}, false, ctx.Err()
		}
	}
}

// findExec returns the tracker of exec eid of sandbox id: the live one, or
// one rebuilt from the store for an ended exec.
func (m *Service) findExec(ctx context.Context, p auth.Principal, id, eid string) (*execTracker, *Live, error) {
	m.mu.Lock()
	sb := m.live[id]
	m.mu.Unlock()
	if sb != nil && p.CanSee(sb.tenant) {
		sb.mu.Lock()
		t := sb.execs[eid]
		sb.mu.Unlock()
		if t != nil {
			return t, sb, nil
		}
	} else {
		sb = nil
		if _, err := m.Record(ctx, p, id); err != nil {
			return nil, nil, err
		}
	}
	rec, err := m.store.GetExec(ctx, id, eid)
	if errdefs.IsNotFound(err) {
		return nil, nil, execNotFound()
	}
	if err != nil {
		return nil, nil, err
	}
	blob, err := m.store.ExecOutput(ctx, eid)
	if err != nil {
		return nil, nil, err
	}
	events, err := decodeEvents(blob)
	if err != nil {
		return nil, nil, fmt.Errorf("exec %s output: %w", eid, err)
	}
	t := newTracker(m, nil, rec, 0)
	// Stored output was capped when it was kept: hold all of it.
	t.out = agentproto.NewOutputLog(0)
	for _, c := range events {
		t.out.Add(c.Stream, c.Off, c.Data)
	}
	v := buildResult(rec, nil, false)
	t.result = &v
	close(t.done)
	return t, sb, nil
}

// GetExec returns exec eid of sandbox id, with its output once it ended.
func (m *Service) GetExec(ctx context.Context, p auth.Principal, id, eid string) (api.ExecResult, error) {
	t, _, err := m.findExec(ctx, p, id, eid)
	if err != nil {
		return api.ExecResult{}, err
	}
	return t.view(true), nil
}

// ListExecs returns one page of sandbox id's exec records, newest first.
func (m *Service) ListExecs(ctx context.Context, p auth.Principal, id string, limit int, cursor string) (api.ExecList, error) {
	if _, err := m.Record(ctx, p, id); err != nil {
		return api.ExecList{}, err
	}
	recs, next, err := m.store.ListExecs(ctx, id, limit, cursor)
	if err != nil {
		if errdefs.IsInvalidArgument(err) {
			return api.ExecList{}, public(errInvalid, "%s", publicText(err))
		}
		return api.ExecList{}, err
	}
	out := api.ExecList{Execs: make([]api.ExecResult, 0, len(recs)), NextCursor: next}
	m.mu.Lock()
	sb := m.live[id]
	m.mu.Unlock()
	for _, r := range recs {
		if sb != nil && r.EndedAt == nil {
			// An exec that has just ended may not be recorded as ended yet
			// (finish writes the store after answering): its tracker knows.
			if t := sb.tracker(r.ID); t != nil {
				if v, ended := t.ended(); ended {
					out.Execs = append(out.Execs, v)
					continue
				}
			}
			// Live duration of a running exec.
			r.DurationMS = m.now().Sub(r.StartedAt).Milliseconds()
		}
		out.Execs = append(out.Execs, buildResult(r, nil, false))
	}
	return out, nil
}

// Events follows exec eid's output from offset from.
func (m *Service) Events(ctx context.Context, p auth.Principal, id, eid string, from int64) (*Subscription, error) {
	if from < 0 {
		return nil, public(errInvalid, "from_offset must not be negative")
	}
	t, _, err := m.findExec(ctx, p, id, eid)
	if err != nil {
		return nil, err
	}
	return t.subscribe(from), nil
}

// runningExec returns the live tracker of a running exec.
func (m *Service) runningExec(ctx context.Context, p auth.Principal, id, eid string) (*execTracker, *Live, error) {
	t, sb, err := m.findExec(ctx, p, id, eid)
	if err != nil {
		return nil, nil, err
	}
	select {
	case <-t.done:
		return nil, nil, public(errdefs.ErrInvalidState, "exec has ended")
	default:
	}
	if sb == nil {
		return nil, nil, public(errdefs.ErrInvalidState, "sandbox is not running")
	}
	if st := sb.state(); st != api.StateRunning {
		return nil, nil, public(errdefs.ErrInvalidState, "sandbox is %s", st)
	}
	return t, sb, nil
}

// WriteStdin forwards r to exec eid's stdin, then closes it if eof.
func (m *Service) WriteStdin(ctx context.Context, p auth.Principal, id, eid string, r io.Reader, eof bool) (int64, error) {
	t, sb, err := m.runningExec(ctx, p, id, eid)
	if err != nil {
		return 0, err
	}
	c, err := sb.agent(ctx)
	if err != nil {
		return 0, err
	}
	var n int64
	buf := make([]byte, stdinChunk)
	for {
		k, rerr := r.Read(buf)
		if k > 0 {
			if err := c.WriteStdin(ctx, t.id, buf[:k]); err != nil {
				return n, err
			}
			n += int64(k)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return n, rerr
		}
	}
	if eof {
		if err := c.CloseStdin(ctx, t.id); err != nil {
			return n, err
		}
	}
	return n, nil
}

// Signal sends sig to exec eid's whole process tree.
func (m *Service) Signal(ctx context.Context, p auth.Principal, id, eid, sig string) error {
	if !signalRE.MatchString(sig) {
		return public(errInvalid, "signal %q is not a signal name or number", truncate(sig, 16))
	}
	t, sb, err := m.runningExec(ctx, p, id, eid)
	if err != nil {
		return err
	}
	return sb.withAgent(ctx, func(c *agentclient.Client) error { return c.Signal(ctx, t.id, sig) })
}

// Resize changes a PTY exec's terminal size.
func (m *Service) Resize(ctx context.Context, p auth.Principal, id, eid string, cols, rows uint16) error {
	if cols == 0 || rows == 0 {
		return public(errInvalid, "cols and rows must be positive")
	}
	t, sb, err := m.runningExec(ctx, p, id, eid)
	if err != nil {
		return err
	}
	return sb.withAgent(ctx, func(c *agentclient.Client) error { return c.Resize(ctx, t.id, cols, rows) })
}

func piecesToChunks(ps []agentproto.OutputPiece) []redact.Chunk {
	out := make([]redact.Chunk, len(ps))
	for i, p := range ps {
		out[i] = redact.Chunk{Stream: p.Stream, Off: p.Off, Data: p.Data}
	}
	return out
}

// defaultCwd returns the directory an exec of user without a cwd ran in:
// cwd when the agent named it (remembered for the user's next execs), else
// the one remembered, else "".
func (sb *Live) defaultCwd(user, cwd string) string {
	sb.homesMu.Lock()
	defer sb.homesMu.Unlock()
	if cwd == "" {
		return sb.homes[user]
	}
	if sb.homes == nil {
		sb.homes = map[string]string{}
	}
	if _, known := sb.homes[user]; known || len(sb.homes) < 64 { // users of one sandbox: a handful
		sb.homes[user] = cwd
	}
	return cwd
}

// effectiveCwd is the cwd an agent's result names, if it is one a record
// may hold (what the agent says is the sandbox's to forge): an absolute,
// valid UTF-8 path without control characters, else "".
func effectiveCwd(s string) string {
	if !strings.HasPrefix(s, "/") || len(s) > 4096 || !utf8.ValidString(s) {
		return ""
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return ""
		}
	}
	return s
}

// agentText makes a text the agent sent fit for a record or an error
// message: valid UTF-8 without control characters, at most n bytes. What
// the agent says is the sandbox's to forge.
func agentText(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// Stream ids in encoded event logs.
var streamIDs = map[string]byte{agentproto.StreamStdout: 1, agentproto.StreamStderr: 2, agentproto.StreamPTY: 3}
var streamNames = map[byte]string{1: agentproto.StreamStdout, 2: agentproto.StreamStderr, 3: agentproto.StreamPTY}

// encodeEvents serialises events for the store: per event a stream byte, a
// uvarint offset, a uvarint length and the bytes.
func encodeEvents(events []redact.Chunk) []byte {
	n := 0
	for _, c := range events {
		n += 1 + 2*binary.MaxVarintLen64 + len(c.Data)
	}
	out := make([]byte, 0, n)
	for _, c := range events {
		out = append(out, streamIDs[c.Stream])
		out = binary.AppendUvarint(out, uint64(c.Off))
		out = binary.AppendUvarint(out, uint64(len(c.Data)))
		out = append(out, c.Data...)
	}
	return out
}

func decodeEvents(b []byte) ([]redact.Chunk, error) {
	var out []redact.Chunk
	for len(b) > 0 {
		name, ok := streamNames[b[0]]
		if !ok {
			return nil, errors.New("bad stream id")
		}
		b = b[1:]
		off, k := binary.Uvarint(b)
		if k <= 0 {
			return nil, errors.New("bad offset")
		}
		b = b[k:]
		l, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < l {
			return nil, errors.New("bad length")
		}
		b = b[k:]
		out = append(out, redact.Chunk{Stream: name, Off: int64(off), Data: b[:l:l]})
		b = b[l:]
	}
	return out, nil
}
