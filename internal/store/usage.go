package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// UsageCursor is how far a sandbox's usage has been accounted: everything
// up to AccountedAt is in the usage buckets, and the counters are the
// sandbox's cumulative values at that point (the next delta starts there).
type UsageCursor struct {
	SandboxID   string
	AccountedAt time.Time
	CPUSeconds  float64
	TxBytes     uint64
}

// UsageQuantities are metered amounts. They add up across intervals.
type UsageQuantities struct {
	RunningS float64
	PausedS  float64
	// PausedDiskS is the part of PausedS paused to disk (RAM released).
	PausedDiskS float64
	VCPUAllocS  float64
	VCPUUsedS   float64
	MemGiBS     float64
	DiskGiBH    float64
	EgressBytes float64
}

// Add returns q plus o.
func (q UsageQuantities) Add(o UsageQuantities) UsageQuantities {
	return UsageQuantities{
		RunningS: q.RunningS + o.RunningS, PausedS: q.PausedS + o.PausedS, PausedDiskS: q.PausedDiskS + o.PausedDiskS,
		VCPUAllocS: q.VCPUAllocS + o.VCPUAllocS, VCPUUsedS: q.VCPUUsedS + o.VCPUUsedS,
		MemGiBS: q.MemGiBS + o.MemGiBS, DiskGiBH: q.DiskGiBH + o.DiskGiBH,
		EgressBytes: q.EgressBytes + o.EgressBytes,
	}
}

// Scale returns q times f.
func (q UsageQuantities) Scale(f float64) UsageQuantities {
	return UsageQuantities{
		RunningS: q.RunningS * f, PausedS: q.PausedS * f, PausedDiskS: q.PausedDiskS * f, VCPUAllocS: q.VCPUAllocS * f,
		VCPUUsedS: q.VCPUUsedS * f, MemGiBS: q.MemGiBS * f, DiskGiBH: q.DiskGiBH * f,
		EgressBytes: q.EgressBytes * f,
	}
}

// UsageAccrual is the usage of one sandbox over [From, To].
type UsageAccrual struct {
	SandboxID string
	Tenant    string
	Template  string
	// From must be the cursor's AccountedAt (the accrual is dropped
	// otherwise); with no cursor yet, any From starts one.
	From, To time.Time
	Q        UsageQuantities
	// CPUSeconds and TxBytes are the counters at To (the next cursor).
	CPUSeconds float64
	TxBytes    uint64
}

// GetUsageCursor returns sandbox id's cursor; ok is false when it has none.
func (s *Store) GetUsageCursor(ctx context.Context, id string) (c UsageCursor, ok bool, err error) {
	var at, tx int64
	err = s.r.QueryRowContext(ctx, `SELECT accounted_at, cpu_seconds, tx_bytes FROM usage_cursors WHERE sandbox_id = ?`, id).
		Scan(&at, &c.CPUSeconds, &tx)
	if errors.Is(err, sql.ErrNoRows) {
		return UsageCursor{}, false, nil
	}
	if err != nil {
		return UsageCursor{}, false, fmt.Errorf("reading usage cursor: %w", err)
	}
	c.SandboxID, c.AccountedAt, c.TxBytes = id, fromTS(at), uint64(tx)
	return c, true, nil
}

