package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/build"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/template"
)

// Timing of a template's start and ready commands.
const (
	// readyCheckTimeout bounds one run of a ready command: it is a probe
	// (curl a port, test a file), not work.
	readyCheckTimeout = 10 * time.Second
	// readyPollMax is the longest pause between two ready checks; they
	// start 50 ms apart and back off, so a fast server is seen at once.
	readyPollMax = time.Second
	// retryAfterBuild is the Retry-After of a create that started the
	// build of a shipped template: such builds take minutes.
	retryAfterBuild = 60 * time.Second
)

// builder returns the template builder or a not-implemented error.
func (m *Service) builder() (*build.Builder, error) {
	if m.cfg.Builder == nil {
		return nil, public(errdefs.ErrNotImplemented, "template builds are not available on this server")
	}
	return m.cfg.Builder, nil
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
		return &PublicError{Msg: se.Error(), Err: err}
	case errors.As(err, &be):
		if errors.Is(err, build.ErrTemplateNotFound) {
			return &PublicError{Msg: be.Msg, Err: fmt.Errorf("%w: %w", ErrTemplateNotFound, err)}
		}
		return &PublicError{Msg: be.Msg, Err: err}
	}
	return err
}

// TemplateUpload creates a temporary file for an upload of a build (the
// context or an image). Hand it to BuildTemplate, which takes it over, or
// remove it.
func (m *Service) TemplateUpload() (*os.File, error) {
	b, err := m.builder()
	if err != nil {
		return nil, err
	}
	return b.TempFile()
}

