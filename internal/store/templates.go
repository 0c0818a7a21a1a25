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

// Template version states. A version is usable only while ready; building
// and failed versions only hold their number, so that `name@N` never names
// two different things.
const (
	TemplateBuilding = "building"
	TemplateReady    = "ready"
	TemplateFailed   = "failed"
	// TemplateDeleted versions cannot be resolved any more but keep their
	// layers while a live sandbox uses them.
	TemplateDeleted = "deleted"
	// TemplatePurged versions had their files removed; the row keeps the
	// number taken.
	TemplatePurged = "purged"
)

// TemplateVersion is one version of a template.
type TemplateVersion struct {
	ID     string // tpl_…
	Tenant string // "" for the shipped templates every tenant sees
	Name   string
	// Version counts from 1 per tenant and name.
	Version int
	State   string
	// Source is spec, image or shipped.
	Source string
	// Layers are refs into the template store, lowest first.
	Layers []string
	// Config is the template's run-time config (JSON, owned by the builder).
	Config    json.RawMessage
	SpecHash  string
	SizeBytes int64
	BuildID   string
	CreatedAt time.Time
	ReadyAt   *time.Time
	DeletedAt *time.Time
}

// TemplateBuild is the record of one build.
type TemplateBuild struct {
	ID         string // bld_…
	Tenant     string
	Name       string
	Version    int
	TemplateID string
	// Status is building, ready or failed.
	Status    string
	Error     string
	Log       []byte
	CreatedAt time.Time
	EndedAt   *time.Time
}

const templateCols = `id, tenant, name, version, state, source, layers, config, spec_hash, size_bytes, build_id,
	created_at, ready_at, deleted_at`

func scanTemplate(row interface{ Scan(...any) error }) (TemplateVersion, error) {
	var (
		tv              TemplateVersion
		layers, config  string
		created         int64
		ready, deleted_ sql.NullInt64
	)
	err := row.Scan(&tv.ID, &tv.Tenant, &tv.Name, &tv.Version, &tv.State, &tv.Source, &layers, &config, &tv.SpecHash,
		&tv.SizeBytes, &tv.BuildID, &created, &ready, &deleted_)
	if err != nil {
		return TemplateVersion{}, err
	}
	if err := json.Unmarshal([]byte(layers), &tv.Layers); err != nil {
		return TemplateVersion{}, fmt.Errorf("template %s layers: %w", tv.ID, err)
	}
	tv.Config = json.RawMessage(config)
	tv.CreatedAt, tv.ReadyAt, tv.DeletedAt = fromTS(created), fromTSP(ready), fromTSP(deleted_)
	return tv, nil
}

const buildCols = `id, tenant, name, version, template_id, status, error, log, created_at, ended_at`

func scanBuild(row interface{ Scan(...any) error }) (TemplateBuild, error) {
	var (
		b       TemplateBuild
		msg     sql.NullString
		created int64
		ended   sql.NullInt64
	)
	if err := row.Scan(&b.ID, &b.Tenant, &b.Name, &b.Version, &b.TemplateID, &b.Status, &msg, &b.Log, &created, &ended); err != nil {
		return TemplateBuild{}, err
	}
	b.Error = msg.String
	b.CreatedAt, b.EndedAt = fromTS(created), fromTSP(ended)
	return b, nil
}

