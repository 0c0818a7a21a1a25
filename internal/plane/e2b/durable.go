package e2b

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/sandbox"
)

// E2B's snapshots, fork and lifecycle over airlock's (docs/lifecycle.md):
// a snapshot's E2B id is airlock's snap_… id (a create names it as its
// templateID, DELETE /templates/{id} removes it), a fork answers one
// result per copy, and the create's autoPause/autoResume are airlock's
// lifecycle rules.

// snapshotPrefix starts every airlock snapshot id.
const snapshotPrefix = "snap_"

// isSnapshotID reports whether an E2B templateID names a snapshot.
func isSnapshotID(id string) bool { return strings.HasPrefix(id, snapshotPrefix) }

// snapshotInfo is E2B's SnapshotInfo.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func snapshotInfoOf(sn api.Snapshot) snapshotInfo {
	names := []string{sn.ID}
	if sn.Name != "" {
		names = []string{sn.Name, sn.ID}
	}
	return snapshotInfo{SnapshotID: sn.ID, Names: names}
}

func (h *Handler) registerDurable(mux *http.ServeMux, a func(controlFunc) http.Handler) {
	mux.Handle("POST /sandboxes/{id}/snapshots", a(h.createSnapshot))
	mux.Handle("GET /snapshots", a(h.listSnapshots))
	mux.Handle("POST /sandboxes/{id}/fork", a(h.fork))
}

func (h *Handler) createSnapshot(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var body struct {
		Name string `json:"name,omitempty"`
	}
	if err := decodeJSON(r, &body); err != nil {
		return err
	}
	if _, err := h.visible(r, p, r.PathValue("id")); err != nil {
		return err
	}
	sn, err := h.sandboxes.CreateSnapshot(r.Context(), p, r.PathValue("id"), api.CreateSnapshotRequest{Name: body.Name})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, snapshotInfoOf(sn))
	return nil
}

func (h *Handler) listSnapshots(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	q := r.URL.Query()
	f := sandbox.SnapshotFilter{SandboxID: q.Get("sandboxID"), Name: q.Get("name"), Cursor: q.Get("nextToken")}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return errf(errdefs.ErrInvalidArgument, "limit must be a positive integer")
		}
		f.Limit = n
	}
	list, err := h.sandboxes.ListSnapshots(r.Context(), p, f)
	if err != nil {
		return err
	}
	out := make([]snapshotInfo, 0, len(list.Snapshots))
	for _, sn := range list.Snapshots {
		out = append(out, snapshotInfoOf(sn))
	}
	if list.NextCursor != "" {
		w.Header().Set("X-Next-Token", list.NextCursor)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// deleteSnapshot serves DELETE /templates/{id} for a snapshot id (the
// templates API hands those here).
func (h *Handler) deleteSnapshot(w http.ResponseWriter, r *http.Request, p auth.Principal, id string) error {
	// E2B answers a second delete 404 (the SDK's deleteSnapshot false);
	// airlock's own delete is idempotent.
	if _, err := h.sandboxes.GetSnapshot(r.Context(), p, id); err != nil {
		return err
	}
	if err := h.sandboxes.DeleteSnapshot(r.Context(), p, id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// forkResult is E2B's SandboxForkResult.
type forkResult struct {
	Sandbox *sandboxResponse `json:"sandbox,omitempty"`
	Error   *errorBody       `json:"error,omitempty"`
}

func (h *Handler) fork(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var body struct {
		Count   int    `json:"count"`
		Timeout *int64 `json:"timeout,omitempty"`
	}
	if err := decodeJSON(r, &body); err != nil {
		return err
	}
	if body.Count == 0 {
		body.Count = 1
	}
	if _, err := h.visible(r, p, r.PathValue("id")); err != nil {
		return err
	}
	res, err := h.sandboxes.Fork(r.Context(), p, r.PathValue("id"), api.ForkRequest{Count: body.Count})
	if err != nil {
		return err
	}
	out := make([]forkResult, 0, len(res.Sandboxes))
	for _, sb := range res.Sandboxes {
		if body.Timeout != nil {
			if s, err := h.sandboxes.SetTimeout(r.Context(), p, sb.ID, *body.Timeout); err == nil {
				sb = s
			}
		}
		resp := h.sandboxOf(sb)
		out = append(out, forkResult{Sandbox: &resp})
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// lifecycleOf maps a create's autoPause, autoPauseMemory and autoResume
// onto airlock's lifecycle rules. A pause at the timeout goes to disk
// where the runtime can checkpoint memory, else keeps memory; E2B's
// filesystem-only auto-pause (autoPauseMemory false) is kept as that too
// (nothing is lost, more is kept). autoResume without autoPause is 400,
// as the SDK says.
func lifecycleOf(autoPause bool, autoResume *autoResumeConfig) (*api.Lifecycle, error) {
	if autoResume == nil {
		return nil, nil
	}
	if autoResume.Enabled && !autoPause {
		return nil, errf(errdefs.ErrInvalidArgument, "autoResume needs autoPause")
	}
	on := autoResume.Enabled
	return &api.Lifecycle{AutoResume: &on}, nil
}

// autoResumeConfig is E2B's autoResume of a create.
type autoResumeConfig struct {
	Enabled bool `json:"enabled"`
}

// lifecycleView is E2B's SandboxLifecycle of sb.
type lifecycleView struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

func lifecycleViewOf(sb api.Sandbox) *lifecycleView {
	if sb.Lifecycle == nil {
		return nil
	}
	v := &lifecycleView{OnTimeout: sb.Lifecycle.OnTimeout}
	if v.OnTimeout == "" {
		v.OnTimeout = api.OnTimeoutKill
	}
	if sb.Lifecycle.AutoResume != nil {
		v.AutoResume = *sb.Lifecycle.AutoResume
	}
	return v
}
