package e2b

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"github.com/airlockhq/airlock/internal/lazyregexp"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/service/templates"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// E2B's templates API (the JS and Python SDKs' Template() builder) over
// airlock's template builds (docs/e2b-templates.md):
//
//   - POST /v3/templates reserves a build of a name ("name" or "name:tag"):
//     the E2B templateID is the airlock template name, the buildID a new
//     id held here until the build is triggered.
//   - GET /templates/{id}/files/{hash} answers whether the files of a COPY
//     step are here and, if not, a one-use URL on this daemon where the SDK
//     PUTs their tar(.gz) (templates_upload.go).
//   - POST /v2/templates/{id}/builds/{buildID} turns the steps into a spec
//     (a Dockerfile subset) and a context tar holding each upload under its
//     hash (templates_spec.go) and starts airlock's build.
//   - GET /templates/{id}/builds/{buildID}/status reads the airlock build:
//     building, ready, error, its log lines from logsOffset.
//   - aliases (does a name exist), tags (names of versions) and delete.
//
// Reserved builds, uploads and tags are held in memory (a restart forgets
// them; the templates built stay, under their names).

const (
	// e2bPendingTTL is how long a reserved build or an upload stays unused.
	e2bPendingTTL = time.Hour
	// e2bBuildTTL is how long a started build keeps its E2B id (its
	// status is then asked by airlock's build id).
	e2bBuildTTL = 24 * time.Hour
	// maxPendingPerTenant bounds the reserved, untriggered builds of a tenant.
	maxPendingPerTenant = 64
	// maxUploadsPerTenant bounds the uploads (and upload slots) of a tenant.
	maxUploadsPerTenant = 256
	// maxLogEntries is the most log entries one status answer carries (the
	// SDK asks again until it gets none).
	maxLogEntries = 100
)

