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

// CreateSandbox creates a sandbox and returns once it is ready to run a
// command. Pass WithIdempotencyKey to make retries safe.
func (c *Client) CreateSandbox(ctx context.Context, req api.CreateSandboxRequest, opts ...CallOption) (*api.Sandbox, error) {
	var out api.Sandbox
	if err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes", nil, req, &out, opts...); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetSandbox returns one sandbox. A sandbox of another tenant is ErrNotFound.
func (c *Client) GetSandbox(ctx context.Context, id string) (*api.Sandbox, error) {
	var out api.Sandbox
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListOptions filters GET /v1/sandboxes.
type ListOptions struct {
	State    string            // only sandboxes in this state
	Metadata map[string]string // only sandboxes whose metadata has all these pairs
	Limit    int               // page size; 0 is the server default
	Cursor   string            // next_cursor of the previous page
}

func (o ListOptions) query() url.Values {
	q := url.Values{}
	if o.State != "" {
		q.Set("state", o.State)
	}
	for k, v := range o.Metadata {
		q.Set("metadata."+k, v)
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.Cursor != "" {
		q.Set("cursor", o.Cursor)
	}
	return q
}

// ListSandboxes returns one page of sandboxes.
func (c *Client) ListSandboxes(ctx context.Context, opts ListOptions) (*api.SandboxList, error) {
	var out api.SandboxList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/sandboxes", opts.query(), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Sandboxes iterates over every sandbox matching opts, following cursors
// page by page. It stops at the first error, which it yields.
func (c *Client) Sandboxes(ctx context.Context, opts ListOptions) iter.Seq2[api.Sandbox, error] {
	return func(yield func(api.Sandbox, error) bool) {
		seen := map[string]bool{}
		for {
			page, err := c.ListSandboxes(ctx, opts)
			if err != nil {
				yield(api.Sandbox{}, err)
				return
			}
			for _, s := range page.Sandboxes {
				if !yield(s, nil) {
					return
				}
			}
			if page.NextCursor == "" {
				return
			}
			// A server bug returning the same cursor again would loop forever.
			if seen[page.NextCursor] {
				yield(api.Sandbox{}, errors.New("server repeated a list cursor"))
				return
			}
			seen[page.NextCursor] = true
			opts.Cursor = page.NextCursor
		}
	}
}

// DeleteSandbox destroys a sandbox. Deleting one already deleted succeeds.
func (c *Client) DeleteSandbox(ctx context.Context, id string) error {
	return c.doJSON(ctx, http.MethodDelete, sandboxPath(id), nil, nil, nil)
}

// SetTimeout sets the sandbox to expire timeoutS seconds from now and
// returns it with its new expires_at.
func (c *Client) SetTimeout(ctx context.Context, id string, timeoutS int64) (*api.Sandbox, error) {
	var out api.Sandbox
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id, "timeout"), nil, api.TimeoutRequest{TimeoutS: timeoutS}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Pause freezes every process of the sandbox. Time paused does not count
// against its timeout.
func (c *Client) Pause(ctx context.Context, id string) (*api.Sandbox, error) {
	var out api.Sandbox
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id, "pause"), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Resume thaws a paused sandbox.
func (c *Client) Resume(ctx context.Context, id string) (*api.Sandbox, error) {
	var out api.Sandbox
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id, "resume"), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Metrics returns the sandbox's resource use now.
func (c *Client) Metrics(ctx context.Context, id string) (*api.Metrics, error) {
	var out api.Metrics
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id, "metrics"), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
