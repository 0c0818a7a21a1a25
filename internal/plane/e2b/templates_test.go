package e2b_test

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/plane/e2b"
)

// fakeTemplates is the template service as the templates API sees it: it
// records what a build was asked for (the spec, the context's entries)
// and answers with builds and templates the test sets.
type fakeTemplates struct {
	t   *testing.T
	mu  sync.Mutex
	dir string
	// templates by tenant ("" for shipped) and name.
	templates map[string]map[string]api.Template
	builds    map[string]*api.TemplateBuild
	tenants   map[string]string // build id → tenant
	reqs      []api.TemplateBuildRequest
	contexts  []map[string]string // name → content ("->target" for links)
}

func newFakeTemplates(t *testing.T) *fakeTemplates {
	return &fakeTemplates{t: t, dir: t.TempDir(), builds: map[string]*api.TemplateBuild{}, tenants: map[string]string{},
		templates: map[string]map[string]api.Template{"": {"base": {Name: "base", Version: 1, Status: api.TemplateReady}}}}
}

func (f *fakeTemplates) TemplateUpload() (*os.File, error) { return os.CreateTemp(f.dir, "upload-*") }

func (f *fakeTemplates) BuildTemplate(_ context.Context, p auth.Principal, req api.TemplateBuildRequest, contextPath, _ string) (api.TemplateBuildStarted, error) {
	entries := map[string]string{}
	if contextPath != "" {
		fh, err := os.Open(contextPath)
		if err != nil {
			f.t.Error(err)
			return api.TemplateBuildStarted{}, err
		}
		tr := tar.NewReader(fh)
		for {
			hdr, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				f.t.Errorf("context tar: %v", err)
				break
			}
			b, _ := io.ReadAll(tr)
			switch hdr.Typeflag {
			case tar.TypeSymlink, tar.TypeLink:
				entries[hdr.Name] = "->" + hdr.Linkname
			case tar.TypeDir:
				entries[hdr.Name] = "dir"
			default:
				entries[hdr.Name] = string(b)
			}
		}
		fh.Close()
		os.Remove(contextPath) // taken over, as the real service does
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, req)
	f.contexts = append(f.contexts, entries)
	id := fmt.Sprintf("bld_%d", len(f.reqs))
	v := 1
	if old, ok := f.templates[p.Tenant][req.Name]; ok {
		v = old.Version + 1
	}
	f.builds[id] = &api.TemplateBuild{ID: id, Name: req.Name, Version: v, Status: api.BuildBuilding}
	f.tenants[id] = p.Tenant
	return api.TemplateBuildStarted{BuildID: id, Name: req.Name, Version: v}, nil
}

func (f *fakeTemplates) TemplateBuild(_ context.Context, p auth.Principal, id string) (api.TemplateBuild, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.builds[id]
	if !ok || f.tenants[id] != p.Tenant {
		return api.TemplateBuild{}, errdefs.Publicf(errdefs.ErrNotFound, "build not found")
	}
	return *b, nil
}

func (f *fakeTemplates) GetTemplate(_ context.Context, p auth.Principal, ref string) (api.Template, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	name, v, _ := strings.Cut(ref, "@")
	for _, tenant := range []string{p.Tenant, ""} {
		if tm, ok := f.templates[tenant][name]; ok && (v == "" || v == strconv.Itoa(tm.Version)) {
			return tm, nil
		}
	}
	return api.Template{}, errdefs.Publicf(errdefs.ErrTemplateNotFound, "template %q not found", ref)
}

func (f *fakeTemplates) DeleteTemplate(_ context.Context, p auth.Principal, ref string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.templates[p.Tenant][ref]; !ok {
		return errdefs.Publicf(errdefs.ErrTemplateNotFound, "template %q not found", ref)
	}
	delete(f.templates[p.Tenant], ref)
	return nil
}

