package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/tracing"
)

// Pause with memory keep or disk, and the resume from each
// (docs/lifecycle.md, "Transitions").
//
// A pause to disk either checkpoints the processes and their memory into
// a memory image (a driver that implements driver.Checkpointer and
// declares MemorySnapshot: gVisor) or, elsewhere (runc), stops every
// process with the driver's Stop, which keeps the sandbox's storage: only
// its files are kept, and the resume starts it again on them (the
// template's start command runs again). Either way the sandbox stays live
// (state paused, pause_memory disk): its record, network namespace, slot
// and writable layer stay, its RAM is released.
//
// The memory image is the sandbox's own: <data dir>/pause/<id>/image,
// made by the pause, removed by the resume that used it, by a delete and
// by a crash. <data dir>/pause/<id>/complete marks an image the driver
// finished writing: without it the resume starts the sandbox afresh.

// PauseOptions are how and why a sandbox is paused.
type PauseOptions struct {
	// Memory is keep (the default) or disk (api.PauseMemory*).
	Memory string
	// Reason is why the daemon paused it (pauseReason*); "" for a client's
	// pause.
	Reason string
}

// Why the daemon paused or resumed a sandbox (the reason of the pause and
// resume events).
const (
	pauseReasonIdle    = "idle"
	pauseReasonTimeout = "timeout"
	// pauseReasonKeepMax: a keep pause held RAM past paused_keep_max_s.
	pauseReasonKeepMax = "keep_max"
	resumeReasonAuto   = "auto"
)

// pauseStopGrace is how long the processes of a sandbox paused to disk
// without a memory image get, after SIGTERM, to exit before they are
// killed.
const pauseStopGrace = 2 * time.Second

// execsEndWait bounds how long a pause to disk waits for the execs it
// ended to be recorded (each tracker notices its stream's end at once).
const execsEndWait = 10 * time.Second

// pauseDir is what a pause to disk keeps of sandbox id beside its storage.
func (m *Service) pauseDir(id string) string { return filepath.Join(m.settings.DataDir, "pause", id) }

// checkpointer is d's Checkpointer when d checkpoints memory.
func checkpointer(d driver.Driver) (driver.Checkpointer, bool) {
	ck, ok := d.(driver.Checkpointer)
	return ck, ok && d.Capabilities().MemorySnapshot
}

// PauseDiskKeeps is what a pause to disk keeps on driver d
// (api.Durability.PauseDisk): the processes and memory where d
// checkpoints them, else the filesystem.
func PauseDiskKeeps(d driver.Driver) string {
	if _, ok := checkpointer(d); ok {
		return api.KeepsMemory
	}
	return api.KeepsFilesystem
}

