package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Pool member states. A member is a sandbox record of the pool's tenant
// (Sandbox.Pool names the pool) that the pool keeps warm; its row here
// says where it is in its life as a member.
const (
	// MemberStarting: the member's sandbox is being made.
	MemberStarting = "starting"
	// MemberReady: it is running and waits for a claim. Unclaimed members
	// are left out of ListSandboxes.
	MemberReady = "ready"
	// MemberClaimed: a create claimed it; it is an ordinary sandbox from
	// then on and never goes back to the pool.
	MemberClaimed = "claimed"
	// MemberDraining: the refill (or a DELETE) took it to destroy it
	// (pool_drained); nobody can claim it any more. A daemon that dies
	// meanwhile finds it among StrayPoolMembers.
	MemberDraining = "draining"
	// MemberGone: its sandbox is no longer live (drained, failed to
	// start, crashed). The row stays until the sandbox's record is purged
	// (ForgetGonePoolMembers), so that the record is never listed as one
	// of the tenant's sandboxes.
	MemberGone = "gone"
)

// Pool is a warm pool's desired state, per tenant and name.
type Pool struct {
	Tenant string
	Name   string
	// Template is as the request named it (name or name@version).
	Template string
	Runtime  string
	// Resources are the members' (JSON api.Resources).
	Resources json.RawMessage
	// Size is how many ready members the pool keeps.
	Size int
	// Error is why the last refill failed, "" when it succeeded.
	Error     string
	CreatedAt time.Time
	UpdatedAt time.Time
}

// PoolMember is one member of a pool.
type PoolMember struct {
	SandboxID string
	Tenant    string
	Pool      string
	State     string
	CreatedAt time.Time
	ReadyAt   *time.Time
	ClaimedAt *time.Time
}

// PoolCounts are a pool's members by state: Claimed counts the claimed
// members whose sandbox is still live.
type PoolCounts struct {
	Starting, Ready, Claimed int
}

const poolCols = `tenant, name, template, runtime, resources, size, error, created_at, updated_at`

func scanPool(row interface{ Scan(...any) error }) (Pool, error) {
	var (
		p                Pool
		res              string
		msg              sql.NullString
		created, updated int64
	)
	if err := row.Scan(&p.Tenant, &p.Name, &p.Template, &p.Runtime, &res, &p.Size, &msg, &created, &updated); err != nil {
		return Pool{}, err
	}
	p.Resources, p.Error = json.RawMessage(res), msg.String
	p.CreatedAt, p.UpdatedAt = fromTS(created), fromTS(updated)
	return p, nil
}

