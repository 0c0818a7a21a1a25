package sandbox

// Reset in place (POST /v1/sandboxes/{id}/reset): the sandbox returns to
// its template version or to a snapshot of its tenant, keeping its id,
// network namespace and policy, secrets, env, metadata, previews and
// expires_at. A running sandbox on a driver.RootResetter (runc) is reset
// in place: every process but its agent is killed and the agent's root is
// swapped for the new layers, nothing else is made again. Otherwise (a
// paused sandbox, a memory snapshot, gVisor, or an in-place reset that
// failed) the driver's sandbox is destroyed and created again with the
// same id over the new layers, joining the same prepared namespace
// (driver.Spec.NetNSPath): the network, the record and the slot are not
// made again.
//
// The in-memory sandbox (*Live) is replaced by a new one: the old one is
// gone for everything that held it (its execs end killed, code
// api.ExecCodeSandboxReset; its agent connection and code contexts end),
// and lookups by id find the new one.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/redact"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/tracing"
)

// auditReset is the audit event of a reset.
const auditReset = "reset"

// attachmentOf is what a reset needs of the network backend: the
// namespace and resolver of a sandbox's existing network.
type attachmentOf interface {
	AttachmentOf(id string) (NetAttachment, bool)
}

// AttachmentOf returns sandbox id's network attachment, if it has one.
func (n netManager) AttachmentOf(id string) (NetAttachment, bool) {
	a, ok := n.Manager.Attachment(id)
	if !ok {
		return NetAttachment{}, false
	}
	return NetAttachment{NetNSPath: a.NetNSPath(), ResolvConfPath: a.ResolvConfPath()}, true
}

