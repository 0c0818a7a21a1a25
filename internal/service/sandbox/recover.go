package sandbox

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/redact"
	"github.com/airlockhq/airlock/internal/store"
)

// recoverParallel bounds concurrent recoveries: each inspects a runtime
// (spawning runc) and dials an agent.
const recoverParallel = 4

// recoverAll re-adopts every sandbox the store says is live.
func (m *Service) recoverAll(ctx context.Context) error {
	recs, err := m.store.SandboxesInStates(ctx, liveStates...)
	if err != nil {
		return err
	}
	if len(recs) > 0 {
		m.log.Info("recovering sandboxes", "count", len(recs))
	}
	sem := make(chan struct{}, recoverParallel)
	var wg sync.WaitGroup
	for _, rec := range recs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			m.recoverOne(ctx, rec)
		}()
	}
	wg.Wait()
	m.sweepNetworks(ctx)
	m.previews.Prune(ctx)
	return nil
}

// recoverOne re-adopts one sandbox, or records that it died and cleans it.
func (m *Service) recoverOne(ctx context.Context, rec store.Sandbox) {
	log := m.log.With("sandbox_id", rec.ID, "tenant", rec.Tenant, "driver", rec.Runtime)
	drv, ok := m.drivers[rec.Runtime]
	if !ok {
		// Nothing here can manage (or clean) it: report it.
		log.Error("sandbox's runtime is not available; cannot recover it")
		now := m.now().UTC()
		rec.State, rec.DesiredState = api.StateError, api.StateStopped
		rec.ErrorCode, rec.ErrorMessage = api.CodeRuntimeUnavailable, "runtime "+rec.Runtime+" is not available after a daemon restart"
		rec.EndedAt, rec.EndReason = &now, api.StopHost
		if err := m.store.UpdateSandbox(ctx, rec); err != nil {
			log.Error("recording unrecoverable sandbox", "err", err)
		}
		return
	}
	secrets, err := m.sealer.open(rec.ID, rec.Secrets)
	if err != nil {
		// The key changed or the row was tampered with: the sandbox runs on,
		// but its execs no longer get (or get masked) its secrets.
		log.Warn("cannot unseal sandbox secrets", "err", err)
	}
	var sp Spec
	_ = json.Unmarshal(rec.Spec, &sp)
	ready := make(chan struct{})
	close(ready)
	sb := &Live{
		id: rec.ID, tenant: rec.Tenant, drv: drv, m: m, rec: rec, ready: ready,
		secrets: envSecrets(sp, secrets), env: sp.Env, red: redact.New(secrets),
		gone: make(chan struct{}),
	}
	sb.setExecDefaults(sp)
	switch {
	case rec.State == api.StateStarting:
		// The client never got its 201: clean up, and let a retry with the
		// same idempotency key create a new sandbox.
		m.failCreate(ctx, sb, &PublicError{Msg: "the daemon restarted while the sandbox was starting", Err: errdefs.ErrUnavailable}, nil)
		if err := m.store.DeleteIdempotencyKeysFor(ctx, rec.ID); err != nil {
			log.Warn("forgetting idempotency keys", "err", err)
		}
		return
	case rec.State == api.StateStopping || rec.DesiredState == api.StateStopped:
		m.mu.Lock()
		m.live[rec.ID] = sb
		m.mu.Unlock()
		m.owners.Live(sb)
		reason := rec.EndReason
		if reason == "" {
			reason = api.StopDeleted
		}
		if err := m.stop(ctx, sb, reason); err != nil {
			log.Warn("finishing interrupted delete", "err", err)
		}
		return
	}
	var h driver.Handle
	if len(rec.Handle) == 0 || json.Unmarshal(rec.Handle, &h) != nil {
		m.crashed(ctx, sb, "sandbox has no runtime handle")
		return
	}
	if rec.State == api.StatePaused && rec.PauseMemory == api.PauseMemoryDisk {
		m.recoverPausedToDisk(ctx, sb, sp, log)
		return
	}
	if err := drv.Recover(ctx, &h); err != nil {
		if !errdefs.IsNotFound(err) {
			log.Warn("recovering sandbox", "err", err)
		}
		if errdefs.IsNotFound(err) && rec.DesiredState == api.StatePaused && rec.State == api.StateRunning && !sp.Resources.DiskTmpfs {
			// The last daemon died pausing it to disk, its processes
			// stopped: it is paused with its files, as it was asked.
			now := m.now().UTC()
			if err := sb.setState(ctx, api.StatePaused, func(r *store.Sandbox) {
				r.PausedAt, r.PauseMemory = &now, api.PauseMemoryDisk
			}); err == nil {
				m.recoverPausedToDisk(ctx, sb, sp, log)
				return
			}
		}
		m.crashedReason(ctx, sb, api.SandboxCodeCrashed, api.StopHost, "sandbox did not survive the daemon restart")
		return
	}
	status, err := drv.Inspect(ctx, rec.ID)
	if err != nil || (status.State != driver.StateRunning && status.State != driver.StatePaused) {
		m.crashedReason(ctx, sb, api.SandboxCodeCrashed, api.StopHost, "sandbox did not survive the daemon restart")
		return
	}
	// Its resolver and proxy died with the last daemon (the filter kept
	// enforcing): restart them and rewrite its rules.
	if err := m.recoverNetwork(ctx, rec.ID, sp); err != nil {
		log.Warn("recovering sandbox network", "err", err)
		m.crashed(ctx, sb, "sandbox network did not survive the daemon restart")
		return
	}
	// Observed state first: the driver's word wins over the record.
	now := m.now().UTC()
	switch {
	case status.State == driver.StatePaused && rec.State == api.StateRunning:
		err = sb.setState(ctx, api.StatePaused, func(r *store.Sandbox) { r.PausedAt = &now })
	case status.State == driver.StateRunning && rec.State == api.StatePaused:
		err = sb.setState(ctx, api.StateRunning, func(r *store.Sandbox) { m.unpause(r) })
	}
	if err != nil {
		log.Error("recording recovered state", "err", err)
	}
	m.mu.Lock()
	m.live[rec.ID] = sb
	m.mu.Unlock()
	m.owners.Live(sb)
	m.previews.Restore(ctx, sb)

	// Then move towards the desired state (an operation the last daemon
	// started but did not finish).
	p := systemPrincipal(rec.Tenant)
	desired := sb.snapshot().DesiredState
	switch {
	case desired == api.StatePaused && sb.state() == api.StateRunning:
		_, err = m.Pause(ctx, p, rec.ID)
	case desired == api.StateRunning && sb.state() == api.StatePaused:
		_, err = m.Resume(ctx, p, rec.ID)
	}
	if err != nil {
		log.Warn("reconciling desired state", "desired", desired, "err", err)
	}
	if sb.state() == api.StatePaused {
		// A frozen agent cannot answer; its execs are re-attached on resume.
		sb.mu.Lock()
		sb.execRecovery = true
		sb.mu.Unlock()
		log.Info("sandbox recovered", "state", api.StatePaused)
		return
	}
	if err := m.reattach(ctx, sb, log); err != nil {
		m.crashedCode(ctx, sb, api.SandboxCodeAgentUnavailable, "sandbox agent did not answer after the daemon restart")
		return
	}
	log.Info("sandbox recovered", "state", sb.state())
}

