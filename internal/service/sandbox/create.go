package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/redact"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/tracing"
)

var (
	errInvalid     = errdefs.ErrInvalidArgument
	errUnavailable = errdefs.ErrUnavailable
)

// CreateResult is a created (or, for an idempotent retry, found) sandbox.
type CreateResult struct {
	Sandbox api.Sandbox
	// Replayed is true when an Idempotency-Key matched an earlier create.
	Replayed bool
}

// Create validates req, starts a sandbox for p's tenant and returns it once
// its agent answered. idemKey is the Idempotency-Key header ("" for none).
// On any failure nothing of the sandbox is left running.
func (m *Service) Create(ctx context.Context, p auth.Principal, req api.CreateSandboxRequest, idemKey string) (_ CreateResult, err error) {
	ctx, span := tracing.StartSpan(ctx, "manager.create", "")
	defer func() { tracing.EndSpan(span, err) }()
	// A create from a snapshot takes its template, runtime and resources
	// unless the request names them (snapshot_create.go).
	var snap *store.Snapshot
	if req.Snapshot != "" {
		sn, err := m.snapshotDefaults(ctx, p, &req)
		if err != nil {
			return CreateResult{}, err
		}
		snap = &sn
	}
	sp, drv, err := m.validateCreate(req)
	if err != nil {
		return CreateResult{}, err
	}
	// A warm pool member, when one matches (pool.go); never for a create
	// from a snapshot, whose files no member has.
	if snap == nil {
		if res, ok, err := m.claim(ctx, p, req, idemKey); ok || err != nil {
			return res, err
		}
	}
	if o := m.cfg.Observer; o != nil {
		start := time.Now()
		defer func() { o.CreateDone(drv.Name(), time.Since(start), err == nil) }()
	}
	if sp.Network, err = m.policy.For(ctx, p, req.Network, drv); err != nil {
		return CreateResult{}, err
	}
	var (
		resolved        template.Resolved
		releaseTemplate func()
		restoreDir      string
	)
	if snap != nil {
		resolved, restoreDir, releaseTemplate, err = m.resolveSnapshot(ctx, *snap)
	} else {
		ref, version, perr := parseTemplateRef(sp.Template)
		if perr != nil {
			return CreateResult{}, perr
		}
		resolved, releaseTemplate, err = m.tmpl.Resolve(ctx, p.Tenant, ref, version, sp.Template, req.WaitForTemplate)
	}
	if err != nil {
		return CreateResult{}, err
	}
	// Until the record below is stored, the template's layers are held
	// against garbage collection; released once, on every path.
	var released bool
	release := func() {
		if !released {
			released = true
			releaseTemplate()
		}
	}
	defer release()
	tmpl := resolved.Template
	// The template's ENV is the sandbox's env, under the request's own; it
	// is stored with the spec, so a restarted daemon keeps injecting it.
	sp.Env = mergeEnv(resolved.Config.Env, sp.Env)
	// Package managers use airlock's registry mirror (cached, audited) when
	// the policy allows registries; the template's and the request's own
	// variables win.
	sp.Env = mergeEnv(m.policy.PackageEnv(sp.Network), sp.Env)
	// Its WORKDIR and USER are the execs' defaults, kept with the spec too.
	sp.Workdir, sp.User = resolved.Config.Workdir, resolved.Config.User
	var idem *store.Idempotency
	if idemKey != "" {
		if !idempotencyRE.MatchString(idemKey) {
			return CreateResult{}, public(errInvalid, "idempotency key must be 1-255 printable ascii characters")
		}
		idem = &store.Idempotency{Key: idemKey, RequestHash: requestHash(req)}
	}

	sp.NetNS = m.net != nil
	now := m.now().UTC()
	id := newSandboxID()
	sealed, err := m.sealer.seal(id, req.Secrets)
	if err != nil {
		return CreateResult{}, fmt.Errorf("sealing secrets: %w", err)
	}
	specJSON, err := json.Marshal(sp)
	if err != nil {
		return CreateResult{}, err
	}
	rec := store.Sandbox{
		ID: id, Tenant: p.Tenant, State: api.StateStarting, DesiredState: api.StateRunning,
		Spec: specJSON, Secrets: sealed, Template: tmpl.Name, TemplateVersion: tmpl.Version, Runtime: drv.Name(),
		CreatedAt: now, ExpiresAt: now.Add(time.Duration(sp.TimeoutS) * time.Second), TimeoutS: sp.TimeoutS,
		Metadata: req.Metadata,
	}
	if snap != nil {
		rec.SnapshotID = snap.ID
	}
	applyLifecycle(&rec, normalizeLifecycle(req))
	sb := &Live{
		id: id, tenant: p.Tenant, drv: drv, m: m, rec: rec, ready: make(chan struct{}),
		secrets: envSecrets(sp, req.Secrets), env: sp.Env, red: redact.New(req.Secrets),
		gone: make(chan struct{}),
	}
	sb.setExecDefaults(sp)

	sb.resOnce.Do(func() { sb.res = sp.Resources })
	quota, err := m.quotas.Quota(ctx, p.Tenant)
	if err != nil {
		return CreateResult{}, err
	}

	// Reserve a slot: check capacity and quota and insert the record under
	// m.mu so that concurrent creates cannot overshoot.
	m.mu.Lock()
	if len(m.live) >= m.settings.MaxSandboxes {
		m.mu.Unlock()
		return m.refuseOrReplay(ctx, p, idem, &PublicError{Msg: "host is at capacity, retry later", RetryAfter: retryAfterCapacity, Err: errdefs.ErrCapacityExhausted})
	}
	if err := m.admitLocked(p.Tenant, quota, sp.Resources); err != nil {
		m.mu.Unlock()
		return m.refuseOrReplay(ctx, p, idem, err)
	}
	existing, err := m.store.CreateSandbox(ctx, rec, idem)
	if err == nil {
		m.live[id] = sb
		m.owners.Live(sb)
	}
	m.mu.Unlock()
	if err == nil && existing == nil && snap != nil {
		// The record keeps the snapshot's layers from here on, unless the
		// snapshot was deleted and purged before it was stored.
		if gerr := m.snapshotStillThere(ctx, snap.ID); gerr != nil {
			release()
			m.failCreate(ctx, sb, gerr, idem)
			close(sb.ready)
			return CreateResult{}, gerr
		}
	}
	release() // the record now keeps the template version alive
	if existing != nil {
		return m.replay(ctx, p, existing, idem)
	}
	if err != nil {
		return CreateResult{}, err
	}

	if span.IsRecording() {
		span.SetAttributes(attribute.String("airlock.sandbox_id", id), attribute.String("airlock.runtime", drv.Name()))
	}
	log := m.log.With("sandbox_id", id, "tenant", p.Tenant, "driver", drv.Name())
	// The client going away must not leave a half-made sandbox, and an
	// idempotent retry should find the finished one: so the create runs to
	// its end on its own deadline, whatever happens to the request.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.CreateTimeout)
	defer cancel()
	start := m.now()
	err = m.bringUp(cctx, sb, sp, tmpl, req.Secrets, restoreDir)
	if err != nil {
		log.Warn("sandbox create failed", "err", err)
		m.failCreate(cctx, sb, err, idem)
		close(sb.ready)
		return CreateResult{}, createError(err)
	}
	readyMS := m.now().Sub(start).Milliseconds()
	err = sb.setState(cctx, api.StateRunning, func(r *store.Sandbox) {
		r.ReadyMS = readyMS
		r.ExpiresAt = m.now().UTC().Add(time.Duration(r.TimeoutS) * time.Second)
	})
	if err != nil {
		log.Error("sandbox create failed", "err", err)
		m.failCreate(cctx, sb, err, idem)
		close(sb.ready)
		return CreateResult{}, err
	}
	if c := resolved.Config; restoreDir == "" && (c.StartCmd != "" || c.ReadyCmd != "") {
		// The template's process runs (and answers its ready check) before
		// the sandbox is reported ready; it is an exec like any other, so
		// the sandbox must be running for it.
		if err := m.execs.StartTemplate(cctx, sb, c); err != nil {
			log.Warn("sandbox create failed: template start", "err", err)
			m.failCreate(cctx, sb, err, idem)
			close(sb.ready)
			return CreateResult{}, createError(err)
		}
		readyMS = m.now().Sub(start).Milliseconds()
		if err := sb.update(cctx, func(r *store.Sandbox) { r.ReadyMS = readyMS }); err != nil {
			log.Warn("recording ready time", "err", err)
		}
	}
	close(sb.ready)
	log.Info("sandbox created", "template", tmpl.Name, "template_version", tmpl.Version, "ready_ms", readyMS, "network", sp.Network.Mode)
	detail := map[string]any{
		"template": tmpl.Name, "template_version": tmpl.Version, "runtime": drv.Name(), "resources": sp.Resources,
		"timeout_s": sp.TimeoutS, "network": sp.Network, "secret_names": sp.Secrets, "ready_ms": readyMS,
	}
	if snap != nil {
		detail["snapshot"] = snap.ID
	}
	m.recordEvent(ctx, sb, audit.TypeCreate, detail)
	return CreateResult{Sandbox: m.view(sb.snapshot())}, nil
}

