package build

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
)

// ErrNotBuilt marks a shipped template that was never built: BuildShipped
// builds it.
var ErrNotBuilt = fmt.Errorf("%w: shipped template not built yet", errdefs.ErrNotFound)

// submitShipped starts the build of shipped template name from its recipe,
// or returns the build already running.
func (b *Builder) submitShipped(ctx context.Context, name string) (api.TemplateBuildStarted, error) {
	b.mu.Lock()
	if id, ok := b.shipping[name]; ok {
		if bs := b.builds[id]; bs != nil {
			b.mu.Unlock()
			return api.TemplateBuildStarted{BuildID: id, Name: name, Version: bs.version}, nil
		}
	}
	b.mu.Unlock()
	started, err := b.start(ctx, "", name, "shipped", func(ctx context.Context, bs *buildState) (result, error) {
		bs.log.logf("building shipped template %s from Debian's packages: %v", name, b.tmpl.ShippedPackages(name))
		t, info, err := b.tmpl.EnsureShipped(ctx, name, bs.log)
		if err != nil {
			return result{}, asUserErr(fmt.Errorf("building %s: %w", name, err))
		}
		ref := template.RecipeRef(t.Name, t.Version)
		b.hold(bs.id, ref)
		return result{layers: []string{ref}, specHash: info.RecipeHash}, nil
	})
	if err != nil {
		return started, err
	}
	b.mu.Lock()
	if _, running := b.builds[started.BuildID]; running {
		b.shipping[name] = started.BuildID
	}
	b.mu.Unlock()
	return started, nil
}

// BuildShipped starts (or joins) the build of shipped template name: what a
// sandbox asking for a shipped template that was never built triggers.
func (b *Builder) BuildShipped(ctx context.Context, name string) (api.TemplateBuildStarted, error) {
	if !template.IsShipped(name) {
		return api.TemplateBuildStarted{}, userErr(errdefs.ErrNotFound, "no shipped template %q", name)
	}
	return b.submitShipped(ctx, name)
}

// shippedVersion returns the newest ready version of shipped template name,
// building and registering it first if there is none, and holds its layers
// for build bs.
func (b *Builder) shippedVersion(ctx context.Context, bs *buildState, name string) (store.TemplateVersion, error) {
	tv, err := b.lookupHeld(ctx, bs.id, []string{""}, name, 0)
	if err == nil || !errdefs.IsNotFound(err) {
		return tv, err
	}
	bs.log.logf("shipped template %s is not built yet: building it from Debian's packages (this takes minutes)", name)
	t, info, err := b.tmpl.EnsureShipped(ctx, name, bs.log)
	if err != nil {
		return tv, asUserErr(fmt.Errorf("building %s: %w", name, err))
	}
	if _, err := b.registerRecipe(ctx, name, t, info); err != nil {
		return tv, err
	}
	return b.lookupHeld(ctx, bs.id, []string{""}, name, 0)
}

// registerRecipe makes a recipe-built rootfs a catalog version of shipped
// template name, unless the newest version is that rootfs already.
func (b *Builder) registerRecipe(ctx context.Context, name string, t driver.Template, info template.Info) (store.TemplateVersion, error) {
	b.shippedMu.Lock()
	defer b.shippedMu.Unlock()
	ref := template.RecipeRef(t.Name, t.Version)
	if tv, err := b.st.GetTemplateVersion(ctx, []string{""}, name, 0); err == nil && slices.Equal(tv.Layers, []string{ref}) {
		return tv, nil
	}
	now := time.Now().UTC()
	id, tid := auth.RandomID("bld_", 15), auth.RandomID("tpl_", 15)
	version, err := b.st.StartTemplateBuild(ctx, store.TemplateVersion{ID: tid, Name: name, Source: "shipped", CreatedAt: now},
		store.TemplateBuild{ID: id, CreatedAt: now})
	if err != nil {
		return store.TemplateVersion{}, err
	}
	msg := fmt.Sprintf("registered %s, built by its recipe (%s) on %s\n", name, info.RecipeHash, info.CreatedAt.Format(time.RFC3339))
	if err := b.st.FinishTemplateBuild(ctx, id, store.BuildResult{
		OK: true, Layers: []string{ref}, Config: []byte("{}"), SpecHash: info.RecipeHash, SizeBytes: info.SizeBytes,
		Log: []byte(msg), EndedAt: now,
	}); err != nil {
		return store.TemplateVersion{}, err
	}
	b.log.Info("shipped template registered", "template", name, "version", version)
	return b.st.GetTemplateVersion(ctx, []string{""}, name, version)
}

// syncShipped registers the shipped templates built on disk (by EnsureBase
// at start, or by an earlier daemon) that the catalog does not have.
func (b *Builder) syncShipped(ctx context.Context) error {
	for _, name := range template.ShippedNames() {
		t, info, ok := b.tmpl.Current(name)
		if !ok {
			continue
		}
		if _, err := b.registerRecipe(ctx, name, t, info); err != nil {
			return fmt.Errorf("registering %s: %w", name, err)
		}
	}
	return nil
}

