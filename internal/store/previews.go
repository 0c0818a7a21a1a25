package store

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Preview is an exposed port of a sandbox (a preview URL), kept so that a
// restarted daemon serves it again.
type Preview struct {
	SandboxID string
	Port      int
	Public    bool
	CreatedAt time.Time
}

// PutPreview records that p.Port of p.SandboxID is exposed, replacing
// whether it is public if it already was.
func (s *Store) PutPreview(ctx context.Context, p Preview) error {
	if _, err := s.w.ExecContext(ctx, `INSERT INTO sandbox_previews(sandbox_id, port, public, created_at) VALUES (?, ?, ?, ?)
		ON CONFLICT(sandbox_id, port) DO UPDATE SET public = excluded.public`,
		p.SandboxID, p.Port, p.Public, ts(p.CreatedAt)); err != nil {
		return fmt.Errorf("recording preview: %w", err)
	}
	return nil
}

// DeletePreview forgets port of sandbox id; an unknown one is not an error.
func (s *Store) DeletePreview(ctx context.Context, id string, port int) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM sandbox_previews WHERE sandbox_id = ? AND port = ?`, id, port); err != nil {
		return fmt.Errorf("deleting preview: %w", err)
	}
	return nil
}

// DeletePreviews forgets every exposed port of sandbox id (it stopped).
func (s *Store) DeletePreviews(ctx context.Context, id string) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM sandbox_previews WHERE sandbox_id = ?`, id); err != nil {
		return fmt.Errorf("deleting previews: %w", err)
	}
	return nil
}

// Previews returns the exposed ports of sandbox id, by port.
func (s *Store) Previews(ctx context.Context, id string) ([]Preview, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT port, public, created_at FROM sandbox_previews WHERE sandbox_id = ? ORDER BY port`, id)
	if err != nil {
		return nil, fmt.Errorf("listing previews: %w", err)
	}
	defer rows.Close()
	var out []Preview
	for rows.Next() {
		p := Preview{SandboxID: id}
		var created int64
		if err := rows.Scan(&p.Port, &p.Public, &created); err != nil {
			return nil, fmt.Errorf("listing previews: %w", err)
		}
		p.CreatedAt = fromTS(created)
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing previews: %w", err)
	}
	return out, nil
}

// PrunePreviews deletes the exposed ports of every sandbox not in one of
// states (those that stopped while no daemon could forget them), and
// returns how many went.
func (s *Store) PrunePreviews(ctx context.Context, states ...string) (int, error) {
	q := `DELETE FROM sandbox_previews`
	args := make([]any, len(states))
	for i, st := range states {
		args[i] = st
	}
	if len(states) > 0 {
		q += ` WHERE sandbox_id NOT IN (SELECT id FROM sandboxes WHERE state IN (` +
			strings.TrimSuffix(strings.Repeat("?,", len(states)), ",") + `))`
	}
	res, err := s.w.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("pruning previews: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}
