package client

import (
	"context"
	"net/http"
	"strconv"

	"github.com/airlockhq/airlock/api"
)

// CreatePreview exposes a TCP port of a running sandbox at a preview URL
// and returns it with the sandbox's preview token. Exposing a port again
// changes whether it is public.
func (c *Client) CreatePreview(ctx context.Context, id string, port int, public bool) (*api.Preview, error) {
	var out api.Preview
	req := api.PreviewRequest{Port: port, Public: public}
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id, "previews"), nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListPreviews lists a sandbox's exposed ports.
func (c *Client) ListPreviews(ctx context.Context, id string) ([]api.Preview, error) {
	var out api.PreviewList
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id, "previews"), nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Previews, nil
}

// DeletePreview stops exposing a sandbox's port.
func (c *Client) DeletePreview(ctx context.Context, id string, port int) error {
	return c.doJSON(ctx, http.MethodDelete, sandboxPath(id, "previews/"+strconv.Itoa(port)), nil, nil, nil)
}