// AccrueUsage adds a's quantities to the hourly buckets it spans (split in
// proportion to time) and moves the sandbox's cursor to a.To, in one
// transaction. It is idempotent: an accrual whose From is not the stored
// cursor (already applied, or computed from a stale cursor) changes nothing
// and reports false. So a crash between computing and committing loses at
// most that interval, and a replay never counts twice.
func (s *Store) AccrueUsage(ctx context.Context, a UsageAccrual) (bool, error) {
	if !a.To.After(a.From) {
		return false, nil
	}
	applied := false
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var at int64
		err := tx.QueryRowContext(ctx, `SELECT accounted_at FROM usage_cursors WHERE sandbox_id = ?`, a.SandboxID).Scan(&at)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return err
		case at != ts(a.From):
			return nil
		}
		total := a.To.Sub(a.From)
		for h := a.From.UTC().Truncate(time.Hour); h.Before(a.To); h = h.Add(time.Hour) {
			lo, hi := maxTime(h, a.From), minTime(h.Add(time.Hour), a.To)
			if !hi.After(lo) {
				continue
			}
			q := a.Q.Scale(float64(hi.Sub(lo)) / float64(total))
			if _, err := tx.ExecContext(ctx, `INSERT INTO usage_buckets
				(sandbox_id, hour, tenant, template, running_s, paused_s, paused_disk_s, vcpu_alloc_s, vcpu_used_s, mem_gib_s,
				disk_gib_h, egress_bytes)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
				ON CONFLICT (sandbox_id, hour) DO UPDATE SET
				running_s = running_s + excluded.running_s, paused_s = paused_s + excluded.paused_s,
				paused_disk_s = paused_disk_s + excluded.paused_disk_s,
				vcpu_alloc_s = vcpu_alloc_s + excluded.vcpu_alloc_s, vcpu_used_s = vcpu_used_s + excluded.vcpu_used_s,
				mem_gib_s = mem_gib_s + excluded.mem_gib_s, disk_gib_h = disk_gib_h + excluded.disk_gib_h,
				egress_bytes = egress_bytes + excluded.egress_bytes`,
				a.SandboxID, ts(h), a.Tenant, a.Template, q.RunningS, q.PausedS, q.PausedDiskS, q.VCPUAllocS, q.VCPUUsedS,
				q.MemGiBS, q.DiskGiBH, q.EgressBytes); err != nil {
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO usage_cursors (sandbox_id, accounted_at, cpu_seconds, tx_bytes)
			VALUES (?, ?, ?, ?) ON CONFLICT (sandbox_id) DO UPDATE SET
			accounted_at = excluded.accounted_at, cpu_seconds = excluded.cpu_seconds, tx_bytes = excluded.tx_bytes`,
			a.SandboxID, ts(a.To), a.CPUSeconds, int64(a.TxBytes)); err != nil {
			return err
		}
		applied = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("accruing usage of %s: %w", a.SandboxID, err)
	}
	return applied, nil
}

// UsageRow is one hourly bucket of one sandbox.
type UsageRow struct {
	SandboxID string
	Tenant    string
	Template  string
	Hour      time.Time
	Q         UsageQuantities
}

// UsageFilter selects usage buckets: Tenant "" means every tenant; buckets
// whose hour starts in [From, To) (a zero bound is open).
type UsageFilter struct {
	Tenant   string
	From, To time.Time
}

// ListUsage returns the buckets f selects, oldest first.
func (s *Store) ListUsage(ctx context.Context, f UsageFilter) ([]UsageRow, error) {
	q := `SELECT sandbox_id, tenant, template, hour, running_s, paused_s, paused_disk_s, vcpu_alloc_s, vcpu_used_s, mem_gib_s,
		disk_gib_h, egress_bytes
		FROM usage_buckets WHERE 1=1`
	var args []any
	if f.Tenant != "" {
		q += ` AND tenant = ?`
		args = append(args, f.Tenant)
	}
	if !f.From.IsZero() {
		q += ` AND hour >= ?`
		args = append(args, ts(f.From.UTC().Truncate(time.Hour)))
	}
	if !f.To.IsZero() {
		q += ` AND hour < ?`
		args = append(args, ts(f.To))
	}
	q += ` ORDER BY hour, sandbox_id`
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing usage: %w", err)
	}
	defer rows.Close()
	var out []UsageRow
	for rows.Next() {
		var (
			r UsageRow
			h int64
		)
		if err := rows.Scan(&r.SandboxID, &r.Tenant, &r.Template, &h, &r.Q.RunningS, &r.Q.PausedS, &r.Q.PausedDiskS, &r.Q.VCPUAllocS,
			&r.Q.VCPUUsedS, &r.Q.MemGiBS, &r.Q.DiskGiBH, &r.Q.EgressBytes); err != nil {
			return nil, fmt.Errorf("listing usage: %w", err)
		}
		r.Hour = fromTS(h)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing usage: %w", err)
	}
	return out, nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
