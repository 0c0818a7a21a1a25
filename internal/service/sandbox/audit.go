package sandbox

import (
	"context"

	"github.com/airlockhq/airlock/internal/audit"
)

// redact is the sandbox's secrets' redactor for audit details.
func (sb *Live) redact() audit.Redactor {
	return sb.Redactor().Func()
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
