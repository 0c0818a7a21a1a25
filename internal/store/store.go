// Package store persists airlock's tenants, API keys, sandboxes, exec records, idempotency keys, template versions and builds, exposed preview ports, snapshots and warm pools in SQLite.
//
// The database is one file in the data dir, opened in WAL mode so that
// readers never wait for the writer. All writes go through one connection
// (SQLite allows one writer; a single connection makes that explicit and
// avoids SQLITE_BUSY storms), reads through a small pool of read-only ones.
// Times are stored as UTC unix nanoseconds, JSON documents as TEXT.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// busyTimeoutMS bounds how long a statement waits for a lock held by another
// connection (a reader checkpointing the WAL, or a second process) before it
// fails; a few seconds covers checkpoints without hanging requests forever.
const busyTimeoutMS = 5000

// readConns is the size of the read pool: enough for concurrent API reads on
// this 2-core class of host without holding many idle file handles.
const readConns = 4

// Store is the SQLite-backed persistence of the daemon. It is safe for
// concurrent use.
type Store struct {
	w *sql.DB // the one writer connection
	r *sql.DB // read-only pool

	// Statements of the hot paths (every request, every exec), prepared
	// once: parsing SQL costs more than running these.
	keyByHash  *sql.Stmt
	createExec *sql.Stmt
	finishExec *sql.Stmt
	putOutput  *sql.Stmt
}

// Open opens (creating if needed) the database at path and applies pending
// migrations.
func Open(ctx context.Context, path string) (*Store, error) {
	if path == "" {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "store path is empty")
	}
	if err := ownerOnly(path); err != nil {
		return nil, err
	}
	base := "file:" + (&url.URL{Path: path}).EscapedPath()
	pragmas := fmt.Sprintf("_pragma=busy_timeout(%d)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(ON)", busyTimeoutMS)
	w, err := sql.Open("sqlite", base+"?"+pragmas+"&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("opening store: %w", err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	if err := w.PingContext(ctx); err != nil {
		w.Close()
		return nil, fmt.Errorf("opening store: %w", err)
	}
	if err := migrate(ctx, w); err != nil {
		w.Close()
		return nil, err
	}
	r, err := sql.Open("sqlite", base+"?"+pragmas+"&_pragma=query_only(1)")
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("opening store: %w", err)
	}
	r.SetMaxOpenConns(readConns)
	r.SetMaxIdleConns(readConns)
	if err := r.PingContext(ctx); err != nil {
		w.Close()
		r.Close()
		return nil, fmt.Errorf("opening store: %w", err)
	}
	st := &Store{w: w, r: r}
	if err := st.prepare(ctx); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

// ownerOnly makes the database file, created now if missing, and its WAL
// and shared-memory files readable by their owner alone: they hold hashed
// keys, sandboxes' sealed secrets, exec output and the audit trail. SQLite
// creates -wal and -shm with the database file's mode, so a new database
// gets 0600 throughout; an older one made with 0644 is tightened.
func ownerOnly(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("opening store: %w", err)
	}
	f.Close()
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(p, 0o600); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("opening store: %w", err)
		}
	}
	return nil
}

func (s *Store) prepare(ctx context.Context) error {
	var err error
	prep := func(db *sql.DB, q string) *sql.Stmt {
		if err != nil {
			return nil
		}
		var st *sql.Stmt
		st, err = db.PrepareContext(ctx, q)
		return st
	}
	s.keyByHash = prep(s.r, `SELECT `+keyCols+` FROM api_keys WHERE hash = ?`)
	s.createExec = prep(s.w, `INSERT INTO execs(`+execCols+`, request_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`)
	s.finishExec = prep(s.w, `UPDATE execs SET status=?, exit_code=?, signal=?, truncated=?, stdout_bytes=?,
			stderr_bytes=?, ended_at=?, duration_ms=?, error=?, error_code=?, stdout_dropped=?, stderr_dropped=?,
			cwd=COALESCE(NULLIF(?, ''), cwd) WHERE id=? RETURNING request_id`)
	s.putOutput = prep(s.w, `INSERT INTO exec_output(exec_id, events) VALUES (?, ?)
				ON CONFLICT(exec_id) DO UPDATE SET events = excluded.events`)
	if err != nil {
		return fmt.Errorf("preparing statements: %w", err)
	}
	return nil
}

// Close closes the database.
func (s *Store) Close() error {
	for _, st := range []*sql.Stmt{s.keyByHash, s.createExec, s.finishExec, s.putOutput} {
		if st != nil {
			st.Close()
		}
	}
	return errors.Join(s.r.Close(), s.w.Close())
}

// Ping checks that the database answers (for /readyz).
func (s *Store) Ping(ctx context.Context) error {
	var one int
	if err := s.r.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
		return fmt.Errorf("%w: store: %v", errdefs.ErrUnavailable, err)
	}
	return nil
}

// tx runs fn in a write transaction, committing when fn returns nil.
func (s *Store) tx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// ts converts t to the stored form (0 for the zero time).
func ts(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UTC().UnixNano()
}

// tsp converts an optional time to the stored form (NULL for nil).
func tsp(t *time.Time) any {
	if t == nil || t.IsZero() {
		return nil
	}
	return t.UTC().UnixNano()
}

// fromTS converts a stored time back (zero for 0).
func fromTS(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// fromTSP converts a nullable stored time back.
func fromTSP(n sql.NullInt64) *time.Time {
	if !n.Valid || n.Int64 == 0 {
		return nil
	}
	t := time.Unix(0, n.Int64).UTC()
	return &t
}

func nullStr(s string) any {
	if s == "" {
		return nil
	}
	return s
}
