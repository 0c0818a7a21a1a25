package build

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
)

// Network is a build sandbox's network: a namespace the sandbox joins and
// the resolv.conf naming its resolver (driver.Spec.NetNSPath and
// ResolvConfPath).
type Network struct {
	NetNSPath      string
	ResolvConfPath string
}

// NetworkFunc gives a build sandbox its network and a cleanup that removes
// it after the sandbox is destroyed. RegistryNetwork makes one that reaches
// the package registries only; without one, build sandboxes have loopback
// only.
type NetworkFunc func(ctx context.Context, sandboxID string) (Network, func(), error)

// Driver is what builds need of a driver: the lifecycle the manager uses
// (build sandboxes are created, started, stopped and destroyed through it),
// the writable layer of a stopped sandbox, which a step's capture turns into
// a template layer, and the list of its sandboxes, to destroy what the
// builds of a dead daemon left. Any driver whose Capabilities declare
// LayerCapture can be one (runc, gvisor); nothing here knows its disk
// layout.
type Driver interface {
	driver.Driver
	driver.LayerCapturer
	driver.Lister
}

// Config configures a Builder. Zero fields take the documented defaults.
type Config struct {
	// Store keeps the catalog of template versions and builds. Required.
	Store *store.Store
	// Templates is the layer store and the shipped recipes. Required.
	Templates *template.Store
	// UploadDir holds uploaded build contexts and images until their
	// build ends (TempFile); the builder owns it and empties it at
	// Recover. Default: a directory inside Templates. It must not be
	// shared with another daemon, while Templates may be.
	UploadDir string
	// Driver runs build sandboxes; nil makes every RUN and COPY step fail
	// with a clear message (cached steps, imports and shipped templates
	// still work).
	Driver Driver
	// Network, when set, gives RUN sandboxes a network (see NetworkFunc).
	Network NetworkFunc
	// Resources of a build sandbox; default 1 CPU, 2 GiB memory, 8 GiB
	// disk (sparse), 1024 tasks.
	Resources driver.Resources
	// StepTimeout bounds one RUN; default 30 minutes.
	StepTimeout time.Duration
	// MaxConcurrent builds run at once; more wait; default 2.
	MaxConcurrent int
	// MaxLayers bounds a template's layers; default 40 (overlayfs takes the
	// lower directories in one mount option string of one page).
	MaxLayers int
	// MaxImageBytes bounds an imported image unpacked; default 32 GiB.
	MaxImageBytes int64
	// GCInterval is how often deleted versions no sandbox uses and
	// unreferenced layers are removed (and a deletion triggers a run);
	// default 1 minute. Negative: never in the background, only GC calls.
	GCInterval time.Duration
	// LayerGrace keeps an unreferenced layer this long after it was made,
	// so that a failed build's finished steps are reused by its retry;
	// default 1 hour. Negative means no grace.
	LayerGrace time.Duration
	// Logger receives the builder's logs (never build output).
	Logger *slog.Logger
}

// BuildSandboxPrefix starts the ids of build sandboxes.
const BuildSandboxPrefix = "bsx_"

// Defaults.
const (
	defaultStepTimeout = 30 * time.Minute
	defaultMaxLayers   = 40
	defaultGCInterval  = time.Minute
	defaultLayerGrace  = time.Hour
	// agentDialTimeout bounds connecting to a build sandbox's agent, which
	// listens within milliseconds of its start.
	agentDialTimeout = 30 * time.Second
	// cleanupTimeout bounds the teardown of a build sandbox.
	cleanupTimeout = 2 * time.Minute
)

// Builder builds, imports, catalogs and collects templates.
type Builder struct {
	cfg  Config
	st   *store.Store
	tmpl *template.Store
	log  *slog.Logger
	sem  chan struct{}

	// gcMu orders garbage collection against everything that starts using
	// layers: builds taking a layer (hold), sandbox creates resolving a
	// template (Hold). Collection takes it exclusively.
	gcMu     sync.RWMutex
	inflight map[string]int // layer refs in use by running builds
	inflMu   sync.Mutex

	// shippedMu serialises registering recipe builds in the catalog.
	shippedMu sync.Mutex

	mu       sync.Mutex
	builds   map[string]*buildState // running builds
	shipping map[string]string      // shipped name → id of its running build

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	kick   chan struct{}
}

// buildState is a running build.
type buildState struct {
	id, tenant, name string
	version          int
	templateID       string
	log              *buildLog
	created          time.Time
	done             chan struct{}
	// status and errMsg are set when done closes.
	status, errMsg string
	ended          time.Time
}

