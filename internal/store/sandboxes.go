package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
)

// Sandbox is a sandbox's persisted record.
type Sandbox struct {
	ID     string
	Tenant string
	// State is the observed state, DesiredState what the user asked for
	// (running, paused or stopped); they differ while an operation is in
	// flight or after a crash, and reconciliation moves State towards it.
	State        string
	DesiredState string
	// Spec is the normalized create request without secrets (JSON).
	Spec json.RawMessage
	// Handle is the driver.Handle (JSON), empty until the driver created it.
	Handle json.RawMessage
	// Secrets is the sealed (encrypted) secrets map, nil when none or deleted.
	Secrets         []byte
	Template        string
	TemplateVersion int
	Runtime         string
	CreatedAt       time.Time
	// ExpiresAt is when the TTL runs out if the sandbox keeps running; on
	// resume it moves forward by the time spent paused.
	ExpiresAt time.Time
	TimeoutS  int64
	// PausedAt is set while the sandbox is paused; PausedTotal sums earlier
	// pauses.
	PausedAt    *time.Time
	PausedTotal time.Duration
	Metadata    map[string]string
	ReadyMS     int64
	// ErrorCode and ErrorMessage say why a sandbox is in state error.
	ErrorCode    string
	ErrorMessage string
	// EndedAt and EndReason (the API's stop_reason: deleted, expired, oom,
	// crashed, host, create_failed…) are set when the sandbox stopped
	// running.
	EndedAt   *time.Time
	EndReason string
	// Lifecycle are the sandbox's lifecycle rules.
	Lifecycle Lifecycle
	// PauseMemory says how a paused sandbox is held (keep or disk); empty
	// when it is not paused.
	PauseMemory string
	// SnapshotID is the snapshot the sandbox started from, or was last
	// reset to: while the sandbox lives, that snapshot's layers are kept
	// even if it is deleted.
	SnapshotID string
	// Pool is the warm pool the sandbox is a member of, or was claimed
	// from (PoolMember says which).
	Pool string
	// LastActiveAt is the sandbox's last activity, the idle timeout's
	// start. It never moves back: UpdateSandbox and TouchSandbox keep the
	// later of the stored time and theirs, so a record read before a
	// touch does not undo it.
	LastActiveAt time.Time
}

// Lifecycle on_timeout values.
const (
	OnTimeoutKill  = "kill"
	OnTimeoutPause = "pause"
)

// Lifecycle are a sandbox's lifecycle rules (the API's lifecycle).
type Lifecycle struct {
	// OnTimeout is kill or pause; empty is stored as kill.
	OnTimeout string
	// AutoResume resumes a paused sandbox on the next request to it.
	AutoResume bool
	// IdleTimeoutS pauses it after that many seconds without activity; 0
	// never does.
	IdleTimeoutS int64
}

// Idempotency binds a client's Idempotency-Key to the sandbox it created.
type Idempotency struct {
	Key string
	// RequestHash identifies the request body, so that reusing a key for a
	// different request is told apart from a retry.
	RequestHash string
}

const sandboxCols = `id, tenant, state, desired_state, spec, handle, secrets, template, template_version, runtime,
	created_at, expires_at, timeout_s, paused_at, paused_total_ns, metadata, ready_ms, error_code, error_message,
	ended_at, end_reason, on_timeout, auto_resume, idle_timeout_s, pause_memory, snapshot_id, pool, last_active_at`

// sandboxPlaceholders are the VALUES of an INSERT of sandboxCols.
const sandboxPlaceholders = `?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?`

func scanSandbox(row interface{ Scan(...any) error }) (Sandbox, error) {
	var (
		sb                        Sandbox
		spec, meta                string
		handle, ecode, emsg, why  sql.NullString
		pmem, snap, pool          sql.NullString
		created, expires, pausedN int64
		active                    int64
		paused, ended             sql.NullInt64
	)
	err := row.Scan(&sb.ID, &sb.Tenant, &sb.State, &sb.DesiredState, &spec, &handle, &sb.Secrets, &sb.Template,
		&sb.TemplateVersion, &sb.Runtime, &created, &expires, &sb.TimeoutS, &paused, &pausedN, &meta, &sb.ReadyMS,
		&ecode, &emsg, &ended, &why, &sb.Lifecycle.OnTimeout, &sb.Lifecycle.AutoResume, &sb.Lifecycle.IdleTimeoutS,
		&pmem, &snap, &pool, &active)
	if err != nil {
		return Sandbox{}, err
	}
	sb.PauseMemory, sb.SnapshotID, sb.Pool, sb.LastActiveAt = pmem.String, snap.String, pool.String, fromTS(active)
	sb.Spec = json.RawMessage(spec)
	if handle.Valid && handle.String != "" {
		sb.Handle = json.RawMessage(handle.String)
	}
	sb.CreatedAt, sb.ExpiresAt = fromTS(created), fromTS(expires)
	sb.PausedAt, sb.PausedTotal = fromTSP(paused), time.Duration(pausedN)
	if err := json.Unmarshal([]byte(meta), &sb.Metadata); err != nil {
		return Sandbox{}, fmt.Errorf("sandbox %s metadata: %w", sb.ID, err)
	}
	sb.ErrorCode, sb.ErrorMessage = ecode.String, emsg.String
	sb.EndedAt, sb.EndReason = fromTSP(ended), why.String
	return sb, nil
}

