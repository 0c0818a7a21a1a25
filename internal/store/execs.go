package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// Exec is the record of one command run in a sandbox. Records outlive their
// sandbox (until the retention purge).
type Exec struct {
	ID        string
	SandboxID string
	Tenant    string
	// Argv or Shell is the command (exactly one is set).
	Argv  []string
	Shell *string
	User  string
	Cwd   string
	PTY   bool
	// Status is running until the exec ends, then exited, timeout, killed,
	// oom or error.
	Status      string
	ExitCode    *int
	Signal      string
	Truncated   bool
	StdoutBytes int64
	StderrBytes int64
	StartedAt   time.Time
	EndedAt     *time.Time
	DurationMS  int64
	Error       string
	// ErrorCode tells apart why an exec did not exit on its own
	// (api.ExecCode*); empty for a normal exit.
	ErrorCode string
	// RequestID is the API request that started the exec: CreateExec takes
	// it from its context (audit.RequestID), FinishExec returns it.
	// Listings leave it empty.
	RequestID string
	// Template is the sandbox's template (name:version) when the exec
	// started, kept so the record still says it after the sandbox is gone.
	Template string
	// StdoutDropped and StderrDropped count the bytes of each stream that
	// went past the exec's output cap and were not kept (between the
	// stream's head and tail).
	StdoutDropped, StderrDropped int64
}

const execCols = `id, sandbox_id, tenant, argv, shell, user, cwd, pty, status, exit_code, signal, truncated,
	stdout_bytes, stderr_bytes, started_at, ended_at, duration_ms, error, template, error_code, stdout_dropped, stderr_dropped`

func scanExec(row interface{ Scan(...any) error }) (Exec, error) {
	var (
		e                      Exec
		argv, shell, sig, eerr sql.NullString
		tmpl, ecode            sql.NullString
		code                   sql.NullInt64
		started                int64
		ended                  sql.NullInt64
	)
	err := row.Scan(&e.ID, &e.SandboxID, &e.Tenant, &argv, &shell, &e.User, &e.Cwd, &e.PTY, &e.Status, &code, &sig,
		&e.Truncated, &e.StdoutBytes, &e.StderrBytes, &started, &ended, &e.DurationMS, &eerr, &tmpl, &ecode,
		&e.StdoutDropped, &e.StderrDropped)
	if err != nil {
		return Exec{}, err
	}
	if argv.Valid {
		if err := json.Unmarshal([]byte(argv.String), &e.Argv); err != nil {
			return Exec{}, fmt.Errorf("exec %s argv: %w", e.ID, err)
		}
	}
	if shell.Valid {
		sh := shell.String
		e.Shell = &sh
	}
	if code.Valid {
		c := int(code.Int64)
		e.ExitCode = &c
	}
	e.Signal, e.Error, e.Template, e.ErrorCode = sig.String, eerr.String, tmpl.String, ecode.String
	e.StartedAt, e.EndedAt = fromTS(started), fromTSP(ended)
	return e, nil
}

// CreateExec inserts the record of an exec that starts.
func (s *Store) CreateExec(ctx context.Context, e Exec) error {
	var argv, shell any
	if e.Argv != nil {
		b, err := json.Marshal(e.Argv)
		if err != nil {
			return fmt.Errorf("encoding argv: %w", err)
		}
		argv = string(b)
	}
	if e.Shell != nil {
		shell = *e.Shell
	}
	var code any
	if e.ExitCode != nil {
		code = *e.ExitCode
	}
	rid := e.RequestID
	if rid == "" {
		rid = audit.RequestID(ctx)
	}
	_, err := s.createExec.ExecContext(ctx,
		e.ID, e.SandboxID, e.Tenant, argv, shell, e.User, e.Cwd, e.PTY, e.Status, code, nullStr(e.Signal),
		e.Truncated, e.StdoutBytes, e.StderrBytes, ts(e.StartedAt), tsp(e.EndedAt), e.DurationMS, nullStr(e.Error),
		nullStr(e.Template), nullStr(e.ErrorCode), e.StdoutDropped, e.StderrDropped, nullStr(rid))
	if err != nil {
		if isUniqueViolation(err) {
			return fmt.Errorf("%w: exec %q", errdefs.ErrAlreadyExists, e.ID)
		}
		return fmt.Errorf("creating exec record: %w", err)
	}
	return nil
}

