package sandbox

// Snapshots (docs/snapshots.md, docs/lifecycle.md): a sandbox's writable
// layer captured as one content layer over its layer set (the template
// version's layers, shared, and the layers of the snapshots it descends
// from), and with memory its processes' image; recorded in the store,
// per tenant. Create from a snapshot is in create.go, fork in fork.go,
// reset in reset.go.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
)

// layerStore is what snapshots need of the template service besides
// Resolve (service/templates.Service has it): the layer store, a hold on
// layer collection, and a nudge to the collector.
type layerStore interface {
	LayerStore() (*template.Store, error)
	HoldLayers() (release func())
	CollectLayers()
}

var snapshotNameRE = lazyregexp.New(`^[A-Za-z0-9._-]{1,64}$`)

const (
	// snapshotCollectEvery is how often deleted and failed snapshots that
	// no live sandbox uses are purged.
	snapshotCollectEvery = time.Minute
	// syncTimeout bounds the agent's sync before a capture.
	syncTimeout = 30 * time.Second
)

// snapshotSpec is what a snapshot keeps of its sandbox's spec (store
// Snapshot.Spec): never secrets, env or network.
type snapshotSpec struct {
	Resources api.Resources `json:"resources"`
	Workdir   string        `json:"workdir,omitempty"`
	User      string        `json:"user,omitempty"`
}

// layers returns the template service's layer store, or the error that
// says snapshots are not available.
func (m *Service) layers() (layerStore, *template.Store, error) {
	ls, ok := m.tmpl.(layerStore)
	if !ok {
		return nil, nil, public(errdefs.ErrCapabilityUnsupported, "snapshots are not available on this server")
	}
	st, err := ls.LayerStore()
	if err != nil {
		return nil, nil, err
	}
	return ls, st, nil
}

// snapshotNotFound is the one answer for a snapshot that does not exist,
// was deleted, or is another tenant's.
func snapshotNotFound() error {
	return &PublicError{Msg: "snapshot not found", Err: errdefs.ErrNotFound}
}

// startSnapshots fails the snapshots a dead daemon left being created,
// removes unfinished memory images, and starts the collector. Called once
// by Start, before anything is served.
func (m *Service) startSnapshots(ctx context.Context) {
	_, st, err := m.layers()
	if err != nil {
		return
	}
	if n, err := m.store.FailUnfinishedSnapshots(ctx, "the daemon stopped during the capture"); err != nil {
		m.log.Warn("failing unfinished snapshots", "err", err)
	} else if n > 0 {
		m.log.Info("failed snapshots left unfinished by the last daemon", "count", n)
	}
	if err := st.RemoveStaleCheckpointWrites(); err != nil {
		m.log.Warn("removing unfinished memory images", "err", err)
	}
	m.goBackground(func() {
		t := time.NewTicker(snapshotCollectEvery)
		defer t.Stop()
		for {
			m.collectSnapshots(m.ctx)
			select {
			case <-m.ctx.Done():
				return
			case <-t.C:
			}
		}
	})
}

// collectSnapshots purges the deleted and failed snapshots no live
// sandbox uses: memory image first, then the record (which releases its
// layers to the layer collector, nudged after).
func (m *Service) collectSnapshots(ctx context.Context) {
	ls, st, err := m.layers()
	if err != nil || ctx.Err() != nil {
		return
	}
	dead, err := m.store.CollectableSnapshots(ctx)
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("listing collectable snapshots", "err", err)
		}
		return
	}
	purged := 0
	for _, sn := range dead {
		if sn.Checkpoint != "" {
			if err := st.RemoveCheckpoint(ctx, sn.Checkpoint); err != nil {
				m.log.Warn("removing a snapshot's memory image", "snapshot_id", sn.ID, "err", err)
				continue
			}
		}
		if err := m.store.PurgeSnapshot(ctx, sn.ID); err != nil {
			m.log.Warn("purging snapshot", "snapshot_id", sn.ID, "err", err)
			continue
		}
		purged++
		if err := m.removeSnapshotLayer(ctx, ls, st, sn.ID); err != nil {
			m.log.Warn("removing a purged snapshot's layer", "snapshot_id", sn.ID, "err", err)
		}
	}
	if purged > 0 {
		m.log.Debug("snapshots purged", "count", purged)
		ls.CollectLayers()
	}
}