// bringUp runs the driver's create and start (restoreDir set: its
// Restore of that memory image instead) and waits for the agent. With
// sp.SecretsAsFiles it then writes secrets into the sandbox as files.
func (m *Service) bringUp(ctx context.Context, sb *Live, sp Spec, tmpl driver.Template, secrets map[string]string, restoreDir string) error {
	dspec := driver.Spec{
		ID:       sb.id,
		Template: tmpl,
		Resources: driver.Resources{
			CPU: sp.Resources.CPU, MemoryMB: sp.Resources.MemoryMB, DiskMB: sp.Resources.DiskMB,
			PIDs: sp.Resources.PIDs, DiskTmpfs: sp.Resources.DiskTmpfs,
		},
		Hostname:     strings.ReplaceAll(sb.id, "_", "-"),
		SecretsTmpfs: sp.SecretsAsFiles,
	}
	// The namespace first: the runtime joins it. failCreate tears it down.
	nctx, span := tracing.StartSpan(ctx, "network.setup", sb.id)
	err := m.setupNetwork(nctx, sb, sp.Network, &dspec)
	tracing.EndSpan(span, err)
	if err != nil {
		return err
	}
	dctx, span := tracing.StartSpan(ctx, "driver.create", sb.id)
	h, err := sb.drv.Create(dctx, dspec)
	tracing.EndSpan(span, err)
	if err != nil {
		return fmt.Errorf("driver create: %w", err)
	}
	hj, err := json.Marshal(h)
	if err != nil {
		return err
	}
	if err := sb.update(ctx, func(r *store.Sandbox) { r.Handle = hj }); err != nil {
		return err
	}
	if restoreDir != "" {
		ck, ok := sb.drv.(driver.Checkpointer)
		if !ok {
			return public(errdefs.ErrCapabilityUnsupported, "runtime %s cannot restore a memory snapshot", sb.drv.Name())
		}
		rctx, span := tracing.StartSpan(ctx, "driver.restore", sb.id)
		err = ck.Restore(rctx, sb.id, restoreDir)
		tracing.EndSpan(span, err)
		if err != nil {
			return fmt.Errorf("driver restore: %w", err)
		}
	} else {
		sctx, span := tracing.StartSpan(ctx, "driver.start", sb.id)
		err = sb.drv.Start(sctx, sb.id)
		tracing.EndSpan(span, err)
		if err != nil {
			return fmt.Errorf("driver start: %w", err)
		}
	}
	actx, span := tracing.StartSpan(ctx, "agent.ready", sb.id)
	err = m.agentReady(actx, sb)
	tracing.EndSpan(span, err)
	if err != nil || !sp.SecretsAsFiles {
		return err
	}
	wctx, span := tracing.StartSpan(ctx, "agent.secret_files", sb.id)
	err = m.writeSecretFiles(wctx, sb, secrets)
	tracing.EndSpan(span, err)
	return err
}

