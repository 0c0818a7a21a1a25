package sandbox

// Fork (POST /v1/sandboxes/{id}/fork): a snapshot of the parent (memory
// where the runtime can), deleted before the fork answers, then count
// creates from it, each a new sandbox of the parent's tenant with its own
// id, network namespace (the parent's policy), tokens, quota charge and
// only the fork request's secrets. All or nothing.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/tracing"
)

const (
	// MaxForkCount bounds a fork's count.
	MaxForkCount = 10
	// forkParallel is how many copies start at once.
	forkParallel = 4
	auditFork    = "fork"
)

// Fork makes req.Count running copies of sandbox id.
func (m *Service) Fork(ctx context.Context, p auth.Principal, id string, req api.ForkRequest) (_ api.ForkResponse, err error) {
	ctx, span := tracing.StartSpan(ctx, "manager.fork", id)
	defer func() { tracing.EndSpan(span, err) }()
	if req.Count < 1 || req.Count > MaxForkCount {
		return api.ForkResponse{}, public(errInvalid, "count must be between 1 and %d", MaxForkCount)
	}
	sb, err := m.LiveSandbox(ctx, p, id)
	if err != nil {
		return api.ForkResponse{}, err
	}
	rec := sb.snapshot()
	var sp Spec
	if err := json.Unmarshal(rec.Spec, &sp); err != nil {
		return api.ForkResponse{}, fmt.Errorf("sandbox spec: %w", err)
	}
	// The copies are the parent's tenant's, whoever asks.
	cp := p
	cp.Tenant = sb.tenant
	if err := m.admitCopies(ctx, sb.tenant, sp.Resources, req.Count); err != nil {
		return api.ForkResponse{}, err
	}
	_, ck := sb.drv.(driver.Checkpointer)
	memory := ck && sb.drv.Capabilities().MemorySnapshot && sb.state() == api.StateRunning
	sn, err := m.snapshot(ctx, sb, "", memory)
	if err != nil {
		return api.ForkResponse{}, err
	}
	defer func() {
		// Gone before the fork answers; the copies keep its layers.
		dctx, cancel := cleanupCtx(ctx)
		defer cancel()
		if err := m.DeleteSnapshot(dctx, cp, sn.ID); err != nil {
			m.log.Warn("deleting a fork's snapshot", "snapshot_id", sn.ID, "err", err)
		}
	}()
	meta := rec.Metadata
	if req.Metadata != nil {
		meta = req.Metadata
	}
	timeout := rec.TimeoutS
	res := sp.Resources
	netw := sp.Network
	creq := api.CreateSandboxRequest{
		Snapshot: sn.ID, Runtime: sb.drv.Name(), Resources: &res, TimeoutS: &timeout, Env: sp.Env,
		Secrets: req.Secrets, SecretsAsFiles: sp.SecretsAsFiles, Network: &netw, Metadata: meta,
	}
	copies := make([]api.Sandbox, req.Count)
	errs := make([]error, req.Count)
	sem := make(chan struct{}, forkParallel)
	var wg sync.WaitGroup
	for i := range req.Count {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			r, err := m.Create(ctx, cp, creq, "")
			copies[i], errs[i] = r.Sandbox, err
		}()
	}
	wg.Wait()
	if err := firstError(errs); err != nil {
		// All or nothing: the copies made are removed.
		dctx, cancel := cleanupCtx(ctx)
		defer cancel()
		for i, c := range copies {
			if errs[i] == nil && c.ID != "" {
				if derr := m.Delete(dctx, cp, c.ID); derr != nil {
					m.log.Error("removing a failed fork's copy", "sandbox_id", c.ID, "err", derr)
				}
			}
		}
		return api.ForkResponse{}, err
	}
	ids := make([]string, len(copies))
	for i, c := range copies {
		ids[i] = c.ID
	}
	m.recordEvent(ctx, sb, auditFork, map[string]any{"count": req.Count, "copies": ids, "memory": memory})
	m.log.Info("sandbox forked", "sandbox_id", sb.id, "tenant", sb.tenant, "count", req.Count, "memory", memory)
	return api.ForkResponse{Sandboxes: copies}, nil
}

// firstError returns the error of the failed copy that says most: a
// refusal (quota, capacity) before an internal failure.
func firstError(errs []error) error {
	var first error
	for _, err := range errs {
		if err == nil {
			continue
		}
		if errors.Is(err, errdefs.ErrQuotaExceeded) || errors.Is(err, errdefs.ErrCapacityExhausted) {
			return err
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// admitCopies checks that n sandboxes of res fit the host's capacity and
// tenant's quota next to what runs, before anything of a fork is made
// (each create checks again as it reserves).
func (m *Service) admitCopies(ctx context.Context, tenant string, res api.Resources, n int) error {
	q, err := m.quotas.Quota(ctx, tenant)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.live)+n > m.settings.MaxSandboxes {
		return &PublicError{Msg: fmt.Sprintf("host has room for %d more sandboxes, the fork asks for %d", max(m.settings.MaxSandboxes-len(m.live), 0), n),
			RetryAfter: retryAfterCapacity, Err: errdefs.ErrCapacityExhausted}
	}
	all := api.Resources{CPU: res.CPU * float64(n), MemoryMB: res.MemoryMB * int64(n), DiskMB: res.DiskMB * int64(n)}
	if q.Sandboxes > 0 {
		if u := m.usageLocked(tenant); u.Sandboxes+n > q.Sandboxes {
			return &PublicError{Msg: fmt.Sprintf("sandboxes quota exceeded: the tenant has %d live sandboxes, the fork asks for %d more, its quota is %d", u.Sandboxes, n, q.Sandboxes),
				RetryAfter: retryAfterCapacity, Err: errdefs.ErrQuotaExceeded}
		}
	}
	q.Sandboxes = 0 // counted above
	return m.admitLocked(tenant, q, all)
}
