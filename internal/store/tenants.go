package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// SetTenantQuota stores tenant's quota override (JSON), creating the tenant
// if needed; nil clears it, so the tenant gets the server's defaults again.
func (s *Store) SetTenantQuota(ctx context.Context, tenant string, quota json.RawMessage) error {
	var v any
	if len(quota) > 0 {
		v = string(quota)
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO tenants(id, created_at) VALUES (?, ?) ON CONFLICT(id) DO NOTHING`,
			tenant, time.Now().UnixNano()); err != nil {
			return fmt.Errorf("storing tenant quota: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE tenants SET quota = ? WHERE id = ?`, v, tenant); err != nil {
			return fmt.Errorf("storing tenant quota: %w", err)
		}
		return nil
	})
}

// TenantQuota returns tenant's quota override (JSON), nil when it has none
// (or the tenant does not exist).
func (s *Store) TenantQuota(ctx context.Context, tenant string) (json.RawMessage, error) {
	var v sql.NullString
	err := s.r.QueryRowContext(ctx, `SELECT quota FROM tenants WHERE id = ?`, tenant).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && !v.Valid) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("loading tenant quota: %w", err)
	}
	return json.RawMessage(v.String), nil
}

func nullFloat(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

func nullInt(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

// IdempotencyKey returns tenant's binding of key, nil if there is none.
func (s *Store) IdempotencyKey(ctx context.Context, tenant, key string) (*IdempotencyRecord, error) {
	var rec IdempotencyRecord
	err := s.r.QueryRowContext(ctx, `SELECT sandbox_id, request_hash FROM idempotency_keys WHERE tenant = ? AND key = ?`,
		tenant, key).Scan(&rec.SandboxID, &rec.RequestHash)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("loading idempotency key: %w", err)
	}
	return &rec, nil
}