// PauseWith pauses sandbox id as o says. Pausing a paused sandbox is a
// no-op, but a keep pause moves to disk when asked.
func (m *Service) PauseWith(ctx context.Context, p auth.Principal, id string, o PauseOptions) (api.Sandbox, error) {
	sb, err := m.LiveSandbox(ctx, p, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	return m.pauseLive(ctx, sb, o)
}

func (m *Service) pauseLive(ctx context.Context, sb *Live, o PauseOptions) (_ api.Sandbox, err error) {
	ctx, span := tracing.StartSpan(ctx, "manager.pause", sb.id)
	defer func() { tracing.EndSpan(span, err) }()
	switch o.Memory {
	case "":
		o.Memory = api.PauseMemoryKeep
	case api.PauseMemoryKeep, api.PauseMemoryDisk:
	default:
		return api.Sandbox{}, public(errInvalid, "memory must be keep or disk")
	}
	if o.Memory == api.PauseMemoryDisk {
		if sb.Spec().Resources.DiskTmpfs {
			return api.Sandbox{}, public(errdefs.ErrCapabilityUnsupported, "a disk_tmpfs sandbox keeps its files in memory: it cannot pause to disk")
		}
	} else if _, ok := sb.drv.(driver.Pauser); !ok || !sb.drv.Capabilities().Pause {
		return api.Sandbox{}, public(errInvalid, "runtime %s cannot pause", sb.drv.Name())
	}
	sb.opMu.Lock()
	defer sb.opMu.Unlock()
	rec := sb.snapshot()
	switch rec.State {
	case api.StatePaused:
		if o.Memory == api.PauseMemoryKeep || rec.PauseMemory == api.PauseMemoryDisk {
			return m.view(rec), nil
		}
	case api.StateRunning:
	default:
		return api.Sandbox{}, public(errdefs.ErrInvalidState, "sandbox is %s", rec.State)
	}
	if o.Memory == api.PauseMemoryDisk {
		err = m.pauseDiskLocked(ctx, sb, o.Reason)
	} else {
		err = m.pauseKeepLocked(ctx, sb, o.Reason)
	}
	if err != nil {
		return api.Sandbox{}, err
	}
	return m.view(sb.snapshot()), nil
}

// pauseKeepLocked freezes running sb (sb.opMu held).
func (m *Service) pauseKeepLocked(ctx context.Context, sb *Live, reason string) error {
	pz := sb.drv.(driver.Pauser)
	if err := sb.update(ctx, func(r *store.Sandbox) { r.DesiredState = api.StatePaused }); err != nil {
		return err
	}
	// Seconds until now were running ones.
	m.meter.Sample(ctx, sb)
	if err := pz.Pause(ctx, sb.id); err != nil {
		sb.update(context.WithoutCancel(ctx), func(r *store.Sandbox) { r.DesiredState = api.StateRunning })
		return fmt.Errorf("pausing: %w", err)
	}
	now := m.now().UTC()
	if err := sb.setState(ctx, api.StatePaused, func(r *store.Sandbox) {
		r.PausedAt, r.PauseMemory = &now, api.PauseMemoryKeep
		if reason == pauseReasonTimeout {
			restartTTL(r, now)
		}
	}); err != nil {
		return err
	}
	m.log.Info("sandbox paused", "sandbox_id", sb.id, "tenant", sb.tenant, "memory", api.PauseMemoryKeep, "reason", reason)
	m.recordEvent(ctx, sb, audit.TypePause, pauseDetail(api.PauseMemoryKeep, reason, ""))
	return nil
}

// restartTTL gives a sandbox paused at its TTL's end (on_timeout pause) a
// whole new TTL from its resume: the resume adds the time paused to
// ExpiresAt.
func restartTTL(r *store.Sandbox, pausedAt time.Time) {
	r.ExpiresAt = pausedAt.Add(time.Duration(r.TimeoutS) * time.Second)
}

func pauseDetail(memory, reason, processes string) map[string]string {
	d := map[string]string{"memory": memory}
	if reason != "" {
		d["reason"] = reason
	}
	if processes != "" {
		d["processes"] = processes
	}
	return d
}

// pauseDiskLocked releases the RAM of running (or keep-paused) sb
// (sb.opMu held). A failure leaves it as it was (running, or paused with
// memory kept) when its processes still run; when they were lost it is
// paused to disk with its files.
func (m *Service) pauseDiskLocked(ctx context.Context, sb *Live, reason string) error {
	rec := sb.snapshot()
	wasPaused := rec.State == api.StatePaused
	if err := sb.update(ctx, func(r *store.Sandbox) { r.DesiredState = api.StatePaused }); err != nil {
		return err
	}
	// Seconds until now were running ones (or paused with memory kept).
	m.meter.Sample(ctx, sb)
	// From here the agent's going away is the pause's doing, not a crash.
	sb.halted.Store(true)
	sb.closeClient()
	processes := "stopped"
	image := false
	if ck, ok := checkpointer(sb.drv); ok {
		err := m.checkpoint(ctx, sb, ck, wasPaused)
		switch {
		case err == nil:
			image, processes = true, "kept"
		case m.stillRuns(ctx, sb):
			// Nothing was lost: it runs (or is frozen) as before.
			m.pauseDiskFailed(ctx, sb, wasPaused, err)
			return fmt.Errorf("pausing to disk: %w", err)
		default:
			// The processes went with the failed checkpoint; the files are
			// kept as by a filesystem pause.
			m.log.Warn("checkpoint failed and lost the processes; pausing with the files", "sandbox_id", sb.id, "err", err)
			processes = "lost"
		}
	}
	if !image {
		if err := sb.drv.Stop(ctx, sb.id, pauseStopGrace); err != nil && m.stillRuns(ctx, sb) {
			m.pauseDiskFailed(ctx, sb, wasPaused, err)
			return fmt.Errorf("pausing to disk: %w", err)
		}
	}
	m.waitExecsEnded(ctx, sb)
	now := m.now().UTC()
	if err := sb.setState(ctx, api.StatePaused, func(r *store.Sandbox) {
		if r.PausedAt == nil {
			r.PausedAt = &now
		}
		r.PauseMemory = api.PauseMemoryDisk
		if reason == pauseReasonTimeout {
			restartTTL(r, *r.PausedAt)
		}
	}); err != nil {
		return err
	}
	sb.diskOnly.Store(true)
	m.log.Info("sandbox paused", "sandbox_id", sb.id, "tenant", sb.tenant, "memory", api.PauseMemoryDisk, "processes", processes, "reason", reason)
	m.recordEvent(ctx, sb, audit.TypePause, pauseDetail(api.PauseMemoryDisk, reason, processes))
	return nil
}

// checkpoint writes sb's memory image into its pause directory.
func (m *Service) checkpoint(ctx context.Context, sb *Live, ck driver.Checkpointer, wasPaused bool) error {
	if wasPaused {
		// A checkpoint is of a running sandbox.
		if err := sb.drv.(driver.Pauser).Resume(ctx, sb.id); err != nil {
			return err
		}
	}
	base := m.pauseDir(sb.id)
	if err := os.RemoveAll(base); err != nil {
		return err
	}
	dir := filepath.Join(base, "image")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := ck.Checkpoint(ctx, sb.id, dir, driver.CheckpointOptions{}); err != nil {
		os.RemoveAll(base)
		return err
	}
	if err := os.WriteFile(filepath.Join(base, "complete"), nil, 0o600); err != nil {
		os.RemoveAll(base)
		return err
	}
	return nil
}

// stillRuns reports whether sb's runtime says its processes run (or are
// frozen).
func (m *Service) stillRuns(ctx context.Context, sb *Live) bool {
	st, err := sb.drv.Inspect(context.WithoutCancel(ctx), sb.id)
	return err == nil && (st.State == driver.StateRunning || st.State == driver.StatePaused)
}

// pauseDiskFailed records a pause to disk that failed with nothing lost:
// sb runs on (frozen again if it was paused with memory kept).
func (m *Service) pauseDiskFailed(ctx context.Context, sb *Live, wasPaused bool, cause error) {
	ctx = context.WithoutCancel(ctx)
	sb.halted.Store(false)
	desired := api.StateRunning
	if wasPaused {
		desired = api.StatePaused
		if st, err := sb.drv.Inspect(ctx, sb.id); err == nil && st.State == driver.StateRunning {
			if err := sb.drv.(driver.Pauser).Pause(ctx, sb.id); err != nil {
				m.log.Warn("freezing again after a failed pause to disk", "sandbox_id", sb.id, "err", err)
			}
		}
	}
	sb.update(ctx, func(r *store.Sandbox) { r.DesiredState = desired })
	m.log.Warn("pause to disk failed", "sandbox_id", sb.id, "err", cause)
	m.recordEvent(ctx, sb, audit.TypeError, map[string]string{"op": "pause", "memory": api.PauseMemoryDisk,
		"message": "pausing to disk failed; the sandbox is unchanged"})
}

// waitExecsEnded waits, a bounded time, for the execs of sb that a pause
// ended to be recorded (killed, sandbox_stopped), so that a resume never
// meets their trackers.
func (m *Service) waitExecsEnded(ctx context.Context, sb *Live) {
	deadline := time.Now().Add(execsEndWait)
	for {
		recs, err := m.store.RunningExecs(ctx, sb.id)
		if err != nil || len(recs) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// resumeLive resumes sb; reason is why the daemon does (resumeReason*),
// "" for a client's resume.
func (m *Service) resumeLive(ctx context.Context, sb *Live, reason string) (_ api.Sandbox, err error) {
	ctx, span := tracing.StartSpan(ctx, "manager.resume", sb.id)
	defer func() { tracing.EndSpan(span, err) }()
	sb.opMu.Lock()
	defer sb.opMu.Unlock()
	rec := sb.snapshot()
	switch rec.State {
	case api.StateRunning:
		return m.view(rec), nil
	case api.StatePaused:
	default:
		return api.Sandbox{}, public(errdefs.ErrInvalidState, "sandbox is %s", rec.State)
	}
	if rec.PauseMemory == api.PauseMemoryDisk {
		err = m.resumeDiskLocked(ctx, sb, reason)
	} else {
		err = m.resumeKeepLocked(ctx, sb, reason)
	}
	if err != nil {
		return api.Sandbox{}, err
	}
	return m.view(sb.snapshot()), nil
}

// resumeKeepLocked thaws frozen sb (sb.opMu held).
func (m *Service) resumeKeepLocked(ctx context.Context, sb *Live, reason string) error {
	pz, ok := sb.drv.(driver.Pauser)
	if !ok {
		return public(errInvalid, "runtime %s cannot pause", sb.drv.Name())
	}
	if err := sb.update(ctx, func(r *store.Sandbox) { r.DesiredState = api.StateRunning }); err != nil {
		return err
	}
	// Seconds until now were paused ones.
	m.meter.Sample(ctx, sb)
	if err := pz.Resume(ctx, sb.id); err != nil {
		m.resumeFailed(ctx, sb, api.PauseMemoryKeep, err)
		return resumeError(err)
	}
	if err := sb.setState(ctx, api.StateRunning, func(r *store.Sandbox) { m.unpause(r) }); err != nil {
		return err
	}
	m.touch(sb)
	m.afterResume(ctx, sb)
	m.log.Info("sandbox resumed", "sandbox_id", sb.id, "tenant", sb.tenant, "memory", api.PauseMemoryKeep, "reason", reason)
	m.recordEvent(ctx, sb, audit.TypeResume, pauseDetail(api.PauseMemoryKeep, reason, ""))
	return nil
}

// resumeDiskLocked runs sb paused to disk again (sb.opMu held): from its
// memory image when it has one, else started afresh on its files, the
// template's start command included. A failure leaves it paused to disk
// with its files and image.
func (m *Service) resumeDiskLocked(ctx context.Context, sb *Live, reason string) error {
	if err := sb.update(ctx, func(r *store.Sandbox) { r.DesiredState = api.StateRunning }); err != nil {
		return err
	}
	// Seconds until now were paused ones.
	m.meter.Sample(ctx, sb)
	base := m.pauseDir(sb.id)
	ck, canRestore := checkpointer(sb.drv)
	_, statErr := os.Stat(filepath.Join(base, "complete"))
	image := canRestore && statErr == nil
	sp := sb.Spec()
	rec := sb.snapshot()
	var startCmd *template.Config
	if !image {
		// The template's config before anything runs: a template that is
		// gone fails the resume with nothing started.
		c, err := m.templateConfig(ctx, rec)
		if err != nil {
			m.resumeFailed(ctx, sb, api.PauseMemoryDisk, err)
			return resumeError(err)
		}
		startCmd = &c
	}
	if err := m.readmit(ctx, sb); err != nil {
		m.resumeFailed(ctx, sb, api.PauseMemoryDisk, err)
		return err
	}
	sb.halted.Store(false)
	var err error
	if image {
		err = ck.Restore(ctx, sb.id, filepath.Join(base, "image"))
	} else {
		err = sb.drv.Start(ctx, sb.id)
	}
	if err == nil {
		err = m.agentReady(ctx, sb)
	}
	if err == nil && !image && sp.SecretsAsFiles {
		// A new start has a new, empty /run/secrets.
		secrets, serr := m.sealer.open(sb.id, rec.Secrets)
		if serr != nil {
			err = serr
		} else {
			err = m.writeSecretFiles(ctx, sb, secrets)
		}
	}
	if err != nil {
		m.haltAgain(ctx, sb)
		m.resumeFailed(ctx, sb, api.PauseMemoryDisk, err)
		return resumeError(err)
	}
	if err := sb.setState(ctx, api.StateRunning, func(r *store.Sandbox) { m.unpause(r) }); err != nil {
		m.haltAgain(ctx, sb)
		return err
	}
	if image {
		if err := os.RemoveAll(base); err != nil {
			m.log.Warn("removing used memory image", "sandbox_id", sb.id, "err", err)
		}
	}
	m.touch(sb)
	// Execs an earlier daemon followed end now (the agent is new: it
	// knows none of them).
	m.afterResume(ctx, sb)
	if startCmd != nil && (startCmd.StartCmd != "" || startCmd.ReadyCmd != "") {
		if err := m.execs.StartTemplate(ctx, sb, *startCmd); err != nil {
			// Back to paused, files kept: the start command is the
			// template's promise of a ready sandbox.
			m.haltAgain(ctx, sb)
			now := m.now().UTC()
			if serr := sb.setState(context.WithoutCancel(ctx), api.StatePaused, func(r *store.Sandbox) {
				r.PausedAt, r.PauseMemory, r.DesiredState = &now, api.PauseMemoryDisk, api.StatePaused
			}); serr != nil {
				m.log.Error("recording failed resume", "sandbox_id", sb.id, "err", serr)
			}
			m.resumeFailed(ctx, sb, api.PauseMemoryDisk, err)
			return resumeError(err)
		}
		sb.mu.Lock()
		sb.restartedAt = m.now().UTC()
		sb.mu.Unlock()
	}
	processes := "restarted"
	if image {
		processes = "restored"
	}
	m.log.Info("sandbox resumed", "sandbox_id", sb.id, "tenant", sb.tenant, "memory", api.PauseMemoryDisk, "processes", processes, "reason", reason)
	m.recordEvent(ctx, sb, audit.TypeResume, pauseDetail(api.PauseMemoryDisk, reason, processes))
	return nil
}

// haltAgain stops what a failed resume started: the sandbox stays paused
// to disk with its files.
func (m *Service) haltAgain(ctx context.Context, sb *Live) {
	sb.halted.Store(true)
	sb.diskOnly.Store(true)
	sb.closeClient()
	if err := sb.drv.Stop(context.WithoutCancel(ctx), sb.id, 0); err != nil {
		m.log.Warn("stopping after a failed resume", "sandbox_id", sb.id, "err", err)
	}
}

// resumeFailed records a resume that failed: sb stays paused.
func (m *Service) resumeFailed(ctx context.Context, sb *Live, memory string, cause error) {
	ctx = context.WithoutCancel(ctx)
	sb.update(ctx, func(r *store.Sandbox) { r.DesiredState = api.StatePaused })
	m.log.Warn("resume failed", "sandbox_id", sb.id, "memory", memory, "err", cause)
	msg := "resuming failed; the sandbox stays paused with its files"
	var pe *PublicError
	if errors.As(cause, &pe) {
		msg += ": " + pe.Msg
	}
	m.recordEvent(ctx, sb, audit.TypeError, map[string]string{"op": "resume", "memory": memory, "message": msg})
}

// resumeError is what the client of a failed resume sees.
func resumeError(err error) error {
	var pe *PublicError
	if errors.As(err, &pe) {
		return err
	}
	if errors.Is(err, errdefs.ErrCapacityExhausted) {
		return &PublicError{Msg: "the host has no room to resume the sandbox, retry later; it stays paused",
			RetryAfter: retryAfterCapacity, Err: err}
	}
	return &PublicError{Msg: "resuming failed; the sandbox stays paused with its files",
		Err: fmt.Errorf("%w: %w", errdefs.ErrInternal, err)}
}

// templateConfig is the config of rec's template version, as a create
// from it would run it.
func (m *Service) templateConfig(ctx context.Context, rec store.Sandbox) (template.Config, error) {
	ref := rec.Template + ":" + strconv.Itoa(rec.TemplateVersion)
	res, release, err := m.tmpl.Resolve(ctx, rec.Tenant, rec.Template, rec.TemplateVersion, ref, false)
	if err != nil {
		return template.Config{}, err
	}
	release()
	return res.Config, nil
}
