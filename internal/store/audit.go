package store

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/errdefs"
)

var _ audit.Sink = (*Store)(nil)

// InsertAuditEvents appends evs to the audit trail in one transaction; the
// store assigns each its Seq.
func (s *Store) InsertAuditEvents(ctx context.Context, evs []audit.Event) error {
	if len(evs) == 0 {
		return nil
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		st, err := tx.PrepareContext(ctx, `INSERT INTO audit_events(id, time, type, tenant, sandbox_id, template, request_id, detail)
			VALUES (?,?,?,?,?,?,?,?)`)
		if err != nil {
			return fmt.Errorf("inserting audit events: %w", err)
		}
		defer st.Close()
		for _, e := range evs {
			detail := string(e.Detail)
			if detail == "" {
				detail = "{}"
			}
			if _, err := st.ExecContext(ctx, e.ID, ts(e.Time), e.Type, e.Tenant, e.SandboxID, e.Template, e.RequestID, detail); err != nil {
				return fmt.Errorf("inserting audit event: %w", err)
			}
		}
		return nil
	})
}

// AuditFilter selects audit events. Zero fields match everything.
type AuditFilter struct {
	// Tenant restricts to one tenant's events ("" for all: admins).
	Tenant    string
	SandboxID string
	// Types keeps events of these types.
	Types []string
	// Since and Until bound the events' time (Since inclusive, Until exclusive).
	Since, Until time.Time
	// Cursor is the NextCursor of an earlier page: only later events.
	Cursor string
	// Limit is the page size (0: 100, at most MaxPageSize).
	Limit int
}

// AuditPage is one page of the trail, oldest first.
type AuditPage struct {
	Events []audit.Event
	// NextCursor is the position after the last event of the page (the
	// request's cursor when the page is empty): pass it again to get the
	// next page, or, once HasMore is false, to poll for new events.
	NextCursor string
	// HasMore is true when more events matched than the page holds.
	HasMore bool
}

// ListAuditEvents returns one page of the events f selects, in the order
// they were written.
func (s *Store) ListAuditEvents(ctx context.Context, f AuditFilter) (AuditPage, error) {
	limit, err := pageSize(f.Limit)
	if err != nil {
		return AuditPage{}, err
	}
	var after int64
	if f.Cursor != "" {
		if after, err = DecodeAuditCursor(f.Cursor); err != nil {
			return AuditPage{}, err
		}
	}
	var (
		where = []string{"seq > ?"}
		args  = []any{after}
	)
	if f.Tenant != "" {
		where, args = append(where, "tenant = ?"), append(args, f.Tenant)
	}
	if f.SandboxID != "" {
		where, args = append(where, "sandbox_id = ?"), append(args, f.SandboxID)
	}
	if len(f.Types) > 0 {
		where = append(where, "type IN ("+strings.TrimSuffix(strings.Repeat("?,", len(f.Types)), ",")+")")
		for _, t := range f.Types {
			args = append(args, t)
		}
	}
	if !f.Since.IsZero() {
		where, args = append(where, "time >= ?"), append(args, ts(f.Since))
	}
	if !f.Until.IsZero() {
		where, args = append(where, "time < ?"), append(args, ts(f.Until))
	}
	args = append(args, limit+1)
	rows, err := s.r.QueryContext(ctx, `SELECT seq, id, time, type, tenant, sandbox_id, template, request_id, detail
		FROM audit_events WHERE `+strings.Join(where, " AND ")+` ORDER BY seq LIMIT ?`, args...)
	if err != nil {
		return AuditPage{}, fmt.Errorf("listing audit events: %w", err)
	}
	defer rows.Close()
	page := AuditPage{Events: []audit.Event{}}
	for rows.Next() {
		var (
			e      audit.Event
			t      int64
			detail string
		)
		if err := rows.Scan(&e.Seq, &e.ID, &t, &e.Type, &e.Tenant, &e.SandboxID, &e.Template, &e.RequestID, &detail); err != nil {
			return AuditPage{}, fmt.Errorf("listing audit events: %w", err)
		}
		e.Time, e.Detail = fromTS(t), json.RawMessage(detail)
		page.Events = append(page.Events, e)
	}
	if err := rows.Err(); err != nil {
		return AuditPage{}, fmt.Errorf("listing audit events: %w", err)
	}
	if len(page.Events) > limit {
		page.Events, page.HasMore = page.Events[:limit], true
	}
	last := after
	if n := len(page.Events); n > 0 {
		last = page.Events[n-1].Seq
	}
	page.NextCursor = EncodeAuditCursor(last)
	return page, nil
}

// auditCursorPrefix tells an audit cursor from the sandbox listings'.
const auditCursorPrefix = "a"

// EncodeAuditCursor returns the cursor of the position after seq.
func EncodeAuditCursor(seq int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte(auditCursorPrefix + strconv.FormatInt(seq, 10)))
}

// DecodeAuditCursor reads a cursor EncodeAuditCursor made; anything else
// is an error wrapping errdefs.ErrInvalidArgument.
func DecodeAuditCursor(c string) (int64, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil || len(b) > 32 || !strings.HasPrefix(string(b), auditCursorPrefix) {
		return 0, errdefs.Wrap(errdefs.ErrInvalidArgument, "invalid cursor")
	}
	n, err := strconv.ParseInt(string(b[len(auditCursorPrefix):]), 10, 64)
	if err != nil || n < 0 {
		return 0, errdefs.Wrap(errdefs.ErrInvalidArgument, "invalid cursor")
	}
	return n, nil
}

// SetTenantNetwork stores tenant's default network policy (JSON), creating
// the tenant if needed; nil clears it.
func (s *Store) SetTenantNetwork(ctx context.Context, tenant string, policy json.RawMessage) error {
	var v any
	if len(policy) > 0 {
		v = string(policy)
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO tenants(id, created_at) VALUES (?, ?) ON CONFLICT(id) DO NOTHING`,
			tenant, time.Now().UnixNano()); err != nil {
			return fmt.Errorf("storing tenant network: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE tenants SET network = ? WHERE id = ?`, v, tenant); err != nil {
			return fmt.Errorf("storing tenant network: %w", err)
		}
		return nil
	})
}

// TenantNetwork returns tenant's default network policy (JSON), nil when it
// has none (or the tenant does not exist).
func (s *Store) TenantNetwork(ctx context.Context, tenant string) (json.RawMessage, error) {
	var v sql.NullString
	err := s.r.QueryRowContext(ctx, `SELECT network FROM tenants WHERE id = ?`, tenant).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && !v.Valid) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("loading tenant network: %w", err)
	}
	return json.RawMessage(v.String), nil
}