var (
	// e2bNameRE is airlock's template name (build.nameRE).
	e2bNameRE = lazyregexp.New(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	// e2bTagRE is a tag of a template version.
	e2bTagRE = lazyregexp.New(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	// filesHashRE is the files hash of a COPY step (the SDKs' sha256 hex).
	filesHashRE = lazyregexp.New(`^[A-Za-z0-9]{1,128}$`)
)

// templateAPI is the state of the templates API.
type templateAPI struct {
	h  *Handler
	mu sync.Mutex
	// builds are the E2B builds by E2B build id.
	builds map[string]*e2bBuild
	// uploads are the files of COPY steps by tenant and hash.
	uploads map[uploadKey]*e2bUpload
	// slots are the upload URLs handed out, by token.
	slots map[string]*uploadSlot
	// tags are the tags of each tenant's templates: tenant\x00name → tag.
	tags map[string]map[string]tagRef
}

type e2bBuild struct {
	id, tenant, name string
	tags             []string
	created          time.Time
	// triggered is set once a trigger took the build; bldID and version
	// are airlock's once it started.
	triggered bool
	bldID     string
	version   int
	// steps maps the spec's lines to the SDK's steps (translated.steps).
	steps []string
}

type uploadKey struct{ tenant, hash string }

type e2bUpload struct {
	path string
	size int64
	used time.Time
}

type uploadSlot struct {
	tenant, templateID, hash string
	expires                  time.Time
}

type tagRef struct {
	version int
	buildID string
	created time.Time
}

// registerTemplates serves E2B's templates API on the control plane.
func (h *Handler) registerTemplates(mux *http.ServeMux, a func(controlFunc) http.Handler) {
	t := &templateAPI{h: h, builds: map[string]*e2bBuild{}, uploads: map[uploadKey]*e2bUpload{},
		slots: map[string]*uploadSlot{}, tags: map[string]map[string]tagRef{}}
	h.tmpl = t
	mux.Handle("POST /v3/templates", a(t.requestBuild))
	mux.Handle("GET /templates/{templateID}/files/{hash}", a(t.fileUploadLink))
	// The SDK PUTs the files to the URL it was given, without its API
	// key: the URL's one-use token authenticates it.
	mux.Handle("PUT /templates/{templateID}/files/{hash}", http.HandlerFunc(t.receiveUpload))
	mux.Handle("POST /v2/templates/{templateID}/builds/{buildID}", a(t.triggerBuild))
	mux.Handle("GET /templates/{templateID}/builds/{buildID}/status", a(t.buildStatus))
	// GET /templates/aliases/{alias} and GET /templates/{templateID}/tags
	// overlap (/templates/aliases/tags): one route, split here.
	mux.Handle("GET /templates/{first}/{second}", a(func(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
		if r.PathValue("first") == "aliases" {
			return t.alias(w, r, p, r.PathValue("second"))
		}
		if r.PathValue("second") == "tags" {
			return t.listTags(w, r, p, r.PathValue("first"))
		}
		return errf(errdefs.ErrNotFound, "airlock does not serve %s %s of the e2b api", r.Method, r.URL.Path)
	}))
	mux.Handle("POST /templates/tags", a(t.assignTags))
	mux.Handle("DELETE /templates/tags", a(t.deleteTags))
	mux.Handle("DELETE /templates/{templateID}", a(t.deleteTemplate))
}

// service returns the template service or a not-implemented error.
func (t *templateAPI) service() (Templates, error) {
	if t.h.cfg.Templates == nil {
		return nil, errf(errdefs.ErrNotImplemented, "template builds are not available on this server")
	}
	return t.h.cfg.Templates, nil
}

func newID() string {
	b := make([]byte, 16)
	rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	s := hex.EncodeToString(b)
	return s[:8] + "-" + s[8:12] + "-" + s[12:16] + "-" + s[16:20] + "-" + s[20:]
}

// sweepLocked forgets what expired: untriggered builds, unused uploads
// (their files removed) and upload slots.
func (t *templateAPI) sweepLocked(now time.Time) {
	for id, b := range t.builds {
		if (!b.triggered && now.Sub(b.created) > e2bPendingTTL) || (b.bldID != "" && now.Sub(b.created) > e2bBuildTTL) {
			delete(t.builds, id)
		}
	}
	for k, u := range t.uploads {
		if now.Sub(u.used) > e2bPendingTTL {
			os.Remove(u.path)
			delete(t.uploads, k)
		}
	}
	for tok, s := range t.slots {
		if now.After(s.expires) {
			delete(t.slots, tok)
		}
	}
}

// splitNameTag splits "name" or "name:tag".
func splitNameTag(ref string) (name, tag string, err error) {
	name, tag, hasTag := strings.Cut(ref, ":")
	if !e2bNameRE.MatchString(name) {
		return "", "", errf(errdefs.ErrInvalidArgument, "template name %q must match %s", name, e2bNameRE)
	}
	if hasTag && !e2bTagRE.MatchString(tag) {
		return "", "", errf(errdefs.ErrInvalidArgument, "tag %q must match %s", tag, e2bTagRE)
	}
	return name, tag, nil
}

func checkTags(tags []string) error {
	if len(tags) > 32 {
		return errf(errdefs.ErrInvalidArgument, "at most 32 tags")
	}
	for _, tg := range tags {
		if !e2bTagRE.MatchString(tg) {
			return errf(errdefs.ErrInvalidArgument, "tag %q must match %s", tg, e2bTagRE)
		}
	}
	return nil
}

// requestResponse is E2B's TemplateRequestResponseV3.
type requestResponse struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Names      []string `json:"names"`
	Aliases    []string `json:"aliases"`
	Tags       []string `json:"tags"`
	Public     bool     `json:"public"`
}

func (t *templateAPI) requestBuild(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	if _, err := t.service(); err != nil {
		return err
	}
	var body struct {
		Name  string   `json:"name"`
		Alias string   `json:"alias"`
		Tags  []string `json:"tags"`
	}
	if err := decodeJSON(r, &body); err != nil {
		return err
	}
	ref := body.Name
	if ref == "" {
		ref = body.Alias
	}
	if ref == "" {
		return errf(errdefs.ErrInvalidArgument, "name is required")
	}
	name, tag, err := splitNameTag(ref)
	if err != nil {
		return err
	}
	if templates.IsShipped(name) {
		return errf(errdefs.ErrInvalidArgument, "template name %q is taken by a shipped template; choose another", name)
	}
	if err := checkTags(body.Tags); err != nil {
		return err
	}
	tags := append([]string{}, body.Tags...)
	if tag != "" && !contains(tags, tag) {
		tags = append([]string{tag}, tags...)
	}
	now := time.Now()
	b := &e2bBuild{id: newID(), tenant: p.Tenant, name: name, tags: tags, created: now}
	t.mu.Lock()
	t.sweepLocked(now)
	n := 0
	for _, o := range t.builds {
		if o.tenant == p.Tenant && !o.triggered {
			n++
		}
	}
	if n >= maxPendingPerTenant {
		t.mu.Unlock()
		return errf(errdefs.ErrRateLimited, "too many template builds requested and not started (at most %d)", maxPendingPerTenant)
	}
	t.builds[b.id] = b
	t.mu.Unlock()
	writeJSON(w, http.StatusAccepted, requestResponse{
		TemplateID: name, BuildID: b.id, Names: []string{name}, Aliases: []string{name}, Tags: tags,
	})
	return nil
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// build returns E2B build id of templateID for p, or not found.
func (t *templateAPI) build(p auth.Principal, templateID, id string) (*e2bBuild, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	b, ok := t.builds[id]
	if !ok || b.tenant != p.Tenant || b.name != templateID {
		return nil, errf(errdefs.ErrNotFound, "build %q of template %q not found", id, templateID)
	}
	return b, nil
}

// triggerBuild starts the build of the steps.
func (t *templateAPI) triggerBuild(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	svc, err := t.service()
	if err != nil {
		return err
	}
	var body buildStart
	if err := decodeJSON(r, &body); err != nil {
		return err
	}
	b, err := t.build(p, r.PathValue("templateID"), r.PathValue("buildID"))
	if err != nil {
		return err
	}
	t.mu.Lock()
	if b.triggered {
		t.mu.Unlock()
		return errf(errdefs.ErrConflict, "build %q was already started", b.id)
	}
	b.triggered = true
	t.mu.Unlock()
	release := func() {
		t.mu.Lock()
		b.triggered = false
		t.mu.Unlock()
	}
	bs, steps, err := t.startBuild(r, p, svc, b, body)
	if err != nil {
		release()
		return err
	}
	now := time.Now()
	t.mu.Lock()
	b.bldID, b.version, b.steps = bs.BuildID, bs.Version, steps
	key := p.Tenant + "\x00" + b.name
	for _, tg := range b.tags {
		if t.tags[key] == nil {
			t.tags[key] = map[string]tagRef{}
		}
		t.tags[key][tg] = tagRef{version: bs.Version, buildID: b.id, created: now}
	}
	t.mu.Unlock()
	w.WriteHeader(http.StatusAccepted)
	return nil
}

// startBuild makes the spec and the context of body and submits them.
func (t *templateAPI) startBuild(r *http.Request, p auth.Principal, svc Templates, b *e2bBuild, body buildStart) (api.TemplateBuildStarted, []string, error) {
	bs, spec, err := t.submit(r, p, svc, b, body)
	return bs, spec.steps, err
}

func (t *templateAPI) submit(r *http.Request, p auth.Principal, svc Templates, b *e2bBuild, body buildStart) (api.TemplateBuildStarted, translated, error) {
	from, err := t.fromRef(r, p, body)
	if err != nil {
		return api.TemplateBuildStarted{}, translated{}, err
	}
	parent, err := svc.GetTemplate(r.Context(), p, from)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return api.TemplateBuildStarted{}, translated{}, errf(errdefs.ErrInvalidArgument, "template %q to build from not found", from)
		}
		return api.TemplateBuildStarted{}, translated{}, err
	}
	// The files of every COPY step, checked out under the lock.
	t.mu.Lock()
	files := map[string]string{}
	var missing []string
	for _, s := range body.Steps {
		if !strings.EqualFold(s.Type, "COPY") {
			continue
		}
		u, ok := t.uploads[uploadKey{p.Tenant, s.FilesHash}]
		if !ok {
			missing = append(missing, s.FilesHash)
			continue
		}
		u.used = time.Now()
		files[s.FilesHash] = u.path
	}
	t.mu.Unlock()
	spec, err := translate(from, parent, body, files, b.id)
	if err != nil {
		return api.TemplateBuildStarted{}, translated{}, err
	}
	if len(missing) > 0 {
		return api.TemplateBuildStarted{}, translated{}, errf(errdefs.ErrInvalidArgument, "the files of COPY (hash %s) were not uploaded", missing[0])
	}
	req := api.TemplateBuildRequest{Name: b.name, Dockerfile: spec.dockerfile}
	if body.StartCmd != "" {
		sc := keepRunning(body.StartCmd)
		req.StartCmd = &sc
	}
	if body.ReadyCmd != "" {
		req.ReadyCmd = &body.ReadyCmd
	}
	ctxPath := ""
	if len(spec.hashes) > 0 {
		if ctxPath, err = t.writeContext(svc, spec.hashes, files); err != nil {
			return api.TemplateBuildStarted{}, translated{}, err
		}
	}
	bs, err := svc.BuildTemplate(r.Context(), p, req, ctxPath, "")
	return bs, spec, err
}

