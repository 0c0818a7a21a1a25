package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/airlockhq/airlock/api"
)

func tenantQuotasPath(tenant string) string {
	return "/v1/tenants/" + url.PathEscape(tenant) + "/quotas"
}

// TenantQuotas returns a tenant's quota (the server's default with the
// tenant's override on top) and its usage now. A tenant key reads its own
// tenant's only.
func (c *Client) TenantQuotas(ctx context.Context, tenant string) (*api.TenantQuotas, error) {
	var out api.TenantQuotas
	if err := c.doJSON(ctx, http.MethodGet, tenantQuotasPath(tenant), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SetTenantQuotas replaces a tenant's quota override: the fields set
// replace the defaults (0: no limit), the others keep them. It applies to
// the next create and exec (admin keys only).
func (c *Client) SetTenantQuotas(ctx context.Context, tenant string, o api.QuotaOverride) (*api.TenantQuotas, error) {
	var out api.TenantQuotas
	if err := c.doJSON(ctx, http.MethodPut, tenantQuotasPath(tenant), nil, o, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ClearTenantQuotas removes a tenant's quota override, so that the
// server's default quota applies again (admin keys only).
func (c *Client) ClearTenantQuotas(ctx context.Context, tenant string) error {
	return c.doJSON(ctx, http.MethodDelete, tenantQuotasPath(tenant), nil, nil, nil)
}