// finish ends build id: ready registers its version as the tenant's.
func (f *fakeTemplates) finish(id, status, log, msg string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.builds[id]
	b.Status, b.Log, b.Error = status, log, msg
	if status == api.BuildReady {
		tenant := f.tenants[id]
		if f.templates[tenant] == nil {
			f.templates[tenant] = map[string]api.Template{}
		}
		f.templates[tenant][b.Name] = api.Template{Name: b.Name, Version: b.Version, Tenant: tenant, Status: api.TemplateReady, BuildID: id}
	}
}

func (f *fakeTemplates) setLog(id, log string) {
	f.mu.Lock()
	f.builds[id].Log = log
	f.mu.Unlock()
}

func (f *fakeTemplates) last() (api.TemplateBuildRequest, map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) == 0 {
		f.t.Fatal("no build was started")
	}
	return f.reqs[len(f.reqs)-1], f.contexts[len(f.contexts)-1]
}

func withTemplates(f *fakeTemplates, maxUpload int64) harnessOption {
	return func(cfg *e2b.Config) {
		cfg.Templates = f
		if maxUpload > 0 {
			cfg.MaxUploadBytes = maxUpload
		}
	}
}

// tarOf makes a tar (gzipped when gz) of entries: name → content, or
// "->target" for a symlink; names ending in / are directories.
func tarOf(t *testing.T, gz bool, entries ...[2]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw io.WriteCloser
	if gz {
		zw = gzipWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	for _, e := range entries {
		hdr := &tar.Header{Name: e[0], Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(e[1]))}
		switch {
		case strings.HasSuffix(e[0], "/"):
			hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeDir, 0o755, 0
		case strings.HasPrefix(e[1], "->"):
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeSymlink, e[1][2:], 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if hdr.Size > 0 {
			tw.Write([]byte(e[1]))
		}
	}
	tw.Close()
	if zw != nil {
		zw.Close()
	}
	return buf.Bytes()
}

type requested struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Names      []string `json:"names"`
	Tags       []string `json:"tags"`
}

type uploadLink struct {
	Present bool   `json:"present"`
	URL     string `json:"url"`
}

type statusBody struct {
	BuildID    string `json:"buildID"`
	TemplateID string `json:"templateID"`
	Status     string `json:"status"`
	LogEntries []struct {
		Level, Message, Timestamp string
	} `json:"logEntries"`
	Logs   []string `json:"logs"`
	Reason *struct {
		Message string `json:"message"`
		Step    string `json:"step"`
	} `json:"reason"`
}