// Hold blocks garbage collection until release is called: a sandbox create
// holds it from resolving its template until its record is stored, so
// that the layers it resolved cannot be collected in between.
func (b *Builder) Hold() (release func()) {
	b.gcMu.RLock()
	return b.gcMu.RUnlock
}

// Layers is the layer store the builder catalogs (snapshots capture
// their layers into it).
func (b *Builder) Layers() *template.Store { return b.tmpl }

// Resolve returns the ready version of template name (0: the newest) that
// tenant may use: its own, or a shipped one. A shipped template never built
// is ErrNotBuilt; anything else missing ErrTemplateNotFound.
func (b *Builder) Resolve(ctx context.Context, tenant, name string, version int) (template.Resolved, error) {
	tv, err := b.st.GetTemplateVersion(ctx, []string{tenant, ""}, name, version)
	if err != nil {
		if errdefs.IsNotFound(err) {
			if template.IsShipped(name) && version == 0 {
				return template.Resolved{}, fmt.Errorf("%w: %s", ErrNotBuilt, name)
			}
			return template.Resolved{}, fmt.Errorf("%w: %s@%d", ErrTemplateNotFound, name, version)
		}
		return template.Resolved{}, err
	}
	return b.resolved(tv)
}

func (b *Builder) resolved(tv store.TemplateVersion) (template.Resolved, error) {
	paths, err := b.tmpl.LayerPaths(tv.Layers)
	if err != nil {
		return template.Resolved{}, fmt.Errorf("template %s@%d: %w", tv.Name, tv.Version, err)
	}
	cfg, err := unmarshalConfig(tv.Config)
	if err != nil {
		return template.Resolved{}, err
	}
	return template.Resolved{
		Template: driver.Template{Name: tv.Name, Version: tv.Version, Layers: paths},
		ID:       tv.ID, Tenant: tv.Tenant, Config: cfg,
	}, nil
}

// Get resolves a shipped template (manager.Templates): what a caller that
// knows no tenant may use.
func (b *Builder) Get(name string, version int) (driver.Template, error) {
	r, err := b.Resolve(context.Background(), "", name, version)
	if err != nil {
		return driver.Template{}, err
	}
	return r.Template, nil
}

// tenantsOf lists the template owners principal tenant sees: its own and
// the shipped ones; nil (all) for an admin listing.
func tenantsOf(tenant string, admin bool) []string {
	if admin {
		return nil
	}
	return []string{tenant, ""}
}

// List returns the newest version of every template tenant can use (with
// admin, every tenant's), by name, and the shipped templates never built.
func (b *Builder) List(ctx context.Context, tenant string, admin bool) (api.TemplateList, error) {
	tvs, err := b.st.ListTemplateVersions(ctx, tenantsOf(tenant, admin))
	if err != nil {
		return api.TemplateList{}, err
	}
	out := api.TemplateList{Templates: []api.Template{}}
	seen := map[string]bool{}
	for i := 0; i < len(tvs); {
		j := i
		var versions []int
		for ; j < len(tvs) && tvs[j].Name == tvs[i].Name && tvs[j].Tenant == tvs[i].Tenant; j++ {
			versions = append(versions, tvs[j].Version)
		}
		v := b.view(tvs[i])
		v.Versions = versions
		out.Templates = append(out.Templates, v)
		if tvs[i].Tenant == "" {
			seen[tvs[i].Name] = true
		}
		i = j
	}
	for _, name := range template.ShippedNames() {
		if !seen[name] {
			out.Templates = append(out.Templates, api.Template{
				Name: name, Status: api.TemplateNotBuilt, Source: "shipped", Shipped: true,
			})
		}
	}
	sort.SliceStable(out.Templates, func(i, j int) bool { return out.Templates[i].Name < out.Templates[j].Name })
	return out, nil
}

// Template returns version ref ("name" or "name@N") with the list of its
// usable versions.
func (b *Builder) Template(ctx context.Context, tenant string, admin bool, ref string) (api.Template, error) {
	name, version, err := ParseRef(ref)
	if err != nil {
		return api.Template{}, err
	}
	tenants := []string{tenant, ""}
	tv, err := b.st.GetTemplateVersion(ctx, tenants, name, version)
	if err != nil && admin && errdefs.IsNotFound(err) {
		tv, err = b.st.GetTemplateVersion(ctx, nil, name, version)
	}
	if err != nil {
		if errdefs.IsNotFound(err) {
			if template.IsShipped(name) && version == 0 {
				return api.Template{Name: name, Status: api.TemplateNotBuilt, Source: "shipped", Shipped: true}, nil
			}
			return api.Template{}, &Error{Msg: fmt.Sprintf("template %s not found", ref), Err: ErrTemplateNotFound}
		}
		return api.Template{}, err
	}
	v := b.view(tv)
	all, err := b.st.ListTemplateVersions(ctx, []string{tv.Tenant})
	if err != nil {
		return api.Template{}, err
	}
	for _, o := range all {
		if o.Name == tv.Name {
			v.Versions = append(v.Versions, o.Version)
		}
	}
	return v, nil
}

