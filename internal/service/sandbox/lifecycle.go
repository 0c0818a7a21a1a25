package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/tracing"
)

// view turns a record into the API's sandbox.
func (m *Service) view(rec store.Sandbox) api.Sandbox {
	var sp Spec
	_ = json.Unmarshal(rec.Spec, &sp)
	out := api.Sandbox{
		ID: rec.ID, Tenant: rec.Tenant, Template: rec.Template, TemplateVersion: rec.TemplateVersion,
		Runtime: rec.Runtime, State: rec.State, CreatedAt: rec.CreatedAt, Resources: sp.Resources,
		Metadata: rec.Metadata, Network: sp.Network, ReadyMS: rec.ReadyMS, Snapshot: rec.SnapshotID,
	}
	if len(out.Metadata) == 0 {
		out.Metadata = nil
	}
	switch rec.State {
	case api.StateRunning, api.StateStarting:
		exp := rec.ExpiresAt
		out.ExpiresAt = &exp
	case api.StatePaused:
		// The deadline if it were resumed now: paused time does not count.
		exp := rec.ExpiresAt
		if rec.PausedAt != nil {
			exp = exp.Add(m.now().Sub(*rec.PausedAt))
		}
		out.ExpiresAt = &exp
	}
	if rec.ErrorCode != "" {
		out.Error = &api.SandboxError{Code: rec.ErrorCode, Message: rec.ErrorMessage}
	}
	out.StopReason, out.EndedAt = rec.EndReason, rec.EndedAt
	paused := rec.PausedTotal
	if rec.State == api.StatePaused && rec.PausedAt != nil {
		at := *rec.PausedAt
		out.PausedAt, out.PauseMemory = &at, rec.PauseMemory
		if out.PauseMemory == "" {
			out.PauseMemory = api.PauseMemoryKeep
		}
		paused += max(m.now().Sub(at), 0)
	}
	out.PausedS = paused.Seconds()
	out.Lifecycle = lifecycleView(rec.Lifecycle)
	if !rec.LastActiveAt.IsZero() {
		at := rec.LastActiveAt
		out.LastActivityAt = &at
	}
	out.Snapshot, out.Pool = rec.SnapshotID, rec.Pool
	return out
}

