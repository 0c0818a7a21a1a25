package exec

import (
	"context"
	"encoding/base64"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/redact"
	"github.com/airlockhq/airlock/internal/service/sandbox"
	"github.com/airlockhq/airlock/internal/store"
)

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

// tracker follows one exec: it reads the agent's events, redacts them,
// keeps them for subscribers and records the outcome.
type tracker struct {
	e        *Engine
	sb       *sandbox.Live
	se       *sandboxExecs
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

// newTracker returns the tracker of exec rec of sb (nil for an ended exec
// read back from the store).
func newTracker(e *Engine, sb *sandbox.Live, rec store.Exec, timeout time.Duration) *tracker {
	t := &tracker{
		e: e, sb: sb, id: rec.ID, rec: rec, timeout: timeout,
		out:    agentproto.NewOutputLog(min(e.settings.MaxExecOutputBytes, agentproto.HardMaxOutputBytes)),
		notify: make(chan struct{}), done: make(chan struct{}),
	}
	if sb != nil {
		t.se = e.of(sb.ID())
	}
	return t
}

// setOutputCap sets the per-stream cap of an exec followed again after a
// daemon restart (the agent's listing says it); call before run.
func (t *tracker) setOutputCap(n int64) {
	if n > 0 {
		t.out = agentproto.NewOutputLog(min(n, agentproto.HardMaxOutputBytes))
	}
}

// emit appends redacted output.
func (t *tracker) emit(cs []redact.Chunk) {
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
func (t *tracker) settle(red *redact.Stream) {
	t.emit(red.End())
	fix := red.Restore()
	t.mu.Lock()
	t.out.Rewrite(fix)
	t.mu.Unlock()
}

// finishGone ends the exec of a sandbox that stopped being live: a crash
// (status error, code sandbox_crashed, or agent_unavailable when the
// platform lost the agent) is told apart from a stop asked for (killed).
func (t *tracker) finishGone() {
	switch code := t.sb.GoneCode(); code {
	case api.SandboxCodeCrashed:
		t.finishLocal(api.ExecError, api.ExecCodeSandboxCrashed, "the sandbox crashed")
	case api.SandboxCodeAgentUnavailable:
		t.finishLocal(api.ExecError, api.ExecCodeAgentUnavailable, "lost connection to the sandbox agent")
	case api.ExecCodeSandboxReset:
		// A reset killed every process (service/sandbox's reset.go).
		t.finishLocal(api.ExecKilled, api.ExecCodeSandboxReset, "the sandbox was reset")
	default:
		why := "sandbox stopped"
		if r := t.sb.Record().EndReason; r != "" {
			why += " (" + r + ")" // deleted, expired, pool_drained…
		}
		t.finishLocal(api.ExecKilled, api.ExecCodeSandboxStopped, why)
	}
}

// finishLocal ends the exec without a result from the agent.
func (t *tracker) finishLocal(status, code, why string) {
	t.mu.Lock()
	started := t.rec.StartedAt
	t.mu.Unlock()
	end := t.e.now().UTC()
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
func (t *tracker) finish(res agentproto.ExecResult, code string) {
	m, sb := t.e, t.sb
	status := res.Status
	if code == "" && status == api.ExecError && res.StartedAt.IsZero() {
		// Not the agent's word on a start (it always stamps one): the
		// stand-in for an exit event without a result.
		code = api.ExecCodeAgentUnavailable
	}
	if status == api.ExecExited && agentproto.EndedBySIGKILL(res) && t.oomKnown {
		// The agent could not tell (no cgroup view inside): the host can,
		// by the same rule (agentproto.EndedBySIGKILL).
		if oomKills := oomCounterOf(sb.Driver()); oomKills != nil {
			ctx, cancel := context.WithTimeout(m.ctx, 5*time.Second)
			if n, err := oomKills(ctx, sb.ID()); err == nil && n > t.oomBase {
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
		rec.Cwd = t.se.defaultCwd(rec.User, effectiveCwd(res.Cwd))
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
	rec.Error = sb.Redactor().Redact(sandbox.AgentText(res.Error, 500))
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
	// evicted before. The engine's Close waits for it (goBackground).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(m.ctx), 30*time.Second)
	if err := m.finishExec(ctx, sb, rec, events); err != nil {
		m.log.Error("recording exec result", "sandbox_id", sb.ID(), "exec_id", t.id, "err", err)
	}
	cancel()
	if o := m.cfg.Observer; o != nil {
		o.ExecDone(sb.Driver().Name(), status, time.Duration(rec.DurationMS)*time.Millisecond)
	}
	m.log.Debug("exec ended", "sandbox_id", sb.ID(), "exec_id", t.id, "status", status, "duration_ms", rec.DurationMS)
	// Keep it in memory a while for fast re-attach, then the store serves it
	// (attached subscribers keep reading from the tracker they hold).
	evict := func() {
		t.se.mu.Lock()
		if t.se.execs[t.id] == t {
			delete(t.se.execs, t.id)
		}
		t.se.mu.Unlock()
	}
	if len(events) > retainMaxBytes {
		evict()
	} else {
		time.AfterFunc(m.cfg.ExecRetention, evict)
	}
}

// ended returns the exec's result without output once it has ended.
func (t *tracker) ended() (api.ExecResult, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.result == nil {
		return api.ExecResult{}, false
	}
	return buildResult(t.rec, nil, false), true
}

// view returns the exec's result, with its captured output if asked.
func (t *tracker) view(withOutput bool) api.ExecResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	rec := t.rec
	if rec.EndedAt == nil {
		rec.DurationMS = t.e.now().Sub(rec.StartedAt).Milliseconds()
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