// view is the API form of a version.
func (b *Builder) view(tv store.TemplateVersion) api.Template {
	cfg, _ := unmarshalConfig(tv.Config)
	return api.Template{
		ID: tv.ID, Name: tv.Name, Version: tv.Version, Tenant: tv.Tenant, Status: api.TemplateReady, Source: tv.Source,
		Shipped: tv.Tenant == "" && template.IsShipped(tv.Name), CreatedAt: tv.CreatedAt, From: cfg.From,
		Layers: len(tv.Layers), SizeBytes: tv.SizeBytes, Env: cfg.Env, Workdir: cfg.Workdir, User: cfg.User,
		StartCmd: cfg.StartCmd, ReadyCmd: cfg.ReadyCmd, BuildID: tv.BuildID,
	}
}

// Delete deletes template ref ("name": every version, "name@N": one) of
// tenant; shipped templates only with admin. Versions that live sandboxes
// use keep their files until those sandboxes are gone; the collector
// removes them after.
func (b *Builder) Delete(ctx context.Context, tenant string, admin bool, ref string) error {
	name, version, err := ParseRef(ref)
	if err != nil {
		return err
	}
	owner := tenant
	if template.IsShipped(name) {
		if !admin {
			return userErr(errdefs.ErrPermissionDenied, "shipped templates can only be deleted with an admin key")
		}
		owner = ""
	}
	n, err := b.st.DeleteTemplateVersions(ctx, owner, name, version, time.Now())
	if err != nil {
		return err
	}
	if n == 0 {
		return &Error{Msg: fmt.Sprintf("template %s not found", ref), Err: ErrTemplateNotFound}
	}
	b.log.Info("template deleted", "template", name, "version", version, "tenant", owner, "versions", n)
	b.Kick()
	return nil
}

// Kick asks the collector to run now.
func (b *Builder) Kick() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// gcLoop collects every GCInterval and when kicked.
func (b *Builder) gcLoop() {
	defer b.wg.Done()
	t := time.NewTicker(b.cfg.GCInterval)
	defer t.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
		case <-b.kick:
		}
		if _, err := b.GC(b.ctx); err != nil && b.ctx.Err() == nil {
			b.log.Warn("template garbage collection", "err", err)
		}
	}
}

// GCStats says what a collection removed.
type GCStats struct {
	// Versions are the deleted versions whose files went (name@N).
	Versions []string
	// Layers are the layer refs removed.
	Layers []string
}

// GC removes the files of deleted versions that no live sandbox uses and
// the layers that no version, running build or grace period keeps.
func (b *Builder) GC(ctx context.Context) (GCStats, error) {
	var stats GCStats
	b.gcMu.Lock()
	locked := true
	unlock := func() {
		if locked {
			b.gcMu.Unlock()
			locked = false
		}
	}
	defer unlock()
	dead, err := b.st.CollectableTemplateVersions(ctx)
	if err != nil {
		return stats, err
	}
	var recipeRefs []string
	for _, tv := range dead {
		if err := b.st.MarkTemplateVersionPurged(ctx, tv.ID); err != nil {
			return stats, err
		}
		stats.Versions = append(stats.Versions, fmt.Sprintf("%s@%d", tv.Name, tv.Version))
		for _, ref := range tv.Layers {
			if template.ValidLayerRef(ref) && !isContentRef(ref) {
				recipeRefs = append(recipeRefs, ref)
			}
		}
	}
	keep, err := b.st.ReferencedTemplateLayers(ctx)
	if err != nil {
		return stats, err
	}
	for ref := range b.heldRefs() {
		keep[ref] = true
	}
	var (
		since  time.Time
		purged map[string]bool
	)
	if b.cfg.LayerGrace > 0 {
		// Fresh layers no template ever had are a failed build's finished
		// steps: kept a while for its retry. A deleted template's go now.
		purged, err = b.st.PurgedTemplateLayers(ctx)
		if err != nil {
			return stats, err
		}
		since = time.Now().Add(-b.cfg.LayerGrace)
		b.tmpl.KeepRecentLayers(keep, purged, since)
	}
	// The grace is checked again at each layer moved: another daemon
	// sharing the store may publish one meanwhile.
	removed, finish, err := b.tmpl.TrashLayersGrace(keep, purged, since)
	stats.Layers = removed
	var recipes []string
	for _, ref := range recipeRefs {
		if !keep[ref] {
			recipes = append(recipes, ref)
		}
	}
	unlock()
	// The slow part, deleting files, runs without the lock: nothing can
	// reach the trashed layers any more.
	errs := []error{err, finish(ctx)}
	for _, ref := range recipes {
		errs = append(errs, b.tmpl.RemoveRecipeVersion(ctx, ref))
	}
	if len(stats.Versions)+len(stats.Layers) > 0 {
		b.log.Info("template garbage collected", "versions", stats.Versions, "layers", len(stats.Layers))
	}
	return stats, errors.Join(errs...)
}

func isContentRef(ref string) bool { return len(ref) > 7 && ref[:7] == "layers/" }
