package sandbox

// The refill of warm pools: one background loop per daemon makes the
// members pools lack, one at a time, and drains those no pool wants.

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/redact"
	"github.com/airlockhq/airlock/internal/store"
)

// The refill's CPU budget: at most one member starts at a time on the
// host (the loop makes them one after another), with a pause between two
// starts so that a pool of many members does not take the host's CPUs
// from the sandboxes that run.
var (
	// poolStartPause is the pause after a member started before the next.
	poolStartPause = 100 * time.Millisecond
	// poolTick is how often the loop looks at the pools when nothing
	// kicked it (a PUT, DELETE or claim does).
	poolTick = 2 * time.Second
	// poolRetry is the first wait before a pool whose member failed to
	// start is tried again, doubled up to poolRetryMax.
	poolRetry    = 2 * time.Second
	poolRetryMax = 2 * time.Minute
)

// memberLifetime stands in for a member's TTL, which does not run before
// its claim (the claim sets the request's).
const memberLifetime = 50 * 365 * 24 * time.Hour

// poolClaimGrace is how long after a claim the refill waits before it
// starts a member: the claimed sandbox's first commands get the CPU that
// starting a member (runc, mounts, the agent) would take from them.
var poolClaimGrace = 300 * time.Millisecond

// poolStates holds each Service's refill state shared with its claims.
var poolStates sync.Map // *Service → *poolState

type poolState struct {
	kick      chan struct{} // wakes the loop
	lastClaim atomic.Int64  // unix nanoseconds of the last claim
}

func (m *Service) poolState() *poolState {
	if v, ok := poolStates.Load(m); ok {
		return v.(*poolState)
	}
	v, _ := poolStates.LoadOrStore(m, &poolState{kick: make(chan struct{}, 1)})
	return v.(*poolState)
}

// kickPools wakes the refill loop.
func (m *Service) kickPools() {
	select {
	case m.poolState().kick <- struct{}{}:
	default:
	}
}

// claimed tells the refill a member was claimed: it refills, after
// poolClaimGrace.
func (m *Service) claimed() {
	m.poolState().lastClaim.Store(time.Now().UnixNano())
	m.kickPools()
}

// claimGrace waits out poolClaimGrace after the last claim; false if the
// service closed meanwhile.
func (m *Service) claimGrace() bool {
	for {
		d := poolClaimGrace - time.Since(time.Unix(0, m.poolState().lastClaim.Load()))
		if d <= 0 {
			return true
		}
		select {
		case <-m.ctx.Done():
			return false
		case <-time.After(d):
		}
	}
}

// StartPools starts the refill of warm pools: call it after Start (the
// members an earlier daemon made are recovered by then). Close stops it.
func (m *Service) StartPools() {
	m.goBackground(m.refillLoop)
}

type poolKey struct{ tenant, name string }

// refill is the loop's state: when each failing pool may be tried again,
// and since when each pool lacks members (oldest deficit first).
type refill struct {
	retryAt map[poolKey]time.Time
	backoff map[poolKey]time.Duration
	short   map[poolKey]time.Time
	forgot  time.Time
}

func (m *Service) refillLoop() {
	defer poolStates.Delete(m)
	kick := m.poolState().kick
	r := &refill{retryAt: map[poolKey]time.Time{}, backoff: map[poolKey]time.Duration{}, short: map[poolKey]time.Time{}}
	tick := time.NewTicker(poolTick)
	defer tick.Stop()
	for m.ctx.Err() == nil {
		// After a claim the loop waits first, before even reading the
		// store: the claimer's first commands get the CPU and the store.
		if !m.claimGrace() {
			return
		}
		if m.refillOnce(m.ctx, r) {
			select {
			case <-m.ctx.Done():
				return
			case <-time.After(poolStartPause):
			}
			continue
		}
		select {
		case <-m.ctx.Done():
			return
		case <-tick.C:
		case <-kick:
		}
	}
}

