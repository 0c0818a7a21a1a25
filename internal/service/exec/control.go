package exec

import (
	"context"
	"io"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/sandbox"
)

// runningExec returns the live tracker of a running exec.
func (m *Service) runningExec(ctx context.Context, p auth.Principal, id, eid string) (*tracker, *sandbox.Live, error) {
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
	if st := sb.State(); st != api.StateRunning {
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
	c, err := sb.Agent(ctx)
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
	return sb.WithAgent(ctx, func(c *agentclient.Client) error { return c.Signal(ctx, t.id, sig) })
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
	return sb.WithAgent(ctx, func(c *agentclient.Client) error { return c.Resize(ctx, t.id, cols, rows) })
}
