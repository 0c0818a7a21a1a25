package sandbox

import (
	"context"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
)

// auditFlushTimeout bounds how long a read of the trail waits for events
// already queued to be written (read your own writes).
const auditFlushTimeout = 2 * time.Second

// redact is the sandbox's secrets' redactor for audit details.
func (sb *Live) redact() audit.Redactor {
	return sb.red.Func()
}

// recordEvent queues an event of sandbox sb, tagged with the request of ctx.
// detail's strings are redacted of the sandbox's secrets by the writer.
// Call it without holding sb.mu.
func (m *Service) recordEvent(ctx context.Context, sb *Live, typ string, detail any) {
	if m.audit == nil {
		return
	}
	sb.mu.Lock()
	tmpl := sb.rec.Template
	sb.mu.Unlock()
	m.audit.RecordDetail(audit.Event{
		Type: typ, Tenant: sb.tenant, SandboxID: sb.id, Template: tmpl, RequestID: audit.RequestID(ctx),
	}, detail, sb.redact())
}

// finishExec writes an exec's end to its record and records its audit
// event: every exec's record is written once at its end, whichever path
// ends it, and that write is its audit event (with the request that
// started it, which the record keeps). Its argv and error are masked
// already; masking again is harmless.
func (m *Service) finishExec(ctx context.Context, sb *Live, e store.Exec, events []byte) error {
	rid, err := m.store.FinishExec(ctx, e, events)
	if err != nil || m.audit == nil {
		return err
	}
	at := m.now()
	if e.EndedAt != nil {
		at = *e.EndedAt
	}
	sb.mu.Lock()
	tmpl := sb.rec.Template
	sb.mu.Unlock()
	m.audit.RecordDetail(audit.Event{
		Time: at, Type: audit.TypeExec, Tenant: e.Tenant, SandboxID: e.SandboxID, Template: tmpl, RequestID: rid,
	}, api.ExecAuditDetail{
		ExecID: e.ID, Cmd: e.Argv, Shell: e.Shell, User: e.User, Cwd: e.Cwd, PTY: e.PTY, Status: e.Status,
		ExitCode: e.ExitCode, Signal: e.Signal, Error: e.Error, StartedAt: e.StartedAt, EndedAt: e.EndedAt,
		DurationMS: e.DurationMS, StdoutB: e.StdoutBytes, StderrB: e.StderrBytes, Truncated: e.Truncated,
	}, sb.redact())
	return nil
}

// AuditFileOp records a file operation p asked for on sandbox id (the
// server calls it once the operation answered). Nothing is recorded for a
// sandbox p cannot see or that is not live.
func (m *Service) AuditFileOp(ctx context.Context, p auth.Principal, id string, d api.FileAuditDetail) {
	if m.audit == nil {
		return
	}
	m.mu.Lock()
	sb := m.live[id]
	m.mu.Unlock()
	if sb == nil || !p.CanSee(sb.tenant) {
		return
	}
	m.recordEvent(ctx, sb, audit.TypeFileWrite, d)
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
func (m *Service) AuditEvents(ctx context.Context, p auth.Principal, q AuditQuery) (api.AuditList, error) {
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
	_ = m.audit.Flush(fctx)
	cancel()
	page, err := m.store.ListAuditEvents(ctx, f)
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
