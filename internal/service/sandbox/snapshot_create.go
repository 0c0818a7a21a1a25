package sandbox

// A create from a snapshot (POST /v1/sandboxes {"snapshot": "snap_…"}):
// the snapshot's layer set read-only under a new writable layer, the
// template config it was taken with, and with memory its processes
// restored instead of started. Everything else (id, tokens, env, secrets,
// network, metadata) is the request's, as at any create.

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
)

// snapshotDefaults loads req's snapshot (p's tenant's, ready) and fills
// in what req leaves out: template, runtime and resources are the
// snapshot's. A memory snapshot starts only on its runtime with its
// resources: a request naming others is invalid.
func (m *Service) snapshotDefaults(ctx context.Context, p auth.Principal, req *api.CreateSandboxRequest) (store.Snapshot, error) {
	if _, _, err := m.layers(); err != nil {
		return store.Snapshot{}, err
	}
	sn, err := m.usableSnapshot(ctx, p.Tenant, req.Snapshot)
	if err != nil {
		return store.Snapshot{}, err
	}
	ref := sn.Template + "@" + strconv.Itoa(sn.TemplateVersion)
	switch req.Template {
	case "":
		req.Template = ref
	case sn.Template, ref:
		req.Template = ref
	default:
		return store.Snapshot{}, public(errInvalid, "template %q is not the snapshot's (%s): leave it out", truncate(req.Template, 64), ref)
	}
	var ss snapshotSpec
	_ = json.Unmarshal(sn.Spec, &ss)
	if sn.Memory {
		if req.Runtime != "" && req.Runtime != sn.Runtime {
			return store.Snapshot{}, public(errInvalid, "a memory snapshot starts on its own runtime (%s)", sn.Runtime)
		}
		if r := req.Resources; r != nil && (r.CPU != 0 && r.CPU != ss.Resources.CPU || r.MemoryMB != 0 && r.MemoryMB != ss.Resources.MemoryMB ||
			r.DiskMB != 0 && r.DiskMB != ss.Resources.DiskMB || r.PIDs != 0 && r.PIDs != ss.Resources.PIDs || r.DiskTmpfs != ss.Resources.DiskTmpfs) {
			return store.Snapshot{}, public(errInvalid, "a memory snapshot starts with its own resources: leave resources out")
		}
	}
	if req.Runtime == "" {
		req.Runtime = sn.Runtime
	}
	if req.Resources == nil {
		r := ss.Resources
		req.Resources = &r
	}
	return sn, nil
}

// resolveSnapshot resolves sn's layers for a driver, holding layer
// collection off until release (called once the sandbox's record names
// the snapshot), and returns the memory image's directory ("" for a
// filesystem snapshot).
func (m *Service) resolveSnapshot(ctx context.Context, sn store.Snapshot) (template.Resolved, string, func(), error) {
	ls, st, err := m.layers()
	if err != nil {
		return template.Resolved{}, "", nil, err
	}
	release := ls.HoldLayers()
	r, dir, err := resolveLayers(st, sn)
	if err != nil {
		release()
		return template.Resolved{}, "", nil, err
	}
	return r, dir, release, nil
}

// resolveLayers maps sn's layer set (and memory image) to host paths.
func resolveLayers(st *template.Store, sn store.Snapshot) (template.Resolved, string, error) {
	paths, err := st.LayerPaths(sn.Layers())
	if err != nil {
		return template.Resolved{}, "", fmt.Errorf("snapshot %s: %w", sn.ID, err)
	}
	var cfg template.Config
	if len(sn.Config) > 0 {
		if err := json.Unmarshal(sn.Config, &cfg); err != nil {
			return template.Resolved{}, "", fmt.Errorf("snapshot %s config: %w", sn.ID, err)
		}
	}
	dir := ""
	if sn.Memory {
		if dir, err = st.CheckpointPath(sn.Checkpoint); err != nil {
			return template.Resolved{}, "", fmt.Errorf("snapshot %s: %w", sn.ID, err)
		}
	}
	return template.Resolved{
		Template: driver.Template{Name: sn.Template, Version: sn.TemplateVersion, Layers: paths},
		Config:   cfg,
	}, dir, nil
}

// snapshotStillThere checks that snapshot sid has a record (in any state)
// once a sandbox's record names it: from then on neither the record nor
// its layers are collected. One deleted and purged just before is gone.
func (m *Service) snapshotStillThere(ctx context.Context, sid string) error {
	if _, err := m.store.LoadSnapshot(ctx, sid); err != nil {
		if errdefs.IsNotFound(err) {
			return snapshotNotFound()
		}
		return err
	}
	return nil
}
