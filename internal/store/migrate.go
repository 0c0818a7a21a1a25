package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// migrations are applied in order, each once, each in its own transaction.
// Append new ones; never edit one that has shipped.
var migrations = []string{
	// 1: the initial schema.
	`
CREATE TABLE tenants (
	id         TEXT PRIMARY KEY,
	created_at INTEGER NOT NULL
);

CREATE TABLE api_keys (
	id         TEXT PRIMARY KEY,
	tenant     TEXT NOT NULL REFERENCES tenants(id),
	name       TEXT NOT NULL DEFAULT '',
	prefix     TEXT NOT NULL,
	hash       BLOB NOT NULL UNIQUE,   -- sha256 of the secret; the secret is never stored
	admin      INTEGER NOT NULL DEFAULT 0,
	created_at INTEGER NOT NULL,
	revoked_at INTEGER
);
CREATE INDEX api_keys_tenant ON api_keys(tenant, created_at);

CREATE TABLE sandboxes (
	id               TEXT PRIMARY KEY,
	tenant           TEXT NOT NULL REFERENCES tenants(id),
	state            TEXT NOT NULL,            -- observed state
	desired_state    TEXT NOT NULL,            -- what the user asked for
	spec             TEXT NOT NULL,            -- normalized create request, secrets excluded
	handle           TEXT,                     -- driver.Handle JSON
	secrets          BLOB,                     -- AES-GCM sealed secrets, NULL once deleted
	template         TEXT NOT NULL,
	template_version INTEGER NOT NULL DEFAULT 0,
	runtime          TEXT NOT NULL,
	created_at       INTEGER NOT NULL,
	expires_at       INTEGER NOT NULL,         -- while running; shifted by paused time on resume
	timeout_s        INTEGER NOT NULL,
	paused_at        INTEGER,
	paused_total_ns  INTEGER NOT NULL DEFAULT 0,
	metadata         TEXT NOT NULL DEFAULT '{}',
	ready_ms         INTEGER NOT NULL DEFAULT 0,
	error_code       TEXT,
	error_message    TEXT,
	ended_at         INTEGER,
	end_reason       TEXT
);
CREATE INDEX sandboxes_tenant ON sandboxes(tenant, created_at, id);
CREATE INDEX sandboxes_created ON sandboxes(created_at, id);
CREATE INDEX sandboxes_state ON sandboxes(state);

CREATE TABLE execs (
	id           TEXT PRIMARY KEY,
	sandbox_id   TEXT NOT NULL,               -- no FK: records outlive the sandbox row
	tenant       TEXT NOT NULL,
	argv         TEXT,                        -- JSON array, NULL for shell
	shell        TEXT,
	user         TEXT NOT NULL,
	cwd          TEXT NOT NULL DEFAULT '',
	pty          INTEGER NOT NULL DEFAULT 0,
	status       TEXT NOT NULL,
	exit_code    INTEGER,
	signal       TEXT,
	truncated    INTEGER NOT NULL DEFAULT 0,
	stdout_bytes INTEGER NOT NULL DEFAULT 0,
	stderr_bytes INTEGER NOT NULL DEFAULT 0,
	started_at   INTEGER NOT NULL,
	ended_at     INTEGER,
	duration_ms  INTEGER NOT NULL DEFAULT 0,
	error        TEXT
);
CREATE INDEX execs_sandbox ON execs(sandbox_id, started_at, id);
CREATE INDEX execs_status ON execs(status);

-- Captured (redacted) output of ended execs, apart from the records so that
-- listings never read it.
CREATE TABLE exec_output (
	exec_id TEXT PRIMARY KEY REFERENCES execs(id) ON DELETE CASCADE,
	events  BLOB NOT NULL
);

CREATE TABLE idempotency_keys (
	tenant       TEXT NOT NULL,
	key          TEXT NOT NULL,
	request_hash TEXT NOT NULL,
	sandbox_id   TEXT NOT NULL,
	created_at   INTEGER NOT NULL,
	PRIMARY KEY (tenant, key)
);
CREATE INDEX idempotency_created ON idempotency_keys(created_at);
`,
	// 2: templates (one row per version) and their builds.
	`
CREATE TABLE templates (
	id         TEXT PRIMARY KEY,             -- tpl_…
	tenant     TEXT NOT NULL,                -- '' for the shipped templates every tenant sees
	name       TEXT NOT NULL,
	version    INTEGER NOT NULL,
	state      TEXT NOT NULL,                -- building, ready, failed, deleted, purged
	source     TEXT NOT NULL,                -- spec, image, shipped
	layers     TEXT NOT NULL DEFAULT '[]',   -- JSON list of layer refs in the template store, lowest first
	config     TEXT NOT NULL DEFAULT '{}',   -- JSON run-time config (env, workdir, user, start and ready commands)
	spec_hash  TEXT NOT NULL DEFAULT '',
	size_bytes INTEGER NOT NULL DEFAULT 0,
	build_id   TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	ready_at   INTEGER,
	deleted_at INTEGER,
	UNIQUE (tenant, name, version)
);
CREATE INDEX templates_state ON templates(state);

CREATE TABLE template_builds (
	id          TEXT PRIMARY KEY,            -- bld_…
	tenant      TEXT NOT NULL,
	name        TEXT NOT NULL,
	version     INTEGER NOT NULL,
	template_id TEXT NOT NULL,
	status      TEXT NOT NULL,               -- building, ready, failed
	error       TEXT,
	log         BLOB,
	created_at  INTEGER NOT NULL,
	ended_at    INTEGER
);
CREATE INDEX template_builds_status ON template_builds(status);
`,
	// 3: the audit trail, the request that started each exec, and a
	// tenant's default network policy.
	`
CREATE TABLE audit_events (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT, -- never reused, so cursors stay valid across purges
	id         TEXT NOT NULL UNIQUE,              -- aud_…
	time       INTEGER NOT NULL,
	type       TEXT NOT NULL,
	tenant     TEXT NOT NULL DEFAULT '',          -- '' for failures of unknown keys
	sandbox_id TEXT NOT NULL DEFAULT '',          -- no FK: the trail outlives the sandbox row
	template   TEXT NOT NULL DEFAULT '',
	request_id TEXT NOT NULL DEFAULT '',
	detail     TEXT NOT NULL DEFAULT '{}'         -- JSON object, secrets redacted
);
CREATE INDEX audit_tenant ON audit_events(tenant, seq);
CREATE INDEX audit_sandbox ON audit_events(sandbox_id, seq);
CREATE INDEX audit_time ON audit_events(time);
-- Append-only: rows are never changed; only the retention purge deletes.
CREATE TRIGGER audit_events_append_only BEFORE UPDATE ON audit_events
BEGIN
	SELECT RAISE(ABORT, 'audit events are append-only');
END;

ALTER TABLE execs ADD COLUMN request_id TEXT;
ALTER TABLE tenants ADD COLUMN network TEXT;   -- JSON api.Network: the tenant's default policy
`,
	// 4: usage metering (hourly buckets per sandbox, and each sandbox's
	// last-accounted point) and the template of each exec.
	`
CREATE TABLE usage_buckets (
	sandbox_id   TEXT NOT NULL,                -- no FK: usage outlives the sandbox row
	hour         INTEGER NOT NULL,             -- start of the UTC hour (ns)
	tenant       TEXT NOT NULL,
	template     TEXT NOT NULL DEFAULT '',
	running_s    REAL NOT NULL DEFAULT 0,
	paused_s     REAL NOT NULL DEFAULT 0,
	vcpu_alloc_s REAL NOT NULL DEFAULT 0,
	vcpu_used_s  REAL NOT NULL DEFAULT 0,
	mem_gib_s    REAL NOT NULL DEFAULT 0,
	disk_gib_h   REAL NOT NULL DEFAULT 0,
	egress_bytes REAL NOT NULL DEFAULT 0,
	PRIMARY KEY (sandbox_id, hour)
);
CREATE INDEX usage_tenant_hour ON usage_buckets(tenant, hour);
CREATE INDEX usage_hour ON usage_buckets(hour);
CREATE TABLE usage_cursors (
	sandbox_id  TEXT PRIMARY KEY,
	accounted_at INTEGER NOT NULL,              -- usage up to here is in usage_buckets
	cpu_seconds REAL NOT NULL DEFAULT 0,        -- the sandbox's cpu counter at accounted_at
	tx_bytes    INTEGER NOT NULL DEFAULT 0      -- its network tx counter at accounted_at
);
ALTER TABLE execs ADD COLUMN template TEXT;
`,
	// 5: the code that tells apart why an exec ended abnormally (timeout,
	// oom, killed, sandbox_crashed, agent_unavailable).
	`
ALTER TABLE execs ADD COLUMN error_code TEXT;
`,
	// 6: tenancy: a tenant's quota override and a key's own rate limit
	// (NULL: the server's default).
	`
ALTER TABLE tenants ADD COLUMN quota TEXT;            -- JSON api.QuotaOverride
ALTER TABLE api_keys ADD COLUMN rate_limit_rps REAL;
ALTER TABLE api_keys ADD COLUMN rate_limit_burst INTEGER;
`,
	// 7: the exposed preview ports of each sandbox, so that preview URLs
	// keep answering across a daemon restart.
	`
CREATE TABLE sandbox_previews (
	sandbox_id TEXT NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
	port       INTEGER NOT NULL,
	public     INTEGER NOT NULL DEFAULT 0,
	created_at INTEGER NOT NULL,
	PRIMARY KEY (sandbox_id, port)
);
`,
	// 8: how many bytes of each stream an exec's output cap dropped (the
	// middle of the stream: its head and tail are kept).
	`
ALTER TABLE execs ADD COLUMN stdout_dropped INTEGER NOT NULL DEFAULT 0;
ALTER TABLE execs ADD COLUMN stderr_dropped INTEGER NOT NULL DEFAULT 0;
`,
	// 9: durable sandboxes (docs/lifecycle.md): each sandbox's lifecycle
	// rules, how a pause holds it, the snapshot it started from, its warm
	// pool and its last activity; snapshots, pools and pool members; the
	// seconds paused to disk.
	`
ALTER TABLE sandboxes ADD COLUMN on_timeout TEXT NOT NULL DEFAULT 'kill';  -- kill | pause
ALTER TABLE sandboxes ADD COLUMN auto_resume INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN idle_timeout_s INTEGER NOT NULL DEFAULT 0; -- 0: never idle-paused
ALTER TABLE sandboxes ADD COLUMN pause_memory TEXT;                        -- keep | disk while paused
ALTER TABLE sandboxes ADD COLUMN snapshot_id TEXT;                         -- started from (or reset to)
ALTER TABLE sandboxes ADD COLUMN pool TEXT;                                -- member of, or claimed from
ALTER TABLE sandboxes ADD COLUMN last_active_at INTEGER NOT NULL DEFAULT 0; -- never moves back
CREATE INDEX sandboxes_snapshot ON sandboxes(snapshot_id) WHERE snapshot_id IS NOT NULL;

CREATE TABLE snapshots (
	id               TEXT PRIMARY KEY,             -- snap_…
	tenant           TEXT NOT NULL,
	name             TEXT NOT NULL DEFAULT '',
	sandbox_id       TEXT NOT NULL,                -- no FK: a snapshot outlives its sandbox
	parent_id        TEXT NOT NULL DEFAULT '',     -- the snapshot that sandbox started from
	template         TEXT NOT NULL,                -- the template version its filesystem descends from
	template_version INTEGER NOT NULL,
	runtime          TEXT NOT NULL,
	state            TEXT NOT NULL,                -- creating, ready, failed, deleted
	memory           INTEGER NOT NULL DEFAULT 0,
	base_layers      TEXT NOT NULL DEFAULT '[]',   -- JSON: the template version's layer refs, lowest first
	captured_layers  TEXT NOT NULL DEFAULT '[]',   -- JSON: captured layer refs over them, its own last
	checkpoint       TEXT NOT NULL DEFAULT '',     -- the memory image's ref in the template store
	config           TEXT NOT NULL DEFAULT '{}',   -- JSON: the template's run-time config when taken
	spec             TEXT NOT NULL DEFAULT '{}',   -- JSON: resources and the like, no secrets, env or network
	size_bytes       INTEGER NOT NULL DEFAULT 0,   -- its own bytes: captured layer and memory image
	memory_bytes     INTEGER NOT NULL DEFAULT 0,
	error            TEXT,
	created_at       INTEGER NOT NULL,
	ready_at         INTEGER,
	deleted_at       INTEGER
);
CREATE INDEX snapshots_tenant ON snapshots(tenant, created_at, id);
CREATE INDEX snapshots_sandbox ON snapshots(sandbox_id);
CREATE INDEX snapshots_state ON snapshots(state);
-- A name names one live snapshot of a tenant.
CREATE UNIQUE INDEX snapshots_name ON snapshots(tenant, name) WHERE name != '' AND state IN ('creating','ready');

CREATE TABLE pools (
	tenant     TEXT NOT NULL,
	name       TEXT NOT NULL,
	template   TEXT NOT NULL,                      -- as asked: name or name@version
	runtime    TEXT NOT NULL DEFAULT '',
	resources  TEXT NOT NULL DEFAULT '{}',         -- JSON api.Resources
	size       INTEGER NOT NULL,
	error      TEXT,                               -- the last refill's failure
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL,
	PRIMARY KEY (tenant, name)
);

CREATE TABLE pool_members (
	sandbox_id TEXT PRIMARY KEY,                   -- no FK: the member row outlives a failed start
	tenant     TEXT NOT NULL,
	pool       TEXT NOT NULL,
	state      TEXT NOT NULL,                      -- starting, ready, claimed
	created_at INTEGER NOT NULL,
	ready_at   INTEGER,
	claimed_at INTEGER
);
CREATE INDEX pool_members_pool ON pool_members(tenant, pool, state, created_at);

ALTER TABLE usage_buckets ADD COLUMN paused_disk_s REAL NOT NULL DEFAULT 0;
`,
}

func migrate(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)`); err != nil {
		return fmt.Errorf("migrations table: %w", err)
	}
	var have int
	if err := db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&have); err != nil {
		return fmt.Errorf("schema version: %w", err)
	}
	if have > len(migrations) {
		// A newer daemon wrote this database: running an older one on it
		// could corrupt what it does not understand.
		return fmt.Errorf("store schema version %d is newer than this daemon's %d", have, len(migrations))
	}
	for v := have + 1; v <= len(migrations); v++ {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("migration %d: %w", v, err)
		}
		if _, err := tx.ExecContext(ctx, migrations[v-1]); err != nil {
			tx.Rollback()
			return fmt.Errorf("migration %d: %w", v, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations(version, applied_at) VALUES (?, ?)`,
			v, time.Now().UnixNano()); err != nil {
			tx.Rollback()
			return fmt.Errorf("migration %d: %w", v, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("migration %d: %w", v, err)
		}
	}
	return nil
}

// SchemaVersion reports the applied schema version.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	err := s.r.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&v)
	return v, err
}
