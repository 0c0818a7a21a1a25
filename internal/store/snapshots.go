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

// Snapshot states. Only creating and ready snapshots are found by
// GetSnapshot and ListSnapshots; failed and deleted ones are kept until
// their files are gone (CollectableSnapshots, PurgeSnapshot).
const (
	// SnapshotCreating: the capture runs. Its layers are already held, so
	// that layer collection cannot take a layer being committed.
	SnapshotCreating = "creating"
	SnapshotReady    = "ready"
	// SnapshotFailed: the capture failed (or the daemon died during it).
	SnapshotFailed = "failed"
	// SnapshotDeleted: deleted by its tenant. Its layers stay while a live
	// sandbox started from it (Sandbox.SnapshotID) runs.
	SnapshotDeleted = "deleted"
)

// Snapshot is a snapshot's record: a sandbox's filesystem as a layer set
// in the template store (the layers of the template version it descends
// from, shared, and the layers captured over them) and, with Memory, the
// memory image of its processes.
type Snapshot struct {
	ID     string // snap_…
	Tenant string
	// Name is optional; unique among the tenant's creating and ready
	// snapshots.
	Name string
	// SandboxID is the sandbox it was taken of; ParentID the snapshot that
	// sandbox started from ("" for none).
	SandboxID string
	ParentID  string
	// Template and TemplateVersion are the template version its
	// filesystem descends from (a snapshot of a sandbox made from a
	// snapshot names the same one as its parent).
	Template        string
	TemplateVersion int
	Runtime         string
	State           string
	// Memory says it holds the processes' memory (Checkpoint).
	Memory bool
	// BaseLayers are the template version's layer refs, lowest first;
	// CapturedLayers the captured ones over them, lowest first, its own
	// last (a parent's come before). A sandbox from it stacks both.
	BaseLayers     []string
	CapturedLayers []string
	// Checkpoint is the memory image's ref in the template store ("" for
	// a filesystem snapshot).
	Checkpoint string
	// Config is the template's run-time config when it was taken (JSON,
	// the builder's): a sandbox from the snapshot runs with it even if
	// the template version is deleted since.
	Config json.RawMessage
	// Spec is what a sandbox from it must keep of the source (resources;
	// JSON, the service's). Never secrets, env or network.
	Spec json.RawMessage
	// SizeBytes is its own stored bytes (captured layer and memory image),
	// MemoryBytes the memory image's part.
	SizeBytes   int64
	MemoryBytes int64
	// Error says why a failed snapshot failed.
	Error     string
	CreatedAt time.Time
	ReadyAt   *time.Time
	DeletedAt *time.Time
}

// Layers returns every layer ref a sandbox from the snapshot stacks,
// lowest first.
func (sn Snapshot) Layers() []string {
	return append(append([]string{}, sn.BaseLayers...), sn.CapturedLayers...)
}

const snapshotCols = `id, tenant, name, sandbox_id, parent_id, template, template_version, runtime, state, memory,
	base_layers, captured_layers, checkpoint, config, spec, size_bytes, memory_bytes, error, created_at, ready_at, deleted_at`

func scanSnapshot(row interface{ Scan(...any) error }) (Snapshot, error) {
	var (
		sn               Snapshot
		base, captured   string
		config, spec     string
		msg              sql.NullString
		created          int64
		ready, deletedAt sql.NullInt64
	)
	err := row.Scan(&sn.ID, &sn.Tenant, &sn.Name, &sn.SandboxID, &sn.ParentID, &sn.Template, &sn.TemplateVersion,
		&sn.Runtime, &sn.State, &sn.Memory, &base, &captured, &sn.Checkpoint, &config, &spec, &sn.SizeBytes,
		&sn.MemoryBytes, &msg, &created, &ready, &deletedAt)
	if err != nil {
		return Snapshot{}, err
	}
	if err := json.Unmarshal([]byte(base), &sn.BaseLayers); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot %s layers: %w", sn.ID, err)
	}
	if err := json.Unmarshal([]byte(captured), &sn.CapturedLayers); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot %s layers: %w", sn.ID, err)
	}
	sn.Config, sn.Spec, sn.Error = json.RawMessage(config), json.RawMessage(spec), msg.String
	sn.CreatedAt, sn.ReadyAt, sn.DeletedAt = fromTS(created), fromTSP(ready), fromTSP(deletedAt)
	return sn, nil
}

