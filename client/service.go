package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/airlockhq/airlock/api"
)

// CreateKey makes an API key (admin keys only). The returned Key.Key is the
// secret, shown this once.
func (c *Client) CreateKey(ctx context.Context, req api.CreateKeyRequest) (*api.Key, error) {
	var out api.Key
	if err := c.doJSON(ctx, http.MethodPost, "/v1/keys", nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListKeys lists the API keys the caller may see (never their secrets).
func (c *Client) ListKeys(ctx context.Context) ([]api.Key, error) {
	var out api.KeyList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/keys", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Keys, nil
}

// DeleteKey revokes a key; it stops working at once.
func (c *Client) DeleteKey(ctx context.Context, id string) error {
	return c.doJSON(ctx, http.MethodDelete, "/v1/keys/"+url.PathEscape(id), nil, nil, nil)
}

// Info returns the server's version, runtimes and limits.
func (c *Client) Info(ctx context.Context) (*api.Info, error) {
	var out api.Info
	if err := c.doJSON(ctx, http.MethodGet, "/v1/info", nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Health checks that the server is alive (GET /healthz, no key needed).
func (c *Client) Health(ctx context.Context) error {
	return c.doJSON(ctx, http.MethodGet, "/healthz", nil, nil, nil)
}

// Ready checks that the server can serve sandboxes (GET /readyz: drivers
// probed, store open).
func (c *Client) Ready(ctx context.Context) error {
	return c.doJSON(ctx, http.MethodGet, "/readyz", nil, nil, nil)
}
