// Package accounting is the accounting service: what tenants may hold (quotas: the defaults, the
// overrides, the exec rate windows), what they used (the metrics series and usage accrual of live
// sandboxes, usage reports) and what they did (the audit trail). Quotas and Meter are given to the sandbox
// lifecycle, which admits creates and samples sandboxes with them; Service is the planes' side.
package accounting

import (
	"context"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/sandbox"
	"github.com/airlockhq/airlock/internal/store"
)

// MaxPageSize bounds one page of the audit trail: a larger limit is cut
// to it.
const MaxPageSize = store.MaxPageSize

// auditFlushTimeout bounds how long a read of the trail waits for events
// already queued to be written (read your own writes).
const auditFlushTimeout = 2 * time.Second

// Sandboxes is what the accounting service needs of the sandbox lifecycle.
type Sandboxes interface {
	// Metrics samples sandbox id's resource use now.
	Metrics(ctx context.Context, p auth.Principal, id string) (api.Metrics, error)
	// LiveSandbox returns sandbox id if p may see it and it is live.
	LiveSandbox(ctx context.Context, p auth.Principal, id string) (*sandbox.Live, error)
	// Lives returns the live sandboxes.
	Lives() []*sandbox.Live
	// TenantUsage sums what tenant's live sandboxes hold.
	TenantUsage(tenant string) api.QuotaUsage
}

// Config configures a Service.
type Config struct {
	Sandboxes Sandboxes
	Quotas    *Quotas
	Meter     *Meter
	Store     *store.Store
	// Audit is flushed before the trail is read; nil records nothing.
	Audit *audit.Recorder
	// Settings hold the prices of usage reports.
	Settings config.Config
	// SampleInterval is how often the lifecycle samples (metrics series).
	SampleInterval time.Duration
}

// Service is the accounting service's side of the planes: tenant quotas,
// usage reports, metrics series and the audit trail.
type Service struct {
	sandboxes      Sandboxes
	quotas         *Quotas
	meter          *Meter
	store          *store.Store
	audit          *audit.Recorder
	settings       config.Config
	sampleInterval time.Duration
}

// New returns the accounting service of cfg.
func New(cfg Config) *Service {
	return &Service{sandboxes: cfg.Sandboxes, quotas: cfg.Quotas, meter: cfg.Meter, store: cfg.Store, audit: cfg.Audit,
		settings: cfg.Settings, sampleInterval: cfg.SampleInterval}
}

// AuditQuery selects audit events (GET /v1/audit).
type AuditQuery struct {
	// Tenant, for an admin, restricts to one tenant ("" for all). Another
	// key may only name its own.
	Tenant    string
	SandboxID string
	Types     []string
	// Since (inclusive) and Until (exclusive) bound the events' time.
	Since, Until time.Time
	Cursor       string
	Limit        int
}

// AuditEvents returns one page of the audit trail p may see: its tenant's
// events (every tenant's for an admin), oldest first. A sandbox of another
// tenant yields nothing, like one that never existed.
func (s *Service) AuditEvents(ctx context.Context, p auth.Principal, q AuditQuery) (api.AuditList, error) {
	for _, t := range q.Types {
		if !audit.ValidType(t) {
			return api.AuditList{}, public(errInvalid, "unknown audit event type %q", truncate(t, 32))
		}
	}
	f := store.AuditFilter{
		Tenant: p.TenantFilter(), SandboxID: q.SandboxID, Types: q.Types,
		Since: q.Since, Until: q.Until, Cursor: q.Cursor, Limit: q.Limit,
	}
	if q.Tenant != "" {
		if !p.CanSee(q.Tenant) {
			return api.AuditList{}, public(errdefs.ErrPermissionDenied, "only an admin key may read another tenant's audit trail")
		}
		f.Tenant = q.Tenant
	}
	// Events already queued (this client's own exec, say) are written first.
	fctx, cancel := context.WithTimeout(ctx, auditFlushTimeout)
	_ = s.audit.Flush(fctx)
	cancel()
	page, err := s.store.ListAuditEvents(ctx, f)
	if err != nil {
		if errdefs.IsInvalidArgument(err) {
			return api.AuditList{}, public(errInvalid, "%s", publicText(err))
		}
		return api.AuditList{}, err
	}
	out := api.AuditList{Events: make([]api.AuditEvent, 0, len(page.Events)), NextCursor: page.NextCursor, HasMore: page.HasMore}
	for _, e := range page.Events {
		out.Events = append(out.Events, api.AuditEvent{
			ID: e.ID, Time: e.Time, Type: e.Type, Tenant: e.Tenant, SandboxID: e.SandboxID,
			Template: e.Template, RequestID: e.RequestID, Detail: e.Detail,
		})
	}
	return out, nil
}

var errInvalid = errdefs.ErrInvalidArgument

// public returns a client-safe error of class cls (errdefs.Public).
func public(cls error, format string, args ...any) error {
	return errdefs.Publicf(cls, format, args...)
}

// publicText strips the class prefix errdefs.Wrap puts on a message.
func publicText(err error) string {
	s := err.Error()
	if p := errdefs.ErrInvalidArgument.Error() + ": "; len(s) > len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
