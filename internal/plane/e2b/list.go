package e2b

import (
	"cmp"
	"context"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/sandbox"
)

// listFilters are GET /v2/sandboxes' filters beyond state and metadata:
// order by start time, startedAfter (inclusive), template (an id or an
// alias, as created).
type listFilters struct {
	asc          bool
	order        bool
	startedAfter time.Time
	template     string
}

func (f listFilters) active() bool { return f.order || !f.startedAfter.IsZero() || f.template != "" }

func parseListFilters(q url.Values) (listFilters, error) {
	var f listFilters
	switch q.Get("order") {
	case "":
	case "asc":
		f.order, f.asc = true, true
	case "desc":
		f.order = true
	default:
		return f, errf(errdefs.ErrInvalidArgument, "order must be asc or desc")
	}
	if v := q.Get("startedAfter"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return f, errf(errdefs.ErrInvalidArgument, "startedAfter must be an RFC 3339 time")
		}
		f.startedAfter = t
	}
	f.template = q.Get("template")
	if t, ok := templateAliases[f.template]; ok {
		f.template = t
	}
	return f, nil
}

// maxFilteredList bounds the sandboxes a filtered list reads: a tenant
// holds far fewer (its quota), and a list past it is refused rather than
// cut short.
const maxFilteredList = 10000

// filteredCursor marks a filtered list's page token: an offset into the
// filtered, ordered sandboxes.
const filteredCursor = "e2b-offset-"

// listFiltered lists with lf: every sandbox of the state and metadata
// filter f is read (page by page), filtered, ordered by start time (E2B's
// default newest first) and paged by offset.
func (h *Handler) listFiltered(ctx context.Context, p auth.Principal, f sandbox.ListFilter, lf listFilters) (api.SandboxList, error) {
	offset := 0
	if f.Cursor != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(f.Cursor, filteredCursor))
		if err != nil || !strings.HasPrefix(f.Cursor, filteredCursor) || n < 0 {
			return api.SandboxList{}, errf(errdefs.ErrInvalidArgument, "invalid nextToken")
		}
		offset = n
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	all := f
	all.Cursor, all.Limit = "", 0
	var kept []api.Sandbox
	for seen := 0; ; {
		page, err := h.sandboxes.List(ctx, p, all)
		if err != nil {
			return api.SandboxList{}, err
		}
		for _, sb := range page.Sandboxes {
			if !sb.CreatedAt.Before(lf.startedAfter) && (lf.template == "" || sb.Template == lf.template || sb.ID == lf.template) {
				kept = append(kept, sb)
			}
		}
		if seen += len(page.Sandboxes); seen > maxFilteredList {
			return api.SandboxList{}, errf(errdefs.ErrTooLarge, "more than %d sandboxes to filter: filter by metadata or state", maxFilteredList)
		}
		if page.NextCursor == "" {
			break
		}
		all.Cursor = page.NextCursor
	}
	slices.SortStableFunc(kept, func(a, b api.Sandbox) int {
		c := a.CreatedAt.Compare(b.CreatedAt)
		if c == 0 {
			c = cmp.Compare(a.ID, b.ID)
		}
		if !lf.asc {
			c = -c
		}
		return c
	})
	out := api.SandboxList{}
	if offset < len(kept) {
		end := min(offset+limit, len(kept))
		out.Sandboxes = kept[offset:end]
		if end < len(kept) {
			out.NextCursor = filteredCursor + strconv.Itoa(end)
		}
	}
	return out, nil
}