func sandboxArgs(sb Sandbox) ([]any, error) {
	meta := sb.Metadata
	if meta == nil {
		meta = map[string]string{}
	}
	mb, err := json.Marshal(meta)
	if err != nil {
		return nil, fmt.Errorf("encoding metadata: %w", err)
	}
	spec := string(sb.Spec)
	if spec == "" {
		spec = "{}"
	}
	var handle any
	if len(sb.Handle) > 0 {
		handle = string(sb.Handle)
	}
	onTimeout := sb.Lifecycle.OnTimeout
	if onTimeout == "" {
		onTimeout = OnTimeoutKill
	}
	return []any{sb.ID, sb.Tenant, sb.State, sb.DesiredState, spec, handle, sb.Secrets, sb.Template,
		sb.TemplateVersion, sb.Runtime, ts(sb.CreatedAt), ts(sb.ExpiresAt), sb.TimeoutS, tsp(sb.PausedAt),
		int64(sb.PausedTotal), string(mb), sb.ReadyMS, nullStr(sb.ErrorCode), nullStr(sb.ErrorMessage),
		tsp(sb.EndedAt), nullStr(sb.EndReason), onTimeout, sb.Lifecycle.AutoResume, sb.Lifecycle.IdleTimeoutS,
		nullStr(sb.PauseMemory), nullStr(sb.SnapshotID), nullStr(sb.Pool), ts(sb.LastActiveAt)}, nil
}

// CreateSandbox inserts sb (creating its tenant if needed). With idem set it
// also records the idempotency key in the same transaction; if the key is
// already taken it inserts nothing and returns the existing binding with an
// error wrapping errdefs.ErrAlreadyExists.
func (s *Store) CreateSandbox(ctx context.Context, sb Sandbox, idem *Idempotency) (existing *IdempotencyRecord, err error) {
	args, err := sandboxArgs(sb)
	if err != nil {
		return nil, err
	}
	err = s.tx(ctx, func(tx *sql.Tx) error {
		if idem != nil {
			var rec IdempotencyRecord
			err := tx.QueryRowContext(ctx, `SELECT sandbox_id, request_hash FROM idempotency_keys WHERE tenant = ? AND key = ?`,
				sb.Tenant, idem.Key).Scan(&rec.SandboxID, &rec.RequestHash)
			if err == nil {
				existing = &rec
				return fmt.Errorf("%w: idempotency key", errdefs.ErrAlreadyExists)
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("idempotency key: %w", err)
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO tenants(id, created_at) VALUES (?, ?) ON CONFLICT(id) DO NOTHING`,
			sb.Tenant, ts(sb.CreatedAt)); err != nil {
			return fmt.Errorf("creating sandbox: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO sandboxes(`+sandboxCols+`)
			VALUES (`+sandboxPlaceholders+`)`, args...); err != nil {
			if isUniqueViolation(err) {
				return fmt.Errorf("%w: sandbox %q", errdefs.ErrAlreadyExists, sb.ID)
			}
			return fmt.Errorf("creating sandbox: %w", err)
		}
		if idem != nil {
			if _, err := tx.ExecContext(ctx, `INSERT INTO idempotency_keys(tenant, key, request_hash, sandbox_id, created_at)
				VALUES (?, ?, ?, ?, ?)`, sb.Tenant, idem.Key, idem.RequestHash, sb.ID, ts(sb.CreatedAt)); err != nil {
				return fmt.Errorf("idempotency key: %w", err)
			}
		}
		return nil
	})
	return existing, err
}

// IdempotencyRecord is a stored idempotency binding.
type IdempotencyRecord struct {
	SandboxID   string
	RequestHash string
}

// DeleteIdempotencyKey forgets tenant's key, so that a retry after a failed
// create starts a new sandbox.
func (s *Store) DeleteIdempotencyKey(ctx context.Context, tenant, key string) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM idempotency_keys WHERE tenant = ? AND key = ?`, tenant, key); err != nil {
		return fmt.Errorf("deleting idempotency key: %w", err)
	}
	return nil
}

// DeleteIdempotencyKeysFor forgets every key bound to sandbox id.
func (s *Store) DeleteIdempotencyKeysFor(ctx context.Context, id string) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM idempotency_keys WHERE sandbox_id = ?`, id); err != nil {
		return fmt.Errorf("deleting idempotency keys: %w", err)
	}
	return nil
}

