package client

import (
	"context"
	"net/http"

	"github.com/airlockhq/airlock/api"
)

// Durable sandboxes' lifecycle (docs/lifecycle.md): pause to memory or to
// disk, lifecycle rules and metadata (PATCH), keepalive.

// PauseOptions say how a sandbox is paused.
type PauseOptions struct {
	// Disk releases the sandbox's RAM (pause_memory disk): where the
	// runtime checkpoints memory (gVisor) its processes resume where they
	// were; elsewhere (runc) only its files are kept and the resume starts
	// it again. Without it every process is frozen in RAM (keep).
	Disk bool
}

func (o PauseOptions) request() api.PauseRequest {
	if o.Disk {
		return api.PauseRequest{Memory: api.PauseMemoryDisk}
	}
	return api.PauseRequest{Memory: api.PauseMemoryKeep}
}

// PauseWith pauses sandbox id as o says. Time paused does not count
// against its timeout.
func (c *Client) PauseWith(ctx context.Context, id string, o PauseOptions) (*api.Sandbox, error) {
	var out api.Sandbox
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id, "pause"), nil, o.request(), &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Patch changes sandbox id's lifecycle rules (field by field: nil fields
// stay) and metadata (as a whole, when req.Metadata is not nil).
func (c *Client) Patch(ctx context.Context, id string, req api.PatchSandboxRequest) (*api.Sandbox, error) {
	var out api.Sandbox
	if err := c.doJSON(ctx, http.MethodPatch, sandboxPath(id), nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Keepalive counts as activity of sandbox id for its idle timeout; it
// does not move its expiry (SetTimeout does). A paused sandbox is resumed
// when its lifecycle has auto_resume, else it is an invalid_state error.
func (c *Client) Keepalive(ctx context.Context, id string) (*api.Sandbox, error) {
	var out api.Sandbox
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id, "keepalive"), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// PauseWith pauses the sandbox as o says.
func (s *Sandbox) PauseWith(ctx context.Context, o PauseOptions) error {
	sb, err := s.c.PauseWith(ctx, s.id, o)
	if err != nil {
		return err
	}
	s.update(sb)
	return nil
}

// SetLifecycle changes the sandbox's lifecycle rules; nil fields of l stay.
func (s *Sandbox) SetLifecycle(ctx context.Context, l api.Lifecycle) error {
	sb, err := s.c.Patch(ctx, s.id, api.PatchSandboxRequest{Lifecycle: &l})
	if err != nil {
		return err
	}
	s.update(sb)
	return nil
}

// Keepalive counts as activity of the sandbox for its idle timeout.
func (s *Sandbox) Keepalive(ctx context.Context) error {
	sb, err := s.c.Keepalive(ctx, s.id)
	if err != nil {
		return err
	}
	s.update(sb)
	return nil
}
