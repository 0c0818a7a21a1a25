package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Key is an API key's record. The secret itself is never stored: only its
// sha256 Hash, and a short Prefix to tell keys apart in listings.
type Key struct {
	ID        string
	Tenant    string
	Name      string
	Prefix    string
	Hash      []byte
	Admin     bool
	CreatedAt time.Time
	RevokedAt *time.Time
	// RateLimitRPS and RateLimitBurst, when set, replace the server's
	// default request rate limit for this key (0 RPS: no limit).
	RateLimitRPS   *float64
	RateLimitBurst *int
}

// EnsureTenant creates tenant id if it does not exist.
func (s *Store) EnsureTenant(ctx context.Context, id string) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO tenants(id, created_at) VALUES (?, ?) ON CONFLICT(id) DO NOTHING`,
		id, time.Now().UnixNano())
	if err != nil {
		return fmt.Errorf("ensuring tenant: %w", err)
	}
	return nil
}

// CreateKey stores k, creating its tenant if needed.
func (s *Store) CreateKey(ctx context.Context, k Key) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO tenants(id, created_at) VALUES (?, ?) ON CONFLICT(id) DO NOTHING`,
			k.Tenant, ts(k.CreatedAt)); err != nil {
			return fmt.Errorf("creating key: %w", err)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO api_keys(`+keyCols+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			k.ID, k.Tenant, k.Name, k.Prefix, k.Hash, k.Admin, ts(k.CreatedAt), tsp(k.RevokedAt),
			nullFloat(k.RateLimitRPS), nullInt(k.RateLimitBurst))
		if err != nil {
			if isUniqueViolation(err) {
				return fmt.Errorf("%w: key", errdefs.ErrAlreadyExists)
			}
			return fmt.Errorf("creating key: %w", err)
		}
		return nil
	})
}

const keyCols = `id, tenant, name, prefix, hash, admin, created_at, revoked_at, rate_limit_rps, rate_limit_burst`

func scanKey(row interface{ Scan(...any) error }) (Key, error) {
	var (
		k       Key
		created int64
		revoked sql.NullInt64
		rps     sql.NullFloat64
		burst   sql.NullInt64
	)
	if err := row.Scan(&k.ID, &k.Tenant, &k.Name, &k.Prefix, &k.Hash, &k.Admin, &created, &revoked, &rps, &burst); err != nil {
		return Key{}, err
	}
	if rps.Valid {
		v := rps.Float64
		k.RateLimitRPS = &v
	}
	if burst.Valid {
		v := int(burst.Int64)
		k.RateLimitBurst = &v
	}
	k.CreatedAt = fromTS(created)
	k.RevokedAt = fromTSP(revoked)
	return k, nil
}

// KeyByHash returns the key whose secret hashes to hash, revoked or not.
// There is no cache: RevokeKey commits before it returns and every read sees
// the latest commit, so a revocation is effective at once.
func (s *Store) KeyByHash(ctx context.Context, hash []byte) (Key, error) {
	k, err := scanKey(s.keyByHash.QueryRowContext(ctx, hash))
	if errors.Is(err, sql.ErrNoRows) {
		return Key{}, fmt.Errorf("%w: key", errdefs.ErrNotFound)
	}
	if err != nil {
		return Key{}, fmt.Errorf("loading key: %w", err)
	}
	return k, nil
}

// GetKey returns key id.
func (s *Store) GetKey(ctx context.Context, id string) (Key, error) {
	k, err := scanKey(s.r.QueryRowContext(ctx, `SELECT `+keyCols+` FROM api_keys WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Key{}, fmt.Errorf("%w: key %q", errdefs.ErrNotFound, id)
	}
	if err != nil {
		return Key{}, fmt.Errorf("loading key: %w", err)
	}
	return k, nil
}

// ListKeys returns the keys of tenant (every tenant when tenant is ""),
// oldest first.
func (s *Store) ListKeys(ctx context.Context, tenant string) ([]Key, error) {
	q := `SELECT ` + keyCols + ` FROM api_keys`
	var args []any
	if tenant != "" {
		q += ` WHERE tenant = ?`
		args = append(args, tenant)
	}
	rows, err := s.r.QueryContext(ctx, q+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("listing keys: %w", err)
	}
	defer rows.Close()
	var out []Key
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("listing keys: %w", err)
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// RevokeKey marks key id revoked at at. Revoking a revoked key keeps the
// first revocation time and is not an error.
func (s *Store) RevokeKey(ctx context.Context, id string, at time.Time) error {
	res, err := s.w.ExecContext(ctx, `UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?`, ts(at), id)
	if err != nil {
		return fmt.Errorf("revoking key: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: key %q", errdefs.ErrNotFound, id)
	}
	return nil
}

// RevokeKeysNamed revokes every live admin key called name except the one
// with hash keep (used to retire an earlier AIRLOCK_ADMIN_KEY).
func (s *Store) RevokeKeysNamed(ctx context.Context, name string, keep []byte, at time.Time) error {
	_, err := s.w.ExecContext(ctx, `UPDATE api_keys SET revoked_at = ? WHERE name = ? AND admin = 1 AND revoked_at IS NULL AND hash != ?`,
		ts(at), name, keep)
	if err != nil {
		return fmt.Errorf("revoking keys: %w", err)
	}
	return nil
}

// CountAdminKeys counts admin keys that are not revoked.
func (s *Store) CountAdminKeys(ctx context.Context) (int, error) {
	var n int
	err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM api_keys WHERE admin = 1 AND revoked_at IS NULL`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("counting admin keys: %w", err)
	}
	return n, nil
}
