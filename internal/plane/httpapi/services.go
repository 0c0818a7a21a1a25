package httpapi

import (
	"context"
	"io"
	"os"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/service/accounting"
	"github.com/airlockhq/airlock/internal/service/exec"
	"github.com/airlockhq/airlock/internal/service/files"
	"github.com/airlockhq/airlock/internal/service/sandbox"
	"github.com/airlockhq/airlock/internal/service/templates"
)

// The services behind the routes, each as the interface of what the
// handlers use of it (internal/service wires the real ones). Every method
// takes the caller's principal and checks what it may see; the handlers
// decode, authenticate, encode and map errors, nothing more.

// Sandboxes is the sandbox lifecycle: create, read, list, delete, the
// TTL, pause and resume, a sandbox's network policy, and the daemon's
// runtimes and readiness.
type Sandboxes interface {
	// Create starts a sandbox and returns it once its agent answered;
	// idemKey is the Idempotency-Key header ("" for none).
	Create(ctx context.Context, p auth.Principal, req api.CreateSandboxRequest, idemKey string) (sandbox.CreateResult, error)
	// Get returns sandbox id.
	Get(ctx context.Context, p auth.Principal, id string) (api.Sandbox, error)
	// List returns one page of p's sandboxes.
	List(ctx context.Context, p auth.Principal, f sandbox.ListFilter) (api.SandboxList, error)
	// Delete stops and removes sandbox id.
	Delete(ctx context.Context, p auth.Principal, id string) error
	// SetTimeout gives sandbox id timeoutS seconds to live from now.
	SetTimeout(ctx context.Context, p auth.Principal, id string, timeoutS int64) (api.Sandbox, error)
	// Pause freezes sandbox id.
	Pause(ctx context.Context, p auth.Principal, id string) (api.Sandbox, error)
	// Resume thaws sandbox id.
	Resume(ctx context.Context, p auth.Principal, id string) (api.Sandbox, error)
	// UpdateNetwork replaces sandbox id's egress policy.
	UpdateNetwork(ctx context.Context, p auth.Principal, id string, req api.Network) (api.Sandbox, error)
	// Info describes the runtimes and limits.
	Info(ctx context.Context, version string) api.Info
	// Ready reports whether the daemon can serve.
	Ready(ctx context.Context) error
	// Settings are the daemon's settings (the default per-key rate limit).
	Settings() config.Config
	// SandboxCounts and Capacity feed the Prometheus gauges.
	SandboxCounts() []sandbox.SandboxCount
	Capacity() (max, used int)
}

// Execs runs commands in sandboxes and follows them.
type Execs interface {
	// Exec starts a command; it is followed to its end whether or not the
	// caller stays.
	Exec(ctx context.Context, p auth.Principal, id string, req api.ExecRequest, opts exec.Options) (*exec.Exec, error)
	// GetExec returns an exec, with its output once it ended.
	GetExec(ctx context.Context, p auth.Principal, id, eid string) (api.ExecResult, error)
	// ListExecs returns one page of a sandbox's execs, newest first.
	ListExecs(ctx context.Context, p auth.Principal, id string, limit int, cursor string) (api.ExecList, error)
	// Events follows an exec's output from offset from.
	Events(ctx context.Context, p auth.Principal, id, eid string, from int64) (*exec.Subscription, error)
	// WriteStdin forwards r to an exec's stdin, closing it after if eof.
	WriteStdin(ctx context.Context, p auth.Principal, id, eid string, r io.Reader, eof bool) (int64, error)
	// Signal sends sig to an exec's process tree.
	Signal(ctx context.Context, p auth.Principal, id, eid, sig string) error
	// Resize changes a PTY exec's terminal size.
	Resize(ctx context.Context, p auth.Principal, id, eid string, cols, rows uint16) error
}

// Files reads, writes and watches files in sandboxes.
type Files interface {
	StatFile(ctx context.Context, p auth.Principal, id, pth, user string) (api.FileInfo, error)
	ListFiles(ctx context.Context, p auth.Principal, id, pth, user string, depth int) (api.FileList, error)
	Mkdir(ctx context.Context, p auth.Principal, id, pth, user string, parents bool) (api.FileInfo, error)
	Move(ctx context.Context, p auth.Principal, id, from, to, user string) (api.FileInfo, error)
	RemoveFile(ctx context.Context, p auth.Principal, id, pth, user string, recursive bool) error
	// WriteFile stores r (a *SocketBody splices) at pth, at most maxBytes.
	WriteFile(ctx context.Context, p auth.Principal, id, pth, user string, mode os.FileMode, r io.Reader, maxBytes int64) (api.FileWritten, error)
	// TarIn unpacks the tar stream r into directory dir.
	TarIn(ctx context.Context, p auth.Principal, id, dir, user string, r io.Reader) (api.FileWritten, error)
	// ReadFile opens pth (a tar stream for a directory).
	ReadFile(ctx context.Context, p auth.Principal, id, pth, user string) (io.ReadCloser, api.FileInfo, error)
	// WatchDir watches directory pth (its tree when recursive).
	WatchDir(ctx context.Context, p auth.Principal, id, pth, user string, recursive bool) (*files.Watch, error)
	// AuditFileOp records a file operation once it answered.
	AuditFileOp(ctx context.Context, p auth.Principal, id string, d api.FileAuditDetail)
}

// TenantNetworks keeps the tenants' default network policies.
type TenantNetworks interface {
	TenantNetwork(ctx context.Context, p auth.Principal, tenant string) (api.TenantNetwork, error)
	SetTenantNetwork(ctx context.Context, p auth.Principal, tenant string, n *api.Network) (api.TenantNetwork, error)
}

// Previews exposes sandbox ports at preview URLs.
type Previews interface {
	CreatePreview(ctx context.Context, p auth.Principal, id string, req api.PreviewRequest) (api.Preview, error)
	ListPreviews(ctx context.Context, p auth.Principal, id string) (api.PreviewList, error)
	DeletePreview(ctx context.Context, p auth.Principal, id string, port int) error
}

// Accounting is what tenants may use (quotas), used (usage, metrics) and
// did (the audit trail).
type Accounting interface {
	TenantQuotas(ctx context.Context, p auth.Principal, tenant string) (api.TenantQuotas, error)
	SetTenantQuotas(ctx context.Context, p auth.Principal, tenant string, o *api.QuotaOverride) (api.TenantQuotas, error)
	Usage(ctx context.Context, p auth.Principal, tenant string, from, to time.Time, groupBy string) (api.UsageReport, error)
	MetricsSeries(ctx context.Context, p auth.Principal, id string, since time.Time) (api.SandboxMetrics, error)
	AuditEvents(ctx context.Context, p auth.Principal, q accounting.AuditQuery) (api.AuditList, error)
}

// Templates builds and catalogs templates.
type Templates interface {
	// TemplateUpload makes a temporary file for a build's upload.
	TemplateUpload() (*os.File, error)
	BuildTemplate(ctx context.Context, p auth.Principal, req api.TemplateBuildRequest, contextPath, imagePath string) (api.TemplateBuildStarted, error)
	TemplateBuild(ctx context.Context, p auth.Principal, id string) (api.TemplateBuild, error)
	// FollowTemplateBuild reads a build's log from offset from.
	FollowTemplateBuild(ctx context.Context, p auth.Principal, id string, from int64) (*templates.LogFollower, error)
	ListTemplates(ctx context.Context, p auth.Principal) (api.TemplateList, error)
	GetTemplate(ctx context.Context, p auth.Principal, ref string) (api.Template, error)
	DeleteTemplate(ctx context.Context, p auth.Principal, ref string) error
}
