package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/airlockhq/airlock/api"
)

// Warm pools (docs/pools.md): a pool keeps members of a template ready, and
// a create that names it (CreateSandboxRequest.Pool) or matches its
// template, runtime and resources claims one, answering in milliseconds.

func poolPath(name string) string { return "/v1/pools/" + url.PathEscape(name) }

// PoolOptions are the optional parts of a pool call.
type PoolOptions struct {
	// Tenant is the tenant whose pool it is (admin keys only; a tenant
	// key acts on its own tenant's).
	Tenant string
}

func (o PoolOptions) query() url.Values {
	if o.Tenant == "" {
		return nil
	}
	return url.Values{"tenant": {o.Tenant}}
}

// PutPool creates pool name or replaces its desired state: Size members
// of Template on Runtime with Resources. Members are made in the
// background; the pool's Status says how many are ready.
func (c *Client) PutPool(ctx context.Context, name string, req api.PutPoolRequest, opts ...PoolOptions) (*api.Pool, error) {
	var out api.Pool
	if err := c.doJSON(ctx, http.MethodPut, poolPath(name), poolOpts(opts).query(), req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Pool returns pool name with its status; a missing pool (or another
// tenant's) is ErrNotFound.
func (c *Client) Pool(ctx context.Context, name string, opts ...PoolOptions) (*api.Pool, error) {
	var out api.Pool
	if err := c.doJSON(ctx, http.MethodGet, poolPath(name), poolOpts(opts).query(), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Pools lists the tenant's pools by name (an admin key's: every tenant's,
// unless Tenant names one).
func (c *Client) Pools(ctx context.Context, opts ...PoolOptions) ([]api.Pool, error) {
	var out api.PoolList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/pools", poolOpts(opts).query(), nil, &out); err != nil {
		return nil, err
	}
	return out.Pools, nil
}

// DeletePool deletes pool name; its unclaimed members are removed,
// sandboxes claimed from it keep running.
func (c *Client) DeletePool(ctx context.Context, name string, opts ...PoolOptions) error {
	return c.doJSON(ctx, http.MethodDelete, poolPath(name), poolOpts(opts).query(), nil, nil)
}

func poolOpts(opts []PoolOptions) PoolOptions {
	if len(opts) == 0 {
		return PoolOptions{}
	}
	return opts[0]
}