// keepRunning is an E2B start command as airlock's start_cmd. On E2B a
// start command may end (successfully) before its ready command passes:
// the template is ready once the ready command is; airlock fails the
// create of a sandbox whose start command ended first. So a start command
// that succeeds leaves a sleep in its place; one that fails still fails
// the create, as it fails E2B's build.
func keepRunning(cmd string) string { return "(\n" + cmd + "\n) && exec sleep infinity" }

// fromRef is the airlock template the build starts from.
func (t *templateAPI) fromRef(r *http.Request, p auth.Principal, body buildStart) (string, error) {
	if len(body.FromImageRegistry) > 0 && string(body.FromImageRegistry) != "null" {
		return "", errf(errdefs.ErrInvalidArgument, "images from registries are not available on this server: build from a template (fromTemplate) or E2B's base image (fromBaseImage)")
	}
	if body.FromTemplate != "" {
		return t.resolveRef(p, body.FromTemplate)
	}
	img := body.FromImage
	if img == "" {
		img = e2bBaseImage
	}
	if isE2BBaseImage(img) {
		return "base", nil
	}
	return "", errf(errdefs.ErrInvalidArgument, "images from registries are not available on this server (%q): build from a template (fromTemplate) or E2B's base image (fromBaseImage)", img)
}

// e2bBaseImage is E2B's base image, which airlock's shipped base stands for.
const e2bBaseImage = "e2bdev/base"

