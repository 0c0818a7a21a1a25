package exec

import (
	"context"
	"errors"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/redact"
)

// A tracker follows its exec with three small state machines, each on a
// channel of the one loop in run:
//
//   - the stream (stream): reading the agent's events; when the
//     connection drops, re-attaching where it was, a bounded number of
//     times, or ending the exec as lost (or as its sandbox's crash);
//   - the hold (hold): output that could be the start of a secret is held
//     back for redact.Hold, then goes out masked;
//   - the backstop (backstop): an exec that outlives its timeout by
//     backstopGrace is killed by the daemon, and recorded as timed out if
//     even that does not end it.

// run follows the agent's stream until the exec ends.
func (t *tracker) run(ctx context.Context, cancel context.CancelFunc, st *agentclient.Stream) {
	defer cancel()
	s := &stream{t: t, items: make(chan streamItem)}
	s.read(ctx, st)
	h := newHold(t)
	defer h.stop()
	b := newBackstop(t)
	defer b.stop()
	for {
		select {
		case it := <-s.items:
			if it.err != nil {
				// The stream goes on after a re-attach: what is held
				// goes out as a timed-out hold does.
				h.expire()
				if !s.reattach(ctx, it.err, h) {
					return
				}
				continue
			}
			if it.ev.Type == agentproto.EventExit {
				h.settle()
				t.exited(it.ev.Result, b.forced)
				return
			}
			s.advance(it.ev)
			h.push(redact.Chunk{Stream: it.ev.Stream, Off: it.ev.Offset, Data: it.ev.Data})
		case <-h.timer.C:
			h.fire()
		case <-b.c:
			if b.fire(ctx) {
				h.settle()
				t.finishLocal(api.ExecTimeout, api.ExecCodeTimeout, "exec did not end after its timeout")
				return
			}
		case <-t.sb.Gone():
			h.settle()
			t.finishGone()
			return
		case <-t.e.shutdown:
			return // the next daemon re-attaches
		}
	}
}

// exited ends the exec with the agent's result (nil: it sent none). An
// exec the backstop killed is a timeout, unless the kernel killed it for
// memory first.
func (t *tracker) exited(result *agentproto.ExecResult, forced bool) {
	res := agentproto.ExecResult{ID: t.id, Status: api.ExecError, ExitCode: -1, Error: "agent sent no result"}
	if result != nil {
		res = *result
	}
	if forced && res.Status != api.ExecOOM {
		res.Status = api.ExecTimeout
	}
	t.finish(res, "")
}

// streamItem is one read of the agent's stream.
type streamItem struct {
	ev  agentproto.Event
	err error
}

// stream is the connection state machine: one reader goroutine per
// attached stream feeds items; reattach follows a dropped one.
type stream struct {
	t          *tracker
	items      chan streamItem
	reattached int
}

// read starts the reader of st, which ends with the exec's exit event,
// an error, or ctx.
func (s *stream) read(ctx context.Context, st *agentclient.Stream) {
	s.t.e.goBackground(func() {
		defer st.Close()
		for {
			ev, err := st.Next()
			select {
			case s.items <- streamItem{ev, err}:
			case <-ctx.Done():
				return
			}
			if err != nil || ev.Type == agentproto.EventExit {
				return
			}
		}
	})
}

// advance moves the offset to re-attach from past ev.
func (s *stream) advance(ev agentproto.Event) {
	t := s.t
	t.mu.Lock()
	if end := ev.Offset + int64(len(ev.Data)); end > t.nextOff {
		t.nextOff = end
	}
	t.mu.Unlock()
}