// New returns a Builder. Call Recover once before the first build, and
// Close at the end.
func New(cfg Config) (*Builder, error) {
	if cfg.Store == nil || cfg.Templates == nil {
		return nil, errors.New("build: store and templates are required")
	}
	if cfg.Driver != nil && !cfg.Driver.Capabilities().LayerCapture {
		return nil, fmt.Errorf("build: the %s driver does not capture layers", cfg.Driver.Name())
	}
	r := &cfg.Resources
	if r.CPU <= 0 {
		r.CPU = 1
	}
	if r.MemoryMB <= 0 {
		r.MemoryMB = 2048
	}
	if r.DiskMB <= 0 {
		r.DiskMB = 8192
	}
	if r.PIDs <= 0 {
		r.PIDs = 1024
	}
	if cfg.StepTimeout <= 0 {
		cfg.StepTimeout = defaultStepTimeout
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = 2
	}
	if cfg.MaxLayers <= 0 {
		cfg.MaxLayers = defaultMaxLayers
	}
	if cfg.GCInterval == 0 {
		cfg.GCInterval = defaultGCInterval
	}
	if cfg.LayerGrace == 0 {
		cfg.LayerGrace = defaultLayerGrace
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	b := &Builder{
		cfg: cfg, st: cfg.Store, tmpl: cfg.Templates, log: cfg.Logger.With("component", "builder"),
		sem: make(chan struct{}, cfg.MaxConcurrent), inflight: map[string]int{},
		builds: map[string]*buildState{}, shipping: map[string]string{}, kick: make(chan struct{}, 1),
	}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	return b, nil
}

// Recover cleans up after a daemon that died: builds it left running are
// failed, half-written layers and leftover build sandboxes removed, and
// shipped templates found on disk registered. Then it starts the garbage
// collector.
func (b *Builder) Recover(ctx context.Context) error {
	n, err := b.st.FailUnfinishedTemplateBuilds(ctx, "the daemon stopped during the build", time.Now())
	if err != nil {
		return err
	}
	if n > 0 {
		b.log.Warn("failed builds the last daemon left unfinished", "count", n)
	}
	if err := b.tmpl.RemoveStaleLayerWrites(); err != nil {
		b.log.Warn("removing unfinished layers", "err", err)
	}
	if err := os.RemoveAll(b.uploadDir()); err != nil {
		b.log.Warn("removing stale uploads", "err", err)
	}
	if b.cfg.Driver != nil {
		ids, err := b.cfg.Driver.List(ctx)
		if err != nil {
			b.log.Warn("listing leftover build sandboxes", "err", err)
		}
		for _, id := range ids {
			if !strings.HasPrefix(id, BuildSandboxPrefix) {
				continue // the manager's
			}
			if err := b.cfg.Driver.Destroy(ctx, id); err != nil {
				b.log.Warn("destroying leftover build sandbox", "sandbox_id", id, "err", err)
			}
		}
	}
	if err := b.syncShipped(ctx); err != nil {
		return err
	}
	if b.cfg.GCInterval > 0 {
		b.wg.Add(1)
		go b.gcLoop()
	}
	return nil
}

// uploadsDir is the default Config.UploadDir, inside the template store:
// nothing of it is on a world-readable path.
const uploadsDir = ".uploads"

func (b *Builder) uploadDir() string {
	if b.cfg.UploadDir != "" {
		return b.cfg.UploadDir
	}
	return filepath.Join(b.tmpl.Dir(), uploadsDir)
}

// TempFile creates a file for an upload of a build (Request.ContextPath,
// ImagePath).
func (b *Builder) TempFile() (*os.File, error) {
	dir := b.uploadDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating upload dir: %w", err)
	}
	f, err := os.CreateTemp(dir, "upload-")
	if err != nil {
		return nil, fmt.Errorf("creating upload file: %w", err)
	}
	return f, nil
}

// Close cancels running builds (each fails and registers nothing) and waits
// for them.
func (b *Builder) Close() error {
	b.cancel()
	b.wg.Wait()
	return nil
}

// Request is a build to start.
type Request struct {
	// Tenant builds the template and owns it.
	Tenant string
	// Name is the template's name.
	Name string
	// Spec is the Dockerfile subset; empty to build a shipped template by
	// name or to import Image as it is.
	Spec string
	// StartCmd and ReadyCmd override the parent template's.
	StartCmd, ReadyCmd *string
	// ContextPath is the build context (a tar), ImagePath an OCI image
	// tarball; either may be empty. Submit takes both files over: they
	// are removed when the build ends.
	ContextPath, ImagePath string
}

