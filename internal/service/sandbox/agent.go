package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// redialAttempts is how often a dropped agent connection is redialled
// before the sandbox is declared dead: an agent that is alive answers the
// first dial; a few more cover a transient failure.
const redialAttempts = 3

// agent returns the sandbox's agent client, dialling (again) when there is
// none or the last one dropped.
func (sb *Live) agent(ctx context.Context) (*agentclient.Client, error) {
	c, _, err := sb.agentDialled(ctx)
	return c, err
}

// agentDialled is agent, and says whether this call dialled: a new
// client's handshake is the agent's answer.
func (sb *Live) agentDialled(ctx context.Context) (_ *agentclient.Client, fresh bool, _ error) {
	sb.dialMu.Lock()
	defer sb.dialMu.Unlock()
	if c := sb.client; c != nil {
		select {
		case <-c.Done():
		default:
			return c, false, nil
		}
	}
	select {
	case <-sb.gone:
		return nil, false, public(errdefs.ErrInvalidState, "sandbox is stopped")
	default:
	}
	if sb.halted.Load() {
		return nil, false, public(errdefs.ErrInvalidState, "sandbox is paused")
	}
	dctx, cancel := context.WithTimeout(ctx, sb.m.cfg.AgentDialTimeout)
	defer cancel()
	start := time.Now()
	conn, err := sb.drv.DialAgent(dctx, sb.id)
	if err != nil {
		return nil, false, fmt.Errorf("dialling agent: %w", err)
	}
	dialled := time.Now()
	// File transfers dial connections of their own (see agentclient).
	dialDirect := func(ctx context.Context) (net.Conn, error) {
		dctx, cancel := context.WithTimeout(ctx, sb.m.cfg.AgentDialTimeout)
		defer cancel()
		return sb.drv.DialAgent(dctx, sb.id)
	}
	c, err := agentclient.New(conn, agentclient.WithDialer(dialDirect))
	if err != nil {
		return nil, false, fmt.Errorf("agent handshake: %w", err)
	}
	// At create, dial_us is mostly the agent starting up.
	sb.m.log.Debug("agent connected", "sandbox_id", sb.id,
		"dial_us", dialled.Sub(start).Microseconds(), "hello_us", time.Since(dialled).Microseconds())
	sb.client = c
	sb.m.goBackground(func() { sb.watch(c) })
	return c, true, nil
}

// closeClient closes the agent connection (the agent keeps running).
func (sb *Live) closeClient() {
	sb.dialMu.Lock()
	c := sb.client
	sb.client = nil
	sb.dialMu.Unlock()
	if c != nil {
		c.Close()
	}
}

// watch waits for the agent connection to drop. The agent is the sandbox's
// init, so a drop usually means the sandbox died: check, and either report
// the crash or reconnect.
func (sb *Live) watch(c *agentclient.Client) {
	m := sb.m
	select {
	case <-c.Done():
	case <-m.shutdown:
		return
	case <-sb.gone:
		return
	}
	for attempt := 0; attempt < redialAttempts; attempt++ {
		if m.isShutdown() {
			return
		}
		select {
		case <-sb.gone:
			return
		default:
		}
		sb.dialMu.Lock()
		replaced := sb.client != nil && sb.client != c
		sb.dialMu.Unlock()
		if replaced {
			return // someone redialled already; that client has its own watch
		}
		if !m.checkAlive(sb) {
			return
		}
		ctx, cancel := context.WithTimeout(m.ctx, 5*time.Second)
		_, err := sb.agent(ctx)
		cancel()
		if err == nil {
			return
		}
		m.log.Warn("agent connection lost, redialling", "sandbox_id", sb.id, "attempt", attempt+1, "err", err)
		select {
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		case <-m.shutdown:
			return
		}
	}
	// Paused sandboxes cannot answer; they are checked again when resumed.
	if st := sb.state(); st == "running" {
		ctx, cancel := context.WithTimeout(m.ctx, cleanupTimeout)
		defer cancel()
		m.crashedCode(ctx, sb, api.SandboxCodeAgentUnavailable, "sandbox agent is unreachable")
	}
}

// withAgent runs fn with the sandbox's agent client. If the call fails
// because the connection dropped, it redials once and runs fn again: every
// call passed here must be safe to repeat.
func (sb *Live) withAgent(ctx context.Context, fn func(*agentclient.Client) error) error {
	for attempt := 0; ; attempt++ {
		c, err := sb.agent(ctx)
		if err != nil {
			return err
		}
		if o := sb.m.cfg.Observer; o != nil {
			start := time.Now()
			err = fn(c)
			o.AgentCall(time.Since(start))
		} else {
			err = fn(c)
		}
		if err == nil || attempt > 0 || !errors.Is(err, errdefs.ErrUnavailable) || ctx.Err() != nil {
			return err
		}
		select {
		case <-c.Done():
		default:
			return err // the connection is fine: the agent itself is unavailable
		}
	}
}
