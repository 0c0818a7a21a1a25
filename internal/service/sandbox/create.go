package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
	"github.com/airlockhq/airlock/internal/redact"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/tracing"
)

// knownRuntimes are the runtime names of the API. Asking for one of them
// that this host lacks is runtime_unavailable; any other name is invalid.
var knownRuntimes = []string{"runc", "gvisor", "microvm", "kubernetes"}

var (
	errInvalid     = errdefs.ErrInvalidArgument
	errUnavailable = errdefs.ErrUnavailable
)

var (
	envNameRE     = lazyregexp.New(`^[A-Za-z_][A-Za-z0-9_]{0,255}$`)
	metaKeyRE     = lazyregexp.New(`^[A-Za-z0-9_.\-]{1,128}$`)
	templateRE    = lazyregexp.New(`^([a-z0-9][a-z0-9._-]{0,63})(?:@([0-9]{1,9}))?$`)
	idempotencyRE = lazyregexp.New(`^[\x21-\x7e]{1,255}$`)
)

// Limits on request sizes that config does not cover.
const (
	maxEnvVars      = 256
	maxMetadataKeys = 64
	maxMetaValueLen = 1024
)

// Spec is the normalized create request as stored (secrets excluded).
type Spec struct {
	Template  string            `json:"template"`
	Runtime   string            `json:"runtime"`
	Resources api.Resources     `json:"resources"`
	TimeoutS  int64             `json:"timeout_s"`
	Env       map[string]string `json:"env,omitempty"`
	Secrets   []string          `json:"secret_names,omitempty"`
	// SecretsAsFiles: the secrets are files in /run/secrets, not exec env.
	SecretsAsFiles bool        `json:"secrets_as_files,omitempty"`
	Network        api.Network `json:"network"`
	// NetNS is set when the sandbox joined a namespace of the network
	// backend (every sandbox of a daemon with one); sandboxes of a daemon
	// without it have their runtime's own, which nothing can change.
	NetNS bool `json:"netns,omitempty"`
	// Workdir and User are the template's WORKDIR and USER: the cwd and
	// user of an exec, PTY or code context that names none.
	Workdir string `json:"workdir,omitempty"`
	User    string `json:"user,omitempty"`
}

// execDefaults fills in the user and cwd of an exec that names none: the
// template's USER and WORKDIR (as docker exec does), else the default
// user, whose home the agent picks ("" cwd).
func (sb *Live) execDefaults(user, cwd string) (string, string) {
	if user == "" {
		user = sb.tmplUser
	}
	if user == "" {
		user = agentproto.DefaultUser
	}
	if cwd == "" {
		cwd = sb.tmplWorkdir
	}
	return user, cwd
}

// setExecDefaults takes the template's WORKDIR and USER from the stored
// spec; values that an exec request could not name are ignored.
func (sb *Live) setExecDefaults(sp Spec) {
	if userRE.MatchString(sp.User) {
		sb.tmplUser = sp.User
	}
	if strings.HasPrefix(sp.Workdir, "/") && !strings.ContainsRune(sp.Workdir, 0) {
		sb.tmplWorkdir = sp.Workdir
	}
}

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
	sp, drv, err := m.validateCreate(req)
	if err != nil {
		return CreateResult{}, err
	}
	if o := m.cfg.Observer; o != nil {
		start := time.Now()
		defer func() { o.CreateDone(drv.Name(), time.Since(start), err == nil) }()
	}
	if sp.Network, err = m.policy.For(ctx, p, req.Network, drv); err != nil {
		return CreateResult{}, err
	}
	ref, version, err := parseTemplateRef(sp.Template)
	if err != nil {
		return CreateResult{}, err
	}
	resolved, releaseTemplate, err := m.tmpl.Resolve(ctx, p.Tenant, ref, version, sp.Template, req.WaitForTemplate)
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
	err = m.bringUp(cctx, sb, sp, tmpl, req.Secrets)
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
	if c := resolved.Config; c.StartCmd != "" || c.ReadyCmd != "" {
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
	m.recordEvent(ctx, sb, audit.TypeCreate, map[string]any{
		"template": tmpl.Name, "template_version": tmpl.Version, "runtime": drv.Name(), "resources": sp.Resources,
		"timeout_s": sp.TimeoutS, "network": sp.Network, "secret_names": sp.Secrets, "ready_ms": readyMS,
	})
	return CreateResult{Sandbox: m.view(sb.snapshot())}, nil
}