// Get returns sandbox id as p sees it.
func (m *Service) Get(ctx context.Context, p auth.Principal, id string) (api.Sandbox, error) {
	rec, err := m.Record(ctx, p, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	return m.view(rec), nil
}

// Record loads the stored record of sandbox id if p may see it. A sandbox of
// another tenant takes the same path and gives the same error as a missing
// one.
func (m *Service) Record(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error) {
	rec, err := m.store.GetSandbox(ctx, id, p.TenantFilter())
	if errdefs.IsNotFound(err) {
		return store.Sandbox{}, sandboxNotFound()
	}
	return rec, err
}

// LiveSandbox returns the in-memory sandbox id if p may see it. A sandbox
// that exists but is not live is an invalid_state error.
func (m *Service) LiveSandbox(ctx context.Context, p auth.Principal, id string) (*Live, error) {
	m.mu.Lock()
	sb := m.live[id]
	m.mu.Unlock()
	if sb != nil && p.CanSee(sb.tenant) {
		return sb, nil
	}
	// Not live, or another tenant's: both go to the store with the tenant
	// filter, so a foreign sandbox ends in the same not-found as a missing one.
	rec, err := m.Record(ctx, p, id)
	if err != nil {
		return nil, err
	}
	return nil, public(errdefs.ErrInvalidState, "sandbox is %s", rec.State)
}

// Lookup returns live sandbox id, nil if it is not live. It checks no
// principal: it is for the daemon's own work (the preview listener, the
// audit of an operation already allowed).
func (m *Service) Lookup(id string) *Live {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.live[id]
}

// Running returns the sandbox if p may see it and it is running (exec and files need that).
func (m *Service) Running(ctx context.Context, p auth.Principal, id string) (*Live, error) {
	sb, err := m.LiveSandbox(ctx, p, id)
	if err != nil {
		return nil, err
	}
	st := sb.state()
	if st == api.StatePaused && sb.snapshot().Lifecycle.AutoResume {
		// auto_resume: the request resumes it first, whatever paused it.
		// The request is activity from before the resume: the idle
		// timeout must not see the resumed sandbox as idle since before
		// its pause and pause it again under the request.
		m.touch(sb)
		if _, err := m.resumeLive(ctx, sb, resumeReasonAuto); err != nil {
			return nil, err
		}
		st = sb.state()
	}
	if st != api.StateRunning {
		return nil, public(errdefs.ErrInvalidState, "sandbox is %s", st)
	}
	// Every request that needs the sandbox running is activity.
	m.touch(sb)
	return sb, nil
}

// ListFilter selects sandboxes for List.
type ListFilter struct {
	// States to keep; empty means every state but stopped.
	States   []string
	Metadata map[string]string
	Limit    int
	Cursor   string
}

// AllStates, as ListFilter.States, lists every state including stopped.
const AllStates = "all"

// List returns one page of p's sandboxes (every tenant's for an admin).
func (m *Service) List(ctx context.Context, p auth.Principal, f ListFilter) (api.SandboxList, error) {
	states := f.States
	if len(states) == 0 {
		states = []string{api.StateStarting, api.StateRunning, api.StatePaused, api.StateStopping, api.StateError}
	}
	for _, s := range states {
		if s == AllStates {
			states = nil
			break
		}
		if _, ok := transitions[s]; !ok {
			return api.SandboxList{}, public(errInvalid, "unknown state %q", truncate(s, 32))
		}
	}
	recs, next, err := m.store.ListSandboxes(ctx, store.SandboxFilter{
		Tenant: p.TenantFilter(), States: states, Metadata: f.Metadata, Limit: f.Limit, Cursor: f.Cursor,
	})
	if err != nil {
		if errdefs.IsInvalidArgument(err) {
			return api.SandboxList{}, public(errInvalid, "%s", publicText(err))
		}
		return api.SandboxList{}, err
	}
	out := api.SandboxList{Sandboxes: make([]api.Sandbox, 0, len(recs)), NextCursor: next}
	for _, r := range recs {
		out.Sandboxes = append(out.Sandboxes, m.view(r))
	}
	return out, nil
}

// publicText strips the class prefix errdefs.Wrap puts on a message.
func publicText(err error) string {
	s := err.Error()
	for _, cls := range []error{errdefs.ErrInvalidArgument, errdefs.ErrNotFound} {
		if p := cls.Error() + ": "; len(s) > len(p) && s[:len(p)] == p {
			return s[len(p):]
		}
	}
	return s
}

// Delete stops and removes sandbox id. Deleting a sandbox that is already
// stopped (or was never fully created) succeeds; nothing of it is left.
func (m *Service) Delete(ctx context.Context, p auth.Principal, id string) (err error) {
	ctx, span := tracing.StartSpan(ctx, "manager.delete", id)
	defer func() { tracing.EndSpan(span, err) }()
	m.mu.Lock()
	sb := m.live[id]
	m.mu.Unlock()
	if sb == nil || !p.CanSee(sb.tenant) {
		rec, err := m.Record(ctx, p, id)
		if err != nil {
			return err
		}
		if rec.State == api.StateError {
			// Cleaned when it failed; deleting acknowledges it.
			if err := checkTransition(rec.State, api.StateStopped); err != nil {
				return err
			}
			// Its cleanup ran when it failed; Destroy is idempotent, so run
			// it again in case that cleanup itself failed.
			cctx, cancel := cleanupCtx(ctx)
			defer cancel()
			if drv, ok := m.drivers[rec.Runtime]; ok {
				if err := drv.Destroy(cctx, rec.ID); err != nil {
					return fmt.Errorf("destroying sandbox: %w", err)
				}
			}
			if err := m.teardownNetwork(cctx, rec.ID); err != nil {
				return err
			}
			if err := m.store.UpdateSandbox(ctx, withState(rec, api.StateStopped)); err != nil {
				return err
			}
			m.audit.Record(audit.Event{Type: audit.TypeDelete, Tenant: rec.Tenant, SandboxID: rec.ID,
				Template: rec.Template, RequestID: audit.RequestID(ctx), Detail: mustJSON(map[string]string{"reason": "deleted", "from": api.StateError})})
			return nil
		}
		return nil
	}
	// Wait for an in-flight create: deleting during create would race the
	// driver, and the create's own failure path already cleans up.
	select {
	case <-sb.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	return m.stop(ctx, sb, api.StopDeleted)
}

func withState(rec store.Sandbox, state string) store.Sandbox {
	rec.State = state
	rec.DesiredState = api.StateStopped
	return rec
}

// stop destroys a live sandbox and records it stopped with reason.
func (m *Service) stop(ctx context.Context, sb *Live, reason string) error {
	sb.opMu.Lock()
	defer sb.opMu.Unlock()
	cctx, cancel := cleanupCtx(ctx)
	defer cancel()
	st := sb.state()
	if !isLive(st) {
		return nil // someone else stopped it first
	}
	// The last seconds are accounted while the counters can still be read.
	m.meter.Sample(cctx, sb)
	if st != api.StateStopping {
		// The reason is recorded from here: the execs that end with the
		// sandbox say it, and a retried destroy (the sweep) keeps it.
		if err := sb.setState(cctx, api.StateStopping, func(r *store.Sandbox) {
			r.DesiredState, r.EndReason = api.StateStopped, reason
		}); err != nil {
			return err
		}
	}
	sb.markGone()
	sb.closeClient()
	if err := sb.drv.Destroy(cctx, sb.id); err != nil {
		// Left in stopping: the sweep retries, and a later delete too.
		m.log.Error("destroying sandbox", "sandbox_id", sb.id, "tenant", sb.tenant, "err", err)
		return fmt.Errorf("destroying sandbox: %w", err)
	}
	if err := m.teardownNetwork(cctx, sb.id); err != nil {
		// Likewise: stopping until the network is gone too.
		m.log.Error("removing sandbox network", "sandbox_id", sb.id, "tenant", sb.tenant, "err", err)
		return err
	}
	m.removePauseDir(sb.id)
	now := m.now().UTC()
	if err := sb.setState(cctx, api.StateStopped, func(r *store.Sandbox) {
		r.EndedAt, r.EndReason, r.Secrets, r.PausedAt, r.PauseMemory = &now, reason, nil, nil, ""
	}); err != nil {
		return err
	}
	typ := audit.TypeDelete
	if reason == api.StopExpired {
		typ = audit.TypeExpiry
	}
	m.recordEvent(ctx, sb, typ, map[string]string{"reason": reason, "stop_reason": reason})
	m.forget(sb)
	m.log.Info("sandbox stopped", "sandbox_id", sb.id, "tenant", sb.tenant, "reason", reason)
	return nil
}

// forget drops a sandbox that is no longer live from memory.
func (m *Service) forget(sb *Live) {
	sb.markGone()
	m.owners.Gone(sb)
	m.mu.Lock()
	if m.live[sb.id] == sb {
		delete(m.live, sb.id)
	}
	m.mu.Unlock()
	m.previews.Forget(sb.id)
	m.meter.Forget(sb.id)
	m.execs.Forget(sb.id)
	sb.envMu.Lock()
	clear(sb.secrets)
	sb.envMu.Unlock()
}

// crashed records that a live sandbox died on its own, cleans it up and
// reports it (state error, code sandbox_crashed). crashedCode is crashed
// with another code: agent_unavailable when the platform lost the agent of
// a sandbox whose runtime still ran.
func (m *Service) crashed(ctx context.Context, sb *Live, why string) {
	m.crashedCode(ctx, sb, api.SandboxCodeCrashed, why)
}

func (m *Service) crashedCode(ctx context.Context, sb *Live, code, why string) {
	reason := api.StopCrashed
	if code == api.SandboxCodeNetworkLost {
		reason = api.StopNetworkLost
	}
	m.crashedReason(ctx, sb, code, reason, why)
}

// crashedReason is crashed with the stop reason given (api.Stop*).
func (m *Service) crashedReason(ctx context.Context, sb *Live, code, reason, why string) {
	sb.opMu.Lock()
	defer sb.opMu.Unlock()
	cctx, cancel := cleanupCtx(ctx)
	defer cancel()
	st := sb.state()
	if !isLive(st) || st == api.StateStarting {
		return
	}
	m.log.Warn("sandbox crashed", "sandbox_id", sb.id, "tenant", sb.tenant, "driver", sb.drv.Name(), "code", code, "stop_reason", reason, "why", why)
	// Bill up to the crash's discovery; counters keep their last sample.
	m.meter.Sample(cctx, sb)
	sb.crashCode.Store(&code)
	sb.markGone()
	sb.closeClient()
	if err := sb.drv.Destroy(cctx, sb.id); err != nil {
		m.log.Error("cleaning crashed sandbox", "sandbox_id", sb.id, "err", err)
	} else if err := m.teardownNetwork(cctx, sb.id); err != nil {
		// Deleting the sandbox (state error) tries again.
		m.log.Error("removing crashed sandbox's network", "sandbox_id", sb.id, "err", err)
	}
	m.removePauseDir(sb.id)
	now := m.now().UTC()
	if err := sb.setState(cctx, api.StateError, func(r *store.Sandbox) {
		r.ErrorCode, r.ErrorMessage = code, why
		r.EndedAt, r.EndReason, r.Secrets, r.PausedAt, r.PauseMemory = &now, reason, nil, nil, ""
		r.DesiredState = api.StateStopped
	}); err != nil {
		m.log.Error("recording crash", "sandbox_id", sb.id, "err", err)
	}
	m.recordEvent(ctx, sb, audit.TypeError, map[string]string{"code": code, "message": why, "stop_reason": reason})
	if o := m.cfg.Observer; o != nil {
		if eo, ok := o.(SandboxErrorObserver); ok {
			eo.SandboxError(code)
		}
	}
	m.forget(sb)
}

// SetTimeout gives sandbox id timeoutS seconds to live from now.
func (m *Service) SetTimeout(ctx context.Context, p auth.Principal, id string, timeoutS int64) (api.Sandbox, error) {
	if timeoutS < 1 || timeoutS > m.settings.MaxTimeoutS {
		return api.Sandbox{}, public(errInvalid, "timeout_s must be between 1 and %d", m.settings.MaxTimeoutS)
	}
	sb, err := m.LiveSandbox(ctx, p, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	sb.opMu.Lock()
	defer sb.opMu.Unlock()
	if st := sb.state(); st != api.StateRunning && st != api.StatePaused {
		return api.Sandbox{}, public(errdefs.ErrInvalidState, "sandbox is %s", st)
	}
	err = sb.update(ctx, func(r *store.Sandbox) {
		base := m.now().UTC()
		if r.State == api.StatePaused && r.PausedAt != nil {
			// Paused time is added back on resume, so count from the pause.
			base = *r.PausedAt
		}
		r.TimeoutS = timeoutS
		r.ExpiresAt = base.Add(time.Duration(timeoutS) * time.Second)
	})
	if err != nil {
		return api.Sandbox{}, err
	}
	return m.view(sb.snapshot()), nil
}

// Pause freezes sandbox id (memory keep). Pausing a paused sandbox is a
// no-op.
func (m *Service) Pause(ctx context.Context, p auth.Principal, id string) (api.Sandbox, error) {
	return m.PauseWith(ctx, p, id, PauseOptions{Memory: api.PauseMemoryKeep})
}

// Resume runs paused sandbox id again (thawed, restored or started on its
// files: pause.go); its deadline moves by the time it was paused.
// Resuming a running sandbox is a no-op. A failed resume leaves it paused.
func (m *Service) Resume(ctx context.Context, p auth.Principal, id string) (api.Sandbox, error) {
	sb, err := m.LiveSandbox(ctx, p, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	return m.resumeLive(ctx, sb, "")
}

// unpause moves the deadline by the time spent paused.
func (m *Service) unpause(r *store.Sandbox) {
	if r.PausedAt == nil {
		return
	}
	d := m.now().Sub(*r.PausedAt)
	if d < 0 {
		d = 0
	}
	r.ExpiresAt = r.ExpiresAt.Add(d)
	r.PausedTotal += d
	r.PausedAt = nil
}

// Metrics samples sandbox id's resource use.
func (m *Service) Metrics(ctx context.Context, p auth.Principal, id string) (api.Metrics, error) {
	sb, err := m.LiveSandbox(ctx, p, id)
	if err != nil {
		return api.Metrics{}, err
	}
	rec := sb.snapshot()
	out := api.Metrics{}
	// Uptime is the time the sandbox has existed minus time spent paused.
	up := m.now().Sub(rec.CreatedAt) - rec.PausedTotal
	if rec.PausedAt != nil {
		up -= m.now().Sub(*rec.PausedAt)
	}
	out.UptimeS = max(up, 0).Seconds()
	st, ok := sb.drv.(driver.Stater)
	if !ok || sb.halted.Load() {
		// Paused to disk: nothing runs, nothing to sample.
		return out, nil
	}
	s, err := st.Stats(ctx, sb.id)
	if err != nil {
		return api.Metrics{}, fmt.Errorf("sampling sandbox stats: %w", err)
	}
	out.CPUSeconds, out.MemoryBytes, out.MemoryPeakBytes = s.CPUSeconds, s.MemoryBytes, s.MemoryPeakBytes
	out.PIDs, out.DiskBytes, out.DiskWrittenBytes = s.PIDs, s.DiskBytes, s.DiskWrittenBytes
	out.NetRxBytes, out.NetTxBytes = s.NetRxBytes, s.NetTxBytes
	if m.net != nil {
		// The host side of the sandbox's veth counts everything, proxied
		// traffic included.
		if rx, tx, err := m.net.Counters(sb.id); err == nil {
			out.NetRxBytes, out.NetTxBytes = rx, tx
		}
	}
	return out, nil
}

// Lives returns the live sandboxes.
func (m *Service) Lives() []*Live {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*Live, 0, len(m.live))
	for _, sb := range m.live {
		out = append(out, sb)
	}
	return out
}

// expire stops every running sandbox whose deadline passed. Paused ones
// wait: their clock is stopped.
func (m *Service) expire() {
	now := m.now()
	for _, sb := range m.Lives() {
		rec := sb.snapshot()
		if rec.State != api.StateRunning || now.Before(rec.ExpiresAt) {
			continue
		}
		m.goExpiring(sb, func() {
			if sb.snapshot().Lifecycle.OnTimeout == store.OnTimeoutPause {
				m.pauseAtTimeout(sb)
				return
			}
			if err := m.stop(m.ctx, sb, api.StopExpired); err != nil {
				m.log.Warn("stopping expired sandbox", "sandbox_id", sb.id, "err", err)
			}
		})
	}
}

// goExpiring runs fn in the background for sb unless an earlier one (a
// stop or pause of the TTL loop) still runs for it: one per sandbox,
// however many ticks pass meanwhile.
func (m *Service) goExpiring(sb *Live, fn func()) {
	sb.mu.Lock()
	busy := sb.expiring
	sb.expiring = true
	sb.mu.Unlock()
	if busy {
		return
	}
	m.goBackground(func() {
		defer func() {
			sb.mu.Lock()
			sb.expiring = false
			sb.mu.Unlock()
		}()
		fn()
	})
}

// boundPaused applies the server's bounds on paused sandboxes: one paused
// longer than paused_retention_s is deleted (stop_reason expired); a keep
// pause older than paused_keep_max_s moves to disk where the runtime
// checkpoints memory (its processes go on at the resume), releasing the
// host's RAM. Elsewhere a keep pause stays: a runc pause to disk would
// stop its processes, which the user did not ask for.
func (m *Service) boundPaused() {
	retention := time.Duration(m.settings.PausedRetentionS) * time.Second
	keepMax := time.Duration(m.settings.PausedKeepMaxS) * time.Second
	if retention <= 0 && keepMax <= 0 {
		return
	}
	now := m.now()
	for _, sb := range m.Lives() {
		rec := sb.snapshot()
		if rec.State != api.StatePaused || rec.PausedAt == nil {
			continue
		}
		held := now.Sub(*rec.PausedAt)
		expire := retention > 0 && held >= retention
		toDisk := !expire && keepMax > 0 && held >= keepMax && rec.PauseMemory == api.PauseMemoryKeep && movesToDisk(sb)
		if !expire && !toDisk {
			continue
		}
		m.goExpiring(sb, func() {
			if sb.state() != api.StatePaused {
				return // resumed (or deleted) meanwhile
			}
			if expire {
				if err := m.stop(m.ctx, sb, api.StopExpired); err != nil {
					m.log.Warn("stopping a sandbox paused past the retention", "sandbox_id", sb.id, "err", err)
				}
				return
			}
			if _, err := m.pauseLive(m.ctx, sb, PauseOptions{Memory: api.PauseMemoryDisk, Reason: pauseReasonKeepMax}); err != nil {
				m.log.Warn("moving a long keep pause to disk", "sandbox_id", sb.id, "err", err)
			}
		})
	}
}

// movesToDisk reports whether a keep pause of sb can move to disk with its
// processes: the runtime checkpoints memory and the files are on disk.
func movesToDisk(sb *Live) bool {
	_, ok := checkpointer(sb.drv)
	return ok && !sb.Spec().Resources.DiskTmpfs
}

// sweep inspects every live sandbox: a dead one is reported as crashed, one
// stuck in stopping (a failed destroy) is destroyed again.
func (m *Service) sweep() {
	// sweepParallel bounds concurrent Inspect calls (each may spawn runc).
	const sweepParallel = 4
	sem := make(chan struct{}, sweepParallel)
	var wg sync.WaitGroup
	for _, sb := range m.Lives() {
		st := sb.state()
		if st == api.StateStarting {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if st == api.StateStopping {
				reason := sb.snapshot().EndReason
				if reason == "" {
					reason = api.StopDeleted
				}
				if err := m.stop(m.ctx, sb, reason); err != nil {
					m.log.Warn("retrying destroy", "sandbox_id", sb.id, "err", err)
				}
				return
			}
			m.checkAlive(sb)
		}()
	}
	wg.Wait()
}

// checkAlive inspects a sandbox and handles it as crashed if its init is
// gone. It returns true if the sandbox still runs.
func (m *Service) checkAlive(sb *Live) bool {
	if sb.halted.Load() {
		// Paused to disk (or being paused): its processes are stopped on
		// purpose, nothing crashed.
		return false
	}
	ctx, cancel := context.WithTimeout(m.ctx, 30*time.Second)
	defer cancel()
	status, err := sb.drv.Inspect(ctx, sb.id)
	if err != nil {
		if m.ctx.Err() != nil {
			return true
		}
		if errdefs.IsNotFound(err) {
			m.crashed(ctx, sb, "sandbox runtime is gone")
			return false
		}
		m.log.Warn("inspecting sandbox", "sandbox_id", sb.id, "err", err)
		return true
	}
	switch status.State {
	case driver.StateRunning, driver.StatePaused, driver.StateCreated:
		return true
	}
	if sb.halted.Load() {
		return false // paused to disk while it was inspected
	}
	why := "sandbox init exited"
	switch {
	case status.OOMKills > 0 && (status.ExitSignal == "SIGKILL" || status.ExitSignal == "" && status.ExitCode == 0):
		// The kernel kills for memory with SIGKILL and counts it in the
		// cgroup: the init (the agent) went for memory, and every process
		// with it. An exit the driver could not read (0, no signal: the
		// agent never exits 0 on its own) after an OOM kill is one too.
		m.crashedReason(ctx, sb, api.SandboxCodeCrashed, api.StopOOM,
			"sandbox init was killed for memory (out of memory: the sandbox's memory limit was reached)")
		return false
	case status.ExitSignal != "":
		why = "sandbox init was killed by " + status.ExitSignal
	case status.State == driver.StateStopped:
		why = fmt.Sprintf("sandbox init exited with code %d", status.ExitCode)
	}
	m.crashed(ctx, sb, why)
	return false
}

// removePauseDir removes what a pause to disk kept of sandbox id beside
// its storage (a memory image).
func (m *Service) removePauseDir(id string) {
	if err := os.RemoveAll(m.pauseDir(id)); err != nil {
		m.log.Warn("removing memory image", "sandbox_id", id, "err", err)
	}
}
