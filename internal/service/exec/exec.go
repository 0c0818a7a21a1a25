package exec

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/sandbox"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/tracing"
)

// Options are the transport-dependent parts of an exec.
type Options struct {
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
	t *tracker
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

// Exec starts a command in sandbox id. The returned Exec is followed to its
// end whether or not the caller stays.
func (m *Service) Exec(ctx context.Context, p auth.Principal, id string, req api.ExecRequest, opts Options) (_ *Exec, err error) {
	// Spans hold ids only (no argv, env or output), so that tracing adds
	// no per-exec allocation beyond the span itself.
	ctx, span := tracing.StartSpan(ctx, "manager.exec", id)
	defer func() { tracing.EndSpan(span, err) }()
	areq, err := m.eng.validate(req)
	if err != nil {
		return nil, err
	}
	sb, err := m.sandboxes.Running(ctx, p, id)
	if err != nil {
		return nil, err
	}
	select {
	case <-sb.Ready():
		// The sandbox's tenant pays, whoever asks (an admin key too).
		if err := m.quotas.AdmitExec(ctx, sb.Tenant()); err != nil {
			return nil, err
		}
	default:
		// Create itself runs the template's start command: not the
		// tenant's exec, and not to be refused for its rate.
	}
	return m.eng.start(ctx, sb, areq, req, opts)
}

// start starts the validated exec areq of req in running sandbox sb and
// follows it in a tracker.
func (m *Engine) start(ctx context.Context, sb *sandbox.Live, areq agentproto.ExecRequest, req api.ExecRequest, opts Options) (*Exec, error) {
	// The template's WORKDIR and USER are the defaults, as in docker exec;
	// the request's own values win.
	areq.User, areq.Cwd = sb.ExecDefaults(areq.User, areq.Cwd)
	areq.ID = auth.RandomID("ex_", 15)
	areq.StdinOpen = opts.StdinOpen
	if req.PTY {
		areq.PTY = &agentproto.PTYSize{Cols: 80, Rows: 24}
		if sz := opts.PTYSize; sz != nil {
			areq.PTY = &agentproto.PTYSize{Cols: sz.Cols, Rows: sz.Rows}
		}
	}
	// Environment: the sandbox's, then its secrets, then this call's.
	areq.Env = sb.Env(req.Env)

	now := m.now().UTC()
	rec := store.Exec{
		ID: areq.ID, SandboxID: sb.ID(), Tenant: sb.Tenant(), User: areq.User,
		Cwd: areq.Cwd, PTY: req.PTY, Status: api.ExecRunning, StartedAt: now, Template: sb.Template(),
	}
	// A command line may carry a secret verbatim: the record keeps it masked.
	if req.Cmd != nil {
		rec.Argv = make([]string, len(req.Cmd))
		for i, a := range req.Cmd {
			rec.Argv[i] = sb.Redactor().Redact(a)
		}
	}
	if req.Shell != nil {
		masked := sb.Redactor().Redact(*req.Shell)
		rec.Shell = &masked
	}
	t := newTracker(m, sb, rec, time.Duration(areq.TimeoutMS)*time.Millisecond)
	t.out = agentproto.NewOutputLog(areq.MaxOutputBytes)
	// The OOM kill count around the exec's start: if it grew when the exec
	// died by SIGKILL, the kernel killed it for memory. Sampled alongside
	// the start (it reads cgroup files) rather than before it: a process
	// cannot outgrow its memory limit within the microseconds between.
	var oomWG sync.WaitGroup
	if oomKills := oomCounterOf(sb.Driver()); oomKills != nil {
		oomWG.Add(1)
		go func() {
			defer oomWG.Done()
			if n, err := oomKills(ctx, sb.ID()); err == nil {
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
	err := sb.WithAgent(ctx, func(c *agentclient.Client) error {
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
		msg := sb.Redactor().Redact(sandbox.AgentText(refused.Message, 200))
		end := m.now().UTC()
		rec.Status, rec.EndedAt, rec.Error, rec.ErrorCode = api.ExecError, &end, msg, api.ExecCodeExecFailed
		if ferr := m.finishExec(context.WithoutCancel(ctx), sb, rec, nil); ferr != nil {
			m.log.Warn("recording refused exec", "sandbox_id", sb.ID(), "exec_id", rec.ID, "err", ferr)
		}
		return nil, public(errInvalid, "%s", msg)
	}
	if err != nil {
		cancel()
		end := m.now().UTC()
		rec.Status, rec.EndedAt, rec.Error = api.ExecError, &end, "could not start: agent unreachable"
		rec.ErrorCode = api.ExecCodeAgentUnavailable
		if ferr := m.finishExec(context.WithoutCancel(ctx), sb, rec, nil); ferr != nil {
			m.log.Warn("recording failed exec", "sandbox_id", sb.ID(), "exec_id", rec.ID, "err", ferr)
		}
		var pe *errdefs.Public
		if ctx.Err() != nil || errors.As(err, &pe) {
			// The client left, or the sandbox stopped meanwhile: say so.
			return nil, fmt.Errorf("starting exec: %w", err)
		}
		// The sandbox runs (Running said so) but its agent did not take
		// the exec: the caller gets the exec record's code, not a generic
		// unavailable, and can tell it from a crash (the sandbox's state).
		// The cause is kept as text only: a dial or handshake timeout in it
		// must not make the edge call this a request timeout.
		return nil, &errdefs.Public{Msg: "the sandbox agent is not answering", Err: fmt.Errorf("%w: starting exec: %v", errdefs.ErrAgentUnavailable, err)}
	}
	t.se.mu.Lock()
	t.se.execs[t.id] = t
	t.se.mu.Unlock()
	oomWG.Wait() // the tracker reads the baseline
	// exec.run lasts until the command ended, after the request may have
	// returned; it is a child of the manager.exec span all the same.
	_, runSpan := tracing.StartSpan(ctx, "exec.run", "")
	m.goBackground(func() {
		t.run(tctx, cancel, stream)
		runSpan.End()
	})
	return &Exec{t: t}, nil
}
