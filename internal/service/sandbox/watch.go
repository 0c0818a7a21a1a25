package sandbox

import (
	"context"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/auth"
)

// WatchDir starts watching directory pth of sandbox id (its whole tree when
// recursive) for p, as user: the agent adds the watches with the user's
// permissions, so it sees only what the user may read. When it returns the
// watch is in place. The watch lives until the caller closes it, ctx ends,
// or the sandbox stops (Next then fails with errdefs.ErrUnavailable); a
// paused sandbox reports nothing until it is resumed.
func (m *Service) WatchDir(ctx context.Context, p auth.Principal, id, pth, user string, recursive bool) (_ *Watch, err error) {
	sctx, span := startSpan(ctx, "manager.files.watch", id)
	defer func() { endSpan(span, err) }()
	sb, err := m.fileSandbox(sctx, p, id, user, &pth)
	if err != nil {
		return nil, err
	}
	// Safe to repeat on a dropped connection: nothing has changed yet.
	var w *agentclient.Watch
	err = sb.withAgent(sctx, func(c *agentclient.Client) error {
		// The watch outlives the span: it is tied to ctx, not sctx.
		w, err = c.Watch(ctx, pth, user, recursive)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Watch{w: w}, nil
}