func jsonDoc(b json.RawMessage) string {
	if len(b) == 0 {
		return "{}"
	}
	return string(b)
}

// CreateSnapshot records sn, normally in state creating before its layer
// is captured: from that moment layer collection keeps every ref of
// sn.BaseLayers and sn.CapturedLayers (its own layer's ref is known before
// the capture: template.SnapshotLayerKey). A name the tenant's creating
// or ready snapshots already use is an error wrapping
// errdefs.ErrAlreadyExists, as is a taken id.
func (s *Store) CreateSnapshot(ctx context.Context, sn Snapshot) error {
	if sn.State == "" {
		sn.State = SnapshotCreating
	}
	base, err := json.Marshal(nonNil(sn.BaseLayers))
	if err != nil {
		return err
	}
	captured, err := json.Marshal(nonNil(sn.CapturedLayers))
	if err != nil {
		return err
	}
	_, err = s.w.ExecContext(ctx, `INSERT INTO snapshots(`+snapshotCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		sn.ID, sn.Tenant, sn.Name, sn.SandboxID, sn.ParentID, sn.Template, sn.TemplateVersion, sn.Runtime, sn.State,
		sn.Memory, string(base), string(captured), sn.Checkpoint, jsonDoc(sn.Config), jsonDoc(sn.Spec), sn.SizeBytes,
		sn.MemoryBytes, nullStr(sn.Error), ts(sn.CreatedAt), tsp(sn.ReadyAt), tsp(sn.DeletedAt))
	if isUniqueViolation(err) {
		if sn.Name != "" {
			return errdefs.Wrap(errdefs.ErrAlreadyExists, "a snapshot named %q exists", sn.Name)
		}
		return fmt.Errorf("%w: snapshot %q", errdefs.ErrAlreadyExists, sn.ID)
	}
	if err != nil {
		return fmt.Errorf("recording snapshot: %w", err)
	}
	return nil
}

// SnapshotResult is what a finished capture records.
type SnapshotResult struct {
	// OK makes the snapshot ready with the fields below; otherwise it is
	// failed with Error (and its layers are no longer held).
	OK          bool
	Checkpoint  string
	SizeBytes   int64
	MemoryBytes int64
	Error       string
	At          time.Time
}

// FinishSnapshot ends the capture of snapshot id (state creating): ready
// or failed. Any other state is an error wrapping errdefs.ErrInvalidState.
func (s *Store) FinishSnapshot(ctx context.Context, id string, r SnapshotResult) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		var state string
		err := tx.QueryRowContext(ctx, `SELECT state FROM snapshots WHERE id = ?`, id).Scan(&state)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: snapshot %q", errdefs.ErrNotFound, id)
		}
		if err != nil {
			return fmt.Errorf("loading snapshot: %w", err)
		}
		if state != SnapshotCreating {
			return fmt.Errorf("%w: snapshot %s is %s", errdefs.ErrInvalidState, id, state)
		}
		if r.OK {
			_, err = tx.ExecContext(ctx, `UPDATE snapshots SET state = ?, checkpoint = ?, size_bytes = ?, memory_bytes = ?,
				ready_at = ? WHERE id = ?`, SnapshotReady, r.Checkpoint, r.SizeBytes, r.MemoryBytes, ts(r.At), id)
		} else {
			_, err = tx.ExecContext(ctx, `UPDATE snapshots SET state = ?, error = ? WHERE id = ?`, SnapshotFailed, r.Error, id)
		}
		if err != nil {
			return fmt.Errorf("finishing snapshot: %w", err)
		}
		return nil
	})
}