// put sends body to an upload URL, without an API key (as the SDK does).
func put(t *testing.T, u string, body []byte) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("PUT", u, bytes.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// upload asks for the upload URL of hash and PUTs body there.
func upload(t *testing.T, h *harness, tenant, templateID, hash string, body []byte) {
	t.Helper()
	var l uploadLink
	if st := h.call(tenant, "GET", "/templates/"+templateID+"/files/"+hash, nil, &l); st != http.StatusCreated || l.Present || l.URL == "" {
		t.Fatalf("upload link: %d %+v", st, l)
	}
	if st, b := put(t, l.URL, body); st != http.StatusOK {
		t.Fatalf("upload: %d %s", st, b)
	}
}

func status(t *testing.T, h *harness, tenant, templateID, buildID string, offset int) (int, statusBody) {
	t.Helper()
	var s statusBody
	st := h.call(tenant, "GET", fmt.Sprintf("/templates/%s/builds/%s/status?logsOffset=%d", templateID, buildID, offset), nil, &s)
	return st, s
}

const hashA = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"

// The SDK's whole build flow: request, upload of a COPY's files by hash,
// trigger, status with logs. The steps become airlock's spec, the uploads
// its context under their hashes.
func TestTemplatesBuildFlowMakesSpecAndContext(t *testing.T) {
	f := newFakeTemplates(t)
	h := newHarness(t, withTemplates(f, 0))

	var rq requested
	if st := h.call("acme", "POST", "/v3/templates", map[string]any{"name": "myapp:v1", "tags": []string{"stable"}, "cpuCount": 1, "memoryMB": 1024}, &rq); st != http.StatusAccepted {
		t.Fatalf("request build: %d", st)
	}
	if rq.TemplateID != "myapp" || rq.BuildID == "" || len(rq.Names) != 1 || rq.Names[0] != "myapp" || strings.Join(rq.Tags, ",") != "v1,stable" {
		t.Fatalf("request build answered %+v", rq)
	}
	if st, s := status(t, h, "acme", "myapp", rq.BuildID, 0); st != http.StatusOK || s.Status != "waiting" {
		t.Fatalf("status before the trigger: %d %+v", st, s)
	}

	// The files: asked for, uploaded to the URL given (no API key), then
	// present. The URL is good once.
	var l uploadLink
	if st := h.call("acme", "GET", "/templates/myapp/files/"+hashA, nil, &l); st != http.StatusCreated || l.Present {
		t.Fatalf("upload link: %d %+v", st, l)
	}
	if !strings.HasPrefix(l.URL, h.url+"/templates/myapp/files/"+hashA+"?") {
		t.Fatalf("upload url %q is not on this daemon", l.URL)
	}
	tarball := tarOf(t, true, [2]string{"folder/test.txt", "This is a test file."}, [2]string{"folder/link.txt", "->test.txt"})
	if st, b := put(t, l.URL, tarball); st != http.StatusOK {
		t.Fatalf("upload: %d %s", st, b)
	}
	if st, _ := put(t, l.URL, tarball); st != http.StatusUnauthorized {
		t.Fatalf("second use of an upload url: %d, want 401", st)
	}
	u, _ := url.Parse(l.URL)
	if st, _ := put(t, h.url+u.Path+"?token=0000", tarball); st != http.StatusUnauthorized {
		t.Fatalf("upload with a made-up token: %d, want 401", st)
	}
	l = uploadLink{}
	if st := h.call("acme", "GET", "/templates/myapp/files/"+hashA, nil, &l); st != http.StatusCreated || !l.Present || l.URL != "" {
		t.Fatalf("upload link once uploaded: %d %+v", st, l)
	}

	start := map[string]any{
		"fromImage": "e2bdev/base", "force": true,
		"startCmd": `echo "Hello, world!"`, "readyCmd": "sleep 1",
		"steps": []map[string]any{
			{"type": "COPY", "args": []string{"folder/*", "folder", "", ""}, "filesHash": hashA, "force": true},
			{"type": "RUN", "args": []string{"cat folder/test.txt"}},
			{"type": "RUN", "args": []string{"test \"$(whoami)\" = root\necho $HOME", "root"}, "force": true},
			{"type": "ENV", "args": []string{"GREETING", `say "hi" for $5`, "EMPTY", ""}},
			{"type": "WORKDIR", "args": []string{"/app"}},
			{"type": "COPY", "args": []string{"folder/test.txt", "/etc/conf/", "root", "0600"}, "filesHash": hashA},
			{"type": "USER", "args": []string{"root"}},
		},
	}
	if st := h.call("acme", "POST", "/v2/templates/myapp/builds/"+rq.BuildID, start, nil); st != http.StatusAccepted {
		t.Fatalf("trigger: %d", st)
	}
	req, ctx := f.last()
	want := strings.Join([]string{
		"FROM base",
		"USER user",
		"WORKDIR /home/user",
		`COPY ["--chown=user:user","` + hashA + `/folder","folder"]`,
		// force (skipCache) makes the first RUN, and a forced one, miss
		// the layer cache.
		`RUN ["/bin/bash","-c",": skip-cache ` + rq.BuildID + `; cat folder/test.txt"]`,
		"USER root",
		`RUN ["/bin/bash","-c",": skip-cache ` + rq.BuildID + `; test \"$(whoami)\" = root\necho $HOME"]`,
		"USER user",
		`ENV GREETING="say \"hi\" for \$5" EMPTY=""`,
		"WORKDIR /app",
		`COPY ["--chown=root:root","` + hashA + `/folder/test.txt","/etc/conf/"]`,
		"USER root",
		`RUN ["chmod","-R","0600","--","/etc/conf/test.txt"]`,
		"USER user",
		"USER root",
	}, "\n") + "\n"
	if req.Name != "myapp" || req.Dockerfile != want {
		t.Fatalf("spec of %q:\n%s\nwant:\n%s", req.Name, req.Dockerfile, want)
	}
	if req.StartCmd == nil || *req.StartCmd != "(\n"+`echo "Hello, world!"`+"\n) && exec sleep infinity" || req.ReadyCmd == nil || *req.ReadyCmd != "sleep 1" {
		t.Fatalf("start and ready commands: %v %v", req.StartCmd, req.ReadyCmd)
	}
	if ctx[hashA+"/folder/test.txt"] != "This is a test file." || ctx[hashA+"/folder/link.txt"] != "->test.txt" {
		t.Fatalf("context: %v", ctx)
	}
	if st := h.call("acme", "POST", "/v2/templates/myapp/builds/"+rq.BuildID, start, nil); st != http.StatusConflict {
		t.Fatalf("second trigger: %d, want 409", st)
	}

	// The log: whole lines while it builds, from the offset the SDK keeps.
	f.setLog("bld_1", "step 1/3: COPY\nstep 2/3: RUN\nThis is a te")
	st, s := status(t, h, "acme", "myapp", rq.BuildID, 0)
	if st != http.StatusOK || s.Status != "building" || len(s.LogEntries) != 2 || s.LogEntries[1].Message != "step 2/3: RUN" || s.LogEntries[0].Level != "info" || s.LogEntries[0].Timestamp == "" || len(s.Logs) != 2 {
		t.Fatalf("status while building: %d %+v", st, s)
	}
	f.finish("bld_1", api.BuildReady, "step 1/3: COPY\nstep 2/3: RUN\nThis is a test file.\nready", "")
	st, s = status(t, h, "acme", "myapp", rq.BuildID, 2)
	if st != http.StatusOK || s.Status != "ready" || len(s.LogEntries) != 2 || s.LogEntries[0].Message != "This is a test file." || s.LogEntries[1].Message != "ready" {
		t.Fatalf("status once ready: %d %+v", st, s)
	}
	if _, s = status(t, h, "acme", "myapp", rq.BuildID, 4); len(s.LogEntries) != 0 {
		t.Fatalf("entries past the end: %+v", s.LogEntries)
	}
	// airlock's build id answers too (what a restarted daemon still
	// knows), for its own template only.
	if st, s := status(t, h, "acme", "myapp", "bld_1", 0); st != http.StatusOK || s.Status != "ready" || len(s.LogEntries) != 4 {
		t.Fatalf("status by airlock's build id: %d %+v", st, s)
	}
	if st, _ := status(t, h, "acme", "other-name", "bld_1", 0); st != http.StatusNotFound {
		t.Fatalf("status by airlock's build id under another name: %d, want 404", st)
	}
	// The build is the template's: another tenant's view of it is 404,
	// and so is its upload (another tenant's files are not present).
	if st, _ := status(t, h, "other", "myapp", rq.BuildID, 0); st != http.StatusNotFound {
		t.Fatalf("another tenant's status: %d, want 404", st)
	}
	if st, _ := status(t, h, "other", "myapp", "bld_1", 0); st != http.StatusNotFound {
		t.Fatalf("another tenant's status by airlock's build id: %d, want 404", st)
	}
	l = uploadLink{}
	if st := h.call("other", "GET", "/templates/myapp/files/"+hashA, nil, &l); st != http.StatusCreated || l.Present {
		t.Fatalf("another tenant's upload link: %d %+v", st, l)
	}
}

// A failed build is E2B's error status with the reason the SDK throws.
func TestTemplatesBuildErrorCarriesReason(t *testing.T) {
	f := newFakeTemplates(t)
	h := newHarness(t, withTemplates(f, 0))
	var rq requested
	h.call("acme", "POST", "/v3/templates", map[string]any{"name": "broken"}, &rq)
	// The spec: FROM base, USER user, WORKDIR /home/user, then a line per
	// step, but the RUN as root, which takes three.
	start := map[string]any{"fromTemplate": "base", "steps": []map[string]any{
		{"type": "RUN", "args": []string{"true"}},
		{"type": "RUN", "args": []string{"id", "root"}},
		{"type": "RUN", "args": []string{"exit 3"}},
	}}
	if st := h.call("acme", "POST", "/v2/templates/broken/builds/"+rq.BuildID, start, nil); st != http.StatusAccepted {
		t.Fatalf("trigger: %d", st)
	}
	msg := "step 6/6 (line 8) RUN exit 3: exited with status 3"
	f.finish("bld_1", api.BuildFailed, "step 1/6 …\n", msg)
	_, s := status(t, h, "acme", "broken", rq.BuildID, 0)
	if s.Status != "error" || s.Reason == nil || s.Reason.Message != msg || s.Reason.Step != "3" || len(s.LogEntries) != 1 {
		t.Fatalf("failed build: %+v", s)
	}
}

// fromTemplate names airlock's templates: base, E2B's public names, the
// tenant's own (name, name:tag as the version the tag names).
func TestTemplatesFromTemplate(t *testing.T) {
	f := newFakeTemplates(t)
	f.templates[""]["code-interpreter"] = api.Template{Name: "code-interpreter", Version: 1, Status: api.TemplateReady, User: "user", Workdir: "/home/user"}
	h := newHarness(t, withTemplates(f, 0))
	build := func(name, from string) (int, api.TemplateBuildRequest) {
		var rq requested
		h.call("acme", "POST", "/v3/templates", map[string]any{"name": name}, &rq)
		st := h.call("acme", "POST", "/v2/templates/"+strings.Split(name, ":")[0]+"/builds/"+rq.BuildID, map[string]any{"fromTemplate": from}, nil)
		if st != http.StatusAccepted {
			return st, api.TemplateBuildRequest{}
		}
		req, _ := f.last()
		return st, req
	}
	if _, req := build("one:first", "base"); req.Dockerfile != "FROM base\nUSER user\nWORKDIR /home/user\n" {
		t.Fatalf("from base:\n%s", req.Dockerfile)
	}
	// A parent with its own user and workdir keeps them.
	if _, req := build("two", "code-interpreter-v1"); req.Dockerfile != "FROM code-interpreter\n" {
		t.Fatalf("from code-interpreter-v1:\n%s", req.Dockerfile)
	}
	f.finish("bld_1", api.BuildReady, "", "")
	if _, req := build("three", "one:first"); req.Dockerfile != "FROM one@1\nUSER user\nWORKDIR /home/user\n" {
		t.Fatalf("from one:first:\n%s", req.Dockerfile)
	}
	if st, _ := build("four", "one:nosuchtag"); st != http.StatusNotFound {
		t.Fatalf("from a tag that names nothing: %d, want 404", st)
	}
	if st, _ := build("five", "missing"); st != http.StatusBadRequest {
		t.Fatalf("from a missing template: %d, want 400", st)
	}
}

// Images from registries (Docker Hub…) cannot be pulled here: a clear 400
// at the trigger, nothing built.
func TestTemplatesRefuseRegistryImages(t *testing.T) {
	f := newFakeTemplates(t)
	h := newHarness(t, withTemplates(f, 0))
	for _, start := range []map[string]any{
		{"fromImage": "ubuntu:22.04"},
		{"fromImage": "e2bdev/base", "fromImageRegistry": map[string]any{"type": "registry", "username": "u", "password": "p"}},
	} {
		var rq requested
		h.call("acme", "POST", "/v3/templates", map[string]any{"name": "img"}, &rq)
		var e struct{ Message string }
		if st := h.call("acme", "POST", "/v2/templates/img/builds/"+rq.BuildID, start, &e); st != http.StatusBadRequest ||
			!strings.Contains(e.Message, "images from registries are not available on this server") {
			t.Fatalf("%v: %d %q", start, st, e.Message)
		}
	}
	if len(f.reqs) != 0 {
		t.Fatalf("builds started: %v", f.reqs)
	}
}

// Names, tags, steps and uploads from the client are checked.
func TestTemplatesRefuseHostileInput(t *testing.T) {
	f := newFakeTemplates(t)
	h := newHarness(t, withTemplates(f, 4096))
	for _, name := range []string{"", "Upper", "../x", "a/b", "base", "ok:", "ok::x", strings.Repeat("a", 70)} {
		if st := h.call("acme", "POST", "/v3/templates", map[string]any{"name": name}, nil); st != http.StatusBadRequest {
			t.Errorf("name %q: %d, want 400", name, st)
		}
	}
	if st := h.call("acme", "GET", "/templates/ok/files/..%2f..%2fetc", nil, nil); st != http.StatusBadRequest {
		t.Errorf("a files hash with slashes: %d, want 400", st)
	}
	for _, c := range []struct {
		name string
		body []byte
		want int
	}{
		{"climbs out", tarOf(t, true, [2]string{"../../etc/passwd", "x"}), http.StatusBadRequest},
		{"not a tar", []byte("just some bytes that are not an archive at all, and longer than a tar header? no"), http.StatusBadRequest},
		{"too large", tarOf(t, false, [2]string{"big", strings.Repeat("x", 8192)}), http.StatusRequestEntityTooLarge},
		{"bomb", tarOf(t, true, [2]string{"big", strings.Repeat("x", 1<<20)}), http.StatusRequestEntityTooLarge},
	} {
		var l uploadLink
		h.call("acme", "GET", "/templates/ok/files/"+hashA, nil, &l)
		if st, b := put(t, l.URL, c.body); st != c.want {
			t.Errorf("upload %s: %d %s, want %d", c.name, st, b, c.want)
		}
	}
	var l uploadLink
	if h.call("acme", "GET", "/templates/ok/files/"+hashA, nil, &l); l.Present {
		t.Fatal("a refused upload is present")
	}
	upload(t, h, "acme", "ok", hashA, tarOf(t, true, [2]string{"a.txt", "a"}))
	var rq requested
	h.call("acme", "POST", "/v3/templates", map[string]any{"name": "ok"}, &rq)
	for _, steps := range [][]map[string]any{
		{{"type": "ADD", "args": []string{"x", "y"}}},
		{{"type": "RUN", "args": []string{"id", "root:root"}}},
		{{"type": "RUN", "args": []string{}}},
		{{"type": "USER", "args": []string{"0"}}},
		{{"type": "ENV", "args": []string{"A B", "x"}}},
		{{"type": "ENV", "args": []string{"A", "x\nRUN evil"}}},
		{{"type": "WORKDIR", "args": []string{"/x\nRUN evil"}}},
		{{"type": "COPY", "args": []string{"a.txt", "/x"}}},
		{{"type": "COPY", "args": []string{"a.txt", "/x"}, "filesHash": "ffff"}},
		{{"type": "COPY", "args": []string{"../a.txt", "/x"}, "filesHash": hashA}},
		{{"type": "COPY", "args": []string{"a.txt", "/x", "root", "9999"}, "filesHash": hashA}},
		{{"type": "COPY", "args": []string{"a.txt", "/x", "Root;x"}, "filesHash": hashA}},
	} {
		if st := h.call("acme", "POST", "/v2/templates/ok/builds/"+rq.BuildID, map[string]any{"fromTemplate": "base", "steps": steps}, nil); st != http.StatusBadRequest {
			t.Errorf("steps %v: %d, want 400", steps, st)
		}
	}
	if len(f.reqs) != 0 {
		t.Fatalf("builds started: %v", f.reqs)
	}
	// What a tenant holds is bounded (four times the upload limit here).
	for i := range 5 {
		var l uploadLink
		hash := fmt.Sprintf("%064x", i+1)
		h.call("quota", "GET", "/templates/ok/files/"+hash, nil, &l)
		st, b := put(t, l.URL, tarOf(t, false, [2]string{"f", strings.Repeat("x", 2000)}))
		if want := map[bool]int{true: http.StatusOK, false: http.StatusInsufficientStorage}[i < 4]; st != want {
			t.Fatalf("upload %d of a tenant: %d %s, want %d", i+1, st, b, want)
		}
	}
	// Another tenant cannot trigger (or see) acme's build.
	if st := h.call("other", "POST", "/v2/templates/ok/builds/"+rq.BuildID, map[string]any{"fromTemplate": "base"}, nil); st != http.StatusNotFound {
		t.Fatalf("another tenant's trigger: %d, want 404", st)
	}
}

// Template.exists and aliases: shipped names and E2B's public ones exist
// for everyone, a tenant's templates for that tenant only (404 for the
// others, never 403).
func TestTemplatesAliases(t *testing.T) {
	f := newFakeTemplates(t)
	f.templates[""]["code-interpreter"] = api.Template{Name: "code-interpreter", Version: 1}
	f.templates["acme"] = map[string]api.Template{"mine": {Name: "mine", Version: 2, Tenant: "acme"}}
	h := newHarness(t, withTemplates(f, 0))
	var a struct {
		TemplateID string `json:"templateID"`
		Public     bool   `json:"public"`
	}
	for _, c := range []struct {
		tenant, alias string
		want          int
		public        bool
	}{
		{"acme", "base", 200, true},
		{"other", "code-interpreter-v1", 200, true},
		{"acme", "mine", 200, false},
		{"other", "mine", 404, false},
		{"acme", "nonexistent-0d8e2c4a-1b2c-4d5e-8f90-123456789abc", 404, false},
		{"acme", "Bad%20Name", 400, false},
	} {
		a.TemplateID, a.Public = "", false
		st := h.call(c.tenant, "GET", "/templates/aliases/"+c.alias, nil, &a)
		if st != c.want || (st == 200 && (a.TemplateID != c.alias || a.Public != c.public)) {
			t.Errorf("%s: alias %s: %d %+v, want %d public=%v", c.tenant, c.alias, st, a, c.want, c.public)
		}
	}
}

// Tags name versions: given at the build, assigned to a name:tag or a
// name's newest version, listed, deleted; a create's templateID may be
// name:tag.
func TestTemplatesTags(t *testing.T) {
	f := newFakeTemplates(t)
	h := newHarness(t, withTemplates(f, 0))
	var rq requested
	h.call("acme", "POST", "/v3/templates", map[string]any{"name": "tagged:v1"}, &rq)
	if st := h.call("acme", "POST", "/v2/templates/tagged/builds/"+rq.BuildID, map[string]any{"fromTemplate": "base"}, nil); st != http.StatusAccepted {
		t.Fatalf("trigger: %d", st)
	}
	f.finish("bld_1", api.BuildReady, "", "")
	var assigned struct {
		BuildID string   `json:"buildID"`
		Tags    []string `json:"tags"`
	}
	if st := h.call("acme", "POST", "/templates/tags", map[string]any{"target": "tagged:v1", "tags": []string{"production", "latest"}}, &assigned); st != http.StatusCreated ||
		assigned.BuildID != rq.BuildID || strings.Join(assigned.Tags, ",") != "production,latest" {
		t.Fatalf("assign: %d %+v", st, assigned)
	}
	if st := h.call("acme", "POST", "/templates/tags", map[string]any{"target": "tagged", "tags": []string{"stable"}}, &assigned); st != http.StatusCreated || assigned.BuildID != rq.BuildID {
		t.Fatalf("assign to the newest: %d %+v", st, assigned)
	}
	for _, c := range []struct {
		target string
		tags   []string
		want   int
	}{
		{"tagged:v1", []string{":invalid-tag"}, 400},
		{"tagged:v1", []string{"tagged:"}, 400},
		{"tagged:v1", nil, 400},
		{"tagged:nope", []string{"x"}, 404},
		{"missing", []string{"x"}, 404},
		{"base", []string{"x"}, 403},
	} {
		if st := h.call("acme", "POST", "/templates/tags", map[string]any{"target": c.target, "tags": c.tags}, nil); st != c.want {
			t.Errorf("assign %v to %s: %d, want %d", c.tags, c.target, st, c.want)
		}
	}
	if st := h.call("other", "POST", "/templates/tags", map[string]any{"target": "tagged:v1", "tags": []string{"x"}}, nil); st != http.StatusNotFound {
		t.Errorf("another tenant's assign: %d, want 404", st)
	}
	var tags []struct {
		Tag, BuildID, CreatedAt string
	}
	if st := h.call("acme", "GET", "/templates/tagged/tags", nil, &tags); st != http.StatusOK || len(tags) != 4 ||
		tags[0].Tag != "latest" || tags[3].Tag != "v1" || tags[0].BuildID != rq.BuildID || tags[0].CreatedAt == "" {
		t.Fatalf("tags: %d %+v", st, tags)
	}
	if st := h.call("other", "GET", "/templates/tagged/tags", nil, nil); st != http.StatusNotFound {
		t.Errorf("another tenant's tags: %d, want 404", st)
	}
	if st := h.call("acme", "DELETE", "/templates/tags", map[string]any{"name": "tagged", "tags": []string{"production", "latest"}}, nil); st != http.StatusNoContent {
		t.Fatalf("delete tags: %d", st)
	}
	if st := h.call("acme", "DELETE", "/templates/tags", map[string]any{"name": "nonexistent", "tags": []string{"x"}}, nil); st != http.StatusNotFound {
		t.Fatalf("delete tags of a missing template: %d", st)
	}
	h.call("acme", "GET", "/templates/tagged/tags", nil, &tags)
	if len(tags) != 2 || tags[0].Tag != "stable" || tags[1].Tag != "v1" {
		t.Fatalf("tags after delete: %+v", tags)
	}
	// A create from a tag that names nothing is not found; one from a tag
	// is a create from the version it names (here the catalog of the
	// harness has none: still not found, but as tagged@1).
	var e struct{ Message string }
	if st := h.call("acme", "POST", "/v2/sandboxes", map[string]any{"templateID": "tagged:nope"}, &e); st != http.StatusNotFound {
		t.Fatalf("create from a missing tag: %d", st)
	}
	if st := h.call("acme", "POST", "/v2/sandboxes", map[string]any{"templateID": "tagged:v1"}, &e); st != http.StatusNotFound || !strings.Contains(e.Message, "tagged@1") {
		t.Fatalf("create from a tag: %d %q", st, e.Message)
	}
	// Deleting the template takes its tags.
	if st := h.call("acme", "DELETE", "/templates/tagged", nil, nil); st != http.StatusNoContent {
		t.Fatalf("delete template: %d", st)
	}
	if st := h.call("acme", "POST", "/templates/tags", map[string]any{"target": "tagged:v1", "tags": []string{"x"}}, nil); st != http.StatusNotFound {
		t.Fatalf("assign after delete: %d", st)
	}
}

// Without a template service the API says so.
func TestTemplatesNotAvailable(t *testing.T) {
	h := newHarness(t)
	var e struct{ Message string }
	if st := h.call("acme", "POST", "/v3/templates", map[string]any{"name": "x"}, &e); st != http.StatusNotImplemented || !strings.Contains(e.Message, "not available") {
		t.Fatalf("%d %q", st, e.Message)
	}
}