// removeSnapshotLayer removes the own layer of purged snapshot sid at once
// (the layer collector would keep a fresh layer for its grace period)
// unless another snapshot stacks it. A record that would name it later
// descends from one that names it now, so the check is enough.
func (m *Service) removeSnapshotLayer(ctx context.Context, ls layerStore, st *template.Store, sid string) error {
	release := ls.HoldLayers()
	defer release()
	refs, err := m.store.ReferencedTemplateLayers(ctx)
	if err != nil {
		return err
	}
	if refs[template.SnapshotLayerRef(sid)] {
		return nil
	}
	return st.RemoveSnapshotLayer(ctx, sid)
}

// sourceLayers is the layer set a live sandbox runs on, and the template
// config it started with.
type sourceLayers struct {
	set    template.LayerSet
	config json.RawMessage
	parent string // the snapshot it started from or was reset to
}

// sourceOf returns the layer set of sandbox record rec: its snapshot's
// (which its record keeps from collection, even deleted), else its
// template version's.
func (m *Service) sourceOf(ctx context.Context, rec store.Sandbox) (sourceLayers, error) {
	if rec.SnapshotID != "" {
		sn, err := m.store.LoadSnapshot(ctx, rec.SnapshotID)
		if err != nil {
			return sourceLayers{}, fmt.Errorf("loading the sandbox's snapshot: %w", err)
		}
		return sourceLayers{set: template.LayerSet{Base: sn.BaseLayers, Captured: sn.CapturedLayers}, config: sn.Config, parent: sn.ID}, nil
	}
	tv, err := m.templateVersion(ctx, rec)
	if err != nil {
		return sourceLayers{}, err
	}
	return sourceLayers{set: template.LayerSet{Base: tv.Layers}, config: tv.Config}, nil
}

// templateVersion returns the template version sandbox rec was created
// from, while it is ready.
func (m *Service) templateVersion(ctx context.Context, rec store.Sandbox) (store.TemplateVersion, error) {
	tv, err := m.store.GetTemplateVersion(ctx, []string{rec.Tenant, ""}, rec.Template, rec.TemplateVersion)
	if errdefs.IsNotFound(err) {
		return store.TemplateVersion{}, public(errdefs.ErrInvalidState, "the sandbox's template version %s@%d was deleted", rec.Template, rec.TemplateVersion)
	}
	return tv, err
}

// snapshotView turns a record into the API's snapshot.
func snapshotView(sn store.Snapshot) api.Snapshot {
	var sp snapshotSpec
	_ = json.Unmarshal(sn.Spec, &sp)
	return api.Snapshot{
		ID: sn.ID, Tenant: sn.Tenant, Name: sn.Name, SandboxID: sn.SandboxID, ParentID: sn.ParentID,
		Template: sn.Template, TemplateVersion: sn.TemplateVersion, Runtime: sn.Runtime, Resources: sp.Resources,
		Memory: sn.Memory, State: sn.State, SizeBytes: sn.SizeBytes, MemoryBytes: sn.MemoryBytes,
		Layers: len(sn.BaseLayers) + len(sn.CapturedLayers), CreatedAt: sn.CreatedAt,
	}
}

func newSnapshotID() string { return auth.RandomID("snap_", 15) }

// CreateSnapshot captures sandbox id (running or paused) as a snapshot of
// its tenant: POST /v1/sandboxes/{id}/snapshots. A running sandbox is
// synced, paused while its layer is read, and resumed; it runs on after,
// whatever happened. Memory is refused (capability_unsupported) where the
// runtime cannot checkpoint.
func (m *Service) CreateSnapshot(ctx context.Context, p auth.Principal, id string, req api.CreateSnapshotRequest) (api.Snapshot, error) {
	if req.Name != "" && !snapshotNameRE.MatchString(req.Name) {
		return api.Snapshot{}, public(errInvalid, "snapshot name must be 1 to 64 of A-Z a-z 0-9 . _ -")
	}
	sb, err := m.LiveSandbox(ctx, p, id)
	if err != nil {
		return api.Snapshot{}, err
	}
	sn, err := m.snapshot(ctx, sb, req.Name, req.Memory)
	if err != nil {
		return api.Snapshot{}, err
	}
	m.recordEvent(ctx, sb, audit.TypeSnapshot, map[string]any{
		"snapshot_id": sn.ID, "name": sn.Name, "memory": sn.Memory, "size_bytes": sn.SizeBytes,
	})
	return snapshotView(sn), nil
}