func isE2BBaseImage(img string) bool {
	img = strings.TrimPrefix(strings.TrimPrefix(img, "docker.io/"), "index.docker.io/")
	img = strings.TrimPrefix(img, "library/")
	return img == e2bBaseImage || img == e2bBaseImage+":latest"
}

// resolveRef is the airlock reference of an E2B template reference: an E2B
// public name (base, code-interpreter-v1), "name" or "name:tag".
func (t *templateAPI) resolveRef(p auth.Principal, ref string) (string, error) {
	if n, ok := templateAliases[ref]; ok {
		return n, nil
	}
	name, tag, hasTag := strings.Cut(ref, ":")
	if !hasTag {
		return ref, nil
	}
	if _, _, err := splitNameTag(ref); err != nil {
		return "", err
	}
	t.mu.Lock()
	tr, ok := t.tags[p.Tenant+"\x00"+name][tag]
	t.mu.Unlock()
	if !ok {
		return "", errf(errdefs.ErrTemplateNotFound, "template %q not found", ref)
	}
	return fmt.Sprintf("%s@%d", name, tr.version), nil
}

// sandboxTemplate is the airlock template a create's templateID names.
func (h *Handler) sandboxTemplate(p auth.Principal, id string) (string, error) {
	if h.tmpl == nil {
		return id, nil
	}
	return h.tmpl.resolveRef(p, id)
}

// logEntry is E2B's BuildLogEntry.
type logEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

// buildInfo is E2B's TemplateBuildInfo.
type buildInfo struct {
	BuildID    string       `json:"buildID"`
	TemplateID string       `json:"templateID"`
	Status     string       `json:"status"`
	LogEntries []logEntry   `json:"logEntries"`
	Logs       []string     `json:"logs"`
	Reason     *buildReason `json:"reason,omitempty"`
}

type buildReason struct {
	Message    string     `json:"message"`
	Step       string     `json:"step,omitempty"`
	LogEntries []logEntry `json:"logEntries"`
}

