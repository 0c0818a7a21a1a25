package client

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/airlockhq/airlock/api"
)

// MetricsSeries returns the sandbox's current metrics and the samples
// taken after since (zero: every kept sample).
func (c *Client) MetricsSeries(ctx context.Context, id string, since time.Time) (*api.SandboxMetrics, error) {
	q := url.Values{}
	if !since.IsZero() {
		q.Set("since", since.UTC().Format(time.RFC3339Nano))
	}
	var out api.SandboxMetrics
	if err := c.doJSON(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/metrics", q, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