// FailUnfinishedSnapshots fails every snapshot still creating (a daemon
// that died during the capture) with msg, and returns how many there were.
func (s *Store) FailUnfinishedSnapshots(ctx context.Context, msg string) (int, error) {
	res, err := s.w.ExecContext(ctx, `UPDATE snapshots SET state = ?, error = ? WHERE state = ?`, SnapshotFailed, msg, SnapshotCreating)
	if err != nil {
		return 0, fmt.Errorf("failing unfinished snapshots: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// GetSnapshot returns snapshot id if it is creating or ready. With tenant
// set, another tenant's snapshot is reported exactly like a missing one
// (errdefs.ErrNotFound), and so is a deleted or failed one.
func (s *Store) GetSnapshot(ctx context.Context, id, tenant string) (Snapshot, error) {
	q := `SELECT ` + snapshotCols + ` FROM snapshots WHERE id = ? AND state IN (?, ?)`
	args := []any{id, SnapshotCreating, SnapshotReady}
	if tenant != "" {
		q += ` AND tenant = ?`
		args = append(args, tenant)
	}
	sn, err := scanSnapshot(s.r.QueryRowContext(ctx, q, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return Snapshot{}, fmt.Errorf("%w: snapshot %q", errdefs.ErrNotFound, id)
	}
	if err != nil {
		return Snapshot{}, fmt.Errorf("loading snapshot: %w", err)
	}
	return sn, nil
}

// SnapshotFilter selects snapshots for ListSnapshots.
type SnapshotFilter struct {
	// Tenant limits the list to one tenant; "" means every tenant (admin).
	Tenant string
	// SandboxID keeps the snapshots taken of one sandbox; Name the one of
	// that name.
	SandboxID string
	Name      string
	// Limit is the page size (1…1000; 0 means 100); Cursor continues a
	// previous page.
	Limit  int
	Cursor string
}

// ListSnapshots returns one page of creating and ready snapshots, newest
// first, and the cursor of the next page ("" on the last one).
func (s *Store) ListSnapshots(ctx context.Context, f SnapshotFilter) ([]Snapshot, string, error) {
	limit, err := pageSize(f.Limit)
	if err != nil {
		return nil, "", err
	}
	where := []string{"state IN (?, ?)"}
	args := []any{SnapshotCreating, SnapshotReady}
	for _, c := range []struct{ col, v string }{{"tenant", f.Tenant}, {"sandbox_id", f.SandboxID}, {"name", f.Name}} {
		if c.v != "" {
			where = append(where, c.col+" = ?")
			args = append(args, c.v)
		}
	}
	if f.Cursor != "" {
		c, err := decodeCursor(f.Cursor)
		if err != nil {
			return nil, "", err
		}
		where = append(where, "(created_at < ? OR (created_at = ? AND id < ?))")
		args = append(args, c.T, c.T, c.ID)
	}
	out, err := s.querySnapshots(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE `+strings.Join(where, " AND ")+
		` ORDER BY created_at DESC, id DESC LIMIT ?`, append(args, limit+1)...)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) > limit {
		out = out[:limit]
		last := out[limit-1]
		next = encodeCursor(cursor{T: ts(last.CreatedAt), ID: last.ID})
	}
	return out, next, nil
}

func (s *Store) querySnapshots(ctx context.Context, q string, args ...any) ([]Snapshot, error) {
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing snapshots: %w", err)
	}
	defer rows.Close()
	var out []Snapshot
	for rows.Next() {
		sn, err := scanSnapshot(rows)
		if err != nil {
			return nil, fmt.Errorf("listing snapshots: %w", err)
		}
		out = append(out, sn)
	}
	return out, rows.Err()
}

// DeleteSnapshot marks tenant's snapshot id deleted: it is never found
// again, and its files go once no live sandbox started from it runs
// (CollectableSnapshots). Deleting a deleted snapshot of the tenant is not
// an error; a missing one, another tenant's or a failed one wraps
// errdefs.ErrNotFound, and one still being created errdefs.ErrInvalidState.
// tenant "" is any tenant (admin).
func (s *Store) DeleteSnapshot(ctx context.Context, id, tenant string, now time.Time) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		q := `SELECT state FROM snapshots WHERE id = ?`
		args := []any{id}
		if tenant != "" {
			q += ` AND tenant = ?`
			args = append(args, tenant)
		}
		var state string
		err := tx.QueryRowContext(ctx, q, args...).Scan(&state)
		switch {
		case errors.Is(err, sql.ErrNoRows) || state == SnapshotFailed:
			return fmt.Errorf("%w: snapshot %q", errdefs.ErrNotFound, id)
		case err != nil:
			return fmt.Errorf("loading snapshot: %w", err)
		case state == SnapshotDeleted:
			return nil
		case state == SnapshotCreating:
			return errdefs.Wrap(errdefs.ErrInvalidState, "snapshot %s is still being created", id)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE snapshots SET state = ?, deleted_at = ? WHERE id = ?`,
			SnapshotDeleted, ts(now), id); err != nil {
			return fmt.Errorf("deleting snapshot: %w", err)
		}
		return nil
	})
}

// SnapshotInUse reports how many live sandboxes started from (or were
// reset to) snapshot id.
func (s *Store) SnapshotInUse(ctx context.Context, id string) (int, error) {
	var n int
	err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM sandboxes WHERE snapshot_id = ? AND state IN (`+
		liveSandboxStates+`)`, id).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("counting snapshot users: %w", err)
	}
	return n, nil
}

// CollectableSnapshots returns the failed and deleted snapshots that no
// live sandbox uses: their memory images can be removed, then their
// records (PurgeSnapshot), which releases their layers to layer
// collection.
func (s *Store) CollectableSnapshots(ctx context.Context) ([]Snapshot, error) {
	return s.querySnapshots(ctx, `SELECT `+snapshotCols+` FROM snapshots n WHERE n.state IN (?, ?) AND NOT EXISTS (
		SELECT 1 FROM sandboxes s WHERE s.snapshot_id = n.id AND s.state IN (`+liveSandboxStates+`))
		ORDER BY created_at, id`, SnapshotFailed, SnapshotDeleted)
}

// PurgeSnapshot removes the record of a failed or deleted snapshot (its
// memory image removed first); a live one (creating, ready) is an error
// wrapping errdefs.ErrInvalidState, a missing one is not an error.
func (s *Store) PurgeSnapshot(ctx context.Context, id string) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		var state string
		err := tx.QueryRowContext(ctx, `SELECT state FROM snapshots WHERE id = ?`, id).Scan(&state)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("loading snapshot: %w", err)
		}
		if state != SnapshotFailed && state != SnapshotDeleted {
			return fmt.Errorf("%w: snapshot %s is %s", errdefs.ErrInvalidState, id, state)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ?`, id); err != nil {
			return fmt.Errorf("purging snapshot: %w", err)
		}
		return nil
	})
}