// snapshotCaps checks that sb's runtime can take the snapshot asked for.
func snapshotCaps(drv driver.Driver, memory bool) (driver.LayerCapturer, driver.Pauser, driver.Checkpointer, error) {
	caps := drv.Capabilities()
	lc, lok := drv.(driver.LayerCapturer)
	pz, pok := drv.(driver.Pauser)
	if !lok || !pok || !caps.LayerCapture || !caps.Pause {
		return nil, nil, nil, public(errdefs.ErrCapabilityUnsupported, "runtime %s cannot snapshot a sandbox", drv.Name())
	}
	if !memory {
		return lc, pz, nil, nil
	}
	ck, ok := drv.(driver.Checkpointer)
	if !ok || !caps.MemorySnapshot {
		return nil, nil, nil, public(errdefs.ErrCapabilityUnsupported,
			"runtime %s cannot snapshot memory (GET /v1/info durability.snapshot_memory); take a filesystem snapshot (memory false)", drv.Name())
	}
	return lc, pz, ck, nil
}

// snapshot takes a snapshot of sb and returns its ready record. It holds
// sb's operation lock for the capture.
func (m *Service) snapshot(ctx context.Context, sb *Live, name string, memory bool) (store.Snapshot, error) {
	ls, st, err := m.layers()
	if err != nil {
		return store.Snapshot{}, err
	}
	lc, pz, ck, err := snapshotCaps(sb.drv, memory)
	if err != nil {
		return store.Snapshot{}, err
	}
	sb.opMu.Lock()
	defer sb.opMu.Unlock()
	running := false
	switch s := sb.state(); s {
	case api.StateRunning:
		running = true
	case api.StatePaused:
		if memory {
			return store.Snapshot{}, public(errdefs.ErrInvalidState, "a memory snapshot needs a running sandbox: resume it first")
		}
	default:
		return store.Snapshot{}, public(errdefs.ErrInvalidState, "sandbox is %s", s)
	}
	rec := sb.snapshot()
	src, err := m.sourceOf(ctx, rec)
	if err != nil {
		return store.Snapshot{}, err
	}
	sid := newSnapshotID()
	own := template.SnapshotLayerRef(sid)
	set := src.set.Over(own)
	if err := set.Validate(); err != nil {
		return store.Snapshot{}, public(errInvalid, "%s", publicText(err))
	}
	var sp Spec
	_ = json.Unmarshal(rec.Spec, &sp)
	now := m.now().UTC()
	sn := store.Snapshot{
		ID: sid, Tenant: sb.tenant, Name: name, SandboxID: sb.id, ParentID: src.parent,
		Template: rec.Template, TemplateVersion: rec.TemplateVersion, Runtime: sb.drv.Name(), State: store.SnapshotCreating,
		Memory: memory, BaseLayers: set.Base, CapturedLayers: set.Captured, Config: src.config,
		Spec: mustJSON(snapshotSpec{Resources: sp.Resources, Workdir: sp.Workdir, User: sp.User}), CreatedAt: now,
	}
	// Recorded (holding its layers, its own included) before anything is
	// written, with collection held off: a collection meanwhile keeps them.
	release := ls.HoldLayers()
	err = m.store.CreateSnapshot(ctx, sn)
	release()
	if err != nil {
		if errors.Is(err, errdefs.ErrAlreadyExists) && name != "" {
			return store.Snapshot{}, public(errdefs.ErrConflict, "a snapshot named %q exists", name)
		}
		return store.Snapshot{}, err
	}
	// The capture runs to its end whatever the client does: a sandbox
	// left paused, or a record left creating, is worse than a late answer.
	cctx, cancel := cleanupCtx(ctx)
	defer cancel()
	res, err := m.capture(cctx, sb, st, lc, pz, ck, sid, src.set, running)
	if err != nil {
		m.log.Warn("snapshot failed", "sandbox_id", sb.id, "snapshot_id", sid, "err", err)
		if ferr := m.store.FinishSnapshot(cctx, sid, store.SnapshotResult{Error: truncate(err.Error(), 512)}); ferr != nil {
			m.log.Error("recording failed snapshot", "snapshot_id", sid, "err", ferr)
		}
		m.goBackground(func() { m.collectSnapshots(m.ctx) })
		var pe *PublicError
		if errors.As(err, &pe) {
			return store.Snapshot{}, err
		}
		return store.Snapshot{}, &PublicError{Msg: "snapshot failed", Err: fmt.Errorf("%w: %w", errdefs.ErrInternal, err)}
	}
	res.OK, res.At = true, m.now().UTC()
	if err := m.store.FinishSnapshot(cctx, sid, res); err != nil {
		return store.Snapshot{}, err
	}
	sn.State, sn.Checkpoint, sn.SizeBytes, sn.MemoryBytes, sn.ReadyAt = store.SnapshotReady, res.Checkpoint, res.SizeBytes, res.MemoryBytes, &res.At
	m.log.Info("snapshot taken", "sandbox_id", sb.id, "tenant", sb.tenant, "snapshot_id", sid, "memory", memory,
		"size_bytes", res.SizeBytes, "ms", m.now().Sub(now).Milliseconds())
	return sn, nil
}

