package httpapi

import (
	"context"
	"net/http"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/sandbox"
)

// Snapshotter is what the snapshot, fork and reset routes need of the
// sandbox service (sandbox.Service has it).
type Snapshotter interface {
	CreateSnapshot(ctx context.Context, p auth.Principal, id string, req api.CreateSnapshotRequest) (api.Snapshot, error)
	GetSnapshot(ctx context.Context, p auth.Principal, sid string) (api.Snapshot, error)
	ListSnapshots(ctx context.Context, p auth.Principal, f sandbox.SnapshotFilter) (api.SnapshotList, error)
	DeleteSnapshot(ctx context.Context, p auth.Principal, sid string) error
	Fork(ctx context.Context, p auth.Principal, id string, req api.ForkRequest) (api.ForkResponse, error)
	Reset(ctx context.Context, p auth.Principal, id string, req api.ResetRequest) (api.Sandbox, error)
}

// registerSnapshots serves snapshots, fork and reset (docs/snapshots.md)
// when the sandbox service has them.
func (s *Server) registerSnapshots(a func(handlerFunc) http.Handler) {
	sn, ok := s.sandboxes.(Snapshotter)
	if !ok {
		return
	}
	s.handle("POST /v1/sandboxes/{id}/snapshots", a(func(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
		var req api.CreateSnapshotRequest
		if err := decodeJSON(w, r, &req, true); err != nil {
			return err
		}
		out, err := sn.CreateSnapshot(r.Context(), p, r.PathValue("id"), req)
		if err != nil {
			return err
		}
		w.Header().Set("Location", "/v1/snapshots/"+out.ID)
		writeJSON(w, http.StatusCreated, out)
		return nil
	}))
	s.handle("GET /v1/snapshots", a(func(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
		q := r.URL.Query()
		f := sandbox.SnapshotFilter{SandboxID: q.Get("sandbox_id"), Name: q.Get("name"), Cursor: q.Get("cursor")}
		var err error
		if f.Limit, err = queryInt(r, "limit", 0); err != nil {
			return err
		}
		out, err := sn.ListSnapshots(r.Context(), p, f)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	}))
	s.handle("GET /v1/snapshots/{sid}", a(func(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
		out, err := sn.GetSnapshot(r.Context(), p, r.PathValue("sid"))
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	}))
	s.handle("DELETE /v1/snapshots/{sid}", a(func(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
		if err := sn.DeleteSnapshot(r.Context(), p, r.PathValue("sid")); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}))
	s.handle("POST /v1/sandboxes/{id}/fork", a(func(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
		var req api.ForkRequest
		if err := decodeJSON(w, r, &req, false); err != nil {
			return err
		}
		if req.Count < 1 {
			return errf(errdefs.ErrInvalidArgument, "count must be at least 1")
		}
		out, err := sn.Fork(r.Context(), p, r.PathValue("id"), req)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusCreated, out)
		return nil
	}))
	s.handle("POST /v1/sandboxes/{id}/reset", a(func(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
		var req api.ResetRequest
		if err := decodeJSON(w, r, &req, true); err != nil {
			return err
		}
		out, err := sn.Reset(r.Context(), p, r.PathValue("id"), req)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	}))
}
