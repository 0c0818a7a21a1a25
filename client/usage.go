package client

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/airlockhq/airlock/api"
)

// UsageOptions select a usage report. Zero fields are left out.
type UsageOptions struct {
	// From and To bound the report (hourly buckets starting in [From, To)).
	From, To time.Time
	// GroupBy is sandbox (default), template or day.
	GroupBy string
	// Tenant is another tenant's usage (admin keys only).
	Tenant string
}

func (o UsageOptions) query() url.Values {
	q := url.Values{}
	if !o.From.IsZero() {
		q.Set("from", o.From.UTC().Format(time.RFC3339Nano))
	}
	if !o.To.IsZero() {
		q.Set("to", o.To.UTC().Format(time.RFC3339Nano))
	}
	if o.GroupBy != "" {
		q.Set("group_by", o.GroupBy)
	}
	if o.Tenant != "" {
		q.Set("tenant", o.Tenant)
	}
	return q
}

// Usage returns metered usage and its cost (GET /v1/usage).
func (c *Client) Usage(ctx context.Context, opts UsageOptions) (*api.UsageReport, error) {
	var out api.UsageReport
	if err := c.doJSON(ctx, http.MethodGet, "/v1/usage", opts.query(), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