// BuildTemplate starts a template build for p's tenant. contextPath (a tar)
// and imagePath (an OCI image tarball) are uploads made with
// TemplateUpload, or ""; they are removed when the build ends.
func (m *Service) BuildTemplate(ctx context.Context, p auth.Principal, req api.TemplateBuildRequest, contextPath, imagePath string) (api.TemplateBuildStarted, error) {
	b, err := m.builder()
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
	m.log.Info("template build started", "tenant", p.Tenant, "template", st.Name, "version", st.Version, "build_id", st.BuildID)
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
func (m *Service) TemplateBuild(ctx context.Context, p auth.Principal, id string) (api.TemplateBuild, error) {
	b, err := m.builder()
	if err != nil {
		return api.TemplateBuild{}, err
	}
	v, err := b.Build(ctx, p.Tenant, p.Admin, id)
	return v, templateErr(err)
}

// LogFollower reads a template build's log as it is written.
type LogFollower = build.LogFollower

// FollowTemplateBuild returns a reader of build id's log from offset from.
func (m *Service) FollowTemplateBuild(ctx context.Context, p auth.Principal, id string, from int64) (*LogFollower, error) {
	b, err := m.builder()
	if err != nil {
		return nil, err
	}
	f, err := b.Follow(ctx, p.Tenant, p.Admin, id, from)
	return f, templateErr(err)
}

// ListTemplates lists the templates p can use.
func (m *Service) ListTemplates(ctx context.Context, p auth.Principal) (api.TemplateList, error) {
	b, err := m.builder()
	if err != nil {
		return api.TemplateList{}, err
	}
	l, err := b.List(ctx, p.Tenant, p.Admin)
	return l, templateErr(err)
}

// GetTemplate returns template ref ("name" or "name@N").
func (m *Service) GetTemplate(ctx context.Context, p auth.Principal, ref string) (api.Template, error) {
	b, err := m.builder()
	if err != nil {
		return api.Template{}, err
	}
	t, err := b.Template(ctx, p.Tenant, p.Admin, ref)
	return t, templateErr(err)
}

// DeleteTemplate deletes template ref ("name": all versions; "name@N": one).
// A version a live sandbox uses keeps its files until that sandbox is gone.
func (m *Service) DeleteTemplate(ctx context.Context, p auth.Principal, ref string) error {
	b, err := m.builder()
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

// resolveTemplate resolves the template of a create for tenant. The
// release function must be called once the sandbox record is stored (or
// the create failed before): until then the template's layers cannot be
// garbage collected. A template without a ready version whose build runs
// (a shipped template's first use starts it) is template_building; with
// wait the build is waited for, up to templateWaitMax, holding nothing.
func (m *Service) resolveTemplate(ctx context.Context, tenant, name string, version int, ref string, wait bool) (template.Resolved, func(), error) {
	deadline := time.Now().Add(templateWaitMax) // real waiting, not the injectable clock
	waited := map[string]bool{}
	for {
		r, release, err := m.resolveTemplateOnce(ctx, tenant, name, version, ref)
		var be *PublicError
		if !wait || !errors.Is(err, ErrTemplateBuilding) || !errors.As(err, &be) || be.BuildID == "" || waited[be.BuildID] {
			return r, release, err
		}
		waited[be.BuildID] = true
		m.log.Debug("create waits for its template's build", "tenant", tenant, "template", ref, "build_id", be.BuildID)
		// Bounded, and over when the daemon stops (the client asks again).
		wctx, cancel := context.WithDeadline(ctx, deadline)
		stop := context.AfterFunc(m.ctx, cancel)
		b, werr := m.cfg.Builder.Wait(wctx, be.BuildID)
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
			return template.Resolved{}, nil, &PublicError{Msg: msg, BuildID: be.BuildID,
				Err: fmt.Errorf("%w: template %s, build %s", ErrTemplateBuildFailed, ref, be.BuildID)}
		}
		// Ready: resolve again (a build that ended without making this
		// version, or another build since, is answered as it is now).
	}
}

// building is the template_building refusal for build id of ref.
func building(ref, id string) error {
	return &PublicError{
		Msg: fmt.Sprintf("template %s is being built (build %s, GET /v1/templates/builds/%s shows its progress); "+
			"retry when it is ready, or create with wait_for_template", ref, id, id),
		RetryAfter: retryAfterBuild,
		BuildID:    id,
		Err:        fmt.Errorf("%w: template %s, build %s", ErrTemplateBuilding, ref, id),
	}
}

func (m *Service) resolveTemplateOnce(ctx context.Context, tenant, name string, version int, ref string) (template.Resolved, func(), error) {
	notFound := func(err error) error {
		return &PublicError{Msg: fmt.Sprintf("template %q not found", ref), Err: fmt.Errorf("%w: %w", ErrTemplateNotFound, err)}
	}
	b := m.cfg.Builder
	if b == nil {
		t, err := m.tmpl.Get(name, version)
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
		m.log.Info("building shipped template on demand", "template", name, "build_id", st.BuildID)
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

// mergeEnv layers the request's env over the template's.
func mergeEnv(tmpl, req map[string]string) map[string]string {
	if len(tmpl) == 0 {
		return req
	}
	out := maps.Clone(tmpl)
	maps.Copy(out, req)
	return out
}

// startTemplate launches the template's start command as a tracked exec
// (its output can be followed like any exec's) and waits for its ready
// command to exit 0. It fails if the start command ends first or ctx ends.
func (m *Service) startTemplate(ctx context.Context, p auth.Principal, sb *Live, cfg template.Config) error {
	user := cfg.User
	if user == "" {
		user = agentproto.DefaultUser
	}
	startDone := make(chan api.ExecResult, 1)
	wctx, stopWait := context.WithCancel(ctx)
	defer stopWait()
	if cfg.StartCmd != "" {
		shell := cfg.StartCmd
		e, err := m.Exec(ctx, p, sb.id, api.ExecRequest{Shell: &shell, User: user, Cwd: cfg.Workdir}, ExecOptions{})
		if err != nil {
			var pe *PublicError
			if errors.As(err, &pe) {
				return &PublicError{Msg: "template start command: " + pe.Msg, Err: err}
			}
			return fmt.Errorf("template start command: %w", err)
		}
		sb.m.log.Debug("template start command running", "sandbox_id", sb.id, "exec_id", e.ID())
		m.goBackground(func() {
			if res, err := e.Wait(wctx); err == nil {
				startDone <- res
			}
		})
	}
	if cfg.ReadyCmd == "" {
		return nil
	}
	delay := 50 * time.Millisecond
	var last string
	for {
		ok, out, err := m.readyCheck(ctx, sb, cfg, user)
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("template ready check: %w", err)
		}
		if ok {
			return nil
		}
		last = out
		select {
		case res := <-startDone:
			how := res.Status
			if res.ExitCode != nil {
				how = fmt.Sprintf("%s (exit code %d)", res.Status, *res.ExitCode)
			}
			// The template's own defect: a retry starts the same command
			// and fails the same way, so it is no retryable 503.
			return &PublicError{
				Msg: fmt.Sprintf("template start command %s before the ready check passed", how),
				Err: errdefs.ErrTemplateUnsupported,
			}
		case <-ctx.Done():
			msg := "template ready check did not pass in time"
			if last != "" {
				msg += "; its last output: " + truncate(last, 512)
			}
			return &PublicError{Msg: msg, Err: fmt.Errorf("%w: %w", errdefs.ErrUnavailable, ctx.Err())}
		case <-time.After(delay):
		}
		delay = min(delay*2, readyPollMax)
	}
}

// readyCheck runs the ready command once and reports whether it exited 0,
// with its output (secrets masked).
func (m *Service) readyCheck(ctx context.Context, sb *Live, cfg template.Config, user string) (bool, string, error) {
	env := make(map[string]string, len(sb.env)+len(sb.secrets))
	maps.Copy(env, sb.env)
	maps.Copy(env, sb.secrets)
	var (
		res agentproto.ExecResult
		out []byte
	)
	c, err := sb.agent(ctx)
	if err != nil {
		return false, "", err
	}
	st, err := c.Exec(ctx, agentproto.ExecRequest{
		ID: auth.RandomID("ex_", 15), Shell: cfg.ReadyCmd, User: user, Cwd: cfg.Workdir, Env: env,
		TimeoutMS: readyCheckTimeout.Milliseconds(), MaxOutputBytes: 64 << 10,
	})
	if err != nil {
		return false, "", err
	}
	defer st.Close()
	for {
		ev, err := st.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return false, "", err
		}
		if ev.Type == agentproto.EventExit && ev.Result != nil {
			res = *ev.Result
			break
		}
		out = append(out, ev.Data...)
	}
	return res.Status == agentproto.StatusExited && res.ExitCode == 0, sb.red.Redact(string(out)), nil
}
