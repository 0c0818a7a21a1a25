package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/api"
)

// AuditOptions filters GET /v1/audit. Zero fields match everything.
type AuditOptions struct {
	SandboxID string
	// Types keeps events of these types (api.AuditExec, api.AuditEgress…).
	Types []string
	// Since (inclusive) and Until (exclusive) bound the events' time.
	Since, Until time.Time
	// Tenant, for an admin key, keeps one tenant's events.
	Tenant string
	// Limit is the page size (0: the server's default).
	Limit int
	// Cursor is a NextCursor of an earlier page.
	Cursor string
}

func (o AuditOptions) query() url.Values {
	q := url.Values{}
	if o.SandboxID != "" {
		q.Set("sandbox_id", o.SandboxID)
	}
	if len(o.Types) > 0 {
		q.Set("type", strings.Join(o.Types, ","))
	}
	if !o.Since.IsZero() {
		q.Set("since", o.Since.UTC().Format(time.RFC3339Nano))
	}
	if !o.Until.IsZero() {
		q.Set("until", o.Until.UTC().Format(time.RFC3339Nano))
	}
	if o.Tenant != "" {
		q.Set("tenant", o.Tenant)
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.Cursor != "" {
		q.Set("cursor", o.Cursor)
	}
	return q
}

// Audit returns one page of the audit trail, oldest first. Its NextCursor
// continues it; once HasMore is false, the same cursor later returns the
// events written since (Follow does that).
func (c *Client) Audit(ctx context.Context, opts AuditOptions) (*api.AuditList, error) {
	var out api.AuditList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/audit", opts.query(), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// AuditEvents iterates over every event matching opts, page by page, and
// stops at the end of the trail (or the first error, which it yields).
func (c *Client) AuditEvents(ctx context.Context, opts AuditOptions) iter.Seq2[api.AuditEvent, error] {
	return c.auditEvents(ctx, opts, 0)
}

// FollowAudit is AuditEvents that, at the end of the trail, polls every
// interval for new events until ctx is done (it then ends without an error).
func (c *Client) FollowAudit(ctx context.Context, opts AuditOptions, interval time.Duration) iter.Seq2[api.AuditEvent, error] {
	if interval <= 0 {
		interval = time.Second
	}
	return c.auditEvents(ctx, opts, interval)
}

func (c *Client) auditEvents(ctx context.Context, opts AuditOptions, poll time.Duration) iter.Seq2[api.AuditEvent, error] {
	return func(yield func(api.AuditEvent, error) bool) {
		for {
			page, err := c.Audit(ctx, opts)
			if err != nil {
				if poll > 0 && ctx.Err() != nil {
					return
				}
				yield(api.AuditEvent{}, err)
				return
			}
			for _, e := range page.Events {
				if !yield(e, nil) {
					return
				}
			}
			if page.HasMore && (page.NextCursor == "" || page.NextCursor == opts.Cursor) {
				// A server bug: the same page again would loop forever.
				yield(api.AuditEvent{}, errors.New("server returned no new audit cursor"))
				return
			}
			if page.NextCursor != "" {
				opts.Cursor = page.NextCursor
			}
			if page.HasMore {
				continue
			}
			if poll <= 0 {
				return
			}
			t := time.NewTimer(poll)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// ExportAudit streams every event matching opts (opts.Limit caps how many;
// the cursor is honoured) as JSON lines, one event per line, to w. It
// returns how many events it wrote.
func (c *Client) ExportAudit(ctx context.Context, opts AuditOptions, w io.Writer) (int, error) {
	req, err := c.newRequest(ctx, http.MethodGet, "/v1/audit", opts.query(), nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.send(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	// Each line is checked to be one event, so that a server error page
	// cannot pass for an export.
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxJSONBody)
	n := 0
	for sc.Scan() {
		line := sc.Bytes()
		var e api.AuditEvent
		if err := json.Unmarshal(line, &e); err != nil || e.ID == "" {
			return n, fmt.Errorf("audit export: line %d is not an event", n+1)
		}
		if _, err := w.Write(append(line, '\n')); err != nil {
			return n, err
		}
		n++
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return n, fmt.Errorf("audit export broke off after %d events: %w", n, err)
		}
		return n, fmt.Errorf("audit export after %d events: %w", n, err)
	}
	return n, nil
}