// snapshotLayers adds to out the layer refs of every snapshot that is
// creating or ready, or that a live sandbox started from.
func snapshotLayers(ctx context.Context, db *sql.DB, out map[string]bool) error {
	rows, err := db.QueryContext(ctx, `SELECT base_layers, captured_layers FROM snapshots n WHERE n.state IN (?, ?)
		OR EXISTS (SELECT 1 FROM sandboxes s WHERE s.snapshot_id = n.id AND s.state IN (`+liveSandboxStates+`))`,
		SnapshotCreating, SnapshotReady)
	if err != nil {
		return fmt.Errorf("listing snapshot layers: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var base, captured string
		if err := rows.Scan(&base, &captured); err != nil {
			return err
		}
		for _, js := range []string{base, captured} {
			var l []string
			if err := json.Unmarshal([]byte(js), &l); err != nil {
				return fmt.Errorf("snapshot layers: %w", err)
			}
			for _, ref := range l {
				out[ref] = true
			}
		}
	}
	return rows.Err()
}

// LoadSnapshot returns snapshot id in any state, of any tenant: the
// layer set of a live sandbox that started from it, which stays while
// the sandbox lives even when the snapshot is deleted. Not for answering
// a client (GetSnapshot is).
func (s *Store) LoadSnapshot(ctx context.Context, id string) (Snapshot, error) {
	sn, err := scanSnapshot(s.r.QueryRowContext(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Snapshot{}, fmt.Errorf("%w: snapshot %q", errdefs.ErrNotFound, id)
	}
	if err != nil {
		return Snapshot{}, fmt.Errorf("loading snapshot: %w", err)
	}
	return sn, nil
}