func (t *templateAPI) buildStatus(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	svc, err := t.service()
	if err != nil {
		return err
	}
	q := r.URL.Query()
	offset, limit := 0, maxLogEntries
	if v := q.Get("logsOffset"); v != "" {
		if offset, err = strconv.Atoi(v); err != nil || offset < 0 {
			return errf(errdefs.ErrInvalidArgument, "logsOffset must be a non-negative integer")
		}
	}
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 0 {
			return errf(errdefs.ErrInvalidArgument, "limit must be a non-negative integer")
		}
		limit = min(limit, maxLogEntries)
	}
	templateID, id := r.PathValue("templateID"), r.PathValue("buildID")
	out := buildInfo{BuildID: id, TemplateID: templateID, LogEntries: []logEntry{}, Logs: []string{}}
	b, err := t.build(p, templateID, id)
	bldID := ""
	var steps []string
	switch {
	case err == nil:
		t.mu.Lock()
		bldID, steps = b.bldID, b.steps
		t.mu.Unlock()
	case strings.HasPrefix(id, "bld_"):
		// An airlock build id (what a restarted daemon still knows).
		bldID = id
	default:
		return err
	}
	if bldID == "" {
		out.Status = "waiting"
		writeJSON(w, http.StatusOK, out)
		return nil
	}
	tb, err := svc.TemplateBuild(r.Context(), p, bldID)
	if err != nil {
		return err
	}
	if tb.Name != templateID {
		return errf(errdefs.ErrNotFound, "build %q of template %q not found", id, templateID)
	}
	done := tb.Status != api.BuildBuilding
	switch tb.Status {
	case api.BuildReady:
		out.Status = "ready"
	case api.BuildFailed:
		out.Status = "error"
	default:
		out.Status = "building"
	}
	now := time.Now().UTC()
	lines := logLines(tb.Log, done)
	if offset < len(lines) {
		lines = lines[offset:]
		if len(lines) > limit {
			lines = lines[:limit]
		}
		for _, l := range lines {
			out.LogEntries = append(out.LogEntries, logEntry{Timestamp: now, Level: "info", Message: l})
			out.Logs = append(out.Logs, l)
		}
	}
	if tb.Status == api.BuildFailed {
		msg := tb.Error
		if msg == "" {
			msg = "the build failed"
		}
		out.Reason = &buildReason{Message: msg, Step: failedStep(msg, steps), LogEntries: []logEntry{}}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// logLines splits a build log into its lines; the last one only when the
// build is over (while it runs, it may be half written).
func logLines(log string, done bool) []string {
	if log == "" {
		return nil
	}
	lines := strings.Split(log, "\n")
	last := lines[len(lines)-1]
	lines = lines[:len(lines)-1]
	if done && last != "" {
		lines = append(lines, last)
	}
	return lines
}

// aliasResponse is E2B's TemplateAliasResponse.
type aliasResponse struct {
	TemplateID string `json:"templateID"`
	Public     bool   `json:"public"`
}

// alias answers whether a name names a template the tenant can use: 200,
// or 404 (another tenant's template is 404 too, never 403).
func (t *templateAPI) alias(w http.ResponseWriter, r *http.Request, p auth.Principal, alias string) error {
	svc, err := t.service()
	if err != nil {
		return err
	}
	ref := alias
	if n, ok := templateAliases[alias]; ok {
		ref = n
	} else if !e2bNameRE.MatchString(alias) {
		return errf(errdefs.ErrInvalidArgument, "template name %q must match %s", alias, e2bNameRE)
	}
	tm, err := svc.GetTemplate(r.Context(), p, ref)
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, aliasResponse{TemplateID: alias, Public: tm.Tenant == ""})
		return nil
	case !errdefs.IsNotFound(err):
		return err
	}
	// A first version on its way is a name already taken.
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, b := range t.builds {
		if b.tenant == p.Tenant && b.name == alias && b.bldID != "" {
			writeJSON(w, http.StatusOK, aliasResponse{TemplateID: alias})
			return nil
		}
	}
	return errf(errdefs.ErrTemplateNotFound, "template %q not found", alias)
}

// tagTarget resolves "name" (its newest version) or "name:tag" for p.
func (t *templateAPI) tagTarget(r *http.Request, p auth.Principal, svc Templates, target string) (name string, ref tagRef, err error) {
	name, tag, err := splitNameTag(target)
	if err != nil {
		return "", tagRef{}, err
	}
	if _, _, hasTag := strings.Cut(target, ":"); hasTag {
		t.mu.Lock()
		tr, ok := t.tags[p.Tenant+"\x00"+name][tag]
		t.mu.Unlock()
		if !ok {
			return "", tagRef{}, errf(errdefs.ErrTemplateNotFound, "template %q not found", target)
		}
		return name, tr, nil
	}
	tm, err := svc.GetTemplate(r.Context(), p, name)
	if err != nil {
		return "", tagRef{}, err
	}
	if tm.Tenant != p.Tenant {
		return "", tagRef{}, errf(errdefs.ErrPermissionDenied, "template %q is not yours to tag", name)
	}
	return name, tagRef{version: tm.Version, buildID: t.buildIDOf(p, name, tm.Version, tm.BuildID)}, nil
}