// capture writes snapshot sid of sb: the memory image (ck set), then the
// writable layer, read while the sandbox is paused (running: paused here
// and resumed before it returns).
func (m *Service) capture(ctx context.Context, sb *Live, st *template.Store, lc driver.LayerCapturer, pz driver.Pauser,
	ck driver.Checkpointer, sid string, set template.LayerSet, running bool) (store.SnapshotResult, error) {
	var res store.SnapshotResult
	if running {
		// What the processes wrote reaches the file system first (gVisor's
		// own caches included); a sync that fails is not fatal (runc's
		// layer is the host's page cache already).
		if err := m.syncSandbox(ctx, sb); err != nil {
			m.log.Debug("sync before snapshot", "sandbox_id", sb.id, "err", err)
		}
	}
	if ck != nil {
		w, err := st.NewCheckpoint(sid)
		if err != nil {
			return res, err
		}
		// The checkpoint stops the runtime and restores it (LeaveRunning):
		// the agent's connection ends and its init is replaced. Meanwhile
		// the sandbox is halted, as in a pause to disk, so that the
		// liveness checks do not take the gap for a crash; the next
		// request dials the restored agent.
		sb.halted.Store(true)
		sb.closeClient()
		err = ck.Checkpoint(ctx, sb.id, w.Dir(), driver.CheckpointOptions{LeaveRunning: true})
		sb.halted.Store(false)
		if err != nil {
			w.Discard()
			return res, fmt.Errorf("checkpoint: %w", err)
		}
		ref, size, err := w.Commit()
		if err != nil {
			return res, err
		}
		res.Checkpoint, res.MemoryBytes = ref, size
	}
	if running {
		if err := pz.Pause(ctx, sb.id); err != nil {
			return res, fmt.Errorf("pausing for the capture: %w", err)
		}
	}
	wl, err := lc.WritableLayer(ctx, sb.id)
	var ref string
	if err == nil {
		ref, _, err = st.CaptureSnapshotLayer(ctx, sid, wl, topRef(set))
	}
	if running {
		if rerr := pz.Resume(ctx, sb.id); rerr != nil {
			// It cannot run on: the sandbox is lost, as a crash.
			m.log.Error("resuming after snapshot", "sandbox_id", sb.id, "err", rerr)
			m.goBackground(func() { m.crashed(m.ctx, sb, "sandbox could not be resumed after a snapshot") })
			err = errors.Join(err, rerr)
		}
	}
	if err != nil {
		if res.Checkpoint != "" {
			_ = st.RemoveCheckpoint(ctx, res.Checkpoint)
		}
		return res, err
	}
	res.SizeBytes = st.LayerSize(ref) + res.MemoryBytes
	return res, nil
}

