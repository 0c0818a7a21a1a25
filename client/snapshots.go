package client

import (
	"context"
	"errors"
	"iter"
	"net/http"
	"net/url"
	"strconv"

	"github.com/airlockhq/airlock/api"
)

// Snapshots, create from a snapshot, fork and reset in place
// (docs/snapshots.md).

// CreateSnapshot snapshots sandbox id (its filesystem; with req.Memory its
// processes too, where the runtime can) and returns the snapshot once it
// is ready. Memory where the runtime cannot is an error with code
// capability_unsupported.
func (c *Client) CreateSnapshot(ctx context.Context, id string, req api.CreateSnapshotRequest) (*api.Snapshot, error) {
	var out api.Snapshot
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id, "snapshots"), nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetSnapshot returns one snapshot. Another tenant's is ErrNotFound.
func (c *Client) GetSnapshot(ctx context.Context, id string) (*api.Snapshot, error) {
	var out api.Snapshot
	if err := c.doJSON(ctx, http.MethodGet, snapshotPath(id), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SnapshotListOptions filters GET /v1/snapshots.
type SnapshotListOptions struct {
	SandboxID string // only the snapshots taken of this sandbox
	Name      string // only the snapshot of this name
	Limit     int    // page size; 0 is the server default
	Cursor    string // next_cursor of the previous page
}

func (o SnapshotListOptions) query() url.Values {
	q := url.Values{}
	if o.SandboxID != "" {
		q.Set("sandbox_id", o.SandboxID)
	}
	if o.Name != "" {
		q.Set("name", o.Name)
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.Cursor != "" {
		q.Set("cursor", o.Cursor)
	}
	return q
}

// ListSnapshots returns one page of snapshots, newest first.
func (c *Client) ListSnapshots(ctx context.Context, opts SnapshotListOptions) (*api.SnapshotList, error) {
	var out api.SnapshotList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/snapshots", opts.query(), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// AllSnapshots iterates over every snapshot matching opts, page by page.
// It stops at the first error, which it yields.
func (c *Client) AllSnapshots(ctx context.Context, opts SnapshotListOptions) iter.Seq2[api.Snapshot, error] {
	return func(yield func(api.Snapshot, error) bool) {
		seen := map[string]bool{}
		for {
			page, err := c.ListSnapshots(ctx, opts)
			if err != nil {
				yield(api.Snapshot{}, err)
				return
			}
			for _, s := range page.Snapshots {
				if !yield(s, nil) {
					return
				}
			}
			if page.NextCursor == "" {
				return
			}
			if seen[page.NextCursor] {
				yield(api.Snapshot{}, errors.New("server repeated a list cursor"))
				return
			}
			seen[page.NextCursor] = true
			opts.Cursor = page.NextCursor
		}
	}
}

// DeleteSnapshot deletes a snapshot: new creates and resets cannot use it;
// sandboxes started from it keep running. Deleting one already deleted
// succeeds.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	return c.doJSON(ctx, http.MethodDelete, snapshotPath(id), nil, nil, nil)
}

// Fork makes req.Count running copies of sandbox id, all or none.
func (c *Client) Fork(ctx context.Context, id string, req api.ForkRequest) (*api.ForkResponse, error) {
	var out api.ForkResponse
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id, "fork"), nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Reset returns sandbox id to its template version (req.Snapshot empty)
// or to a snapshot, in place: same id, network, secrets, env, metadata
// and expiry; every process is killed and the filesystem's changes are
// dropped.
func (c *Client) Reset(ctx context.Context, id string, req api.ResetRequest) (*api.Sandbox, error) {
	var out api.Sandbox
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id, "reset"), nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

func snapshotPath(id string) string { return "/v1/snapshots/" + url.PathEscape(id) }

// Snapshot snapshots the sandbox's filesystem (with memory true its
// processes too, where the runtime can).
func (s *Sandbox) Snapshot(ctx context.Context, name string, memory bool) (*api.Snapshot, error) {
	return s.c.CreateSnapshot(ctx, s.id, api.CreateSnapshotRequest{Name: name, Memory: memory})
}

// Fork makes count running copies of the sandbox, each with only secrets
// (nil: none) and, when metadata is not nil, that metadata. Close each
// copy when done.
func (s *Sandbox) Fork(ctx context.Context, count int, secrets, metadata map[string]string) ([]*Sandbox, error) {
	res, err := s.c.Fork(ctx, s.id, api.ForkRequest{Count: count, Secrets: secrets, Metadata: metadata})
	if err != nil {
		return nil, err
	}
	out := make([]*Sandbox, len(res.Sandboxes))
	for i := range res.Sandboxes {
		out[i] = s.c.handle(&res.Sandboxes[i])
	}
	return out, nil
}

// Reset returns the sandbox in place to its template (snapshot "") or to
// a snapshot.
func (s *Sandbox) Reset(ctx context.Context, snapshot string) error {
	sb, err := s.c.Reset(ctx, s.id, api.ResetRequest{Snapshot: snapshot})
	if err != nil {
		return err
	}
	s.update(sb)
	return nil
}

// WithSnapshot starts the sandbox from a snapshot (snap_…) instead of a
// template: its template, runtime and resources unless other options set
// them.
func WithSnapshot(id string) SandboxOption {
	return sandboxOptionFunc(func(c *createConfig) { c.req.Snapshot = id })
}
