// Package templates is the template service: the template API (builds, their logs, the catalog of a
// tenant's templates) over the builder (internal/build), and the resolution of a create's template
// reference, which starts or waits for the build of a shipped template used the first time.
package templates

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/build"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/template"
)

const (
	// retryAfterBuild is the Retry-After of a create that started the
	// build of a shipped template: such builds take minutes.
	retryAfterBuild = 60 * time.Second
)

// Catalog resolves a template reference to the layers a driver stacks,
// without a builder (tests): name at version (0: the newest), or an error
// wrapping errdefs.ErrNotFound.
type Catalog interface {
	Get(name string, version int) (driver.Template, error)
}

// Config configures a Service.
type Config struct {
	// Builder builds and catalogs templates per tenant; nil serves the
	// catalog alone and answers the template API with not_implemented.
	Builder *build.Builder
	// Catalog resolves templates when there is no builder.
	Catalog Catalog
	// Logger receives the service's logs; default slog.Default().
	Logger *slog.Logger
}

// Service is the template service. Close ends the waits of creates for
// their templates' builds.
type Service struct {
	bld     *build.Builder
	catalog Catalog
	log     *slog.Logger
	ctx     context.Context
	cancel  context.CancelFunc
}

// New returns the template service of cfg.
func New(cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Service{bld: cfg.Builder, catalog: cfg.Catalog, log: cfg.Logger.With("component", "templates")}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// Close ends the waits for builds (the clients ask again).
func (s *Service) Close() { s.cancel() }

// LogFollower reads a template build's log as it is written.
type LogFollower = build.LogFollower

// builder returns the template builder or a not-implemented error.
func (s *Service) builder() (*build.Builder, error) {
	if s.bld == nil {
		return nil, errdefs.Publicf(errdefs.ErrNotImplemented, "template builds are not available on this server")
	}
	return s.bld, nil
}

// templateErr turns the builder's errors into client-facing ones.
func templateErr(err error) error {
	var (
		be *build.Error
		se *build.SpecError
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &se):
		return &errdefs.Public{Msg: se.Error(), Err: err}
	case errors.As(err, &be):
		if errors.Is(err, build.ErrTemplateNotFound) {
			return &errdefs.Public{Msg: be.Msg, Err: fmt.Errorf("%w: %w", errdefs.ErrTemplateNotFound, err)}
		}
		return &errdefs.Public{Msg: be.Msg, Err: err}
	}
	return err
}

// TemplateUpload creates a temporary file for an upload of a build (the
// context or an image). Hand it to BuildTemplate, which takes it over, or
// remove it.
func (s *Service) TemplateUpload() (*os.File, error) {
	b, err := s.builder()
	if err != nil {
		return nil, err
	}
	return b.TempFile()
}

// BuildTemplate starts a template build for p's tenant. contextPath (a tar)
// and imagePath (an OCI image tarball) are uploads made with
// TemplateUpload, or ""; they are removed when the build ends.
func (s *Service) BuildTemplate(ctx context.Context, p auth.Principal, req api.TemplateBuildRequest, contextPath, imagePath string) (api.TemplateBuildStarted, error) {
	b, err := s.builder()
	if err != nil {
		removeUploads(contextPath, imagePath)
		return api.TemplateBuildStarted{}, err
	}
	st, err := b.Submit(ctx, build.Request{
		Tenant: p.Tenant, Name: req.Name, Spec: req.Dockerfile, StartCmd: req.StartCmd, ReadyCmd: req.ReadyCmd,
		ContextPath: contextPath, ImagePath: imagePath,
	})
	if err != nil {
		return st, templateErr(err)
	}
	s.log.Info("template build started", "tenant", p.Tenant, "template", st.Name, "version", st.Version, "build_id", st.BuildID)
	return st, nil
}

func removeUploads(paths ...string) {
	for _, p := range paths {
		if p != "" {
			os.Remove(p)
		}
	}
}

// TemplateBuild returns build id.
func (s *Service) TemplateBuild(ctx context.Context, p auth.Principal, id string) (api.TemplateBuild, error) {
	b, err := s.builder()
	if err != nil {
		return api.TemplateBuild{}, err
	}
	v, err := b.Build(ctx, p.Tenant, p.Admin, id)
	return v, templateErr(err)
}

// FollowTemplateBuild returns a reader of build id's log from offset from.
func (s *Service) FollowTemplateBuild(ctx context.Context, p auth.Principal, id string, from int64) (*LogFollower, error) {
	b, err := s.builder()
	if err != nil {
		return nil, err
	}
	f, err := b.Follow(ctx, p.Tenant, p.Admin, id, from)
	return f, templateErr(err)
}

// ListTemplates lists the templates p can use.
func (s *Service) ListTemplates(ctx context.Context, p auth.Principal) (api.TemplateList, error) {
	b, err := s.builder()
	if err != nil {
		return api.TemplateList{}, err
	}
	l, err := b.List(ctx, p.Tenant, p.Admin)
	return l, templateErr(err)
}

// GetTemplate returns template ref ("name" or "name@N").
func (s *Service) GetTemplate(ctx context.Context, p auth.Principal, ref string) (api.Template, error) {
	b, err := s.builder()
	if err != nil {
		return api.Template{}, err
	}
	t, err := b.Template(ctx, p.Tenant, p.Admin, ref)
	return t, templateErr(err)
}

// DeleteTemplate deletes template ref ("name": all versions; "name@N": one).
// A version a live sandbox uses keeps its files until that sandbox is gone.
func (s *Service) DeleteTemplate(ctx context.Context, p auth.Principal, ref string) error {
	b, err := s.builder()
	if err != nil {
		return err
	}
	return templateErr(b.Delete(ctx, p.Tenant, p.Admin, ref))
}

