package sandbox

import (
	"context"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
)

// Activity and the idle timeout (docs/lifecycle.md, "Activity").
//
// Activity is recorded in memory (touch) and written to the store once a
// tick (flushActivity): a request must not wait for a database write. What
// counts: every request that needs the sandbox running (Service.Running:
// exec, files, code, PTY, previews' dial), a keepalive, an open stream
// (Live.Active) and a running exec (the store's running execs, checked
// when the idle deadline is reached).

// touch records activity of sb now.
func (m *Service) touch(sb *Live) {
	now := m.now().UTC()
	sb.mu.Lock()
	if now.After(sb.rec.LastActiveAt) {
		sb.rec.LastActiveAt = now
		sb.activityDirty = true
	}
	sb.mu.Unlock()
}

// Active marks an open stream of the sandbox (an exec's event stream, a
// PTY, a file watch, a preview WebSocket): the sandbox is active until
// done is called, and done's call is activity too.
func (sb *Live) Active() (done func()) {
	sb.streams.Add(1)
	sb.m.touch(sb)
	var once bool
	return func() {
		if once {
			return
		}
		once = true
		sb.m.touch(sb)
		sb.streams.Add(-1)
	}
}

// Keepalive marks activity of sandbox id and nothing else: it does not
// move expires_at. A paused sandbox with auto_resume is resumed; without
// it the keepalive is invalid_state.
func (m *Service) Keepalive(ctx context.Context, p auth.Principal, id string) (api.Sandbox, error) {
	sb, err := m.LiveSandbox(ctx, p, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	switch st := sb.state(); st {
	case api.StateRunning:
	case api.StatePaused:
		if !sb.snapshot().Lifecycle.AutoResume {
			return api.Sandbox{}, public(errdefs.ErrInvalidState, "sandbox is paused")
		}
		if _, err := m.resumeLive(ctx, sb, resumeReasonAuto); err != nil {
			return api.Sandbox{}, err
		}
	default:
		return api.Sandbox{}, public(errdefs.ErrInvalidState, "sandbox is %s", st)
	}
	m.touch(sb)
	m.flushOne(ctx, sb)
	return m.view(sb.snapshot()), nil
}

// activityFlushEvery is how often recorded activity is written to the
// store: the idle timeout runs on the in-memory record, the store's copy
// is for a daemon restart (a keepalive writes at once).
const activityFlushEvery = 5 * time.Second

// flushActivity stores the activity recorded since the last flush, once
// every activityFlushEvery.
func (m *Service) flushActivity() {
	now := time.Now()
	if now.Sub(m.activityFlushed) < activityFlushEvery {
		return
	}
	m.activityFlushed = now
	for _, sb := range m.Lives() {
		m.flushOne(m.ctx, sb)
	}
}

func (m *Service) flushOne(ctx context.Context, sb *Live) {
	sb.mu.Lock()
	dirty, at := sb.activityDirty, sb.rec.LastActiveAt
	sb.activityDirty = false
	sb.mu.Unlock()
	if !dirty {
		return
	}
	if err := m.store.TouchSandbox(ctx, sb.id, at); err != nil && !errdefs.IsNotFound(err) {
		m.log.Warn("recording activity", "sandbox_id", sb.id, "err", err)
		sb.mu.Lock()
		sb.activityDirty = true
		sb.mu.Unlock()
	}
}

// idle pauses (memory keep) every running sandbox whose idle timeout has
// passed with nothing ongoing.
func (m *Service) idle() {
	now := m.now()
	for _, sb := range m.Lives() {
		sb.mu.Lock()
		rec := sb.rec
		due := rec.State == api.StateRunning && rec.Lifecycle.IdleTimeoutS > 0 && !sb.idling && !sb.expiring
		if due {
			last := rec.LastActiveAt
			if last.Before(rec.CreatedAt) {
				last = rec.CreatedAt
			}
			due = !now.Before(last.Add(time.Duration(rec.Lifecycle.IdleTimeoutS) * time.Second))
		}
		if due {
			sb.idling = true
		}
		sb.mu.Unlock()
		if !due {
			continue
		}
		m.goBackground(func() {
			defer func() {
				sb.mu.Lock()
				sb.idling = false
				sb.mu.Unlock()
			}()
			if m.ongoing(sb) {
				m.touch(sb)
				return
			}
			if _, err := m.pauseLive(m.ctx, sb, PauseOptions{Memory: api.PauseMemoryKeep, Reason: pauseReasonIdle}); err != nil {
				m.log.Warn("pausing idle sandbox", "sandbox_id", sb.id, "err", err)
			}
		})
	}
}

// ongoing reports whether something keeps sb awake right now: an open
// stream or a running exec (the template's start command does not count:
// it always runs).
func (m *Service) ongoing(sb *Live) bool {
	if sb.streams.Load() > 0 {
		return true
	}
	recs, err := m.store.RunningExecs(m.ctx, sb.id)
	if err != nil {
		m.log.Warn("listing running execs", "sandbox_id", sb.id, "err", err)
		return true // unknown: never pause on a guess
	}
	// The start command is the shell exec that began before the sandbox
	// was ready (at its create, or its last start on its files).
	rec := sb.snapshot()
	readyAt := rec.CreatedAt.Add(time.Duration(rec.ReadyMS) * time.Millisecond)
	sb.mu.Lock()
	if sb.restartedAt.After(readyAt) {
		readyAt = sb.restartedAt
	}
	sb.mu.Unlock()
	for _, r := range recs {
		if r.Shell != nil && !r.StartedAt.After(readyAt) {
			continue
		}
		return true
	}
	return false
}

// pauseAtTimeout pauses sb at its TTL's end (on_timeout pause): to disk
// where the runtime checkpoints memory, else with memory kept (a runc
// pause to disk would stop its processes, which the user did not ask
// for). The TTL starts anew at the resume.
func (m *Service) pauseAtTimeout(sb *Live) {
	mem := api.PauseMemoryKeep
	if _, ok := checkpointer(sb.drv); ok && !sb.Spec().Resources.DiskTmpfs {
		mem = api.PauseMemoryDisk
	} else if _, ok := sb.drv.(driver.Pauser); !ok || !sb.drv.Capabilities().Pause {
		mem = api.PauseMemoryDisk
		if sb.Spec().Resources.DiskTmpfs {
			// Nothing can keep it: it expires as on_timeout kill.
			if err := m.stop(m.ctx, sb, api.StopExpired); err != nil {
				m.log.Warn("stopping expired sandbox", "sandbox_id", sb.id, "err", err)
			}
			return
		}
	}
	if _, err := m.pauseLive(m.ctx, sb, PauseOptions{Memory: mem, Reason: pauseReasonTimeout}); err != nil {
		m.log.Warn("pausing sandbox at its timeout", "sandbox_id", sb.id, "err", err)
	}
}

// storeLifecycle is l's stored form.
func storeLifecycle(l store.Lifecycle) store.Lifecycle {
	if l.OnTimeout == "" {
		l.OnTimeout = store.OnTimeoutKill
	}
	return l
}