// PutPool creates pool p.Tenant/p.Name or replaces its desired state
// (template, runtime, resources, size), keeping its CreatedAt and clearing
// its Error. It reports whether the pool is new.
func (s *Store) PutPool(ctx context.Context, p Pool) (created bool, err error) {
	if p.Size < 0 {
		return false, errdefs.Wrap(errdefs.ErrInvalidArgument, "pool size %d", p.Size)
	}
	err = s.tx(ctx, func(tx *sql.Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM pools WHERE tenant = ? AND name = ?`, p.Tenant, p.Name).Scan(&n); err != nil {
			return err
		}
		created = n == 0
		if created {
			_, err := tx.ExecContext(ctx, `INSERT INTO pools(`+poolCols+`) VALUES (?,?,?,?,?,?,?,?,?)`, p.Tenant, p.Name,
				p.Template, p.Runtime, jsonDoc(p.Resources), p.Size, nil, ts(p.CreatedAt), ts(p.UpdatedAt))
			return err
		}
		_, err := tx.ExecContext(ctx, `UPDATE pools SET template = ?, runtime = ?, resources = ?, size = ?, error = NULL,
			updated_at = ? WHERE tenant = ? AND name = ?`, p.Template, p.Runtime, jsonDoc(p.Resources), p.Size,
			ts(p.UpdatedAt), p.Tenant, p.Name)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("recording pool: %w", err)
	}
	return created, nil
}

// GetPool returns tenant's pool name; a missing one (another tenant's
// included) wraps errdefs.ErrNotFound.
func (s *Store) GetPool(ctx context.Context, tenant, name string) (Pool, error) {
	p, err := scanPool(s.r.QueryRowContext(ctx, `SELECT `+poolCols+` FROM pools WHERE tenant = ? AND name = ?`, tenant, name))
	if errors.Is(err, sql.ErrNoRows) {
		return Pool{}, fmt.Errorf("%w: pool %q", errdefs.ErrNotFound, name)
	}
	if err != nil {
		return Pool{}, fmt.Errorf("loading pool: %w", err)
	}
	return p, nil
}

// ListPools returns tenant's pools by name; tenant "" lists every
// tenant's (the refill loop, an admin), by tenant and name.
func (s *Store) ListPools(ctx context.Context, tenant string) ([]Pool, error) {
	q := `SELECT ` + poolCols + ` FROM pools`
	var args []any
	if tenant != "" {
		q += ` WHERE tenant = ?`
		args = append(args, tenant)
	}
	rows, err := s.r.QueryContext(ctx, q+` ORDER BY tenant, name`, args...)
	if err != nil {
		return nil, fmt.Errorf("listing pools: %w", err)
	}
	defer rows.Close()
	var out []Pool
	for rows.Next() {
		p, err := scanPool(rows)
		if err != nil {
			return nil, fmt.Errorf("listing pools: %w", err)
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// DeletePool deletes tenant's pool name; a missing one wraps
// errdefs.ErrNotFound. Its members' rows stay: the unclaimed ones are
// StrayPoolMembers from now on, to be destroyed; claimed ones are ordinary
// sandboxes.
func (s *Store) DeletePool(ctx context.Context, tenant, name string) error {
	res, err := s.w.ExecContext(ctx, `DELETE FROM pools WHERE tenant = ? AND name = ?`, tenant, name)
	if err != nil {
		return fmt.Errorf("deleting pool: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: pool %q", errdefs.ErrNotFound, name)
	}
	return nil
}

// SetPoolError records why the last refill of tenant's pool name failed
// ("" when it succeeded again). A missing pool is not an error: it was
// deleted meanwhile.
func (s *Store) SetPoolError(ctx context.Context, tenant, name, msg string) error {
	if _, err := s.w.ExecContext(ctx, `UPDATE pools SET error = ? WHERE tenant = ? AND name = ?`, nullStr(msg), tenant, name); err != nil {
		return fmt.Errorf("recording pool error: %w", err)
	}
	return nil
}

const memberCols = `sandbox_id, tenant, pool, state, created_at, ready_at, claimed_at`

func scanMember(row interface{ Scan(...any) error }) (PoolMember, error) {
	var (
		m              PoolMember
		created        int64
		ready, claimed sql.NullInt64
	)
	if err := row.Scan(&m.SandboxID, &m.Tenant, &m.Pool, &m.State, &created, &ready, &claimed); err != nil {
		return PoolMember{}, err
	}
	m.CreatedAt, m.ReadyAt, m.ClaimedAt = fromTS(created), fromTSP(ready), fromTSP(claimed)
	return m, nil
}

func (s *Store) queryMembers(ctx context.Context, q string, args ...any) ([]PoolMember, error) {
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing pool members: %w", err)
	}
	defer rows.Close()
	var out []PoolMember
	for rows.Next() {
		m, err := scanMember(rows)
		if err != nil {
			return nil, fmt.Errorf("listing pool members: %w", err)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// AddPoolMember records m (state starting) before its sandbox is made, so
// that a daemon dying meanwhile leaves a stray member, not an unknown
// sandbox. Its pool must exist (errdefs.ErrNotFound otherwise).
func (s *Store) AddPoolMember(ctx context.Context, m PoolMember) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM pools WHERE tenant = ? AND name = ?`, m.Tenant, m.Pool).Scan(&n); err != nil {
			return fmt.Errorf("loading pool: %w", err)
		}
		if n == 0 {
			return fmt.Errorf("%w: pool %q", errdefs.ErrNotFound, m.Pool)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO pool_members(`+memberCols+`) VALUES (?,?,?,?,?,?,?)`,
			m.SandboxID, m.Tenant, m.Pool, MemberStarting, ts(m.CreatedAt), nil, nil)
		if isUniqueViolation(err) {
			return fmt.Errorf("%w: pool member %q", errdefs.ErrAlreadyExists, m.SandboxID)
		}
		if err != nil {
			return fmt.Errorf("recording pool member: %w", err)
		}
		return nil
	})
}

// SetPoolMemberReady moves member id from starting to ready; any other
// state wraps errdefs.ErrInvalidState, a missing member errdefs.ErrNotFound.
func (s *Store) SetPoolMemberReady(ctx context.Context, id string, at time.Time) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		var state string
		err := tx.QueryRowContext(ctx, `SELECT state FROM pool_members WHERE sandbox_id = ?`, id).Scan(&state)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: pool member %q", errdefs.ErrNotFound, id)
		}
		if err != nil {
			return fmt.Errorf("loading pool member: %w", err)
		}
		if state != MemberStarting {
			return fmt.Errorf("%w: pool member %s is %s", errdefs.ErrInvalidState, id, state)
		}
		_, err = tx.ExecContext(ctx, `UPDATE pool_members SET state = ?, ready_at = ? WHERE sandbox_id = ?`, MemberReady, ts(at), id)
		return err
	})
}

// ClaimPoolMember claims the oldest ready member of tenant's pool name
// whose sandbox is running, in one transaction: no two claims get the same
// member, and a member is never claimed twice. None ready wraps
// errdefs.ErrNotFound (the caller creates cold).
func (s *Store) ClaimPoolMember(ctx context.Context, tenant, name string, at time.Time) (PoolMember, error) {
	m, _, err := s.ClaimPoolMemberKeyed(ctx, tenant, name, at, nil)
	return m, err
}

// ClaimPoolMemberKeyed is ClaimPoolMember that, with idem set, also binds
// the idempotency key to the claimed member in the same transaction. If
// the key is taken already it claims nothing and returns the existing
// binding with an error wrapping errdefs.ErrAlreadyExists (as
// CreateSandbox does).
func (s *Store) ClaimPoolMemberKeyed(ctx context.Context, tenant, name string, at time.Time, idem *Idempotency) (PoolMember, *IdempotencyRecord, error) {
	var (
		m        PoolMember
		existing *IdempotencyRecord
	)
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var err error
		if idem != nil {
			var rec IdempotencyRecord
			err := tx.QueryRowContext(ctx, `SELECT sandbox_id, request_hash FROM idempotency_keys WHERE tenant = ? AND key = ?`,
				tenant, idem.Key).Scan(&rec.SandboxID, &rec.RequestHash)
			if err == nil {
				existing = &rec
				return fmt.Errorf("%w: idempotency key", errdefs.ErrAlreadyExists)
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("idempotency key: %w", err)
			}
		}
		m, err = scanMember(tx.QueryRowContext(ctx, `SELECT `+memberCols+` FROM pool_members m WHERE m.tenant = ? AND m.pool = ?
			AND m.state = ? AND EXISTS (SELECT 1 FROM sandboxes s WHERE s.id = m.sandbox_id AND s.tenant = m.tenant AND s.state = 'running')
			ORDER BY m.ready_at, m.sandbox_id LIMIT 1`, tenant, name, MemberReady))
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: no ready member in pool %q", errdefs.ErrNotFound, name)
		}
		if err != nil {
			return fmt.Errorf("claiming pool member: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE pool_members SET state = ?, claimed_at = ? WHERE sandbox_id = ?`,
			MemberClaimed, ts(at), m.SandboxID); err != nil {
			return fmt.Errorf("claiming pool member: %w", err)
		}
		if idem != nil {
			if _, err := tx.ExecContext(ctx, `INSERT INTO idempotency_keys(tenant, key, request_hash, sandbox_id, created_at)
				VALUES (?, ?, ?, ?, ?)`, tenant, idem.Key, idem.RequestHash, m.SandboxID, ts(at)); err != nil {
				return fmt.Errorf("idempotency key: %w", err)
			}
		}
		m.State, m.ClaimedAt = MemberClaimed, &at
		return nil
	})
	return m, existing, err
}