// templateWaitMax bounds how long a create with wait_for_template waits for
// a build: the shipped templates take a few minutes the first time; after
// this the create answers template_building and the client asks again, so
// that no request hangs silently for longer than a proxy would keep it.
const templateWaitMax = 10 * time.Minute

// Resolve resolves the template of a create for tenant. The
// release function must be called once the sandbox record is stored (or
// the create failed before): until then the template's layers cannot be
// garbage collected. A template without a ready version whose build runs
// (a shipped template's first use starts it) is template_building; with
// wait the build is waited for, up to templateWaitMax, holding nothing.
func (s *Service) Resolve(ctx context.Context, tenant, name string, version int, ref string, wait bool) (template.Resolved, func(), error) {
	deadline := time.Now().Add(templateWaitMax) // real waiting, not the injectable clock
	waited := map[string]bool{}
	for {
		r, release, err := s.resolveOnce(ctx, tenant, name, version, ref)
		var be *errdefs.Public
		if !wait || !errors.Is(err, errdefs.ErrTemplateBuilding) || !errors.As(err, &be) || be.BuildID == "" || waited[be.BuildID] {
			return r, release, err
		}
		waited[be.BuildID] = true
		s.log.Debug("create waits for its template's build", "tenant", tenant, "template", ref, "build_id", be.BuildID)
		// Bounded, and over when the daemon stops (the client asks again).
		wctx, cancel := context.WithDeadline(ctx, deadline)
		stop := context.AfterFunc(s.ctx, cancel)
		b, werr := s.bld.Wait(wctx, be.BuildID)
		stop()
		cancel()
		switch {
		case ctx.Err() != nil:
			return template.Resolved{}, nil, ctx.Err()
		case werr != nil:
			// Still building at the bound (or the daemon stops): the
			// client asks again.
			return template.Resolved{}, nil, err
		case b.Status == api.BuildFailed:
			msg := fmt.Sprintf("template %s could not be built (build %s): %s; GET /v1/templates/builds/%s has its log",
				ref, be.BuildID, truncate(b.Error, 512), be.BuildID)
			return template.Resolved{}, nil, &errdefs.Public{Msg: msg, BuildID: be.BuildID,
				Err: fmt.Errorf("%w: template %s, build %s", errdefs.ErrTemplateBuildFailed, ref, be.BuildID)}
		}
		// Ready: resolve again (a build that ended without making this
		// version, or another build since, is answered as it is now).
	}
}

// building is the template_building refusal for build id of ref.
func building(ref, id string) error {
	return &errdefs.Public{
		Msg: fmt.Sprintf("template %s is being built (build %s, GET /v1/templates/builds/%s shows its progress); "+
			"retry when it is ready, or create with wait_for_template", ref, id, id),
		RetryAfter: retryAfterBuild,
		BuildID:    id,
		Err:        fmt.Errorf("%w: template %s, build %s", errdefs.ErrTemplateBuilding, ref, id),
	}
}

func (s *Service) resolveOnce(ctx context.Context, tenant, name string, version int, ref string) (template.Resolved, func(), error) {
	notFound := func(err error) error {
		return &errdefs.Public{Msg: fmt.Sprintf("template %q not found", ref), Err: fmt.Errorf("%w: %w", errdefs.ErrTemplateNotFound, err)}
	}
	b := s.bld
	if b == nil {
		t, err := s.catalog.Get(name, version)
		if err != nil {
			if errdefs.IsNotFound(err) {
				return template.Resolved{}, nil, notFound(err)
			}
			return template.Resolved{}, nil, fmt.Errorf("resolving template %q: %w", ref, err)
		}
		return template.Resolved{Template: t}, func() {}, nil
	}
	release := b.Hold()
	r, err := b.Resolve(ctx, tenant, name, version)
	if err == nil {
		return r, release, nil
	}
	release()
	switch {
	case errors.Is(err, build.ErrNotBuilt):
		// Shipped templates are built on demand: this request starts it
		// (or joins the build that runs).
		st, berr := b.BuildShipped(ctx, name)
		if berr != nil {
			return template.Resolved{}, nil, templateErr(berr)
		}
		s.log.Info("building shipped template on demand", "template", name, "build_id", st.BuildID)
		return template.Resolved{}, nil, building(ref, st.BuildID)
	case errdefs.IsNotFound(err):
		// The first version of a tenant's template (or the version asked
		// for) may be on its way.
		if id, ok := b.Building(tenant, name, version); ok {
			return template.Resolved{}, nil, building(ref, id)
		}
		return template.Resolved{}, nil, notFound(err)
	}
	return template.Resolved{}, nil, fmt.Errorf("resolving template %q: %w", ref, err)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// LayerStore returns the layer store that snapshots capture into: the
// builder's. Without a builder snapshots are not available
// (errdefs.ErrCapabilityUnsupported).
func (s *Service) LayerStore() (*template.Store, error) {
	if s.bld == nil {
		return nil, errdefs.Publicf(errdefs.ErrCapabilityUnsupported, "snapshots are not available on this server (it has no template store)")
	}
	return s.bld.Layers(), nil
}

// HoldLayers blocks layer collection until release is called: a snapshot
// is recorded, and a create or reset from one resolves its layers, under
// it (see build.Builder.Hold).
func (s *Service) HoldLayers() (release func()) {
	if s.bld == nil {
		return func() {}
	}
	return s.bld.Hold()
}

// CollectLayers asks the layer collector to run now (a snapshot's record
// was purged: its layer may go).
func (s *Service) CollectLayers() {
	if s.bld != nil {
		s.bld.Kick()
	}
}

// IsShipped reports whether name is one of the templates airlock ships
// (base, python, …): no tenant builds a template of its own under it.
func IsShipped(name string) bool { return template.IsShipped(name) }