// StartTemplateBuild takes the next version number of tv.Tenant/tv.Name and
// records tv (state building) and its build b in one transaction, so that
// concurrent builds of one name get distinct numbers. It returns the number.
func (s *Store) StartTemplateBuild(ctx context.Context, tv TemplateVersion, b TemplateBuild) (int, error) {
	var version int
	err := s.tx(ctx, func(tx *sql.Tx) error {
		if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) + 1 FROM templates WHERE tenant = ? AND name = ?`,
			tv.Tenant, tv.Name).Scan(&version); err != nil {
			return fmt.Errorf("template version: %w", err)
		}
		layers, err := json.Marshal(nonNil(tv.Layers))
		if err != nil {
			return err
		}
		config := string(tv.Config)
		if config == "" {
			config = "{}"
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO templates(`+templateCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
			tv.ID, tv.Tenant, tv.Name, version, TemplateBuilding, tv.Source, string(layers), config, tv.SpecHash,
			tv.SizeBytes, b.ID, ts(tv.CreatedAt), nil, nil); err != nil {
			if isUniqueViolation(err) {
				return fmt.Errorf("%w: template %q", errdefs.ErrAlreadyExists, tv.ID)
			}
			return fmt.Errorf("recording template: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO template_builds(`+buildCols+`) VALUES (?,?,?,?,?,?,?,?,?,?)`,
			b.ID, tv.Tenant, tv.Name, version, tv.ID, TemplateBuilding, nil, []byte{}, ts(b.CreatedAt), nil); err != nil {
			return fmt.Errorf("recording build: %w", err)
		}
		return nil
	})
	return version, err
}

func nonNil(l []string) []string {
	if l == nil {
		return []string{}
	}
	return l
}

// BuildResult is what a finished build records.
type BuildResult struct {
	// OK publishes the version (state ready) with the fields below;
	// otherwise the version and the build are failed with Error.
	OK        bool
	Layers    []string
	Config    json.RawMessage
	SpecHash  string
	SizeBytes int64
	Error     string
	Log       []byte
	EndedAt   time.Time
}

// FinishTemplateBuild ends build id and its template version in one
// transaction: a version is ready exactly when its build is.
func (s *Store) FinishTemplateBuild(ctx context.Context, id string, r BuildResult) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		var tid, status string
		err := tx.QueryRowContext(ctx, `SELECT template_id, status FROM template_builds WHERE id = ?`, id).Scan(&tid, &status)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: build %q", errdefs.ErrNotFound, id)
		}
		if err != nil {
			return fmt.Errorf("loading build: %w", err)
		}
		if status != TemplateBuilding {
			return fmt.Errorf("%w: build %s is already %s", errdefs.ErrInvalidState, id, status)
		}
		end := ts(r.EndedAt)
		if r.OK {
			layers, err := json.Marshal(nonNil(r.Layers))
			if err != nil {
				return err
			}
			config := string(r.Config)
			if config == "" {
				config = "{}"
			}
			if _, err := tx.ExecContext(ctx, `UPDATE templates SET state = ?, layers = ?, config = ?, spec_hash = ?,
				size_bytes = ?, ready_at = ? WHERE id = ?`, TemplateReady, string(layers), config, r.SpecHash,
				r.SizeBytes, end, tid); err != nil {
				return fmt.Errorf("publishing template: %w", err)
			}
			_, err = tx.ExecContext(ctx, `UPDATE template_builds SET status = ?, log = ?, ended_at = ? WHERE id = ?`,
				TemplateReady, r.Log, end, id)
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE templates SET state = ? WHERE id = ?`, TemplateFailed, tid); err != nil {
			return fmt.Errorf("failing template: %w", err)
		}
		_, err = tx.ExecContext(ctx, `UPDATE template_builds SET status = ?, error = ?, log = ?, ended_at = ? WHERE id = ?`,
			TemplateFailed, r.Error, r.Log, end, id)
		return err
	})
}

// GetTemplateBuild returns build id.
func (s *Store) GetTemplateBuild(ctx context.Context, id string) (TemplateBuild, error) {
	b, err := scanBuild(s.r.QueryRowContext(ctx, `SELECT `+buildCols+` FROM template_builds WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return TemplateBuild{}, fmt.Errorf("%w: build %q", errdefs.ErrNotFound, id)
	}
	if err != nil {
		return TemplateBuild{}, fmt.Errorf("loading build: %w", err)
	}
	return b, nil
}