// GetSandbox returns sandbox id. With tenant set, a sandbox of another
// tenant is reported exactly like a missing one (the same query, the same
// error), so callers cannot tell the two apart.
func (s *Store) GetSandbox(ctx context.Context, id, tenant string) (Sandbox, error) {
	q := `SELECT ` + sandboxCols + ` FROM sandboxes WHERE id = ?`
	args := []any{id}
	if tenant != "" {
		q += ` AND tenant = ?`
		args = append(args, tenant)
	}
	sb, err := scanSandbox(s.r.QueryRowContext(ctx, q, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return Sandbox{}, fmt.Errorf("%w: sandbox %q", errdefs.ErrNotFound, id)
	}
	if err != nil {
		return Sandbox{}, fmt.Errorf("loading sandbox: %w", err)
	}
	return sb, nil
}

// UpdateSandbox writes every field of sb over the stored record, but for
// LastActiveAt, which only moves forward.
func (s *Store) UpdateSandbox(ctx context.Context, sb Sandbox) error {
	args, err := sandboxArgs(sb)
	if err != nil {
		return err
	}
	res, err := s.w.ExecContext(ctx, `UPDATE sandboxes SET tenant=?2, state=?3, desired_state=?4, spec=?5, handle=?6,
		secrets=?7, template=?8, template_version=?9, runtime=?10, created_at=?11, expires_at=?12, timeout_s=?13,
		paused_at=?14, paused_total_ns=?15, metadata=?16, ready_ms=?17, error_code=?18, error_message=?19,
		ended_at=?20, end_reason=?21, on_timeout=?22, auto_resume=?23, idle_timeout_s=?24, pause_memory=?25,
		snapshot_id=?26, pool=?27, last_active_at=MAX(last_active_at, ?28) WHERE id=?1`, args...)
	if err != nil {
		return fmt.Errorf("updating sandbox: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: sandbox %q", errdefs.ErrNotFound, sb.ID)
	}
	return nil
}

// SandboxFilter selects sandboxes for ListSandboxes.
type SandboxFilter struct {
	// Tenant limits the list to one tenant; "" means every tenant (admin).
	Tenant string
	// States keeps sandboxes in one of these states; empty means all.
	States []string
	// Metadata keeps sandboxes whose metadata has every one of these pairs.
	Metadata map[string]string
	// Limit is the page size (1…1000; 0 means 100).
	Limit int
	// Cursor continues a previous page (the NextCursor it returned).
	Cursor string
	// PoolMembers lists unclaimed warm pool members too; they are left
	// out otherwise (nobody has claimed them: they are nobody's sandboxes
	// yet).
	PoolMembers bool
}

// MaxPageSize bounds a listing page.
const MaxPageSize = 1000

// metadataKeyRE restricts filter keys to what can be quoted safely in a JSON
// path; the manager enforces the same rule on stored metadata.
var metadataKeyRE = lazyregexp.New(`^[A-Za-z0-9_.\-]{1,128}$`)

// ListSandboxes returns one page of sandboxes, newest first, and the cursor
// of the next page ("" on the last one).
func (s *Store) ListSandboxes(ctx context.Context, f SandboxFilter) ([]Sandbox, string, error) {
	limit, err := pageSize(f.Limit)
	if err != nil {
		return nil, "", err
	}
	var (
		where []string
		args  []any
	)
	if f.Tenant != "" {
		where = append(where, "tenant = ?")
		args = append(args, f.Tenant)
	}
	if len(f.States) > 0 {
		where = append(where, "state IN ("+strings.TrimSuffix(strings.Repeat("?,", len(f.States)), ",")+")")
		for _, st := range f.States {
			args = append(args, st)
		}
	}
	for k, v := range f.Metadata {
		if !metadataKeyRE.MatchString(k) {
			return nil, "", errdefs.Wrap(errdefs.ErrInvalidArgument, "metadata filter key %q", k)
		}
		where = append(where, `json_extract(metadata, '$."`+k+`"') = ?`)
		args = append(args, v)
	}
	if !f.PoolMembers {
		where = append(where, `id NOT IN (SELECT sandbox_id FROM pool_members WHERE state != '`+MemberClaimed+`')`)
	}
	if f.Cursor != "" {
		c, err := decodeCursor(f.Cursor)
		if err != nil {
			return nil, "", err
		}
		where = append(where, "(created_at < ? OR (created_at = ? AND id < ?))")
		args = append(args, c.T, c.T, c.ID)
	}
	q := `SELECT ` + sandboxCols + ` FROM sandboxes`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY created_at DESC, id DESC LIMIT ?"
	args = append(args, limit+1)
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, "", fmt.Errorf("listing sandboxes: %w", err)
	}
	defer rows.Close()
	var out []Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, "", fmt.Errorf("listing sandboxes: %w", err)
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("listing sandboxes: %w", err)
	}
	next := ""
	if len(out) > limit {
		out = out[:limit]
		last := out[limit-1]
		next = encodeCursor(cursor{T: ts(last.CreatedAt), ID: last.ID})
	}
	return out, next, nil
}