// agentReady connects to the sandbox's agent and waits for its answer.
func (m *Service) agentReady(ctx context.Context, sb *Live) error {
	c, dialled, err := sb.agentDialled(ctx)
	if err != nil || dialled {
		// A new connection's handshake was the answer (a round trip that
		// costs a gVisor sandbox's start milliseconds).
		return err
	}
	if err := c.Ping(ctx); err != nil {
		return fmt.Errorf("agent ping: %w", err)
	}
	return nil
}

// failCreate tears down a sandbox whose create failed and records why.
func (m *Service) failCreate(ctx context.Context, sb *Live, cause error, idem *store.Idempotency) {
	cctx, cancel := cleanupCtx(ctx)
	defer cancel()
	sb.markGone()
	sb.closeClient()
	if err := sb.drv.Destroy(cctx, sb.id); err != nil {
		m.log.Error("destroying failed sandbox", "sandbox_id", sb.id, "err", err)
	} else if err := m.teardownNetwork(cctx, sb.id); err != nil {
		// Deleting the sandbox (state error) tries again.
		m.log.Error("removing failed sandbox's network", "sandbox_id", sb.id, "err", err)
	}
	now := m.now().UTC()
	code, msg := stateErrorOf(cause)
	m.recordEvent(ctx, sb, audit.TypeError, map[string]any{"op": "create", "code": code, "message": msg})
	if err := sb.setState(cctx, api.StateError, func(r *store.Sandbox) {
		r.DesiredState = api.StateStopped
		r.ErrorCode, r.ErrorMessage = code, msg
		r.EndedAt, r.EndReason = &now, "create_failed"
		r.Secrets = nil
	}); err != nil {
		m.log.Error("recording failed create", "sandbox_id", sb.id, "err", err)
	}
	if idem != nil {
		// A retry with the same key should try again, not replay a failure.
		if err := m.store.DeleteIdempotencyKey(cctx, sb.tenant, idem.Key); err != nil {
			m.log.Warn("forgetting idempotency key", "sandbox_id", sb.id, "err", err)
		}
	}
	m.owners.Gone(sb)
	m.mu.Lock()
	delete(m.live, sb.id)
	m.mu.Unlock()
	m.meter.Forget(sb.id)
	m.execs.Forget(sb.id)
}