// buildIDOf is the E2B build id of version v of name: the one the SDK was
// given, else airlock's.
func (t *templateAPI) buildIDOf(p auth.Principal, name string, v int, fallback string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, b := range t.builds {
		if b.tenant == p.Tenant && b.name == name && b.version == v && b.bldID != "" {
			return b.id
		}
	}
	return fallback
}

func (t *templateAPI) assignTags(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	svc, err := t.service()
	if err != nil {
		return err
	}
	var body struct {
		Target string   `json:"target"`
		Tags   []string `json:"tags"`
	}
	if err := decodeJSON(r, &body); err != nil {
		return err
	}
	if len(body.Tags) == 0 {
		return errf(errdefs.ErrInvalidArgument, "tags are required")
	}
	if err := checkTags(body.Tags); err != nil {
		return err
	}
	name, ref, err := t.tagTarget(r, p, svc, body.Target)
	if err != nil {
		return err
	}
	ref.created = time.Now()
	key := p.Tenant + "\x00" + name
	t.mu.Lock()
	if t.tags[key] == nil {
		t.tags[key] = map[string]tagRef{}
	}
	for _, tg := range body.Tags {
		t.tags[key][tg] = ref
	}
	t.mu.Unlock()
	writeJSON(w, http.StatusCreated, struct {
		BuildID string   `json:"buildID"`
		Tags    []string `json:"tags"`
	}{ref.buildID, body.Tags})
	return nil
}

// ownTemplate checks that name is a template of p's tenant.
func (t *templateAPI) ownTemplate(r *http.Request, p auth.Principal, svc Templates, name string) error {
	if !e2bNameRE.MatchString(name) {
		return errf(errdefs.ErrInvalidArgument, "template name %q must match %s", name, e2bNameRE)
	}
	tm, err := svc.GetTemplate(r.Context(), p, name)
	if err != nil {
		return err
	}
	if tm.Tenant != p.Tenant {
		return errf(errdefs.ErrPermissionDenied, "template %q is not yours", name)
	}
	return nil
}

func (t *templateAPI) deleteTags(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	svc, err := t.service()
	if err != nil {
		return err
	}
	var body struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}
	if err := decodeJSON(r, &body); err != nil {
		return err
	}
	if err := checkTags(body.Tags); err != nil {
		return err
	}
	if err := t.ownTemplate(r, p, svc, body.Name); err != nil {
		return err
	}
	t.mu.Lock()
	for _, tg := range body.Tags {
		delete(t.tags[p.Tenant+"\x00"+body.Name], tg)
	}
	t.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// templateTag is E2B's TemplateTag.
type templateTag struct {
	Tag       string    `json:"tag"`
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}

func (t *templateAPI) listTags(w http.ResponseWriter, r *http.Request, p auth.Principal, name string) error {
	svc, err := t.service()
	if err != nil {
		return err
	}
	if err := t.ownTemplate(r, p, svc, name); err != nil {
		return err
	}
	out := []templateTag{}
	t.mu.Lock()
	for tg, ref := range t.tags[p.Tenant+"\x00"+name] {
		out = append(out, templateTag{Tag: tg, BuildID: ref.buildID, CreatedAt: ref.created.UTC()})
	}
	t.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Tag < out[j].Tag })
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (t *templateAPI) deleteTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	if id := r.PathValue("templateID"); isSnapshotID(id) {
		return t.h.deleteSnapshot(w, r, p, id) // Sandbox.deleteSnapshot
	}
	svc, err := t.service()
	if err != nil {
		return err
	}
	name := r.PathValue("templateID")
	if err := t.ownTemplate(r, p, svc, name); err != nil {
		return err
	}
	if err := svc.DeleteTemplate(r.Context(), p, name); err != nil {
		return err
	}
	t.mu.Lock()
	delete(t.tags, p.Tenant+"\x00"+name)
	t.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
	return nil
}