// refillOnce drains stray and surplus members and starts at most one
// member; it reports whether it started (or tried to start) one.
func (m *Service) refillOnce(ctx context.Context, r *refill) bool {
	m.drainStrays(ctx)
	if now := m.now(); now.Sub(r.forgot) > time.Hour {
		r.forgot = now
		if err := m.store.ForgetGonePoolMembers(ctx); err != nil {
			m.log.Warn("forgetting gone pool members", "err", err)
		}
	}
	pools, err := m.store.ListPools(ctx, "")
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("listing pools", "err", err)
		}
		return false
	}
	var (
		pick   *store.Pool
		pickAt time.Time
		now    = m.now()
	)
	seen := map[poolKey]bool{}
	for i := range pools {
		pl := pools[i]
		k := poolKey{pl.Tenant, pl.Name}
		seen[k] = true
		ready := m.drainPool(ctx, pl, m.poolVersion(ctx, pl))
		if ready >= pl.Size {
			delete(r.short, k)
			continue
		}
		since, ok := r.short[k]
		if !ok {
			since = now
			r.short[k] = now
		}
		if now.Before(r.retryAt[k]) {
			continue
		}
		if pick == nil || since.Before(pickAt) {
			pick, pickAt = &pools[i], since
		}
	}
	for k := range r.short {
		if !seen[k] {
			delete(r.short, k)
		}
	}
	for k := range r.retryAt {
		if !seen[k] {
			delete(r.retryAt, k)
			delete(r.backoff, k)
		}
	}
	if pick == nil {
		return false
	}
	k := poolKey{pick.Tenant, pick.Name}
	if !m.claimGrace() {
		return false
	}
	if err := m.startMember(ctx, *pick); err != nil {
		if ctx.Err() != nil {
			return true
		}
		msg := "a pool member failed to start"
		var pe *PublicError
		if errors.As(err, &pe) {
			msg = pe.Msg
		}
		m.log.Warn("starting a pool member", "tenant", pick.Tenant, "pool", pick.Name, "err", err)
		if err := m.store.SetPoolError(ctx, pick.Tenant, pick.Name, msg); err != nil {
			m.log.Warn("recording pool error", "err", err)
		}
		b := r.backoff[k]
		if b == 0 {
			b = poolRetry
		} else {
			b = min(2*b, poolRetryMax)
		}
		r.backoff[k], r.retryAt[k] = b, m.now().Add(b)
		return true
	}
	delete(r.backoff, k)
	delete(r.retryAt, k)
	if pick.Error != "" {
		if err := m.store.SetPoolError(ctx, pick.Tenant, pick.Name, ""); err != nil {
			m.log.Warn("clearing pool error", "err", err)
		}
	}
	return true
}

// poolVersion is the template version a create of pool's template would
// get now (0 when it cannot say: a build runs, the template is gone).
func (m *Service) poolVersion(ctx context.Context, pool store.Pool) int {
	ref, version, err := parseTemplateRef(pool.Template)
	if err != nil {
		return 0
	}
	if version > 0 {
		return version
	}
	r, release, err := m.tmpl.Resolve(ctx, pool.Tenant, ref, 0, pool.Template, false)
	if err != nil {
		return 0
	}
	release()
	return r.Template.Version
}

// drainPool drains pool's ready members that no longer match it (another
// template, runtime or resources, or a template version other than
// version when it is not 0) and those beyond its size (the newest; Size
// -1: every one), and returns how many ready ones it keeps.
func (m *Service) drainPool(ctx context.Context, pool store.Pool, version int) int {
	members, err := m.store.PoolMembers(ctx, pool.Tenant, pool.Name)
	if err != nil {
		m.log.Warn("listing pool members", "tenant", pool.Tenant, "pool", pool.Name, "err", err)
		return 0
	}
	var keep []string
	for _, mem := range members {
		if mem.State != store.MemberReady {
			continue
		}
		m.mu.Lock()
		sb := m.live[mem.SandboxID]
		m.mu.Unlock()
		if pool.Size < 0 || sb == nil || !poolMatches(pool, sb.Spec()) || version > 0 && sb.Record().TemplateVersion != version {
			m.drainMember(ctx, mem.SandboxID)
			continue
		}
		keep = append(keep, mem.SandboxID)
	}
	// Claims take the oldest: drain the newest surplus.
	for len(keep) > max(pool.Size, 0) {
		m.drainMember(ctx, keep[len(keep)-1])
		keep = keep[:len(keep)-1]
	}
	return len(keep)
}