// Error is a build error whose message is safe to show to the API client.
type Error struct {
	Msg string
	// Err is the class (errdefs) and cause.
	Err error
}

func (e *Error) Error() string { return e.Msg }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

func userErr(cls error, format string, args ...any) error {
	return &Error{Msg: fmt.Sprintf(format, args...), Err: cls}
}

// ErrTemplateNotFound marks a template reference that names nothing the
// tenant can use.
var ErrTemplateNotFound = fmt.Errorf("%w: template", errdefs.ErrNotFound)

// nameRE is a template name: what the manager and the template store accept.
var nameRE = lazyregexp.New(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// maxCmdLen bounds start_cmd and ready_cmd.
const maxCmdLen = 16 << 10

// Submit validates req and starts its build. It returns once the version
// number is taken; the build goes on in the background (Wait, Follow).
// Errors in the spec itself (syntax, FROM) are returned here, before any
// version is taken.
func (b *Builder) Submit(ctx context.Context, req Request) (started api.TemplateBuildStarted, err error) {
	owned := []string{req.ContextPath, req.ImagePath}
	defer func() {
		if err != nil {
			removeFiles(owned)
		}
	}()
	if !nameRE.MatchString(req.Name) {
		return started, userErr(errdefs.ErrInvalidArgument, "template name must match %s", nameRE)
	}
	for _, c := range []*string{req.StartCmd, req.ReadyCmd} {
		if c != nil && (len(*c) > maxCmdLen || containsNUL(*c)) {
			return started, userErr(errdefs.ErrInvalidArgument, "start_cmd and ready_cmd must be under %d bytes, without NUL", maxCmdLen)
		}
	}
	p := &plan{req: req}
	switch {
	case req.Spec == "" && req.ImagePath == "":
		if !template.IsShipped(req.Name) {
			return started, userErr(errdefs.ErrInvalidArgument, "dockerfile is empty (only a shipped template, %v, builds without one)", template.ShippedNames())
		}
		if req.ContextPath != "" || req.StartCmd != nil || req.ReadyCmd != nil {
			return started, userErr(errdefs.ErrInvalidArgument, "a shipped template is built from its recipe: give no context, start_cmd or ready_cmd")
		}
		return b.submitShipped(ctx, req.Name)
	case template.IsShipped(req.Name):
		return started, userErr(errdefs.ErrInvalidArgument, "template name %q is taken by a shipped template; choose another", req.Name)
	}
	spec := req.Spec
	if spec == "" {
		spec = "FROM image"
	}
	sp, err := Parse(spec)
	if err != nil {
		return started, err
	}
	p.spec = sp
	if err := b.checkFrom(ctx, p); err != nil {
		return started, err
	}
	if req.ContextPath != "" {
		if p.context, err = openContext(req.ContextPath); err != nil {
			return started, asUserErr(err)
		}
	} else {
		p.context = emptyContext()
	}
	return b.start(ctx, req.Tenant, req.Name, sourceOf(p), func(ctx context.Context, bs *buildState) (result, error) {
		defer removeFiles(owned)
		return b.runSpec(ctx, bs, p)
	})
}

func sourceOf(p *plan) string {
	if p.fromKind == fromImage {
		return "image"
	}
	return "spec"
}

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}

func removeFiles(paths []string) {
	for _, p := range paths {
		if p != "" {
			os.Remove(p)
		}
	}
}

// asUserErr keeps a classified error's text for the client: the errors of
// the context and image readers name archive entries, never host paths.
func asUserErr(err error) error {
	var ue *Error
	if errors.As(err, &ue) {
		return err
	}
	for _, cls := range []error{errdefs.ErrInvalidArgument, errdefs.ErrTooLarge} {
		if errors.Is(err, cls) {
			return &Error{Msg: publicText(err, cls), Err: err}
		}
	}
	return err
}

// publicText is err's message without its class prefix ("invalid
// argument: ").
func publicText(err, cls error) string {
	return strings.ReplaceAll(err.Error(), cls.Error()+": ", "")
}

// result is what a successful build registers.
type result struct {
	layers   []string
	config   template.Config
	specHash string
}