// FailUnfinishedTemplateBuilds fails every build still marked building (a
// daemon that died mid-build) with msg, and returns how many there were.
func (s *Store) FailUnfinishedTemplateBuilds(ctx context.Context, msg string, now time.Time) (int, error) {
	var n int64
	err := s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE templates SET state = ? WHERE state = ?`, TemplateFailed, TemplateBuilding); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE template_builds SET status = ?, error = ?, ended_at = ? WHERE status = ?`,
			TemplateFailed, msg, ts(now), TemplateBuilding)
		if err != nil {
			return err
		}
		n, _ = res.RowsAffected()
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("failing unfinished builds: %w", err)
	}
	return int(n), nil
}

// tenantClause limits rows to the given tenants ("" being the shipped
// templates); no tenants means every row.
func tenantClause(tenants []string) (string, []any) {
	if len(tenants) == 0 {
		return "1=1", nil
	}
	args := make([]any, len(tenants))
	for i, t := range tenants {
		args[i] = t
	}
	return "tenant IN (" + strings.TrimSuffix(strings.Repeat("?,", len(tenants)), ",") + ")", args
}

// GetTemplateVersion returns the ready version of name among tenants' templates
// (version 0: the newest). A missing one wraps errdefs.ErrNotFound.
func (s *Store) GetTemplateVersion(ctx context.Context, tenants []string, name string, version int) (TemplateVersion, error) {
	where, args := tenantClause(tenants)
	q := `SELECT ` + templateCols + ` FROM templates WHERE ` + where + ` AND name = ? AND state = ?`
	args = append(args, name, TemplateReady)
	if version > 0 {
		q += ` AND version = ?`
		args = append(args, version)
	}
	q += ` ORDER BY version DESC LIMIT 1`
	tv, err := scanTemplate(s.r.QueryRowContext(ctx, q, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return TemplateVersion{}, fmt.Errorf("%w: template %s version %d", errdefs.ErrNotFound, name, version)
	}
	if err != nil {
		return TemplateVersion{}, fmt.Errorf("loading template: %w", err)
	}
	return tv, nil
}

// ListTemplateVersions returns the ready versions of tenants' templates (no
// tenants: all), by name, newest version first.
func (s *Store) ListTemplateVersions(ctx context.Context, tenants []string) ([]TemplateVersion, error) {
	where, args := tenantClause(tenants)
	return s.queryTemplates(ctx, `SELECT `+templateCols+` FROM templates WHERE `+where+` AND state = ?
		ORDER BY name, tenant, version DESC`, append(args, TemplateReady)...)
}

func (s *Store) queryTemplates(ctx context.Context, q string, args ...any) ([]TemplateVersion, error) {
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing templates: %w", err)
	}
	defer rows.Close()
	var out []TemplateVersion
	for rows.Next() {
		tv, err := scanTemplate(rows)
		if err != nil {
			return nil, fmt.Errorf("listing templates: %w", err)
		}
		out = append(out, tv)
	}
	return out, rows.Err()
}