// SetPoolMemberState moves member id to state to if it is in one of the
// states from, and reports whether it did: the one way to take a member
// from the pool (draining it, say) that cannot race a claim.
func (s *Store) SetPoolMemberState(ctx context.Context, id, to string, from ...string) (bool, error) {
	if len(from) == 0 {
		return false, errdefs.Wrap(errdefs.ErrInvalidArgument, "no state to move member %s from", id)
	}
	args := []any{to, id}
	q := `UPDATE pool_members SET state = ? WHERE sandbox_id = ? AND state IN (?` + strings.Repeat(",?", len(from)-1) + `)`
	for _, f := range from {
		args = append(args, f)
	}
	res, err := s.w.ExecContext(ctx, q, args...)
	if err != nil {
		return false, fmt.Errorf("updating pool member: %w", err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// ForgetGonePoolMembers drops the rows of gone members whose sandbox
// record was purged.
func (s *Store) ForgetGonePoolMembers(ctx context.Context) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM pool_members WHERE state = ? AND NOT EXISTS (
		SELECT 1 FROM sandboxes s WHERE s.id = pool_members.sandbox_id)`, MemberGone); err != nil {
		return fmt.Errorf("forgetting pool members: %w", err)
	}
	return nil
}

// GetPoolMember returns the member row of sandbox id (errdefs.ErrNotFound
// when it is no member).
func (s *Store) GetPoolMember(ctx context.Context, id string) (PoolMember, error) {
	m, err := scanMember(s.r.QueryRowContext(ctx, `SELECT `+memberCols+` FROM pool_members WHERE sandbox_id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return PoolMember{}, fmt.Errorf("%w: pool member %q", errdefs.ErrNotFound, id)
	}
	if err != nil {
		return PoolMember{}, fmt.Errorf("loading pool member: %w", err)
	}
	return m, nil
}

// RemovePoolMember forgets member id (its sandbox was destroyed, or never
// made); an unknown one is not an error.
func (s *Store) RemovePoolMember(ctx context.Context, id string) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM pool_members WHERE sandbox_id = ?`, id); err != nil {
		return fmt.Errorf("removing pool member: %w", err)
	}
	return nil
}

// PoolMembers returns the members of tenant's pool name, every state,
// oldest first.
func (s *Store) PoolMembers(ctx context.Context, tenant, name string) ([]PoolMember, error) {
	return s.queryMembers(ctx, `SELECT `+memberCols+` FROM pool_members WHERE tenant = ? AND pool = ?
		ORDER BY created_at, sandbox_id`, tenant, name)
}

// PoolCounts counts the members of tenant's pool name by state; Claimed
// only those whose sandbox is live.
func (s *Store) PoolCounts(ctx context.Context, tenant, name string) (PoolCounts, error) {
	var c PoolCounts
	err := s.r.QueryRowContext(ctx, `SELECT
		COALESCE(SUM(m.state = ?), 0), COALESCE(SUM(m.state = ?), 0),
		COALESCE(SUM(m.state = ? AND EXISTS (SELECT 1 FROM sandboxes s WHERE s.id = m.sandbox_id AND s.state IN (`+liveSandboxStates+`))), 0)
		FROM pool_members m WHERE m.tenant = ? AND m.pool = ?`,
		MemberStarting, MemberReady, MemberClaimed, tenant, name).Scan(&c.Starting, &c.Ready, &c.Claimed)
	if err != nil {
		return PoolCounts{}, fmt.Errorf("counting pool members: %w", err)
	}
	return c, nil
}

// StrayPoolMembers returns the unclaimed members to destroy and forget:
// those being drained, those whose pool is gone, and those whose sandbox
// is no longer live or was never recorded. A member being started has no
// sandbox record for a moment, so call it when no member is being started
// (at daemon start, or under the refill's own lock). Gone members are not
// stray: there is nothing left of them to destroy.
func (s *Store) StrayPoolMembers(ctx context.Context) ([]PoolMember, error) {
	return s.queryMembers(ctx, `SELECT `+memberCols+` FROM pool_members m WHERE m.state NOT IN (?, ?) AND (m.state = ?
		OR NOT EXISTS (SELECT 1 FROM pools p WHERE p.tenant = m.tenant AND p.name = m.pool)
		OR NOT EXISTS (SELECT 1 FROM sandboxes s WHERE s.id = m.sandbox_id AND s.state IN (`+liveSandboxStates+`)))
		ORDER BY m.created_at, m.sandbox_id`, MemberClaimed, MemberGone, MemberDraining)
}
