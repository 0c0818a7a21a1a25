package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/airlockhq/airlock/api"
)

// UpdateNetwork replaces a running sandbox's egress policy; it takes effect
// at once. It returns the sandbox with its new network.
func (c *Client) UpdateNetwork(ctx context.Context, id string, n api.Network) (*api.Sandbox, error) {
	var out api.Sandbox
	if err := c.doJSON(ctx, http.MethodPut, sandboxPath(id, "network"), nil, n, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

func tenantNetworkPath(tenant string) string {
	return "/v1/tenants/" + url.PathEscape(tenant) + "/network"
}

// TenantNetwork returns a tenant's default network policy (Network nil: the
// server's default). A tenant key reads its own tenant's.
func (c *Client) TenantNetwork(ctx context.Context, tenant string) (*api.TenantNetwork, error) {
	var out api.TenantNetwork
	if err := c.doJSON(ctx, http.MethodGet, tenantNetworkPath(tenant), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SetTenantNetwork sets a tenant's default network policy: the one its
// sandboxes get when their create names no mode (admin keys only).
func (c *Client) SetTenantNetwork(ctx context.Context, tenant string, n api.Network) (*api.TenantNetwork, error) {
	var out api.TenantNetwork
	if err := c.doJSON(ctx, http.MethodPut, tenantNetworkPath(tenant), nil, n, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ClearTenantNetwork removes a tenant's default network policy, so that the
// server's default applies again (admin keys only).
func (c *Client) ClearTenantNetwork(ctx context.Context, tenant string) error {
	return c.doJSON(ctx, http.MethodDelete, tenantNetworkPath(tenant), nil, nil, nil)
}