// SandboxesInStates returns every sandbox in one of states (for recovery and
// the TTL loop), oldest first.
func (s *Store) SandboxesInStates(ctx context.Context, states ...string) ([]Sandbox, error) {
	if len(states) == 0 {
		return nil, nil
	}
	args := make([]any, len(states))
	for i, st := range states {
		args[i] = st
	}
	rows, err := s.r.QueryContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE state IN (`+
		strings.TrimSuffix(strings.Repeat("?,", len(states)), ",")+`) ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	defer rows.Close()
	var out []Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, fmt.Errorf("listing sandboxes: %w", err)
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

// TouchSandbox records activity of sandbox id at at (the idle timeout
// counts from it). An earlier time than the stored one changes nothing.
func (s *Store) TouchSandbox(ctx context.Context, id string, at time.Time) error {
	res, err := s.w.ExecContext(ctx, `UPDATE sandboxes SET last_active_at = MAX(last_active_at, ?) WHERE id = ?`, ts(at), id)
	if err != nil {
		return fmt.Errorf("recording activity: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: sandbox %q", errdefs.ErrNotFound, id)
	}
	return nil
}

// IdleSandboxes returns the running sandboxes whose idle timeout has
// passed at now: no activity since IdleTimeoutS seconds (counted from the
// create when there was none), oldest first.
func (s *Store) IdleSandboxes(ctx context.Context, now time.Time) ([]Sandbox, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE state = 'running' AND idle_timeout_s > 0
		AND MAX(last_active_at, created_at) + idle_timeout_s * 1000000000 <= ? ORDER BY created_at, id`, ts(now))
	if err != nil {
		return nil, fmt.Errorf("listing idle sandboxes: %w", err)
	}
	defer rows.Close()
	var out []Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, fmt.Errorf("listing idle sandboxes: %w", err)
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

// Purge deletes records that ended before before: sandboxes in state
// stopped or error whose EndedAt is older, ended execs (and their output),
// idempotency keys and audit events older than it, the records of failed
// template builds, and the rows of claimed pool members whose sandbox is
// no longer live (they count nothing any more). It returns how many
// sandboxes went.
func (s *Store) Purge(ctx context.Context, before time.Time) (int, error) {
	var n int64
	err := s.tx(ctx, func(tx *sql.Tx) error {
		b := ts(before)
		res, err := tx.ExecContext(ctx, `DELETE FROM sandboxes WHERE state IN ('stopped','error') AND ended_at IS NOT NULL AND ended_at < ?`, b)
		if err != nil {
			return err
		}
		n, _ = res.RowsAffected()
		if _, err := tx.ExecContext(ctx, `DELETE FROM exec_output WHERE exec_id IN (SELECT id FROM execs WHERE ended_at IS NOT NULL AND ended_at < ?)`, b); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM execs WHERE ended_at IS NOT NULL AND ended_at < ?`, b); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM idempotency_keys WHERE created_at < ?`, b); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM audit_events WHERE time < ?`, b); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM pool_members WHERE state = ? AND NOT EXISTS (
			SELECT 1 FROM sandboxes s WHERE s.id = pool_members.sandbox_id AND s.state IN (`+liveSandboxStates+`))`, MemberClaimed); err != nil {
			return err
		}
		// Failed builds are kept for their logs until the retention; the
		// template row keeps its version number.
		_, err = tx.ExecContext(ctx, `DELETE FROM template_builds WHERE status = 'failed' AND ended_at IS NOT NULL AND ended_at < ?`, b)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("purging records: %w", err)
	}
	return int(n), nil
}

func pageSize(n int) (int, error) {
	switch {
	case n == 0:
		return 100, nil
	case n < 0 || n > MaxPageSize:
		return 0, errdefs.Wrap(errdefs.ErrInvalidArgument, "limit must be between 1 and %d", MaxPageSize)
	}
	return n, nil
}

func isUniqueViolation(err error) bool {
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE || se.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
	}
	return false
}