// bringUp runs the driver's create and start and waits for the agent.
// With sp.SecretsAsFiles it then writes secrets into the sandbox as files.
func (m *Service) bringUp(ctx context.Context, sb *Live, sp Spec, tmpl driver.Template, secrets map[string]string) error {
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
	sctx, span := tracing.StartSpan(ctx, "driver.start", sb.id)
	err = sb.drv.Start(sctx, sb.id)
	tracing.EndSpan(span, err)
	if err != nil {
		return fmt.Errorf("driver start: %w", err)
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
	c, err := sb.agent(ctx)
	if err != nil {
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

// validateCreate checks req against the limits and fills defaults.
func (m *Service) validateCreate(req api.CreateSandboxRequest) (Spec, driver.Driver, error) {
	s := m.settings
	// The durable sandboxes' fields are in the contract (docs/lifecycle.md)
	// before they are served: refused, never silently ignored (a create
	// "from a snapshot" that started from the template would lose data).
	switch {
	case req.Snapshot != "":
		return Spec{}, nil, public(errdefs.ErrCapabilityUnsupported, "creating from a snapshot is not available on this server yet")
	case req.Pool != "":
		return Spec{}, nil, public(errdefs.ErrCapabilityUnsupported, "warm pools are not available on this server yet")
	case req.Lifecycle != nil && (req.Lifecycle.OnTimeout != "" && req.Lifecycle.OnTimeout != api.OnTimeoutKill ||
		req.Lifecycle.AutoResume != nil && *req.Lifecycle.AutoResume || req.Lifecycle.IdleTimeoutS != nil):
		return Spec{}, nil, public(errdefs.ErrCapabilityUnsupported, "lifecycle rules other than on_timeout kill are not available on this server yet")
	}
	sp := Spec{Template: req.Template, Runtime: req.Runtime, TimeoutS: s.DefaultTimeoutS}
	if sp.Template == "" {
		sp.Template = s.DefaultTemplate
	}
	if sp.Runtime == "" {
		sp.Runtime = s.DefaultRuntime
	}
	// Resources.
	d, mx := s.DefaultResources, s.MaxResources
	sp.Resources = api.Resources{CPU: d.CPU, MemoryMB: d.MemoryMB, DiskMB: d.DiskMB, PIDs: d.PIDs}
	if r := req.Resources; r != nil {
		if r.CPU < 0 || r.MemoryMB < 0 || r.DiskMB < 0 || r.PIDs < 0 {
			return sp, nil, public(errInvalid, "resources must not be negative")
		}
		if r.CPU > 0 {
			if r.CPU < 0.01 {
				return sp, nil, public(errInvalid, "resources.cpu must be at least 0.01")
			}
			sp.Resources.CPU = r.CPU
		}
		if r.MemoryMB > 0 {
			if r.MemoryMB < 16 {
				return sp, nil, public(errInvalid, "resources.memory_mb must be at least 16")
			}
			sp.Resources.MemoryMB = r.MemoryMB
		}
		if r.DiskMB > 0 {
			if r.DiskMB < 16 {
				return sp, nil, public(errInvalid, "resources.disk_mb must be at least 16")
			}
			sp.Resources.DiskMB = r.DiskMB
		}
		if r.PIDs > 0 {
			if r.PIDs < 8 {
				return sp, nil, public(errInvalid, "resources.pids must be at least 8")
			}
			sp.Resources.PIDs = r.PIDs
		}
		sp.Resources.DiskTmpfs = r.DiskTmpfs
	}
	switch {
	case sp.Resources.CPU > mx.CPU:
		return sp, nil, public(errInvalid, "resources.cpu %g exceeds the maximum %g", sp.Resources.CPU, mx.CPU)
	case sp.Resources.MemoryMB > mx.MemoryMB:
		return sp, nil, public(errInvalid, "resources.memory_mb %d exceeds the maximum %d", sp.Resources.MemoryMB, mx.MemoryMB)
	case sp.Resources.DiskMB > mx.DiskMB:
		return sp, nil, public(errInvalid, "resources.disk_mb %d exceeds the maximum %d", sp.Resources.DiskMB, mx.DiskMB)
	case sp.Resources.PIDs > mx.PIDs:
		return sp, nil, public(errInvalid, "resources.pids %d exceeds the maximum %d", sp.Resources.PIDs, mx.PIDs)
	}
	// Timeout.
	if req.TimeoutS != nil {
		t := *req.TimeoutS
		if t < 1 || t > s.MaxTimeoutS {
			return sp, nil, public(errInvalid, "timeout_s must be between 1 and %d", s.MaxTimeoutS)
		}
		sp.TimeoutS = t
	}
	// Env and secrets.
	if len(req.Env)+len(req.Secrets) > maxEnvVars {
		return sp, nil, public(errInvalid, "at most %d env variables and secrets", maxEnvVars)
	}
	size := 0
	for _, kv := range []map[string]string{req.Env, req.Secrets} {
		for k, v := range kv {
			if err := ValidEnv(k, v); err != nil {
				return sp, nil, err
			}
			size += len(k) + len(v)
		}
	}
	if size > s.MaxEnvBytes {
		return sp, nil, public(errInvalid, "env and secrets exceed %d bytes", s.MaxEnvBytes)
	}
	for k := range req.Secrets {
		if req.SecretsAsFiles && !secretFileRE.MatchString(k) {
			return sp, nil, public(errInvalid, "secret name %q is not a valid file name (want %s)", truncate(k, 64), secretFileRE)
		}
		sp.Secrets = append(sp.Secrets, k)
	}
	sp.SecretsAsFiles = req.SecretsAsFiles
	sort.Strings(sp.Secrets)
	sp.Env = req.Env
	// Metadata.
	if len(req.Metadata) > maxMetadataKeys {
		return sp, nil, public(errInvalid, "at most %d metadata keys", maxMetadataKeys)
	}
	size = 0
	for k, v := range req.Metadata {
		if !metaKeyRE.MatchString(k) {
			return sp, nil, public(errInvalid, "metadata key %q must match %s", truncate(k, 64), metaKeyRE)
		}
		if len(v) > maxMetaValueLen {
			return sp, nil, public(errInvalid, "metadata value of %q exceeds %d bytes", k, maxMetaValueLen)
		}
		size += len(k) + len(v)
	}
	if size > s.MaxMetadataBytes {
		return sp, nil, public(errInvalid, "metadata exceeds %d bytes", s.MaxMetadataBytes)
	}
	// Features this version does not have yet: refuse rather than ignore.
	if len(req.Volumes) > 0 {
		return sp, nil, public(errInvalid, "volumes are not supported yet")
	}
	if req.AutoPause {
		return sp, nil, public(errInvalid, "auto_pause is not supported yet")
	}
	if _, _, err := parseTemplateRef(sp.Template); err != nil {
		return sp, nil, err
	}
	// Runtime: a known name the host lacks is unavailable, never a fallback.
	known := false
	for _, k := range knownRuntimes {
		known = known || k == sp.Runtime
	}
	if !known {
		return sp, nil, public(errInvalid, "unknown runtime %q (want one of %s)", truncate(sp.Runtime, 32), strings.Join(knownRuntimes, ", "))
	}
	// Absent (or undetected: not installed, needs root) is permanent, a
	// 400; unhealthy may recover at the next probe, a 503 with Retry-After.
	drv, ok := m.drivers[sp.Runtime]
	if !ok {
		return sp, nil, public(errdefs.ErrRuntimeAbsent, "runtime %s is not available on this host", sp.Runtime)
	}
	switch h := m.refreshHealth(context.Background(), false)[sp.Runtime]; h.State {
	case driver.HealthHealthy:
	case driver.HealthUndetected:
		return sp, nil, public(errdefs.ErrRuntimeAbsent, "runtime %s is not available on this host", sp.Runtime)
	default:
		return sp, nil, public(errdefs.ErrRuntimeUnavailable, "runtime %s is not usable on this host now", sp.Runtime)
	}
	// The network (it may come from the tenant's default) is settled by
	// Policy.For.
	return sp, drv, nil
}

// ValidEnv checks an environment variable a request gives (a create's,
// an exec's): a variable name that is not the exec id's, a value without
// NUL.
func ValidEnv(k, v string) error {
	if !envNameRE.MatchString(k) {
		return public(errInvalid, "env name %q is not a valid variable name", truncate(k, 64))
	}
	if k == agentproto.ExecIDEnv {
		return public(errInvalid, "env name %s is reserved", k)
	}
	if strings.IndexByte(v, 0) >= 0 {
		return public(errInvalid, "env value of %s contains a NUL byte", k)
	}
	return nil
}

// parseTemplateRef splits "name" or "name@N".
func parseTemplateRef(ref string) (string, int, error) {
	m := templateRE.FindStringSubmatch(ref)
	if m == nil {
		return "", 0, public(errInvalid, "template %q must be a name or name@version", truncate(ref, 64))
	}
	v := 0
	if m[2] != "" {
		n, err := strconv.Atoi(m[2])
		if err != nil || n < 1 {
			return "", 0, public(errInvalid, "template version must be at least 1")
		}
		v = n
	}
	return m[1], v, nil
}

// requestHash identifies a create request for idempotency. Secret values
// are left out (only their names count): a hash of a weak secret could be
// guessed offline.
func requestHash(req api.CreateSandboxRequest) string {
	names := make([]string, 0, len(req.Secrets))
	for k := range req.Secrets {
		names = append(names, k)
	}
	sort.Strings(names)
	req.Secrets = nil
	req.WaitForTemplate = false // how to wait is not what is created
	b, _ := json.Marshal(struct {
		Req     api.CreateSandboxRequest `json:"req"`
		Secrets []string                 `json:"secrets"`
	}{req, names})
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func newSandboxID() string { return auth.RandomID("sbx_", 15) }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