// DeleteTemplateVersions marks tenant's ready versions of name deleted (only
// version when it is not 0) and returns how many it marked. Deleted versions
// are never resolved again; their files go once no live sandbox uses them
// (CollectableTemplateVersions).
func (s *Store) DeleteTemplateVersions(ctx context.Context, tenant, name string, version int, now time.Time) (int, error) {
	q := `UPDATE templates SET state = ?, deleted_at = ? WHERE tenant = ? AND name = ? AND state = ?`
	args := []any{TemplateDeleted, ts(now), tenant, name, TemplateReady}
	if version > 0 {
		q += ` AND version = ?`
		args = append(args, version)
	}
	res, err := s.w.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("deleting template: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// liveSandboxStates are the sandbox states that may hold a template's layers
// mounted.
const liveSandboxStates = `'starting','running','paused','stopping'`

// CollectableTemplateVersions returns the deleted versions that no live
// sandbox and no live snapshot uses. A sandbox (or a snapshot) uses a
// version when it names it and belongs to its tenant, or the version is a
// shipped one; a snapshot is live while it is creating or ready (a sandbox
// started from a deleted snapshot names the version itself).
func (s *Store) CollectableTemplateVersions(ctx context.Context) ([]TemplateVersion, error) {
	return s.queryTemplates(ctx, `SELECT `+templateCols+` FROM templates t WHERE t.state = ? AND NOT EXISTS (
		SELECT 1 FROM sandboxes s WHERE s.template = t.name AND s.template_version = t.version
			AND (t.tenant = '' OR s.tenant = t.tenant) AND s.state IN (`+liveSandboxStates+`))
		AND NOT EXISTS (
		SELECT 1 FROM snapshots n WHERE n.template = t.name AND n.template_version = t.version
			AND (t.tenant = '' OR n.tenant = t.tenant) AND n.state IN (?, ?))`, TemplateDeleted, SnapshotCreating, SnapshotReady)
}

// TemplateVersionInUse reports how many live sandboxes use tv.
func (s *Store) TemplateVersionInUse(ctx context.Context, tv TemplateVersion) (int, error) {
	var n int
	err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM sandboxes s WHERE s.template = ? AND s.template_version = ?
		AND (? = '' OR s.tenant = ?) AND s.state IN (`+liveSandboxStates+`)`, tv.Name, tv.Version, tv.Tenant, tv.Tenant).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("counting template users: %w", err)
	}
	return n, nil
}

// MarkTemplateVersionPurged records that a deleted version's files are
// gone (or going). The row keeps its layer refs: PurgedTemplateLayers.
func (s *Store) MarkTemplateVersionPurged(ctx context.Context, id string) error {
	if _, err := s.w.ExecContext(ctx, `UPDATE templates SET state = ? WHERE id = ? AND state = ?`,
		TemplatePurged, id, TemplateDeleted); err != nil {
		return fmt.Errorf("purging template: %w", err)
	}
	return nil
}

// ReferencedTemplateLayers returns the layers garbage collection must
// keep: every layer ref a version that is building, ready or deleted
// (still in use) holds, and every ref of a snapshot that is creating or
// ready or that a live sandbox started from (its template's layers and
// the captured ones). A layer that only a snapshot holds, its own captured
// layer above all, is kept exactly as long as the snapshot may be used.
func (s *Store) ReferencedTemplateLayers(ctx context.Context) (map[string]bool, error) {
	out, err := s.templateLayers(ctx, TemplateBuilding, TemplateReady, TemplateDeleted)
	if err != nil {
		return nil, err
	}
	if err := snapshotLayers(ctx, s.r, out); err != nil {
		return nil, err
	}
	return out, nil
}

// PurgedTemplateLayers returns the layer refs of purged versions: layers
// that belonged to a template once (as opposed to the finished steps of a
// failed build, which garbage collection keeps a while for a retry).
func (s *Store) PurgedTemplateLayers(ctx context.Context) (map[string]bool, error) {
	return s.templateLayers(ctx, TemplatePurged)
}

func (s *Store) templateLayers(ctx context.Context, states ...string) (map[string]bool, error) {
	args := make([]any, len(states))
	for i, st := range states {
		args[i] = st
	}
	rows, err := s.r.QueryContext(ctx, `SELECT layers FROM templates WHERE state IN (`+
		strings.TrimSuffix(strings.Repeat("?,", len(states)), ",")+`)`, args...)
	if err != nil {
		return nil, fmt.Errorf("listing template layers: %w", err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var js string
		if err := rows.Scan(&js); err != nil {
			return nil, err
		}
		var l []string
		if err := json.Unmarshal([]byte(js), &l); err != nil {
			return nil, fmt.Errorf("template layers: %w", err)
		}
		for _, ref := range l {
			out[ref] = true
		}
	}
	return out, rows.Err()
}
