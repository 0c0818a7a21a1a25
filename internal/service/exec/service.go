// Package exec is the exec service: commands run in a sandbox (JSON, async, streamed, PTY), their stdin,
// signals and terminal size, their output followed, masked of the sandbox's secrets and kept for
// re-attach, and their records.
//
// An exec is followed by a tracker (tracker.go) that outlives the request that started it; its three state
// machines (follow.go: the agent's stream and its re-attach, the hold of output that could be a secret,
// the timeout backstop) share one loop. The Engine keeps the trackers and is given to the sandbox
// lifecycle, which runs a template's start command through it and re-attaches the execs of sandboxes
// recovered after a restart; Service is the planes' side.
package exec

import (
	"context"

	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/sandbox"
	"github.com/airlockhq/airlock/internal/store"
)

// Sandboxes is what the exec service needs of the sandbox lifecycle.
type Sandboxes interface {
	// Running returns sandbox id if p may see it and it is running.
	Running(ctx context.Context, p auth.Principal, id string) (*sandbox.Live, error)
	// Lookup returns live sandbox id, nil if it is not live.
	Lookup(id string) *sandbox.Live
	// Record returns the stored record of sandbox id if p may see it.
	Record(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error)
}

// Quotas admits execs against their tenant's exec rate quota.
type Quotas interface {
	AdmitExec(ctx context.Context, tenant string) error
}

// Config configures a Service.
type Config struct {
	Engine    *Engine
	Sandboxes Sandboxes
	Quotas    Quotas
}

// Service is the exec service's side of the planes. Its methods are safe
// for concurrent use.
type Service struct {
	eng       *Engine
	sandboxes Sandboxes
	quotas    Quotas
}

// New returns the exec service of cfg.
func New(cfg Config) *Service {
	return &Service{eng: cfg.Engine, sandboxes: cfg.Sandboxes, quotas: cfg.Quotas}
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
