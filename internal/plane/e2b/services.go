package e2b

import (
	"context"
	"io"
	"net"
	"os"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/service/exec"
	"github.com/airlockhq/airlock/internal/service/files"
	"github.com/airlockhq/airlock/internal/service/sandbox"
)

// The services the E2B planes translate to, each as the interface of what
// the handlers use of it (internal/service wires the real ones; the
// HTTP API's are the same services).

// Sandboxes is the sandbox lifecycle (the control plane).
type Sandboxes interface {
	Create(ctx context.Context, p auth.Principal, req api.CreateSandboxRequest, idemKey string) (sandbox.CreateResult, error)
	Get(ctx context.Context, p auth.Principal, id string) (api.Sandbox, error)
	List(ctx context.Context, p auth.Principal, f sandbox.ListFilter) (api.SandboxList, error)
	Delete(ctx context.Context, p auth.Principal, id string) error
	SetTimeout(ctx context.Context, p auth.Principal, id string, timeoutS int64) (api.Sandbox, error)
	Pause(ctx context.Context, p auth.Principal, id string) (api.Sandbox, error)
	Resume(ctx context.Context, p auth.Principal, id string) (api.Sandbox, error)
	Metrics(ctx context.Context, p auth.Principal, id string) (api.Metrics, error)
	UpdateNetwork(ctx context.Context, p auth.Principal, id string, req api.Network) (api.Sandbox, error)
	PauseWith(ctx context.Context, p auth.Principal, id string, o sandbox.PauseOptions) (api.Sandbox, error)
	CreateSnapshot(ctx context.Context, p auth.Principal, id string, req api.CreateSnapshotRequest) (api.Snapshot, error)
	ListSnapshots(ctx context.Context, p auth.Principal, f sandbox.SnapshotFilter) (api.SnapshotList, error)
	GetSnapshot(ctx context.Context, p auth.Principal, sid string) (api.Snapshot, error)
	DeleteSnapshot(ctx context.Context, p auth.Principal, sid string) error
	Fork(ctx context.Context, p auth.Principal, id string, req api.ForkRequest) (api.ForkResponse, error)
	// Lives are the sandboxes this daemon holds (the signed /files URLs
	// name none: signing.go).
	Lives() []*sandbox.Live
}

// Execs runs and follows commands (envd's process service).
type Execs interface {
	Exec(ctx context.Context, p auth.Principal, id string, req api.ExecRequest, opts exec.Options) (*exec.Exec, error)
	ListExecs(ctx context.Context, p auth.Principal, id string, limit int, cursor string) (api.ExecList, error)
	Events(ctx context.Context, p auth.Principal, id, eid string, from int64) (*exec.Subscription, error)
	WriteStdin(ctx context.Context, p auth.Principal, id, eid string, r io.Reader, eof bool) (int64, error)
	Signal(ctx context.Context, p auth.Principal, id, eid, sig string) error
	Resize(ctx context.Context, p auth.Principal, id, eid string, cols, rows uint16) error
}

// Files reads, writes and watches files (envd's filesystem service and
// /files).
type Files interface {
	StatFile(ctx context.Context, p auth.Principal, id, pth, user string) (api.FileInfo, error)
	ListFiles(ctx context.Context, p auth.Principal, id, pth, user string, depth int) (api.FileList, error)
	Mkdir(ctx context.Context, p auth.Principal, id, pth, user string, parents bool) (api.FileInfo, error)
	Move(ctx context.Context, p auth.Principal, id, from, to, user string) (api.FileInfo, error)
	RemoveFile(ctx context.Context, p auth.Principal, id, pth, user string, recursive bool) error
	WriteFileWithMetadata(ctx context.Context, p auth.Principal, id, pth, user string, mode os.FileMode, md map[string]string, r io.Reader, maxBytes int64) (api.FileWritten, error)
	TarIn(ctx context.Context, p auth.Principal, id, dir, user string, r io.Reader) (api.FileWritten, error)
	ReadFile(ctx context.Context, p auth.Principal, id, pth, user string) (io.ReadCloser, api.FileInfo, error)
	WatchDir(ctx context.Context, p auth.Principal, id, pth, user string, recursive bool) (*files.Watch, error)
	AuditFileOp(ctx context.Context, p auth.Principal, id string, d api.FileAuditDetail)
}

// Ports connects to TCP ports inside sandboxes (sandbox.getHost traffic).
type Ports interface {
	// DialSandbox connects to port on sandbox id's loopback.
	DialSandbox(ctx context.Context, p auth.Principal, id string, port int) (net.Conn, error)
}

// Templates builds and catalogs templates (E2B's templates API:
// templates.go); *templates.Service implements it.
type Templates interface {
	TemplateUpload() (*os.File, error)
	BuildTemplate(ctx context.Context, p auth.Principal, req api.TemplateBuildRequest, contextPath, imagePath string) (api.TemplateBuildStarted, error)
	TemplateBuild(ctx context.Context, p auth.Principal, id string) (api.TemplateBuild, error)
	GetTemplate(ctx context.Context, p auth.Principal, ref string) (api.Template, error)
	DeleteTemplate(ctx context.Context, p auth.Principal, ref string) error
}
