package sandbox

// Warm pools (issue 15, docs/pools.md): PUT /v1/pools/{name} keeps `size`
// members of a tenant's ready (pool_refill.go makes them in the
// background); a create that names or matches a pool claims one (claim)
// and applies the request to it before it answers.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
	"github.com/airlockhq/airlock/internal/redact"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/tracing"
)

// MaxPoolSize bounds one pool's size. A tenant's pools together are
// bounded by its quota too (members are its sandboxes), and by the host's
// capacity (they are live sandboxes of the host).
const MaxPoolSize = 32

var poolNameRE = lazyregexp.New(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// checkPoolFields checks a create's pool fields.
func checkPoolFields(req api.CreateSandboxRequest) error {
	if req.Pool != "" && !poolNameRE.MatchString(req.Pool) {
		return public(errInvalid, "pool %q must be 1 to 64 of [a-z0-9._-], starting with a letter or digit", truncate(req.Pool, 64))
	}
	return nil
}

// poolNotFound is the one error for a pool that does not exist or is
// another tenant's.
func poolNotFound(name string) error {
	return public(errdefs.ErrNotFound, "pool %q not found", truncate(name, 64))
}

// poolTenant is the tenant a pool request of p acts on: p's own, or for an
// admin key the one it names. A tenant key naming another tenant gets the
// not-found of a missing pool.
func poolTenant(p auth.Principal, tenant, name string) (string, error) {
	if tenant == "" || tenant == p.Tenant {
		return p.Tenant, nil
	}
	if !p.Admin {
		return "", poolNotFound(name)
	}
	return tenant, nil
}

// poolSpec normalises a pool's template, runtime and resources exactly as
// a create's: a member is what a create of them would be.
func (m *Service) poolSpec(template, runtime string, res *api.Resources) (Spec, driver.Driver, error) {
	return m.validateCreate(api.CreateSandboxRequest{Template: template, Runtime: runtime, Resources: res})
}

// poolMatches reports whether a create normalised into sp is one a member
// of pool (template, runtime and resources normalised the same way) can
// answer.
func poolMatches(pool store.Pool, sp Spec) bool {
	var res api.Resources
	if json.Unmarshal(pool.Resources, &res) != nil {
		return false
	}
	return pool.Template == sp.Template && pool.Runtime == sp.Runtime && res == sp.Resources
}

// memberNetwork is the network a member of a pool on drv starts with:
// mode none, or for a runtime that sees only the interfaces it had at
// start (gVisor) a wired namespace with every egress denied (an allowlist
// of nothing), which the claim opens as the request asks.
func (m *Service) memberNetwork(drv driver.Driver) (api.Network, error) {
	if !drv.Capabilities().InterfacesAtStart {
		return api.Network{Mode: "none"}, nil
	}
	if m.net == nil {
		return api.Network{}, public(errdefs.ErrCapabilityUnsupported,
			"pools on runtime %s need sandbox networking, which this server does not have", drv.Name())
	}
	n, err := m.policy.Check(api.Network{Mode: "allowlist"}, drv)
	if err != nil {
		return api.Network{}, public(errdefs.ErrCapabilityUnsupported, "pools on runtime %s are not available on this server", drv.Name())
	}
	return n, nil
}

// PutPool creates tenant's pool name (p's own tenant when tenant is "")
// or replaces its desired state. The refill makes or drains members in
// the background; members that no longer match, or are too many, are
// drained before it answers.
func (m *Service) PutPool(ctx context.Context, p auth.Principal, tenant, name string, req api.PutPoolRequest) (_ api.Pool, created bool, _ error) {
	if !poolNameRE.MatchString(name) {
		return api.Pool{}, false, public(errInvalid, "pool name %q must be 1 to 64 of [a-z0-9._-], starting with a letter or digit", truncate(name, 64))
	}
	tenant, err := poolTenant(p, tenant, name)
	if err != nil {
		return api.Pool{}, false, err
	}
	if req.Size < 0 || req.Size > MaxPoolSize {
		return api.Pool{}, false, public(errInvalid, "size must be between 0 and %d", MaxPoolSize)
	}
	if req.Size > m.settings.MaxSandboxes {
		return api.Pool{}, false, public(errInvalid, "size %d exceeds the host's capacity of %d sandboxes", req.Size, m.settings.MaxSandboxes)
	}
	if req.Template == "" {
		return api.Pool{}, false, public(errInvalid, "template is required")
	}
	sp, drv, err := m.poolSpec(req.Template, req.Runtime, req.Resources)
	if err != nil {
		return api.Pool{}, false, err
	}
	if _, err := m.memberNetwork(drv); err != nil {
		return api.Pool{}, false, err
	}
	ref, version, err := parseTemplateRef(sp.Template)
	if err != nil {
		return api.Pool{}, false, err
	}
	// The template must exist now (a build in progress is fine: the refill
	// waits for it).
	if _, release, err := m.tmpl.Resolve(ctx, tenant, ref, version, sp.Template, false); err == nil {
		release()
	} else if !errors.Is(err, errdefs.ErrTemplateBuilding) {
		return api.Pool{}, false, err
	}
	if err := m.checkPoolQuota(ctx, tenant, name, req.Size, sp.Resources); err != nil {
		return api.Pool{}, false, err
	}
	now := m.now().UTC()
	rec := store.Pool{Tenant: tenant, Name: name, Template: sp.Template, Runtime: sp.Runtime,
		Resources: mustJSON(sp.Resources), Size: req.Size, CreatedAt: now, UpdatedAt: now}
	created, err = m.store.PutPool(ctx, rec)
	if err != nil {
		return api.Pool{}, false, err
	}
	m.log.Info("pool put", "tenant", tenant, "pool", name, "template", sp.Template, "runtime", sp.Runtime, "size", req.Size)
	if !created {
		// Drain what no longer fits before answering, so that a PUT of
		// size 0 leaves nothing running.
		m.drainPool(ctx, rec, 0)
	}
	m.kickPools()
	out, err := m.getPool(ctx, tenant, name)
	return out, created, err
}

// checkPoolQuota refuses a pool whose members, with those of the tenant's
// other pools, could never fit the tenant's quota: members are its
// sandboxes and hold its resources.
func (m *Service) checkPoolQuota(ctx context.Context, tenant, name string, size int, res api.Resources) error {
	q, err := m.quotas.Quota(ctx, tenant)
	if err != nil {
		return err
	}
	pools, err := m.store.ListPools(ctx, tenant)
	if err != nil {
		return err
	}
	n, cpu, mem, disk := size, float64(size)*res.CPU, int64(size)*res.MemoryMB, int64(size)*res.DiskMB
	for _, pl := range pools {
		if pl.Name == name {
			continue
		}
		var r api.Resources
		_ = json.Unmarshal(pl.Resources, &r)
		n += pl.Size
		cpu += float64(pl.Size) * r.CPU
		mem += int64(pl.Size) * r.MemoryMB
		disk += int64(pl.Size) * r.DiskMB
	}
	exceeded := func(format string, args ...any) error {
		return &PublicError{Msg: fmt.Sprintf(format, args...), Err: errdefs.ErrQuotaExceeded}
	}
	switch {
	case q.Sandboxes > 0 && n > q.Sandboxes:
		return exceeded("sandboxes quota exceeded: the tenant's pools would hold %d members, its quota is %d sandboxes", n, q.Sandboxes)
	case q.CPU > 0 && cpu > q.CPU+1e-9:
		return exceeded("cpu quota exceeded: the tenant's pools would hold %g cpu, its quota is %g", cpu, q.CPU)
	case q.MemoryMB > 0 && mem > q.MemoryMB:
		return exceeded("memory quota exceeded: the tenant's pools would hold %d MiB, its quota is %d", mem, q.MemoryMB)
	case q.DiskMB > 0 && disk > q.DiskMB:
		return exceeded("disk quota exceeded: the tenant's pools would hold %d MiB, its quota is %d", disk, q.DiskMB)
	}
	return nil
}

// GetPool returns tenant's pool name with its status.
func (m *Service) GetPool(ctx context.Context, p auth.Principal, tenant, name string) (api.Pool, error) {
	tenant, err := poolTenant(p, tenant, name)
	if err != nil {
		return api.Pool{}, err
	}
	return m.getPool(ctx, tenant, name)
}

func (m *Service) getPool(ctx context.Context, tenant, name string) (api.Pool, error) {
	rec, err := m.store.GetPool(ctx, tenant, name)
	if errdefs.IsNotFound(err) {
		return api.Pool{}, poolNotFound(name)
	}
	if err != nil {
		return api.Pool{}, err
	}
	return m.poolView(ctx, rec)
}

func (m *Service) poolView(ctx context.Context, rec store.Pool) (api.Pool, error) {
	c, err := m.store.PoolCounts(ctx, rec.Tenant, rec.Name)
	if err != nil {
		return api.Pool{}, err
	}
	out := api.Pool{Name: rec.Name, Tenant: rec.Tenant, Template: rec.Template, Runtime: rec.Runtime, Size: rec.Size,
		Status:    api.PoolStatus{Ready: c.Ready, Starting: c.Starting, Claimed: c.Claimed, Error: rec.Error},
		CreatedAt: rec.CreatedAt, UpdatedAt: rec.UpdatedAt}
	_ = json.Unmarshal(rec.Resources, &out.Resources)
	return out, nil
}

// ListPools returns p's tenant's pools by name; an admin key's are every
// tenant's (by tenant, then name) unless tenant names one.
func (m *Service) ListPools(ctx context.Context, p auth.Principal, tenant string) (api.PoolList, error) {
	filter := p.TenantFilter()
	if tenant != "" {
		if !p.CanSee(tenant) {
			return api.PoolList{Pools: []api.Pool{}}, nil
		}
		filter = tenant
	}
	recs, err := m.store.ListPools(ctx, filter)
	if err != nil {
		return api.PoolList{}, err
	}
	out := api.PoolList{Pools: make([]api.Pool, 0, len(recs))}
	for _, r := range recs {
		v, err := m.poolView(ctx, r)
		if err != nil {
			return api.PoolList{}, err
		}
		out.Pools = append(out.Pools, v)
	}
	return out, nil
}

// DeletePool deletes tenant's pool name and drains its ready members
// before it answers (a member being started is drained by the refill as
// soon as it is up). Sandboxes claimed from it keep running.
func (m *Service) DeletePool(ctx context.Context, p auth.Principal, tenant, name string) error {
	tenant, err := poolTenant(p, tenant, name)
	if err != nil {
		return err
	}
	if err := m.store.DeletePool(ctx, tenant, name); err != nil {
		if errdefs.IsNotFound(err) {
			return poolNotFound(name)
		}
		return err
	}
	m.log.Info("pool deleted", "tenant", tenant, "pool", name)
	// A member being started is drained as soon as it is up: wait for it
	// too, so that nothing of the pool runs once DELETE answered.
	dctx, cancel := context.WithTimeout(ctx, m.cfg.CreateTimeout)
	defer cancel()
	for {
		m.drainPool(dctx, store.Pool{Tenant: tenant, Name: name, Size: -1}, 0)
		members, err := m.store.PoolMembers(dctx, tenant, name)
		if err != nil {
			return err
		}
		starting := false
		for _, mem := range members {
			starting = starting || mem.State == store.MemberStarting
		}
		if !starting {
			break
		}
		select {
		case <-dctx.Done():
			return dctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	m.kickPools()
	return nil
}

// claim answers a create from a warm pool member when req names or
// matches a pool of p's tenant: ok is false when no member was claimed
// (no matching pool, none ready, or the member could not take the
// request), and the create then starts cold. It never waits for a member.
func (m *Service) claim(ctx context.Context, p auth.Principal, req api.CreateSandboxRequest, idemKey string) (_ CreateResult, ok bool, err error) {
	pool, sp, drv, err := m.claimPool(ctx, p, req)
	if err != nil || pool == nil {
		return CreateResult{}, false, err
	}
	ctx, span := tracing.StartSpan(ctx, "pool.claim", "")
	defer func() { tracing.EndSpan(span, err) }()
	start := m.now()
	// The request is checked as a cold create would check it, before any
	// member is taken: a refusal is the same either way.
	n, err := m.policy.For(ctx, p, req.Network, drv)
	if err != nil {
		return CreateResult{}, false, err
	}
	var idem *store.Idempotency
	if idemKey != "" {
		if !idempotencyRE.MatchString(idemKey) {
			return CreateResult{}, false, public(errInvalid, "idempotency key must be 1-255 printable ascii characters")
		}
		idem = &store.Idempotency{Key: idemKey, RequestHash: requestHash(req)}
	}
	mem, existing, err := m.store.ClaimPoolMemberKeyed(ctx, p.Tenant, pool.Name, start.UTC(), idem)
	if existing != nil {
		res, err := m.replay(ctx, p, existing, idem)
		return res, true, err
	}
	if errdefs.IsNotFound(err) {
		return CreateResult{}, false, nil // none ready: cold
	}
	if err != nil {
		return CreateResult{}, false, err
	}
	m.claimed() // the pool refills with a new member
	m.mu.Lock()
	sb := m.live[mem.SandboxID]
	m.mu.Unlock()
	log := m.log.With("sandbox_id", mem.SandboxID, "tenant", p.Tenant, "pool", pool.Name)
	if sb == nil {
		log.Warn("claimed pool member is not live; creating cold")
		m.abandonClaim(ctx, mem.SandboxID, nil, idem, p.Tenant)
		return CreateResult{}, false, nil
	}
	// Finish the request even if its client goes away: a half-applied
	// member is destroyed, never handed out.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.CreateTimeout)
	defer cancel()
	if err := m.applyClaim(actx, sb, req, sp, n, start); err != nil {
		log.Warn("applying a create to a pool member failed; creating cold", "err", err)
		m.abandonClaim(actx, mem.SandboxID, sb, idem, p.Tenant)
		return CreateResult{}, false, nil
	}
	// What applyClaim set in sb is read by the requests that find sb
	// through m.live, under m.mu: this orders them after it.
	m.mu.Lock()
	//lint:ignore SA2001 an empty critical section on purpose: it orders the writes before
	m.mu.Unlock()
	rec := sb.snapshot()
	if o := m.cfg.Observer; o != nil {
		o.CreateDone(drv.Name(), m.now().Sub(start), true)
	}
	log.Info("sandbox claimed from pool", "template", rec.Template, "template_version", rec.TemplateVersion, "ready_ms", rec.ReadyMS)
	var nsp Spec
	_ = json.Unmarshal(rec.Spec, &nsp)
	m.recordEvent(ctx, sb, audit.TypeCreate, map[string]any{
		"template": rec.Template, "template_version": rec.TemplateVersion, "runtime": rec.Runtime, "resources": nsp.Resources,
		"timeout_s": nsp.TimeoutS, "network": nsp.Network, "secret_names": nsp.Secrets, "ready_ms": rec.ReadyMS, "pool": pool.Name,
	})
	out := m.view(rec)
	out.Pool = pool.Name
	return CreateResult{Sandbox: out}, true, nil
}

// claimPool finds the pool a create claims from: the one it names (whose
// template, runtime and resources the request must agree with), else the
// first of the tenant's pools it matches. nil when there is none.
func (m *Service) claimPool(ctx context.Context, p auth.Principal, req api.CreateSandboxRequest) (*store.Pool, Spec, driver.Driver, error) {
	if req.Snapshot != "" {
		return nil, Spec{}, nil, nil
	}
	var pools []store.Pool
	if req.Pool != "" {
		pl, err := m.store.GetPool(ctx, p.Tenant, req.Pool)
		if errdefs.IsNotFound(err) {
			return nil, Spec{}, nil, poolNotFound(req.Pool)
		}
		if err != nil {
			return nil, Spec{}, nil, err
		}
		pools = []store.Pool{pl}
	} else {
		var err error
		if pools, err = m.store.ListPools(ctx, p.Tenant); err != nil || len(pools) == 0 {
			return nil, Spec{}, nil, err
		}
	}
	sp, drv, err := m.validateCreate(req)
	if err != nil {
		return nil, Spec{}, nil, err
	}
	for i := range pools {
		if poolMatches(pools[i], sp) {
			return &pools[i], sp, drv, nil
		}
	}
	if req.Pool != "" {
		pl := pools[0]
		return nil, Spec{}, nil, public(errInvalid,
			"the request does not match pool %q (template %s, runtime %s, resources %s): give the pool's or leave pool out",
			pl.Name, pl.Template, pl.Runtime, string(pl.Resources))
	}
	return nil, Spec{}, nil, nil
}

// applyClaim gives the claimed member sb what a cold create of req would
// have: env, secrets (as env or as files), network policy, metadata,
// lifecycle and TTL, from now.
func (m *Service) applyClaim(ctx context.Context, sb *Live, req api.CreateSandboxRequest, sp Spec, n api.Network, start time.Time) error {
	sb.opMu.Lock()
	defer sb.opMu.Unlock()
	if st := sb.state(); st != api.StateRunning {
		return fmt.Errorf("pool member is %s", st)
	}
	old := sb.Spec()
	nsp := old
	nsp.TimeoutS = sp.TimeoutS
	nsp.Env = mergeEnv(m.policy.PackageEnv(n), mergeEnv(old.Env, sp.Env))
	nsp.Secrets, nsp.SecretsAsFiles = sp.Secrets, sp.SecretsAsFiles
	nsp.Network = n
	if !reflect.DeepEqual(old.Network, n) {
		if m.net == nil || !old.NetNS {
			return errors.New("pool member has no managed network")
		}
		if err := m.net.Update(ctx, sb.id, toPolicy(n)); err != nil {
			return fmt.Errorf("updating the member's network: %w", err)
		}
	}
	sealed, err := m.sealer.seal(sb.id, req.Secrets)
	if err != nil {
		return fmt.Errorf("sealing secrets: %w", err)
	}
	if sp.SecretsAsFiles {
		// The member was made with the secrets' memory file system.
		if err := m.writeSecretFiles(ctx, sb, req.Secrets); err != nil {
			return err
		}
	}
	specJSON, err := json.Marshal(nsp)
	if err != nil {
		return err
	}
	now := m.now().UTC()
	err = sb.update(ctx, func(r *store.Sandbox) {
		r.Spec, r.Secrets, r.Metadata = specJSON, sealed, req.Metadata
		r.CreatedAt, r.TimeoutS = now, sp.TimeoutS
		r.ExpiresAt = now.Add(time.Duration(sp.TimeoutS) * time.Second)
		r.ReadyMS = m.now().Sub(start).Milliseconds()
		r.LastActiveAt = now
		applyLifecycle(r, normalizeLifecycle(req))
	})
	if err != nil {
		return err
	}
	sb.envMu.Lock()
	sb.env, sb.secrets, sb.red = nsp.Env, envSecrets(nsp, req.Secrets), redact.New(req.Secrets)
	sb.envMu.Unlock()
	return nil
}

// abandonClaim destroys a claimed member that could not take its request
// (sb nil: it is not live) and forgets the idempotency key the claim
// bound, so that the create starts cold with it.
func (m *Service) abandonClaim(ctx context.Context, id string, sb *Live, idem *store.Idempotency, tenant string) {
	cctx, cancel := cleanupCtx(ctx)
	defer cancel()
	if _, err := m.store.SetPoolMemberState(cctx, id, store.MemberGone, store.MemberClaimed); err != nil {
		m.log.Warn("recording an abandoned pool member", "sandbox_id", id, "err", err)
	}
	if idem != nil {
		if err := m.store.DeleteIdempotencyKey(cctx, tenant, idem.Key); err != nil {
			m.log.Warn("forgetting idempotency key", "sandbox_id", id, "err", err)
		}
	}
	if sb != nil {
		if err := m.stop(cctx, sb, api.StopPoolDrained); err != nil {
			m.log.Warn("destroying an abandoned pool member", "sandbox_id", id, "err", err)
		}
	}
}
