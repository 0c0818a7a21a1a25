package daemon

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/hostcheck"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testutil"
)

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// buildBinaries builds airlock-agent (static) and airlock once.
func buildBinaries(t *testing.T) (agent, cli string) {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "airlock-daemon-test-"); binErr != nil {
			return
		}
		for _, b := range []struct{ out, pkg, cgo string }{
			{"airlock-agent", "./cmd/airlock-agent", "CGO_ENABLED=0"},
			{"airlock", "./cmd/airlock", ""},
		} {
			cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(binDir, b.out), b.pkg)
			cmd.Dir = filepath.Join("..", "..")
			cmd.Env = append(os.Environ(), b.cgo)
			if out, err := cmd.CombinedOutput(); err != nil {
				binErr = fmt.Errorf("building %s: %v\n%s", b.out, err, out)
				return
			}
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return filepath.Join(binDir, "airlock-agent"), filepath.Join(binDir, "airlock")
}

// templateDaemon runs the daemon on a fresh data dir whose base template
// is the shared test cache's, and returns an admin and a tenant client.
func templateDaemon(t *testing.T) (admin, tenant *client.Client, tenantKey string, cliEnv []string, dataDir string) {
	t.Helper()
	return templateDaemonWith(t, Options{})
}

// templateDaemonWith is templateDaemon with extra options (a test
// network).
func templateDaemonWith(t *testing.T, opts Options) (admin, tenant *client.Client, tenantKey string, cliEnv []string, dataDir string) {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "runc")
	agent, _ := buildBinaries(t)
	shared := filepath.Join(testutil.DataDir(), "templates")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var progress strings.Builder
	if _, err := template.NewStore(shared).EnsureBase(ctx, &progress); err != nil {
		t.Fatalf("base template: %v\n%s", err, progress.String())
	}
	dataDir, err := os.MkdirTemp("", "airlock-daemon-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dataDir, 0o711)
	t.Cleanup(func() { os.RemoveAll(dataDir) })
	os.MkdirAll(filepath.Join(dataDir, "templates"), 0o700)
	if err := os.Symlink(filepath.Join(shared, "base"), filepath.Join(dataDir, "templates", "base")); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.DataDir, cfg.Listen, cfg.NoPrepare, cfg.AgentPath = dataDir, "127.0.0.1:0", true, agent
	cfg.ShutdownTimeoutS = 5
	const key = "admin-key-for-the-template-tests-0123"
	opts.Stderr, opts.AdminKey = io.Discard, key
	addr, stop := runDaemon(t, cfg, opts)
	os.MkdirAll(filepath.Join(dataDir, "sandboxes"), 0o711)
	leaks := hostcheck.Take(t, filepath.Join(dataDir, "sandboxes"), filepath.Join(dataDir, "network"))
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("daemon: %v", err)
		}
		leaks.AssertNoLeaks(t)
	})
	url := "http://" + addr
	admin, err = client.New(url, key)
	if err != nil {
		t.Fatal(err)
	}
	k, err := admin.CreateKey(context.Background(), api.CreateKeyRequest{Tenant: "acme", Name: "templates"})
	if err != nil {
		t.Fatal(err)
	}
	tenant, err = client.New(url, k.Key)
	if err != nil {
		t.Fatal(err)
	}
	return admin, tenant, k.Key, []string{"AIRLOCK_URL=" + url, "AIRLOCK_API_KEY=" + k.Key, "PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, dataDir
}

func tarOf(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for n, d := range files {
		tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(d)), Typeflag: tar.TypeReg})
		tw.Write([]byte(d))
	}
	tw.Close()
	return buf.Bytes()
}

func apiCode(err error) string {
	var ae *client.APIError
	if errors.As(err, &ae) {
		return ae.Code
	}
	return ""
}

// server.py writes a marker a second after it starts, then serves
// forever: the sandbox may only be reported ready once the marker is there.
const serverPy = `import time, os
time.sleep(1)
open("/tmp/ready-marker", "w").write(os.environ.get("APP_MODE", "") + "\n")
while True:
    time.sleep(60)
`