// drainMember takes ready member id from its pool (a claim that comes
// first wins) and destroys it (stop_reason pool_drained).
func (m *Service) drainMember(ctx context.Context, id string) {
	ok, err := m.store.SetPoolMemberState(ctx, id, store.MemberDraining, store.MemberReady)
	if err != nil {
		return
	}
	if ok {
		m.destroyMember(ctx, id)
		return
	}
	// Another drain (the refill's, a PUT's or DELETE's) took it first:
	// wait for it to finish, so that a PUT of size 0 or a DELETE answers
	// with nothing of the pool's left running. A claim that took it is
	// not waited for.
	if mem, err := m.store.GetPoolMember(ctx, id); err != nil || mem.State != store.MemberDraining {
		return
	}
	wait := time.NewTicker(10 * time.Millisecond)
	defer wait.Stop()
	deadline := time.After(cleanupTimeout)
	for {
		m.mu.Lock()
		_, live := m.live[id]
		m.mu.Unlock()
		if !live {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline:
			return
		case <-wait.C:
		}
	}
}

// destroyMember destroys member id, already draining, and records it gone.
func (m *Service) destroyMember(ctx context.Context, id string) {
	m.mu.Lock()
	sb := m.live[id]
	m.mu.Unlock()
	if sb != nil {
		if err := m.stop(ctx, sb, api.StopPoolDrained); err != nil {
			// Still draining: the next pass tries again.
			m.log.Warn("draining a pool member", "sandbox_id", id, "err", err)
			return
		}
	}
	if _, err := m.store.SetPoolMemberState(ctx, id, store.MemberGone, store.MemberDraining, store.MemberStarting, store.MemberReady); err != nil {
		m.log.Warn("recording a drained pool member", "sandbox_id", id, "err", err)
	}
}

// drainStrays destroys the unclaimed members no pool wants any more
// (their pool was deleted, a drain was cut short) and records as gone
// those whose sandbox is no longer live.
func (m *Service) drainStrays(ctx context.Context) {
	strays, err := m.store.StrayPoolMembers(ctx)
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("listing stray pool members", "err", err)
		}
		return
	}
	for _, mem := range strays {
		ok, err := m.store.SetPoolMemberState(ctx, mem.SandboxID, store.MemberDraining, store.MemberStarting, store.MemberReady, store.MemberDraining)
		if err != nil || !ok {
			continue
		}
		m.destroyMember(ctx, mem.SandboxID)
	}
}