// reattach dials the agent of a recovered sandbox and has the exec engine
// follow again the execs the store says are still running.
func (m *Service) reattach(ctx context.Context, sb *Live, log *slog.Logger) error {
	dctx, cancel := context.WithTimeout(ctx, m.cfg.AgentDialTimeout)
	defer cancel()
	c, err := sb.agent(dctx)
	if err != nil {
		log.Warn("dialling recovered agent", "err", err)
		return err
	}
	if err := c.Ping(dctx); err != nil {
		log.Warn("pinging recovered agent", "err", err)
		return err
	}
	return m.execs.Reattach(ctx, sb)
}

// systemPrincipal acts for the daemon itself on tenant's sandboxes.
func systemPrincipal(tenant string) auth.Principal {
	return auth.Principal{Tenant: tenant, Admin: true}
}

// afterResume re-attaches the execs of a sandbox recovered while paused.
func (m *Service) afterResume(ctx context.Context, sb *Live) {
	sb.mu.Lock()
	pending := sb.execRecovery
	sb.execRecovery = false
	sb.mu.Unlock()
	if !pending {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := m.reattach(rctx, sb, m.log.With("sandbox_id", sb.id)); err != nil {
		m.log.Warn("re-attaching execs after resume", "sandbox_id", sb.id, "err", err)
	}
}

// recoverPausedToDisk re-adopts a sandbox paused to disk: nothing of it
// runs, its storage (and memory image) must be there. It stays paused
// and resumable; a resume the last daemon started is finished.
func (m *Service) recoverPausedToDisk(ctx context.Context, sb *Live, sp Spec, log *slog.Logger) {
	sb.halted.Store(true)
	sb.diskOnly.Store(true)
	if _, err := sb.drv.Inspect(ctx, sb.id); err != nil {
		log.Warn("sandbox paused to disk lost its storage", "err", err)
		m.crashedReason(ctx, sb, api.SandboxCodeCrashed, api.StopHost, "the files of the sandbox paused to disk did not survive the daemon restart")
		return
	}
	if err := m.recoverNetwork(ctx, sb.id, sp); err != nil {
		log.Warn("recovering sandbox network", "err", err)
		m.crashedCode(ctx, sb, api.SandboxCodeNetworkLost, "sandbox network did not survive the daemon restart")
		return
	}
	m.mu.Lock()
	m.live[sb.id] = sb
	m.mu.Unlock()
	m.owners.Live(sb)
	m.previews.Restore(ctx, sb)
	// Execs the store says run were ended by the pause, or are lost with
	// the last daemon: the resume's Reattach ends them.
	sb.mu.Lock()
	sb.execRecovery = true
	sb.mu.Unlock()
	if sb.snapshot().DesiredState == api.StateRunning {
		if _, err := m.resumeLive(ctx, sb, ""); err != nil {
			log.Warn("finishing interrupted resume", "err", err)
		}
	}
	log.Info("sandbox recovered", "state", sb.state(), "pause_memory", api.PauseMemoryDisk)
}