// topRef is the ref a layer captured over set lies on.
func topRef(set template.LayerSet) string {
	refs := set.Refs()
	if len(refs) == 0 {
		return ""
	}
	return refs[len(refs)-1]
}

// syncSandbox runs sync(1) in sb as root and waits for it to end.
func (m *Service) syncSandbox(ctx context.Context, sb *Live) error {
	ctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	eid := auth.RandomID("ex_sync", 10)
	var res agentproto.ExecResult
	err := sb.withAgent(ctx, func(c *agentclient.Client) error {
		st, err := c.Exec(ctx, agentproto.ExecRequest{ID: eid, Argv: []string{"sync"}, User: "root", TimeoutMS: syncTimeout.Milliseconds()})
		if err != nil {
			return err
		}
		st.Close()
		res, err = c.Wait(ctx, eid)
		return err
	})
	if err == nil && (res.Status != "exited" || res.ExitCode != 0) {
		err = fmt.Errorf("sync ended %s (code %d)", res.Status, res.ExitCode)
	}
	return err
}

// GetSnapshot returns snapshot sid of p's tenant.
func (m *Service) GetSnapshot(ctx context.Context, p auth.Principal, sid string) (api.Snapshot, error) {
	sn, err := m.store.GetSnapshot(ctx, sid, p.TenantFilter())
	if errdefs.IsNotFound(err) {
		return api.Snapshot{}, snapshotNotFound()
	}
	if err != nil {
		return api.Snapshot{}, err
	}
	return snapshotView(sn), nil
}

// SnapshotFilter selects snapshots for ListSnapshots.
type SnapshotFilter struct {
	SandboxID, Name string
	Limit           int
	Cursor          string
}

// ListSnapshots returns one page of p's tenant's snapshots (every
// tenant's for an admin), newest first.
func (m *Service) ListSnapshots(ctx context.Context, p auth.Principal, f SnapshotFilter) (api.SnapshotList, error) {
	sns, next, err := m.store.ListSnapshots(ctx, store.SnapshotFilter{
		Tenant: p.TenantFilter(), SandboxID: f.SandboxID, Name: f.Name, Limit: f.Limit, Cursor: f.Cursor,
	})
	if err != nil {
		if errdefs.IsInvalidArgument(err) {
			return api.SnapshotList{}, public(errInvalid, "%s", publicText(err))
		}
		return api.SnapshotList{}, err
	}
	out := api.SnapshotList{Snapshots: make([]api.Snapshot, 0, len(sns)), NextCursor: next}
	for _, sn := range sns {
		out.Snapshots = append(out.Snapshots, snapshotView(sn))
	}
	return out, nil
}

// DeleteSnapshot deletes snapshot sid of p's tenant: unusable at once,
// its files collected once no live sandbox started from it.
func (m *Service) DeleteSnapshot(ctx context.Context, p auth.Principal, sid string) error {
	err := m.store.DeleteSnapshot(ctx, sid, p.TenantFilter(), m.now().UTC())
	switch {
	case errdefs.IsNotFound(err):
		return snapshotNotFound()
	case errors.Is(err, errdefs.ErrInvalidState):
		return public(errdefs.ErrInvalidState, "snapshot is still being created")
	case err != nil:
		return err
	}
	m.goBackground(func() { m.collectSnapshots(m.ctx) })
	return nil
}

// usableSnapshot returns snapshot sid of tenant if it is ready (creates
// and resets start from it); anything else is not found.
func (m *Service) usableSnapshot(ctx context.Context, tenant, sid string) (store.Snapshot, error) {
	sn, err := m.store.GetSnapshot(ctx, sid, tenant)
	if errdefs.IsNotFound(err) {
		return store.Snapshot{}, snapshotNotFound()
	}
	if err != nil {
		return store.Snapshot{}, err
	}
	if sn.State != store.SnapshotReady {
		return store.Snapshot{}, public(errdefs.ErrInvalidState, "snapshot %s is still being created", sid)
	}
	return sn, nil
}