// startMember makes one member of pool and waits until it is ready. It
// runs only in the refill loop, one at a time.
func (m *Service) startMember(ctx context.Context, pool store.Pool) (err error) {
	var res api.Resources
	if err := json.Unmarshal(pool.Resources, &res); err != nil {
		return err
	}
	sp, drv, err := m.poolSpec(pool.Template, pool.Runtime, &res)
	if err != nil {
		return err
	}
	if sp.Network, err = m.memberNetwork(drv); err != nil {
		return err
	}
	ref, version, err := parseTemplateRef(sp.Template)
	if err != nil {
		return err
	}
	resolved, releaseTemplate, err := m.tmpl.Resolve(ctx, pool.Tenant, ref, version, sp.Template, false)
	if err != nil {
		return err
	}
	defer releaseTemplate() // once the record is stored, it keeps the version
	tmpl := resolved.Template
	sp.Env = resolved.Config.Env
	sp.Workdir, sp.User = resolved.Config.Workdir, resolved.Config.User
	sp.NetNS = m.net != nil
	// The secrets' memory file system, empty until a claim that gives
	// secrets as files fills it.
	sp.SecretsAsFiles = true
	now := m.now().UTC()
	id := newSandboxID()
	specJSON, err := json.Marshal(sp)
	if err != nil {
		return err
	}
	rec := store.Sandbox{
		ID: id, Tenant: pool.Tenant, State: api.StateStarting, DesiredState: api.StateRunning,
		Spec: specJSON, Template: tmpl.Name, TemplateVersion: tmpl.Version, Runtime: drv.Name(),
		CreatedAt: now, ExpiresAt: now.Add(memberLifetime), TimeoutS: sp.TimeoutS, Pool: pool.Name,
	}
	sb := &Live{
		id: id, tenant: pool.Tenant, drv: drv, m: m, rec: rec, ready: make(chan struct{}),
		env: sp.Env, red: redact.New(nil), gone: make(chan struct{}),
	}
	sb.setExecDefaults(sp)
	sb.resOnce.Do(func() { sb.res = sp.Resources })
	quota, err := m.quotas.Quota(ctx, pool.Tenant)
	if err != nil {
		return err
	}
	// The member row first: a daemon that dies from here on leaves a
	// stray member, never a sandbox of the tenant's nobody asked for.
	if err := m.store.AddPoolMember(ctx, store.PoolMember{SandboxID: id, Tenant: pool.Tenant, Pool: pool.Name, CreatedAt: now}); err != nil {
		return err
	}
	m.mu.Lock()
	if len(m.live) >= m.settings.MaxSandboxes {
		m.mu.Unlock()
		m.forgetMember(ctx, id)
		return public(errdefs.ErrCapacityExhausted, "the host is at capacity")
	}
	if err := m.admitLocked(pool.Tenant, quota, sp.Resources); err != nil {
		m.mu.Unlock()
		m.forgetMember(ctx, id)
		return err
	}
	_, err = m.store.CreateSandbox(ctx, rec, nil)
	if err == nil {
		m.live[id] = sb
		m.owners.Live(sb)
	}
	m.mu.Unlock()
	if err != nil {
		m.forgetMember(ctx, id)
		return err
	}
	log := m.log.With("sandbox_id", id, "tenant", pool.Tenant, "pool", pool.Name, "driver", drv.Name())
	cctx, cancel := context.WithTimeout(ctx, m.cfg.CreateTimeout)
	defer cancel()
	fail := func(err error) error {
		log.Warn("pool member failed to start", "err", err)
		m.failCreate(context.WithoutCancel(cctx), sb, err, nil)
		close(sb.ready)
		m.forgetMember(ctx, id)
		return createError(err)
	}
	start := m.now()
	if err := m.bringUp(cctx, sb, sp, tmpl, nil, ""); err != nil {
		return fail(err)
	}
	if err := sb.setState(cctx, api.StateRunning, nil); err != nil {
		return fail(err)
	}
	if c := resolved.Config; c.StartCmd != "" || c.ReadyCmd != "" {
		if err := m.execs.StartTemplate(cctx, sb, c); err != nil {
			return fail(err)
		}
	}
	m.warmMember(cctx, sb, log)
	close(sb.ready)
	if err := m.store.SetPoolMemberReady(ctx, id, m.now().UTC()); err != nil {
		// Drained by the next pass (stray or not ready).
		log.Warn("recording a ready pool member", "err", err)
		return err
	}
	log.Debug("pool member ready", "ms", m.now().Sub(start).Milliseconds())
	return nil
}

// forgetMember records member id gone (its sandbox never ran, or failed).
func (m *Service) forgetMember(ctx context.Context, id string) {
	cctx, cancel := cleanupCtx(ctx)
	defer cancel()
	if _, err := m.store.SetPoolMemberState(cctx, id, store.MemberGone, store.MemberStarting, store.MemberReady, store.MemberDraining); err != nil {
		m.log.Warn("recording a failed pool member", "sandbox_id", id, "err", err)
	}
}

// warmMember runs `true` in member sb as its default user, through the
// agent alone (no exec record: nothing of it is the claimer's to see),
// before the member is ready. A new sandbox's first command pays for its
// overlay's first lookups of the shell's and the loader's files and the
// agent's first user lookup (≈ 2 ms of a 6 ms exec on the bench host);
// the member pays it before its claim instead of the claimer's first
// command. A failure only costs that: the member is still handed out.
func (m *Service) warmMember(ctx context.Context, sb *Live, log *slog.Logger) {
	user, cwd := sb.execDefaults("", "")
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := sb.WithAgent(wctx, func(c *agentclient.Client) error {
		id := auth.RandomID("ex_", 15)
		st, err := c.Exec(wctx, agentproto.ExecRequest{ID: id, Argv: []string{"true"}, User: user, Cwd: cwd, TimeoutMS: 10_000})
		if err != nil {
			return err
		}
		defer st.Close()
		_, err = c.Wait(wctx, id)
		return err
	})
	if err != nil {
		log.Debug("warming a pool member", "err", err)
	}
}