// stateErrorOf turns an error into the {code, message} shown on a sandbox in
// state error: the public message when there is one, else a generic one.
func stateErrorOf(err error) (code, msg string) {
	var pe *PublicError
	if errors.As(err, &pe) {
		return codeOf(err), pe.Msg
	}
	return codeOf(err), "sandbox failed to start"
}

// codeOf returns the API error code of err's class.
func codeOf(err error) string {
	switch {
	case errors.Is(err, ErrTemplateNotFound):
		return api.CodeTemplateNotFound
	case errors.Is(err, errdefs.ErrQuotaExceeded):
		return api.CodeQuotaExceeded
	case errors.Is(err, errdefs.ErrCapacityExhausted):
		return api.CodeCapacityExhausted
	case errors.Is(err, errdefs.ErrRuntimeUnavailable):
		return api.CodeRuntimeUnavailable
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return api.CodeInvalidArgument
	}
	return api.CodeInternal
}

// createError is what the client of a failed create sees: runtime failures
// are internal errors with a generic message (the detail is logged).
func createError(err error) error {
	var pe *PublicError
	if errors.As(err, &pe) {
		return err
	}
	switch {
	case errors.Is(err, errdefs.ErrCapacityExhausted), errors.Is(err, errdefs.ErrQuotaExceeded),
		errors.Is(err, errdefs.ErrRuntimeUnavailable):
		return err
	}
	return &PublicError{Msg: "sandbox failed to start", Err: fmt.Errorf("%w: %w", errdefs.ErrInternal, err)}
}

// refuseOrReplay answers a create that capacity or quota refused: with the
// sandbox an earlier request with the same idempotency key made, if there
// is one (that sandbox may be what fills the quota, and a retry must not
// be told otherwise), else with refusal.
func (m *Service) refuseOrReplay(ctx context.Context, p auth.Principal, idem *store.Idempotency, refusal error) (CreateResult, error) {
	if idem == nil {
		return CreateResult{}, refusal
	}
	existing, err := m.store.IdempotencyKey(ctx, p.Tenant, idem.Key)
	if err != nil {
		m.log.Warn("looking up idempotency key", "tenant", p.Tenant, "err", err)
		return CreateResult{}, refusal
	}
	if existing == nil {
		return CreateResult{}, refusal
	}
	return m.replay(ctx, p, existing, idem)
}

// replay answers an idempotent retry: the sandbox the key created, once it
// is ready.
func (m *Service) replay(ctx context.Context, p auth.Principal, existing *store.IdempotencyRecord, idem *store.Idempotency) (CreateResult, error) {
	if existing.RequestHash != idem.RequestHash {
		return CreateResult{}, public(errdefs.ErrConflict, "idempotency key was used with a different request")
	}
	m.mu.Lock()
	sb := m.live[existing.SandboxID]
	m.mu.Unlock()
	if sb != nil {
		select {
		case <-sb.ready:
		case <-ctx.Done():
			return CreateResult{}, ctx.Err()
		}
	}
	rec, err := m.store.GetSandbox(ctx, existing.SandboxID, p.Tenant)
	if err != nil {
		return CreateResult{}, err
	}
	return CreateResult{Sandbox: m.view(rec), Replayed: true}, nil
}