// FinishExec writes the outcome of an exec and, when events is not nil, its
// captured output. It returns the request that started the exec (the
// record's, see Exec.RequestID), for the exec's audit event.
func (s *Store) FinishExec(ctx context.Context, e Exec, events []byte) (requestID string, err error) {
	var code any
	if e.ExitCode != nil {
		code = *e.ExitCode
	}
	var rid sql.NullString
	err = s.tx(ctx, func(tx *sql.Tx) error {
		err := tx.StmtContext(ctx, s.finishExec).QueryRowContext(ctx,
			e.Status, code, nullStr(e.Signal), e.Truncated, e.StdoutBytes, e.StderrBytes, tsp(e.EndedAt),
			e.DurationMS, nullStr(e.Error), nullStr(e.ErrorCode), e.StdoutDropped, e.StderrDropped, e.Cwd, e.ID).Scan(&rid)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: exec %q", errdefs.ErrNotFound, e.ID)
		}
		if err != nil {
			return fmt.Errorf("finishing exec record: %w", err)
		}
		if events != nil {
			if _, err := tx.StmtContext(ctx, s.putOutput).ExecContext(ctx, e.ID, events); err != nil {
				return fmt.Errorf("storing exec output: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return rid.String, nil
}

// GetExec returns exec id of sandbox sandboxID.
func (s *Store) GetExec(ctx context.Context, sandboxID, id string) (Exec, error) {
	e, err := scanExec(s.r.QueryRowContext(ctx, `SELECT `+execCols+` FROM execs WHERE id = ? AND sandbox_id = ?`, id, sandboxID))
	if errors.Is(err, sql.ErrNoRows) {
		return Exec{}, fmt.Errorf("%w: exec %q", errdefs.ErrNotFound, id)
	}
	if err != nil {
		return Exec{}, fmt.Errorf("loading exec: %w", err)
	}
	return e, nil
}

// ExecOutput returns the stored output events of an ended exec (nil when
// none were stored).
func (s *Store) ExecOutput(ctx context.Context, id string) ([]byte, error) {
	var b []byte
	err := s.r.QueryRowContext(ctx, `SELECT events FROM exec_output WHERE exec_id = ?`, id).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("loading exec output: %w", err)
	}
	return b, nil
}

// ListExecs returns one page of sandboxID's exec records, newest first.
func (s *Store) ListExecs(ctx context.Context, sandboxID string, limit int, cur string) ([]Exec, string, error) {
	limit, err := pageSize(limit)
	if err != nil {
		return nil, "", err
	}
	q := `SELECT ` + execCols + ` FROM execs WHERE sandbox_id = ?`
	args := []any{sandboxID}
	if cur != "" {
		c, err := decodeCursor(cur)
		if err != nil {
			return nil, "", err
		}
		q += ` AND (started_at < ? OR (started_at = ? AND id < ?))`
		args = append(args, c.T, c.T, c.ID)
	}
	q += ` ORDER BY started_at DESC, id DESC LIMIT ?`
	args = append(args, limit+1)
	out, err := s.queryExecs(ctx, q, args...)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) > limit {
		out = out[:limit]
		last := out[limit-1]
		next = encodeCursor(cursor{T: ts(last.StartedAt), ID: last.ID})
	}
	return out, next, nil
}

// RunningExecs returns the records of sandboxID still marked running.
func (s *Store) RunningExecs(ctx context.Context, sandboxID string) ([]Exec, error) {
	return s.queryExecs(ctx, `SELECT `+execCols+` FROM execs WHERE sandbox_id = ? AND status = 'running' ORDER BY started_at, id`, sandboxID)
}

func (s *Store) queryExecs(ctx context.Context, q string, args ...any) ([]Exec, error) {
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing execs: %w", err)
	}
	defer rows.Close()
	var out []Exec
	for rows.Next() {
		e, err := scanExec(rows)
		if err != nil {
			return nil, fmt.Errorf("listing execs: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}