// start takes the version number and runs fn in the background.
func (b *Builder) start(ctx context.Context, tenant, name, source string, fn func(context.Context, *buildState) (result, error)) (api.TemplateBuildStarted, error) {
	now := time.Now().UTC()
	bs := &buildState{
		id: auth.RandomID("bld_", 15), tenant: tenant, name: name, templateID: auth.RandomID("tpl_", 15),
		log: newBuildLog(0), created: now, done: make(chan struct{}),
	}
	version, err := b.st.StartTemplateBuild(ctx, store.TemplateVersion{
		ID: bs.templateID, Tenant: tenant, Name: name, Source: source, CreatedAt: now,
	}, store.TemplateBuild{ID: bs.id, CreatedAt: now})
	if err != nil {
		return api.TemplateBuildStarted{}, err
	}
	bs.version = version
	b.mu.Lock()
	b.builds[bs.id] = bs
	b.mu.Unlock()
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		b.execute(bs, fn)
	}()
	return api.TemplateBuildStarted{BuildID: bs.id, Name: name, Version: version}, nil
}

// execute runs a build to its end and records the outcome.
func (b *Builder) execute(bs *buildState, fn func(context.Context, *buildState) (result, error)) {
	log := b.log.With("build_id", bs.id, "template", bs.name, "version", bs.version, "tenant", bs.tenant)
	ctx := withOwner(b.ctx, Owner{Tenant: bs.tenant, Template: bs.name, BuildID: bs.id})
	bs.log.logf("build %s: template %s version %d", bs.id, bs.name, bs.version)
	var (
		res result
		err error
	)
	select {
	case b.sem <- struct{}{}:
	default:
		bs.log.logf("waiting for one of the %d running builds to end", cap(b.sem))
		select {
		case b.sem <- struct{}{}:
		case <-ctx.Done():
			err = errors.New("the daemon stopped before the build began")
		}
	}
	if err == nil {
		res, err = fn(ctx, bs)
		<-b.sem
	}
	defer b.releaseBuild(bs)
	end := time.Now().UTC()
	rec := store.BuildResult{EndedAt: end}
	if err == nil {
		cfg, merr := marshalConfig(res.config)
		if merr != nil {
			err = merr
		} else {
			rec.OK, rec.Layers, rec.Config, rec.SpecHash = true, res.layers, cfg, res.specHash
			rec.SizeBytes = b.size(res.layers)
		}
	}
	if err != nil {
		rec.OK = false
		rec.Error = b.scrub(failureText(ctx, err))
		bs.log.logf("build failed: %s", rec.Error)
	} else {
		bs.log.logf("template %s version %d is ready (%d layers)", bs.name, bs.version, len(res.layers))
	}
	rec.Log = bs.log.bytes()
	// The record is written even when the daemon is stopping.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if ferr := b.st.FinishTemplateBuild(sctx, bs.id, rec); ferr != nil {
		log.Error("recording build result", "err", ferr)
		if rec.OK {
			rec.OK, rec.Error = false, "the build result could not be recorded"
		}
	}
	bs.status, bs.errMsg, bs.ended = api.BuildReady, "", end
	if !rec.OK {
		bs.status, bs.errMsg = api.BuildFailed, rec.Error
		log.Info("template build failed", "err", err)
	} else {
		log.Info("template built", "layers", len(res.layers))
	}
	// done first: a follower that sees the log end then reads the record.
	close(bs.done)
	bs.log.close()
}

// failureText is the build error shown to the user.
func failureText(ctx context.Context, err error) string {
	var ue *Error
	var se *SpecError
	switch {
	case ctx.Err() != nil:
		return "the daemon stopped during the build"
	case errors.As(err, &ue):
		return ue.Msg
	case errors.As(err, &se):
		return se.Error()
	}
	return "internal error during the build"
}

// scrub removes host paths of the data dir from a message for the client.
func (b *Builder) scrub(msg string) string {
	dir := b.tmpl.Dir()
	msg = strings.ReplaceAll(msg, dir+"/", "")
	return strings.ReplaceAll(msg, filepath.Dir(dir)+"/", "")
}

// releaseBuild forgets a finished build (its record is in the store) and
// lets go of the layers it held.
func (b *Builder) releaseBuild(bs *buildState) {
	b.mu.Lock()
	delete(b.builds, bs.id)
	for name, id := range b.shipping {
		if id == bs.id {
			delete(b.shipping, name)
		}
	}
	b.mu.Unlock()
	b.releaseAll(bs.id)
}

// size sums the sizes of layers.
func (b *Builder) size(layers []string) int64 {
	var n int64
	for _, ref := range layers {
		n += b.tmpl.LayerSize(ref)
	}
	return n
}

