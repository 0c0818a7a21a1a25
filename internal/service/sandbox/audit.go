package sandbox

import (
	"context"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/store"
)

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
