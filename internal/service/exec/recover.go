package exec

import (
	"context"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/service/sandbox"
)

// Reattach follows again the execs of sb, a sandbox recovered after a
// daemon restart whose agent answers, that the store says are still
// running (sandbox.Execs): the agent kept them running and their output;
// one it does not know any more was lost with its daemon.
func (m *Engine) Reattach(ctx context.Context, sb *sandbox.Live) error {
	log := m.log.With("sandbox_id", sb.ID())
	recs, err := m.store.RunningExecs(ctx, sb.ID())
	if err != nil || len(recs) == 0 {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, m.cfg.AgentDialTimeout)
	defer cancel()
	c, err := sb.Agent(dctx)
	if err != nil {
		return err
	}
	infos, err := c.ListExecs(dctx)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	caps := map[string]int64{}
	for _, in := range infos {
		known[in.ID] = true
		caps[in.ID] = in.MaxOutputBytes
	}
	for _, rec := range recs {
		if !known[rec.ID] {
			end := m.now().UTC()
			rec.Status, rec.EndedAt, rec.Error = api.ExecError, &end, "exec was lost while the daemon restarted"
			rec.ErrorCode = api.ExecCodeAgentUnavailable
			rec.DurationMS = end.Sub(rec.StartedAt).Milliseconds()
			if err := m.finishExec(ctx, sb, rec, nil); err != nil {
				log.Warn("recording lost exec", "exec_id", rec.ID, "err", err)
			}
			continue
		}
		t := newTracker(m, sb, rec, 0) // the agent enforces its timeout
		t.setOutputCap(caps[rec.ID])
		tctx, tcancel := context.WithCancel(m.ctx)
		st, err := c.Attach(tctx, rec.ID, 0)
		if err != nil {
			tcancel()
			log.Warn("re-attaching exec", "exec_id", rec.ID, "err", err)
			continue
		}
		t.se.mu.Lock()
		t.se.execs[t.id] = t
		t.se.mu.Unlock()
		m.goBackground(func() { t.run(tctx, tcancel, st) })
	}
	return nil
}