// Reset returns sandbox id to its template version (req.Snapshot empty)
// or to snapshot req.Snapshot of its tenant, and answers once it is
// running and ready again.
func (m *Service) Reset(ctx context.Context, p auth.Principal, id string, req api.ResetRequest) (_ api.Sandbox, err error) {
	ctx, span := tracing.StartSpan(ctx, "manager.reset", id)
	defer func() { tracing.EndSpan(span, err) }()
	sb, err := m.LiveSandbox(ctx, p, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	select {
	case <-sb.ready:
	case <-ctx.Done():
		return api.Sandbox{}, ctx.Err()
	}
	sb.opMu.Lock()
	defer sb.opMu.Unlock()
	if sb.isGone() {
		// Replaced by a reset that ran meanwhile, or stopped.
		return api.Sandbox{}, public(errdefs.ErrConflict, "sandbox changed while the reset waited: retry")
	}
	switch st := sb.state(); st {
	case api.StateRunning, api.StatePaused:
	default:
		return api.Sandbox{}, public(errdefs.ErrInvalidState, "sandbox is %s", st)
	}
	rec := sb.snapshot()
	var sp Spec
	if err := json.Unmarshal(rec.Spec, &sp); err != nil {
		return api.Sandbox{}, fmt.Errorf("sandbox spec: %w", err)
	}
	// What it returns to, held against layer collection until the record
	// names it.
	var (
		resolved   template.Resolved
		restoreDir string
		release    func()
		snapID     string
	)
	if req.Snapshot != "" {
		if _, _, err := m.layers(); err != nil {
			return api.Sandbox{}, err
		}
		// The sandbox's tenant's, whoever asks (an admin too): a snapshot
		// never crosses tenants.
		sn, err := m.usableSnapshot(ctx, sb.tenant, req.Snapshot)
		if err != nil {
			return api.Sandbox{}, err
		}
		if sn.Memory {
			var ss snapshotSpec
			_ = json.Unmarshal(sn.Spec, &ss)
			if sn.Runtime != sb.drv.Name() || ss.Resources != sp.Resources {
				return api.Sandbox{}, public(errInvalid, "a memory snapshot restores only on its runtime (%s) with its resources", sn.Runtime)
			}
		}
		if resolved, restoreDir, release, err = m.resolveSnapshot(ctx, sn); err != nil {
			return api.Sandbox{}, err
		}
		snapID = sn.ID
	} else {
		ref := rec.Template + "@" + strconv.Itoa(rec.TemplateVersion)
		resolved, release, err = m.tmpl.Resolve(ctx, rec.Tenant, rec.Template, rec.TemplateVersion, ref, false)
		if err != nil {
			return api.Sandbox{}, err
		}
	}
	defer func() {
		if release != nil {
			release()
		}
	}()
	dspec := driver.Spec{
		ID: sb.id, Template: resolved.Template,
		Resources: driver.Resources{
			CPU: sp.Resources.CPU, MemoryMB: sp.Resources.MemoryMB, DiskMB: sp.Resources.DiskMB,
			PIDs: sp.Resources.PIDs, DiskTmpfs: sp.Resources.DiskTmpfs,
		},
		Hostname:     strings.ReplaceAll(sb.id, "_", "-"),
		SecretsTmpfs: sp.SecretsAsFiles,
	}
	if m.net != nil && sp.NetNS {
		an, ok := m.net.(attachmentOf)
		if !ok {
			return api.Sandbox{}, public(errdefs.ErrCapabilityUnsupported, "reset is not available with this network backend")
		}
		att, ok := an.AttachmentOf(sb.id)
		if !ok {
			return api.Sandbox{}, public(errdefs.ErrInvalidState, "the sandbox's network is gone")
		}
		dspec.NetNSPath, dspec.ResolvConfPath = att.NetNSPath, att.ResolvConfPath
	}
	var fileSecrets map[string]string
	if sp.SecretsAsFiles && len(rec.Secrets) > 0 {
		if fileSecrets, err = m.sealer.open(sb.id, rec.Secrets); err != nil {
			return api.Sandbox{}, fmt.Errorf("opening sealed secrets: %w", err)
		}
	}

	// A sandbox paused to disk runs again: its cpu and memory must fit
	// the tenant's quota again.
	if err := m.readmit(ctx, sb); err != nil {
		clear(fileSecrets)
		return api.Sandbox{}, err
	}
	// From here the old processes go: the reset runs to its end whatever
	// the client does.
	cctx, cancel := cleanupCtx(ctx)
	defer cancel()
	m.meter.Sample(cctx, sb)
	// Starting until its agent answers again, as a create: the liveness
	// sweep and crash checks leave a starting sandbox alone (its driver
	// sandbox is gone for a moment), and requests to it wait or are
	// refused (409) instead of reaching a half-made sandbox.
	nrec := rec
	nrec.State = api.StateStarting
	sb.envMu.RLock()
	nb := &Live{
		id: sb.id, tenant: sb.tenant, drv: sb.drv, m: m, rec: nrec, ready: make(chan struct{}),
		secrets: maps.Clone(sb.secrets), env: maps.Clone(sb.env), red: sb.red, gone: make(chan struct{}),
		tmplUser: sb.tmplUser, tmplWorkdir: sb.tmplWorkdir,
	}
	sb.envMu.RUnlock()
	if nb.red == nil {
		nb.red = redact.New(nil)
	}
	nb.resOnce.Do(func() { nb.res = sp.Resources })
	nb.opMu.Lock()
	defer nb.opMu.Unlock()
	defer close(nb.ready)
	m.retire(sb, nb)

	err = m.resetDriver(cctx, nb, dspec, restoreDir, rec.State == api.StatePaused, snapID)
	if err == nil && sp.SecretsAsFiles {
		err = m.writeSecretFiles(cctx, nb, fileSecrets)
	}
	clear(fileSecrets)
	release()
	release = nil
	if err != nil {
		m.log.Warn("sandbox reset failed", "sandbox_id", sb.id, "err", err)
		if nb.state() == api.StateStarting {
			// Ended as a crash (state error, cleaned), which starts from running.
			if serr := nb.setState(cctx, api.StateRunning, nil); serr != nil {
				m.log.Error("recording failed reset", "sandbox_id", sb.id, "err", serr)
			}
		}
		nb.opMu.Unlock()
		m.crashed(cctx, nb, "the sandbox could not be started again after a reset")
		nb.opMu.Lock()
		return api.Sandbox{}, &PublicError{Msg: "reset failed: the sandbox could not be started again", Err: fmt.Errorf("%w: %w", errdefs.ErrInternal, err)}
	}
	if c := resolved.Config; restoreDir == "" && (c.StartCmd != "" || c.ReadyCmd != "") {
		if err := m.execs.StartTemplate(cctx, nb, c); err != nil {
			m.log.Warn("sandbox reset failed: template start", "sandbox_id", sb.id, "err", err)
			nb.opMu.Unlock()
			m.crashed(cctx, nb, "the template's start command failed after a reset")
			nb.opMu.Lock()
			return api.Sandbox{}, createError(err)
		}
	}
	m.recordEvent(ctx, nb, auditReset, map[string]any{"snapshot": snapID, "template": rec.Template, "template_version": rec.TemplateVersion})
	m.log.Info("sandbox reset", "sandbox_id", sb.id, "tenant", sb.tenant, "snapshot", snapID)
	return m.view(nb.snapshot()), nil
}

// retire replaces live sandbox old by nb (same id): old is gone for
// everyone holding it (its execs end killed with code sandbox_reset), and
// lookups find nb. old's record copy is marked stopped so that nothing
// still holding it acts on the sandbox (a crash check, a stop).
func (m *Service) retire(old, nb *Live) {
	old.mu.Lock()
	old.rec.State = api.StateStopped
	old.mu.Unlock()
	code := api.ExecCodeSandboxReset
	old.crashCode.Store(&code)
	old.markGone()
	old.closeClient()
	m.mu.Lock()
	m.live[nb.id] = nb
	m.mu.Unlock()
	m.owners.Gone(old)
	m.owners.Live(nb)
}

// resetDriver destroys nb's driver sandbox and creates and starts (or
// restores) it again from dspec, recording the new handle, the snapshot
// it now runs on and state running.
func (m *Service) resetDriver(ctx context.Context, nb *Live, dspec driver.Spec, restoreDir string, paused bool, snapID string) error {
	// In place where the driver can: the init stays, its root is swapped
	// (a running sandbox onto layers; a memory image is restored by a
	// new runtime process).
	if rr, ok := nb.drv.(driver.RootResetter); ok && restoreDir == "" && !paused {
		err := rr.ResetRoot(ctx, nb.id, dspec.Template)
		if err == nil {
			if err := m.agentReady(ctx, nb); err != nil {
				return err
			}
			return nb.setState(ctx, api.StateRunning, func(r *store.Sandbox) {
				r.SnapshotID, r.DesiredState = snapID, api.StateRunning
			})
		}
		if !errors.Is(err, errdefs.ErrNotImplemented) {
			// Its processes may be gone already: a destroy and a create
			// (below) give the same result the slow way.
			m.log.Warn("reset in place failed; destroying and creating the sandbox instead", "sandbox_id", nb.id, "err", err)
		}
	}
	if err := nb.drv.Destroy(ctx, nb.id); err != nil {
		return fmt.Errorf("driver destroy: %w", err)
	}
	h, err := nb.drv.Create(ctx, dspec)
	if err != nil {
		return fmt.Errorf("driver create: %w", err)
	}
	hj, err := json.Marshal(h)
	if err != nil {
		return err
	}
	// The new handle is stored before the runtime starts (a restarted
	// daemon finds what runs), with state starting.
	if err := nb.update(ctx, func(r *store.Sandbox) { r.Handle = hj }); err != nil {
		return err
	}
	if restoreDir != "" {
		ck, ok := nb.drv.(driver.Checkpointer)
		if !ok {
			return public(errdefs.ErrCapabilityUnsupported, "runtime %s cannot restore a memory snapshot", nb.drv.Name())
		}
		if err := ck.Restore(ctx, nb.id, restoreDir); err != nil {
			return fmt.Errorf("driver restore: %w", err)
		}
	} else if err := nb.drv.Start(ctx, nb.id); err != nil {
		return fmt.Errorf("driver start: %w", err)
	}
	if err := m.agentReady(ctx, nb); err != nil {
		return err
	}
	return nb.setState(ctx, api.StateRunning, func(r *store.Sandbox) {
		r.SnapshotID, r.DesiredState = snapID, api.StateRunning
		if paused {
			m.unpause(r)
		}
	})
}
