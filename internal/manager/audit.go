package manager

import (
	"context"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/network"
	"github.com/airlockhq/airlock/internal/store"
)

const (
	// ownerRetention is how long a sandbox's tenant, template and secrets'
	// redactor are remembered after it stopped being live: network events
	// of its last connections (reported when they close, and by the packet
	// filter's log reader) arrive a little after its teardown.
	ownerRetention = 2 * time.Minute
	// auditFlushTimeout bounds how long a read of the trail waits for
	// events already queued to be written (read your own writes).
	auditFlushTimeout = 2 * time.Second
)

// owner is whom a sandbox's audit events belong to.
type owner struct {
	tenant   string
	template string
	red      *redactor
	// gone is when the sandbox stopped being live (zero while it is, or
	// while an attribution is held).
	gone time.Time
}

func (o owner) redact() audit.Redactor {
	if o.red.empty() {
		return nil
	}
	return o.red.redactString
}

// redact is the sandbox's secrets' redactor for audit details.
func (sb *sandbox) redact() audit.Redactor {
	if sb.red.empty() {
		return nil
	}
	return sb.red.redactString
}

// recordEvent queues an event of sandbox sb, tagged with the request of ctx.
// detail's strings are redacted of the sandbox's secrets by the writer.
// Call it without holding sb.mu.
func (m *Manager) recordEvent(ctx context.Context, sb *sandbox, typ string, detail any) {
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

// ownerOf finds whom sandbox id's events belong to: a live sandbox, one
// that recently stopped, or an attributed one (build sandboxes).
func (m *Manager) ownerOf(id string) (owner, bool) {
	m.mu.Lock()
	sb := m.live[id]
	m.mu.Unlock()
	if sb != nil {
		sb.mu.Lock()
		tmpl := sb.rec.Template
		sb.mu.Unlock()
		return owner{tenant: sb.tenant, template: tmpl, red: sb.red}, true
	}
	m.ownersMu.Lock()
	defer m.ownersMu.Unlock()
	o, ok := m.owners[id]
	return o, ok
}

// setOwner remembers o for id, pruning entries past their retention.
func (m *Manager) setOwner(id string, o owner) {
	m.ownersMu.Lock()
	defer m.ownersMu.Unlock()
	now := m.now()
	for k, v := range m.owners {
		if !v.gone.IsZero() && now.Sub(v.gone) > ownerRetention {
			delete(m.owners, k)
		}
	}
	m.owners[id] = o
}

// rememberOwner keeps a sandbox that stops being live attributable for a
// while.
func (m *Manager) rememberOwner(sb *sandbox) {
	if m.audit == nil {
		return
	}
	sb.mu.Lock()
	tmpl := sb.rec.Template
	sb.mu.Unlock()
	m.setOwner(sb.id, owner{tenant: sb.tenant, template: tmpl, red: sb.red, gone: m.now()})
}

// AttributeNetwork makes the audit events of sandbox id (one the manager
// does not run: a template build's) belong to tenant and template until
// release is called (and ownerRetention after).
func (m *Manager) AttributeNetwork(id, tenant, template string) (release func()) {
	if m.audit == nil {
		return func() {}
	}
	m.setOwner(id, owner{tenant: tenant, template: template})
	return func() { m.setOwner(id, owner{tenant: tenant, template: template, gone: m.now()}) }
}

// execEnded records an exec's audit event (the store's exec hook: every
// exec record written at its end). Its argv and error are masked already;
// masking again is harmless.
func (m *Manager) execEnded(e store.Exec) {
	if m.audit == nil {
		return
	}
	o, _ := m.ownerOf(e.SandboxID)
	at := m.now()
	if e.EndedAt != nil {
		at = *e.EndedAt
	}
	m.audit.RecordDetail(audit.Event{
		Time: at, Type: audit.TypeExec, Tenant: e.Tenant, SandboxID: e.SandboxID, Template: o.template, RequestID: e.RequestID,
	}, api.ExecAuditDetail{
		ExecID: e.ID, Cmd: e.Argv, Shell: e.Shell, User: e.User, Cwd: e.Cwd, PTY: e.PTY, Status: e.Status,
		ExitCode: e.ExitCode, Signal: e.Signal, Error: e.Error, StartedAt: e.StartedAt, EndedAt: e.EndedAt,
		DurationMS: e.DurationMS, StdoutB: e.StdoutBytes, StderrB: e.StderrBytes, Truncated: e.Truncated,
	}, o.redact())
}

// NetworkEvent records a network decision (network.Config.Audit). It is
// called from the network package's goroutines and only queues. The
// domain is masked too: a secret may leave as a DNS name.
func (m *Manager) NetworkEvent(ev network.Event) {
	if m.audit == nil {
		return
	}
	o, _ := m.ownerOf(ev.SandboxID)
	m.audit.RecordDetail(audit.Event{
		Time: ev.Time, Type: audit.TypeEgress, Tenant: o.tenant, SandboxID: ev.SandboxID, Template: o.template,
	}, api.EgressAuditDetail{
		Kind: ev.Kind, Domain: ev.Domain, IP: ev.IP, Port: ev.Port, Proto: ev.Proto, Allowed: ev.Allowed,
		Reason: ev.Reason, BytesIn: ev.BytesIn, BytesOut: ev.BytesOut, Registry: m.registryOf(ev.Domain),
	}, o.redact())
}

// AuditFileOp records a file operation p asked for on sandbox id (the
// server calls it once the operation answered). Nothing is recorded for a
// sandbox p cannot see or that is not live.
func (m *Manager) AuditFileOp(ctx context.Context, p auth.Principal, id string, d api.FileAuditDetail) {
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
func (m *Manager) AuditEvents(ctx context.Context, p auth.Principal, q AuditQuery) (api.AuditList, error) {
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