// Wait blocks until build id ends (or ctx is done) and returns it.
func (b *Builder) Wait(ctx context.Context, id string) (api.TemplateBuild, error) {
	b.mu.Lock()
	bs := b.builds[id]
	b.mu.Unlock()
	if bs != nil {
		select {
		case <-bs.done:
		case <-ctx.Done():
			return api.TemplateBuild{}, ctx.Err()
		}
	}
	v, err := b.buildView(ctx, id)
	return v.TemplateBuild, err
}

// Building returns the id of a running build of template name that tenant
// may use (its own, or a shipped one) and that would make version (0: any
// version) ready: what a create of a template without a ready version
// waits for. With several, the oldest. (Shipped names are not tenants'.)
func (b *Builder) Building(tenant, name string, version int) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var found *buildState
	for _, bs := range b.builds {
		if bs.name != name || (bs.tenant != tenant && bs.tenant != "") || (version != 0 && bs.version != version) {
			continue
		}
		select {
		case <-bs.done:
			continue
		default:
		}
		if found == nil || bs.version < found.version {
			found = bs
		}
	}
	if found == nil {
		return "", false
	}
	return found.id, true
}

// Build returns build id if principal tenant may see it (its own, a
// shipped template's, or any with admin).
func (b *Builder) Build(ctx context.Context, tenant string, admin bool, id string) (api.TemplateBuild, error) {
	v, err := b.buildView(ctx, id)
	if err != nil {
		return api.TemplateBuild{}, err
	}
	if !admin && v.tenant != tenant && v.tenant != "" {
		return api.TemplateBuild{}, userErr(errdefs.ErrNotFound, "build not found")
	}
	return v.TemplateBuild, nil
}

type buildView struct {
	api.TemplateBuild
	tenant string
}

func (b *Builder) buildView(ctx context.Context, id string) (buildView, error) {
	b.mu.Lock()
	bs := b.builds[id]
	b.mu.Unlock()
	if bs != nil {
		select {
		case <-bs.done:
		default:
			return buildView{api.TemplateBuild{
				ID: bs.id, Name: bs.name, Version: bs.version, Status: api.BuildBuilding,
				Log: string(bs.log.bytes()), CreatedAt: bs.created,
			}, bs.tenant}, nil
		}
	}
	rec, err := b.st.GetTemplateBuild(ctx, id)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return buildView{}, userErr(errdefs.ErrNotFound, "build not found")
		}
		return buildView{}, err
	}
	return buildView{api.TemplateBuild{
		ID: rec.ID, Name: rec.Name, Version: rec.Version, Status: rec.Status, Error: rec.Error,
		Log: string(rec.Log), CreatedAt: rec.CreatedAt, EndedAt: rec.EndedAt,
	}, rec.Tenant}, nil
}

// Follow returns a reader of build id's log from offset from: live while
// the build runs, the stored log once it ended.
func (b *Builder) Follow(ctx context.Context, tenant string, admin bool, id string, from int64) (*LogFollower, error) {
	if _, err := b.Build(ctx, tenant, admin, id); err != nil {
		return nil, err
	}
	b.mu.Lock()
	bs := b.builds[id]
	b.mu.Unlock()
	if bs != nil {
		return &LogFollower{log: bs.log, offset: from}, nil
	}
	v, err := b.buildView(ctx, id)
	if err != nil {
		return nil, err
	}
	return &LogFollower{final: []byte(v.Log), offset: min(from, int64(len(v.Log)))}, nil
}

// hold marks layer ref as in use by build id, so that the collector keeps
// it, and reports whether it exists. Taking the hold and looking are one
// step for the collector.
func (b *Builder) hold(id, ref string) bool {
	b.gcMu.RLock()
	defer b.gcMu.RUnlock()
	b.inflMu.Lock()
	b.inflight[id+"\x00"+ref]++
	b.inflMu.Unlock()
	p, err := b.tmpl.LayerPath(ref)
	if err != nil {
		return false
	}
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// releaseAll drops every hold of build id.
func (b *Builder) releaseAll(id string) {
	b.inflMu.Lock()
	defer b.inflMu.Unlock()
	prefix := id + "\x00"
	for k := range b.inflight {
		if len(k) > len(prefix) && k[:len(prefix)] == prefix {
			delete(b.inflight, k)
		}
	}
}

// heldRefs returns the layer refs running builds hold.
func (b *Builder) heldRefs() map[string]bool {
	b.inflMu.Lock()
	defer b.inflMu.Unlock()
	out := map[string]bool{}
	for k := range b.inflight {
		for i := 0; i < len(k); i++ {
			if k[i] == 0 {
				out[k[i+1:]] = true
				break
			}
		}
	}
	return out
}
