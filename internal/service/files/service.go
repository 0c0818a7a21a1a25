// Package files is the file service: stat, list, read, write, move and remove files in a running sandbox,
// tar in and out, and watch directories, each as a user of the sandbox (the agent acts with the user's
// permissions inside the sandbox's root). Downloads are masked of the sandbox's secrets; uploads may
// splice from the client's socket to the agent's (SocketBody).
package files

import (
	"context"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/sandbox"
)

// SocketBody is an upload whose bytes are still in the client's socket:
// Head (what the HTTP server read ahead), then exactly N bytes from Conn.
// Given to WriteFile as its body, it lets the bytes go from the client's
// socket to the agent's by splice(2), without copies in the daemon.
type SocketBody = agentproto.SocketBody

// Sandboxes is what the file service needs of the sandbox lifecycle.
type Sandboxes interface {
	// Running returns sandbox id if p may see it and it is running.
	Running(ctx context.Context, p auth.Principal, id string) (*sandbox.Live, error)
	// Lookup returns live sandbox id, nil if it is not live.
	Lookup(id string) *sandbox.Live
}

// Config configures a Service.
type Config struct {
	// Sandboxes finds the running sandboxes. Required.
	Sandboxes Sandboxes
	// MaxUploadBytes bounds one upload (the daemon's max_upload_bytes).
	MaxUploadBytes int64
}

// Service is the file service. Its methods are safe for concurrent use.
type Service struct {
	sandboxes      Sandboxes
	maxUploadBytes int64
}

// New returns the file service of cfg.
func New(cfg Config) *Service {
	return &Service{sandboxes: cfg.Sandboxes, maxUploadBytes: cfg.MaxUploadBytes}
}

// AuditFileOp records a file operation p asked for on sandbox id (the
// planes call it once the operation answered). Nothing is recorded for a
// sandbox p cannot see or that is not live.
func (s *Service) AuditFileOp(ctx context.Context, p auth.Principal, id string, d api.FileAuditDetail) {
	sb := s.sandboxes.Lookup(id)
	if sb == nil || !p.CanSee(sb.Tenant()) {
		return
	}
	sb.Audit(ctx, audit.TypeFileWrite, d)
}

var errInvalid = errdefs.ErrInvalidArgument

// public returns a client-safe error of class cls (errdefs.Public).
func public(cls error, format string, args ...any) error {
	return errdefs.Publicf(cls, format, args...)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