func TestTemplatesEndToEnd(t *testing.T) {
	admin, tc, key, cliEnv, dataDir := templateDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	spec := "FROM debian:bookworm\nENV APP_MODE=test\nWORKDIR /srv\nCOPY server.py /srv/\nUSER user\n"
	start, ready := "python3 /srv/server.py", "test -s /tmp/ready-marker"
	st, err := tc.BuildTemplate(ctx, api.TemplateBuildRequest{Name: "web", Dockerfile: spec, StartCmd: &start, ReadyCmd: &ready},
		client.BuildUploads{Context: bytes.NewReader(tarOf(t, map[string]string{"server.py": serverPy}))})
	if err != nil {
		t.Fatal(err)
	}
	if st.Name != "web" || st.Version != 1 || !strings.HasPrefix(st.BuildID, "bld_") {
		t.Fatalf("build started %+v", st)
	}
	var logBuf bytes.Buffer
	b, err := tc.FollowTemplateBuild(ctx, st.BuildID, &logBuf)
	if err != nil {
		t.Fatal(err)
	}
	if b.Status != api.BuildReady || !strings.Contains(logBuf.String(), "step 3/4 (line 4) COPY server.py /srv/") {
		t.Fatalf("build %+v, streamed log:\n%s", b, logBuf.String())
	}

	t.Run("start-and-ready", func(t *testing.T) {
		sbx, err := tc.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "web", Env: map[string]string{"EXTRA": "1"}})
		if err != nil {
			t.Fatal(err)
		}
		defer tc.DeleteSandbox(ctx, sbx.ID)
		if sbx.Template != "web" || sbx.TemplateVersion != 1 || sbx.ReadyMS < 1000 {
			t.Errorf("sandbox %+v: ready before the ready check could pass", sbx)
		}
		// Reported ready only after the ready command passed.
		res, err := tc.Exec(ctx, sbx.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "cat /tmp/ready-marker; echo $APP_MODE $EXTRA; id -un"}})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == nil || *res.ExitCode != 0 || deref(res.Stdout) != "test\ntest 1\nuser\n" {
			t.Errorf("exec: %+v", res)
		}
		// The start command is an exec of the sandbox, still running.
		l, err := tc.Execs(ctx, sbx.ID, client.ExecListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, e := range l.Execs {
			if e.Shell != nil && *e.Shell == start && e.Status == api.ExecRunning {
				found = true
			}
		}
		if !found {
			t.Errorf("start command not among the execs: %+v", l.Execs)
		}
	})

	t.Run("failing-start", func(t *testing.T) {
		bad, never := "echo starting; exit 3", "false"
		st, err := tc.BuildTemplate(ctx, api.TemplateBuildRequest{Name: "broken", Dockerfile: "FROM web\n", StartCmd: &bad, ReadyCmd: &never}, client.BuildUploads{})
		if err != nil {
			t.Fatal(err)
		}
		if b, err := tc.FollowTemplateBuild(ctx, st.BuildID, io.Discard); err != nil || b.Status != api.BuildReady {
			t.Fatalf("build %+v %v", b, err)
		}
		_, err = tc.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "broken"})
		if err == nil || !strings.Contains(err.Error(), "template start command exited (exit code 3) before the ready check passed") {
			t.Errorf("create with a failing start command: %v", err)
		}
		// The template's defect is permanent: no retryable 503.
		var ae *client.APIError
		if !errors.As(err, &ae) || ae.StatusCode != http.StatusBadRequest || ae.Code != api.CodeTemplateUnsupported {
			t.Errorf("create with a failing start command: %#v, want 400 %s", err, api.CodeTemplateUnsupported)
		}
	})

	t.Run("list-get-versions", func(t *testing.T) {
		l, err := tc.ListTemplates(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]api.Template{}
		for _, tp := range l.Templates {
			got[tp.Name] = tp
		}
		if w := got["web"]; w.Version != 1 || w.StartCmd != start || w.Env["APP_MODE"] != "test" || w.Layers != 2 || w.Source != "spec" || w.From != "debian:bookworm" {
			t.Errorf("web listed as %+v", w)
		}
		if p := got["python"]; p.Status != api.TemplateNotBuilt || !p.Shipped {
			t.Errorf("python listed as %+v", p)
		}
		// Another tenant does not see acme's templates.
		al, _ := admin.ListTemplates(ctx)
		if len(al.Templates) < len(l.Templates) {
			t.Errorf("admin sees fewer templates than a tenant")
		}
		if _, err := admin.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "web"}); apiCode(err) != api.CodeTemplateNotFound {
			t.Errorf("another tenant used acme's template: %v", err)
		}
		tp, err := tc.GetTemplate(ctx, "web@1")
		if err != nil || tp.Version != 1 || tp.BuildID != st.BuildID {
			t.Errorf("web@1: %+v %v", tp, err)
		}
		if _, err := tc.GetTemplate(ctx, "web@7"); apiCode(err) != api.CodeTemplateNotFound {
			t.Errorf("web@7: %v", err)
		}
	})

	t.Run("bad-input", func(t *testing.T) {
		_, err := tc.BuildTemplate(ctx, api.TemplateBuildRequest{Name: "x", Dockerfile: "FROM debian:bookworm\nFETCH it\n"}, client.BuildUploads{})
		var ae *client.APIError
		if !errors.As(err, &ae) || ae.StatusCode != 400 || ae.Message != "line 2: FETCH: unknown instruction (the spec supports FROM, RUN, COPY, ENV, WORKDIR and USER)" {
			t.Errorf("unknown instruction: %v", err)
		}
		st, err := tc.BuildTemplate(ctx, api.TemplateBuildRequest{Name: "fails", Dockerfile: "FROM debian:bookworm\nRUN echo nope; false\n"}, client.BuildUploads{})
		if err != nil {
			t.Fatal(err)
		}
		b, err := tc.FollowTemplateBuild(ctx, st.BuildID, io.Discard)
		if err != nil || b.Status != api.BuildFailed || !strings.Contains(b.Error, "step 1/1 (line 2) RUN echo nope; false: the command exited with status 1; last output:\nnope") {
			t.Errorf("failing RUN: %+v %v", b, err)
		}
		if _, err := tc.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "fails"}); apiCode(err) != api.CodeTemplateNotFound {
			t.Errorf("a failed build was registered: %v", err)
		}
		if _, err := tc.BuildTemplate(ctx, api.TemplateBuildRequest{Name: "nope", Dockerfile: "FROM nope\n"}, client.BuildUploads{}); apiCode(err) != api.CodeInvalidArgument {
			t.Errorf("FROM a missing template: %v", err)
		}
		if _, err := tc.TemplateBuild(ctx, "bld_nosuch"); apiCode(err) != api.CodeNotFound {
			t.Errorf("missing build: %v", err)
		}
		if err := tc.DeleteTemplate(ctx, "base"); apiCode(err) != api.CodePermissionDenied {
			t.Errorf("tenant deleted base: %v", err)
		}
	})

	t.Run("json-context-and-import", func(t *testing.T) {
		// The context as base64 in a JSON body.
		b64 := base64.StdEncoding.EncodeToString(tarOf(t, map[string]string{"hello": "from json\n"}))
		body, _ := json.Marshal(api.TemplateBuildRequest{Name: "jsonctx", Dockerfile: "FROM web\nCOPY hello /tmp/hello\n", ContextTarB64: &b64})
		st := postJSON(t, tc, key, "/v1/templates", body)
		if b, err := tc.FollowTemplateBuild(ctx, st.BuildID, io.Discard); err != nil || b.Status != api.BuildReady {
			t.Fatalf("json build %+v %v", b, err)
		}
		// An OCI image tarball, imported as it is.
		img, err := random.Image(1024, 2)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		tag, _ := name.NewTag("test/random:1")
		if err := tarball.Write(tag, img, &buf); err != nil {
			t.Fatal(err)
		}
		ist, err := tc.ImportImage(ctx, "random", &buf)
		if err != nil {
			t.Fatal(err)
		}
		if b, err := tc.FollowTemplateBuild(ctx, ist.BuildID, io.Discard); err != nil || b.Status != api.BuildReady {
			t.Fatalf("import %+v %v", b, err)
		}
		tp, err := tc.GetTemplate(ctx, "random")
		if err != nil || tp.Source != "image" || tp.Layers != 3 { // two image layers and the accounts layer
			t.Errorf("imported template %+v %v", tp, err)
		}
		// Its sandboxes boot: the agent answers even without a shell.
		sbx, err := tc.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "random"})
		if err != nil {
			t.Fatal(err)
		}
		tc.DeleteSandbox(ctx, sbx.ID)
		// Not an image: the build fails and registers nothing.
		bst, err := tc.ImportImage(ctx, "junk", strings.NewReader(strings.Repeat("junk", 1000)))
		if err != nil {
			t.Fatal(err)
		}
		if b, err := tc.FollowTemplateBuild(ctx, bst.BuildID, io.Discard); err != nil || b.Status != api.BuildFailed || !strings.Contains(b.Error, "not an image") {
			t.Errorf("junk import %+v %v", b, err)
		}
	})

	t.Run("delete-while-used", func(t *testing.T) {
		st, err := tc.BuildTemplate(ctx, api.TemplateBuildRequest{Name: "temp", Dockerfile: "FROM debian:bookworm\nRUN echo kept > /marker\n"}, client.BuildUploads{})
		if err != nil {
			t.Fatal(err)
		}
		if b, err := tc.FollowTemplateBuild(ctx, st.BuildID, io.Discard); err != nil || b.Status != api.BuildReady {
			t.Fatalf("build %+v %v", b, err)
		}
		sbx, err := tc.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "temp"})
		if err != nil {
			t.Fatal(err)
		}
		layers, _ := filepath.Glob(filepath.Join(dataDir, "templates", "layers", "*"))
		if err := tc.DeleteTemplate(ctx, "temp"); err != nil {
			t.Fatal(err)
		}
		if _, err := tc.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "temp"}); apiCode(err) != api.CodeTemplateNotFound {
			t.Errorf("create from a deleted template: %v", err)
		}
		kick(t, tc)
		res, err := tc.Exec(ctx, sbx.ID, api.ExecRequest{Cmd: []string{"cat", "/marker"}})
		if err != nil || deref(res.Stdout) != "kept\n" {
			t.Errorf("the sandbox of a deleted template: %+v %v", res, err)
		}
		if now, _ := filepath.Glob(filepath.Join(dataDir, "templates", "layers", "*")); len(now) < len(layers) {
			t.Errorf("layers in use were collected: %d → %d", len(layers), len(now))
		}
		if err := tc.DeleteSandbox(ctx, sbx.ID); err != nil {
			t.Fatal(err)
		}
		// Once the sandbox is gone, the next collection removes its layer.
		deadline := time.Now().Add(30 * time.Second)
		for {
			kick(t, tc)
			now, _ := filepath.Glob(filepath.Join(dataDir, "templates", "layers", "*"))
			if len(now) < len(layers) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the deleted template's layer was never collected")
			}
			time.Sleep(200 * time.Millisecond)
		}
	})

	t.Run("cli", func(t *testing.T) {
		_, cli := buildBinaries(t)
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "Spec"), []byte("FROM web\nCOPY note.txt /srv/\n"), 0o644)
		os.MkdirAll(filepath.Join(dir, "ctx"), 0o755)
		os.WriteFile(filepath.Join(dir, "ctx", "note.txt"), []byte("cli\n"), 0o644)
		runCLI := func(args ...string) (string, string, int) {
			cmd := exec.CommandContext(ctx, cli, args...)
			cmd.Env = cliEnv
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			return out.String(), errb.String(), code
		}
		out, errOut, code := runCLI("template", "build", "-f", filepath.Join(dir, "Spec"), "--name", "clitest", filepath.Join(dir, "ctx"))
		if code != 0 || out != "clitest@1\n" || !strings.Contains(errOut, "step 1/1 (line 2) COPY note.txt /srv/") {
			t.Fatalf("template build: exit %d, stdout %q, stderr:\n%s", code, out, errOut)
		}
		out, _, code = runCLI("template", "ls")
		if code != 0 || !strings.Contains(out, "clitest") || !strings.Contains(out, "not_built") {
			t.Errorf("template ls: %d\n%s", code, out)
		}
		os.WriteFile(filepath.Join(dir, "Bad"), []byte("FROM web\nRUN exit 9\n"), 0o644)
		_, errOut, code = runCLI("template", "build", "-f", filepath.Join(dir, "Bad"), "--name", "clibad")
		if code != 1 || !strings.Contains(errOut, "exited with status 9") || !strings.Contains(errOut, "(build_failed)") {
			t.Errorf("failing build: exit %d, stderr:\n%s", code, errOut)
		}
		if _, errOut, code = runCLI("template", "rm", "clitest"); code != 0 {
			t.Errorf("template rm: %d %s", code, errOut)
		}
		if _, errOut, code = runCLI("template", "info", "clitest"); code != 1 || !strings.Contains(errOut, "template_not_found") {
			t.Errorf("info after rm: %d %s", code, errOut)
		}
	})
}

// kick makes the daemon's collector run: it runs at every template
// deletion (and every minute).
func kick(t *testing.T, c *client.Client) {
	t.Helper()
	ctx := context.Background()
	st, err := c.BuildTemplate(ctx, api.TemplateBuildRequest{Name: "kicker", Dockerfile: "FROM debian:bookworm\nENV K=1\n"}, client.BuildUploads{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.FollowTemplateBuild(ctx, st.BuildID, io.Discard); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteTemplate(ctx, "kicker"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
}

// postJSON posts body with key and decodes a 202.
func postJSON(t *testing.T, c *client.Client, key, path string, body []byte) api.TemplateBuildStarted {
	t.Helper()
	req, _ := http.NewRequest("POST", c.BaseURL()+path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != 202 {
		t.Fatalf("POST %s: %d %s", path, res.StatusCode, b)
	}
	var st api.TemplateBuildStarted
	json.Unmarshal(b, &st)
	return st
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