// reattach follows the exec again after its stream failed with cause. It
// reports whether the tracker goes on; when it does not, the exec was
// ended (or the daemon is stopping: the next one re-attaches).
func (s *stream) reattach(ctx context.Context, cause error, h *hold) bool {
	t, e, sb := s.t, s.t.e, s.t.sb
	if e.isShutdown() {
		return false
	}
	if sb.IsGone() {
		h.settle()
		t.finishGone()
		return false
	}
	// An agent that broke the protocol would only do it again; one that
	// keeps dropping the stream is not followed for ever (see
	// maxReattach).
	if s.reattached++; errors.Is(cause, agentclient.ErrProtocol) || s.reattached > maxReattach {
		if !sb.CheckAlive() {
			t.finishGone()
			return false
		}
		e.log.Warn("giving up on an exec's stream", "sandbox_id", sb.ID(), "exec_id", t.id, "reattached", s.reattached-1, "err", cause)
		why := "lost connection to the sandbox agent"
		if errors.Is(cause, agentclient.ErrProtocol) {
			why = "the sandbox agent broke the exec protocol"
		}
		t.finishLocal(api.ExecError, api.ExecCodeAgentUnavailable, why)
		return false
	}
	// The connection dropped but the sandbox may live: re-attach where we
	// were.
	t.mu.Lock()
	from := t.nextOff
	t.mu.Unlock()
	var st *agentclient.Stream
	err := sb.WithAgent(ctx, func(c *agentclient.Client) error {
		a, err := c.Attach(ctx, t.id, from)
		st = a
		return err
	})
	if err != nil {
		if e.isShutdown() {
			return false
		}
		h.settle()
		if sb.IsGone() {
			t.finishGone()
			return false
		}
		// The agent is unreachable: a dead sandbox (its init and the
		// agent with it) is a crash, not a platform fault; ask the runtime
		// before telling them apart.
		if !sb.CheckAlive() {
			t.finishGone()
			return false
		}
		e.log.Warn("lost exec stream", "sandbox_id", sb.ID(), "exec_id", t.id, "err", err)
		t.finishLocal(api.ExecError, api.ExecCodeAgentUnavailable, "lost connection to the sandbox agent")
		return false
	}
	s.read(ctx, st)
	return true
}

// hold is the redaction state machine: a redact.Stream and the timer of
// its hold, armed once per hold (output that keeps coming must not
// postpone it forever).
type hold struct {
	t     *tracker
	red   *redact.Stream
	timer *time.Timer
	armed bool
}

func newHold(t *tracker) *hold {
	h := &hold{t: t, red: redact.NewStream(t.sb.Redactor()), timer: time.NewTimer(time.Hour)}
	h.timer.Stop()
	return h
}

// push masks c and emits what can go out; it arms or disarms the timer.
func (h *hold) push(c redact.Chunk) {
	h.t.emit(h.red.Push(c))
	switch pending := h.red.Pending(); {
	case !pending && h.armed:
		h.timer.Stop()
		h.armed = false
	case pending && !h.armed:
		h.timer.Reset(redact.Hold)
		h.armed = true
	}
}

// fire is the timer's end: the rest did not come in time, the held bytes
// go out masked, and the redactor still masks the rest of a secret when
// it comes.
func (h *hold) fire() {
	h.armed = false
	h.t.emit(h.red.Expire())
}

// expire releases what is held, masked, at once (the stream failed).
func (h *hold) expire() {
	h.t.emit(h.red.Expire())
	h.armed = false
	h.timer.Stop()
}

// settle ends the output (see tracker.settle).
func (h *hold) settle() { h.t.settle(h.red) }

func (h *hold) stop() { h.timer.Stop() }

// backstop is the timeout state machine: waiting for the exec's timeout
// plus backstopGrace (a paused sandbox's clock stops), then killing it,
// then giving up on it after backstopKillWait.
type backstop struct {
	t      *tracker
	timer  *time.Timer
	c      <-chan time.Time // nil without a timeout: never fires
	forced bool             // the daemon sent its SIGKILL
}

func newBackstop(t *tracker) *backstop {
	b := &backstop{t: t}
	if t.timeout > 0 {
		b.timer = time.NewTimer(t.timeout + backstopGrace)
		b.c = b.timer.C
	}
	return b
}

// fire handles the backstop's timer; it reports whether the exec is to be
// recorded as timed out now.
func (b *backstop) fire(ctx context.Context) bool {
	t, sb := b.t, b.t.sb
	if sb.State() == api.StatePaused {
		// A frozen sandbox's exec cannot end; look again later.
		b.c = time.After(backstopGrace)
		return false
	}
	if !b.forced {
		b.forced = true
		t.e.log.Warn("exec outlived its timeout, killing it", "sandbox_id", sb.ID(), "exec_id", t.id)
		kctx, kcancel := context.WithTimeout(ctx, backstopKillWait)
		if c, err := sb.Agent(kctx); err == nil {
			c.Signal(kctx, t.id, "SIGKILL")
		}
		kcancel()
		b.c = time.After(backstopKillWait)
		return false
	}
	return true
}

func (b *backstop) stop() {
	if b.timer != nil {
		b.timer.Stop()
	}
}
