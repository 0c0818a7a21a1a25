package build

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/gvisor"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testutil"
)

// fullSpec uses every instruction and the overlay cases a layer capture
// must keep: deletions (whiteouts), a replaced directory (opaque), hard and
// symbolic links, owners, setuid, a sparse file.
const fullSpec = `FROM debian:bookworm
ENV GREETING="hi there" TOOL_HOME=/opt/tool
WORKDIR /srv/app
RUN echo "$GREETING" > greeting && ln greeting greeting.hard && ln -s greeting greeting.sym \
 && rm -rf /usr/share/doc && rm /etc/debian_version \
 && rm -rf /etc/apt && mkdir /etc/apt && echo replaced > /etc/apt/only \
 && chown user:user greeting && cp /bin/true /usr/local/bin/suid && chmod 4755 /usr/local/bin/suid \
 && truncate -s 1G /srv/sparse
COPY app/ ./
COPY bin/tool $TOOL_HOME/
COPY --chown=user:user app/hello.txt /home/user/hello-copy.txt
USER user
RUN whoami > /home/user/who && id -u >> /home/user/who && touch /home/user/made-by-user
`

func fullContext(t testing.TB) string {
	return contextTar(t, map[string]string{
		"app/": "", "app/hello.txt": "hello\n", "app/sub/": "", "app/sub/deep.txt": "deep\n",
		"app/link": "->hello.txt", "bin/tool": "#!/bin/sh\necho tool ran\n",
	})
}

func TestBuildSpec(t *testing.T) {
	e := newEnv(t, nil)
	st := e.mustBuild(t, Request{Name: "full", Spec: fullSpec, ContextPath: fullContext(t)})
	if st.Version != 1 {
		t.Errorf("version %d, want 1", st.Version)
	}
	c, r := e.sandbox(t, "t1", "full")
	if len(r.Layers) != 6 { // base + RUN + 3 COPY + RUN
		t.Errorf("%d layers, want 6: %v", len(r.Layers), r.Layers)
	}
	if r.Config.Env["GREETING"] != "hi there" || r.Config.Workdir != "/srv/app" || r.Config.User != "user" || r.Config.From != DebianFrom {
		t.Errorf("config %+v", r.Config)
	}
	checkFull(t, c)
	t.Run("layers-on-disk", func(t *testing.T) {
		// The layer holds container ids (host uid = container uid) and
		// keeps the sparse file sparse.
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(r.Layers[1], "srv/app/greeting"), &st); err != nil || st.Uid != 1000 {
			t.Errorf("greeting in the layer owned by %d (%v), want 1000", st.Uid, err)
		}
		if err := unix.Stat(filepath.Join(r.Layers[1], "srv/sparse"), &st); err != nil || st.Blocks*512 > 1<<20 {
			t.Errorf("sparse file takes %d bytes in the layer (%v)", st.Blocks*512, err)
		}
	})
	t.Run("log", func(t *testing.T) {
		b, err := e.b.Build(context.Background(), "t1", false, st.BuildID)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"step 3/8 (line 4) RUN echo", "step 8/8 (line 13) RUN whoami", "is ready (6 layers)"} {
			if !strings.Contains(b.Log, want) {
				t.Errorf("log lacks %q:\n%s", want, b.Log)
			}
		}
		if b.Status != api.BuildReady || b.EndedAt == nil {
			t.Errorf("build %+v", b)
		}
	})
}

// checkFull checks, in a sandbox of a template built from fullSpec, what
// every step made and the overlay cases its capture kept.
func checkFull(t *testing.T, c *agentclient.Client) {
	checks := []struct {
		name, script, want string
	}{
		{"run-output", "cat /srv/app/greeting", "hi there\n"},
		{"hardlink", "stat -c '%h %i' /srv/app/greeting | cut -d' ' -f1; [ /srv/app/greeting -ef /srv/app/greeting.hard ] && echo same", "2\nsame\n"},
		{"symlink", "readlink /srv/app/greeting.sym", "greeting\n"},
		{"whiteout", "ls /usr/share/doc /etc/debian_version 2>&1 | wc -l; test -e /etc/debian_version || echo gone", "2\ngone\n"},
		{"opaque", "ls /etc/apt", "only\n"},
		{"owner-changed-in-run", "stat -c '%U:%G' /srv/app/greeting", "user:user\n"},
		{"setuid", "stat -c '%a %U' /usr/local/bin/suid", "4755 root\n"},
		{"sparse", "stat -c '%s' /srv/sparse; [ $(stat -c '%b' /srv/sparse) -lt 100 ] && echo sparse", "1073741824\nsparse\n"},
		{"copy-dir-contents", "cat /srv/app/hello.txt /srv/app/sub/deep.txt; readlink /srv/app/link", "hello\ndeep\nhello.txt\n"},
		{"copy-owner-root", "stat -c '%U %a' /srv/app/hello.txt /opt/tool/tool", "root 644\nroot 755\n"},
		{"copy-env-dest", "/opt/tool/tool", "tool ran\n"},
		{"copy-chown", "stat -c '%U:%G' /home/user/hello-copy.txt", "user:user\n"},
		{"user-step", "cat /home/user/who; stat -c %U /home/user/made-by-user", "user\n1000\nuser\n"},
		{"workdir-made", "stat -c '%F %U' /srv/app", "directory root\n"},
		{"base-intact", "python3 -c 'print(6*7)'; id user", "42\nuid=1000(user) gid=1000(user) groups=1000(user)\n"},
		{"no-build-leftovers", "ls -A /.airlock | sort | tr '\\n' ' '", "airlock-agent "},
	}
	for _, ch := range checks {
		t.Run(ch.name, func(t *testing.T) {
			out, code := run(t, c, "root", nil, ch.script)
			if code != 0 || out != ch.want {
				t.Errorf("%s: %q (exit %d), want %q", ch.script, out, code, ch.want)
			}
		})
	}
}

// TestBuildOnGVisor: the build sandboxes of a template run on the gVisor
// driver as well as on runc (any driver that captures layers), and the
// template it makes holds the same: checked in a runc sandbox, as one from
// a runc build is. (No step of fullSpec leaves files in /tmp: under gVisor
// that is the Sentry's own memory file system, not the writable layer; see
// docs/drivers.md.)
func TestBuildOnGVisor(t *testing.T) {
	e := newEnvOn(t, gvisor.Name, nil)
	e.mustBuild(t, Request{Name: "full", Spec: fullSpec, ContextPath: fullContext(t)})
	if n := e.drv.creates.Load(); n == 0 {
		t.Fatal("no build sandbox was created on the gvisor driver")
	}
	c, _ := e.sandbox(t, "t1", "full")
	checkFull(t, c)
}

// TestRecoverDestroysLeftovers: a builder's Recover destroys the build
// sandboxes a dead daemon left (found through the driver's list) and
// leaves every other sandbox of the driver alone.
func TestRecoverDestroysLeftovers(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	tmpl := driver.Template{Name: "base", Layers: []string{filepath.Join(e.dataDir, "templates", "base", "1", "rootfs")}}
	for _, id := range []string{BuildSandboxPrefix + "leftover1", "sbx_notabuild1"} {
		if _, err := e.runc.Create(ctx, driver.Spec{ID: id, Template: tmpl, Resources: driver.Resources{DiskMB: 64}}); err != nil {
			t.Fatal(err)
		}
		if err := e.runc.Start(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { e.runc.Destroy(context.Background(), "sbx_notabuild1") })
	b, err := New(Config{Store: e.st, Templates: e.tmpl, Driver: e.drv, LayerGrace: -1, GCInterval: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.runc.Inspect(ctx, BuildSandboxPrefix+"leftover1"); !errdefs.IsNotFound(err) {
		t.Errorf("leftover build sandbox after Recover: %v, want not found", err)
	}
	if st, err := e.runc.Inspect(ctx, "sbx_notabuild1"); err != nil || st.State != driver.StateRunning {
		t.Errorf("a sandbox that is not a build's after Recover: %+v, %v; want running", st, err)
	}
}

func TestRebuildUsesCache(t *testing.T) {
	e := newEnv(t, nil)
	ctxPath := fullContext(t)
	first := e.mustBuild(t, Request{Name: "cached", Spec: fullSpec, ContextPath: ctxPath})
	created := e.drv.creates.Load()
	r1, err := e.b.Resolve(context.Background(), "t1", "cached", 1)
	if err != nil {
		t.Fatal(err)
	}

	// Unchanged spec and context: every step is a cache hit, no sandbox.
	again := e.mustBuild(t, Request{Name: "cached", Spec: fullSpec, ContextPath: fullContext(t)})
	if again.Version != first.Version+1 {
		t.Errorf("rebuild version %d, want %d", again.Version, first.Version+1)
	}
	if n := e.drv.creates.Load(); n != created {
		t.Errorf("an unchanged rebuild started %d sandboxes", n-created)
	}
	r2, _ := e.b.Resolve(context.Background(), "t1", "cached", 0)
	if r2.Version != 2 || !slices.Equal(r1.Layers, r2.Layers) {
		t.Errorf("rebuild layers differ: %v vs %v", r1.Layers, r2.Layers)
	}
	b, _ := e.b.Build(context.Background(), "t1", false, again.BuildID)
	if n := strings.Count(b.Log, "  cached\n"); n != 5 {
		t.Errorf("%d cached steps in the log, want 5:\n%s", n, b.Log)
	}

	// A changed file of the context rebuilds its COPY and what follows only.
	changed := contextTar(t, map[string]string{
		"app/": "", "app/hello.txt": "hello\n", "app/sub/": "", "app/sub/deep.txt": "deep\n",
		"app/link": "->hello.txt", "bin/tool": "#!/bin/sh\necho tool v2\n",
	})
	e.mustBuild(t, Request{Name: "cached", Spec: fullSpec, ContextPath: changed})
	if n := e.drv.creates.Load() - created; n != 3 { // COPY bin/tool, COPY --chown, RUN whoami
		t.Errorf("a changed context file started %d sandboxes, want 3", n)
	}
	r3, _ := e.b.Resolve(context.Background(), "t1", "cached", 0)
	if !slices.Equal(r3.Layers[:3], r1.Layers[:3]) || r3.Layers[3] == r1.Layers[3] {
		t.Errorf("layers of the changed build: %v, first: %v", r3.Layers, r1.Layers)
	}

	// Another tenant's identical spec does not get this tenant's layers.
	before := e.drv.creates.Load()
	e.mustBuild(t, Request{Tenant: "t2", Name: "cached", Spec: fullSpec, ContextPath: fullContext(t)})
	if e.drv.creates.Load() == before {
		t.Error("a layer made by tenant t1's commands was reused for t2")
	}
}

// assertNotRegistered checks that no version of name is usable or listed.
func assertNotRegistered(t *testing.T, e *env, name string) {
	t.Helper()
	if _, err := e.b.Resolve(context.Background(), "t1", name, 0); !errdefs.IsNotFound(err) {
		t.Errorf("Resolve(%s) after a failed build: %v", name, err)
	}
	l, err := e.b.List(context.Background(), "t1", false)
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range l.Templates {
		if tp.Name == name {
			t.Errorf("%s listed after a failed build: %+v", name, tp)
		}
	}
	left, _ := filepath.Glob(filepath.Join(e.dataDir, "templates", "layers", ".tmp-*"))
	if len(left) > 0 {
		t.Errorf("unfinished layers left: %v", left)
	}
}

func TestBuildBadInput(t *testing.T) {
	e := newEnv(t, nil)
	e.mustBuild(t, Request{Name: "parent", Spec: "FROM debian:bookworm\nRUN touch /parent\n"})
	e.mustBuild(t, Request{Name: "child", Spec: "FROM parent\nRUN touch /child\n"})
	notTar := filepath.Join(t.TempDir(), "junk.tar")
	os.WriteFile(notTar, []byte(strings.Repeat("this is not an image ", 100)), 0o644)
	escaping := writeRawTarFile(t, "../../outside", "x")

	tests := []struct {
		name     string
		req      Request
		atSubmit bool     // refused before a version is taken
		want     []string // in the error
	}{
		{"unknown-instruction", Request{Spec: "FROM debian:bookworm\nRUN true\nFETCH x\n"}, true,
			[]string{"line 3: FETCH: unknown instruction"}},
		{"failing-run", Request{Spec: "FROM debian:bookworm\nRUN echo about to fail; echo oops >&2; exit 3\n"}, false,
			[]string{"step 1/1 (line 2) RUN echo about to fail", "exited with status 3", "about to fail", "oops"}},
		{"run-wants-network", Request{Spec: "FROM debian:bookworm\nRUN python3 -c 'import socket; socket.getaddrinfo(\"deb.debian.org\", 80)'\n"}, false,
			[]string{"exited with status 1", "gives build sandboxes no network"}},
		{"run-unknown-user", Request{Spec: "FROM debian:bookworm\nUSER nobody-here\nRUN true\n"}, false,
			[]string{"step 2/2", "could not start", "nobody-here"}},
		{"missing-copy-source", Request{Spec: "FROM debian:bookworm\nCOPY missing.txt /x\n", ContextPath: contextTar(t, map[string]string{"other": "1"})}, false,
			[]string{"step 1/1 (line 2) COPY missing.txt /x", `source "missing.txt" is not in the build context`}},
		{"copy-without-context", Request{Spec: "FROM debian:bookworm\nCOPY a /a\n"}, false,
			[]string{"not in the build context"}},
		{"cyclic-from-self", Request{Name: "loop", Spec: "FROM loop\n"}, true,
			[]string{"line 1: FROM: cyclic FROM", "loop cannot be built from itself"}},
		{"cyclic-from-lineage", Request{Name: "parent", Spec: "FROM child\nRUN true\n"}, true,
			[]string{"cyclic FROM", "child is built from parent"}},
		{"from-missing", Request{Spec: "FROM nosuch\n"}, true, []string{"template nosuch not found"}},
		{"from-registry", Request{Spec: "FROM python:3.12\n"}, true, []string{"not pulled from registries"}},
		{"not-an-image", Request{ImagePath: notTar}, false, []string{"not an image", "not a tar archive"}},
		{"image-escapes", Request{ImagePath: escaping}, false, []string{`"../../outside" escapes the archive's root`}},
		{"context-escapes", Request{Spec: "FROM debian:bookworm\nCOPY . /x\n", ContextPath: escaping}, true,
			[]string{`"../../outside" escapes the archive's root`}},
		{"shipped-name", Request{Name: "python", Spec: "FROM debian:bookworm\n"}, true, []string{"taken by a shipped template"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			if req.Name == "" {
				req.Name = "bad-" + tc.name
			}
			req.Tenant = "t1"
			// Submit takes the upload files over: give it copies.
			req.ContextPath, req.ImagePath = copyFile(t, req.ContextPath), copyFile(t, req.ImagePath)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			created := e.drv.creates.Load()
			st, err := e.b.Submit(ctx, req)
			var msg string
			if tc.atSubmit {
				if err == nil {
					t.Fatalf("Submit accepted it: %+v", st)
				}
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Errorf("error %v is not invalid_argument", err)
				}
				msg = err.Error()
				if n := e.drv.creates.Load(); n != created {
					t.Errorf("a refused spec started %d sandboxes", n-created)
				}
			} else {
				if err != nil {
					t.Fatalf("Submit: %v", err)
				}
				b, err := e.b.Wait(ctx, st.BuildID)
				if err != nil {
					t.Fatal(err)
				}
				if b.Status != api.BuildFailed {
					t.Fatalf("build %s, want failed; log:\n%s", b.Status, b.Log)
				}
				msg = b.Error
				if !strings.Contains(b.Log, "build failed") {
					t.Errorf("log does not say it failed:\n%s", b.Log)
				}
				if strings.Contains(msg, e.dataDir) {
					t.Errorf("error shows a host path: %s", msg)
				}
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q lacks %q", msg, w)
				}
			}
			switch tc.name {
			case "cyclic-from-lineage": // parent exists, and stays version 1 (below)
			case "shipped-name":
				if _, err := e.b.Resolve(context.Background(), "t1", "python", 0); !errors.Is(err, ErrNotBuilt) {
					t.Errorf("python after the refused build: %v", err)
				}
			default:
				assertNotRegistered(t, e, req.Name)
			}
			for _, p := range []string{req.ContextPath, req.ImagePath} {
				if _, err := os.Stat(p); p != "" && !os.IsNotExist(err) {
					t.Errorf("upload %s not removed: %v", p, err)
				}
			}
		})
	}
	// The cyclic build changed nothing: parent is still version 1.
	if r, err := e.b.Resolve(context.Background(), "t1", "parent", 0); err != nil || r.Version != 1 {
		t.Errorf("parent after the refused cyclic build: %+v %v", r, err)
	}
}

func writeRawTarFile(t *testing.T, name, data string) string {
	t.Helper()
	return writeRawTar(t, []tar.Header{{Name: name, Typeflag: tar.TypeReg, Mode: 0o644}}, map[string]string{name: data})
}

// copyFile copies p ("" stays "") to a new temp file.
func copyFile(t *testing.T, p string) string {
	t.Helper()
	if p == "" {
		return ""
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.CreateTemp(t.TempDir(), "upload-")
	if err != nil {
		t.Fatal(err)
	}
	f.Write(b)
	f.Close()
	return f.Name()
}

func TestVersionsDeleteAndCollect(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	e.mustBuild(t, Request{Name: "app", Spec: "FROM debian:bookworm\nRUN echo one > /version\n"})
	e.mustBuild(t, Request{Name: "app", Spec: "FROM debian:bookworm\nRUN echo two > /version\n"})
	v1, err := e.b.Resolve(ctx, "t1", "app", 1)
	if err != nil {
		t.Fatal(err)
	}
	v2, err := e.b.Resolve(ctx, "t1", "app", 0)
	if err != nil || v2.Version != 2 {
		t.Fatalf("newest %+v %v", v2, err)
	}
	t.Run("pins", func(t *testing.T) {
		c1, _ := e.sandbox(t, "t1", "app@1")
		c2, _ := e.sandbox(t, "t1", "app")
		if out, _ := run(t, c1, "root", nil, "cat /version"); out != "one\n" {
			t.Errorf("app@1: %q", out)
		}
		if out, _ := run(t, c2, "root", nil, "cat /version"); out != "two\n" {
			t.Errorf("app: %q", out)
		}
		tpl, err := e.b.Template(ctx, "t1", false, "app")
		if err != nil || tpl.Version != 2 || !slices.Equal(tpl.Versions, []int{2, 1}) {
			t.Errorf("Template(app) = %+v %v", tpl, err)
		}
		if _, err := e.b.Resolve(ctx, "t2", "app", 0); !errdefs.IsNotFound(err) {
			t.Errorf("another tenant resolved t1's template: %v", err)
		}
	})

	// A live sandbox of tenant t1 uses version 1.
	now := time.Now()
	sbx := store.Sandbox{ID: "sbx_uses_v1", Tenant: "t1", State: "running", DesiredState: "running", Template: "app",
		TemplateVersion: 1, Runtime: "runc", CreatedAt: now, ExpiresAt: now.Add(time.Hour), TimeoutS: 3600}
	if _, err := e.st.CreateSandbox(ctx, sbx, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.b.Delete(ctx, "t2", false, "app"); !errdefs.IsNotFound(err) {
		t.Errorf("tenant t2 deleted t1's template: %v", err)
	}
	if err := e.b.Delete(ctx, "t1", false, "app"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.b.Resolve(ctx, "t1", "app", 1); !errdefs.IsNotFound(err) {
		t.Errorf("a deleted version resolved: %v", err)
	}
	gc, err := e.b.GC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(gc.Versions, []string{"app@2"}) || len(gc.Layers) != 1 {
		t.Errorf("first collection %+v, want app@2 and its one layer", gc)
	}
	for _, l := range v1.Layers {
		if _, err := os.Stat(l); err != nil {
			t.Errorf("layer of the version in use removed: %v", err)
		}
	}
	if _, err := os.Stat(v2.Layers[1]); !os.IsNotExist(err) {
		t.Errorf("layer of the unused deleted version kept: %v", err)
	}

	// The sandbox ends: its version goes at the next collection, the
	// shared base stays.
	sbx.State = "stopped"
	if err := e.st.UpdateSandbox(ctx, sbx); err != nil {
		t.Fatal(err)
	}
	gc, err = e.b.GC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(gc.Versions, []string{"app@1"}) || len(gc.Layers) != 1 {
		t.Errorf("second collection %+v, want app@1 and its layer", gc)
	}
	if _, err := os.Stat(v1.Layers[1]); !os.IsNotExist(err) {
		t.Errorf("layer of app@1 kept after its sandbox ended: %v", err)
	}
	if _, err := os.Stat(v1.Layers[0]); err != nil {
		t.Errorf("the base was collected: %v", err)
	}
	// A new build of the name goes on counting: app@1 never means
	// something else.
	st := e.mustBuild(t, Request{Name: "app", Spec: "FROM debian:bookworm\nRUN echo three > /version\n"})
	if st.Version != 3 {
		t.Errorf("version after deletion %d, want 3", st.Version)
	}
}

func TestFromTemplateInherits(t *testing.T) {
	e := newEnv(t, nil)
	e.mustBuild(t, Request{Name: "py", Spec: "FROM debian:bookworm\nENV APP=base\nWORKDIR /work\nUSER user\nRUN touch mine\n",
		StartCmd: ptr("sleep 1000"), ReadyCmd: ptr("true")})
	e.mustBuild(t, Request{Name: "py-plus", Spec: "FROM py\nENV EXTRA=1\nRUN touch extra && echo $APP > app\n"})
	c, r := e.sandbox(t, "t1", "py-plus")
	if r.Config.Env["APP"] != "base" || r.Config.Env["EXTRA"] != "1" || r.Config.Workdir != "/work" || r.Config.User != "user" {
		t.Errorf("inherited config %+v", r.Config)
	}
	if r.Config.StartCmd != "sleep 1000" || r.Config.ReadyCmd != "true" || !slices.Equal(r.Config.Lineage, []string{"py"}) {
		t.Errorf("start/ready/lineage %+v", r.Config)
	}
	out, code := run(t, c, "root", nil, "stat -c %U /work/mine /work/extra; cat /work/app")
	if code != 0 || out != "user\nuser\nbase\n" {
		t.Errorf("FROM py layers: %q (%d)", out, code)
	}
	// Building py on py-plus would be a cycle, unless pinned on purpose.
	st := e.mustBuild(t, Request{Name: "py", Spec: "FROM py-plus@1\nRUN touch third\n"})
	c3, r3 := e.sandbox(t, "t1", fmt.Sprintf("py@%d", st.Version))
	if out, code := run(t, c3, "root", nil, "ls /work | tr '\\n' ' '"); code != 0 || out != "app extra mine third " {
		t.Errorf("py@2: %q (%d)", out, code)
	}
	if !slices.Equal(r3.Config.Lineage, []string{"py", "py-plus"}) {
		t.Errorf("lineage %v", r3.Config.Lineage)
	}
}

func TestBuildFromImage(t *testing.T) {
	e := newEnv(t, nil)
	img := shellImage(t)
	spec := "FROM image\nENV MARK=from-spec\nRUN echo \"$MARK $IMAGE_VAR\" > /made; rm /etc/motd\n"
	st := e.mustBuild(t, Request{Name: "imported", Spec: spec, ImagePath: img})
	c, r := e.sandbox(t, "t1", "imported")
	if r.Config.Env["IMAGE_VAR"] != "from-image" || r.Config.From != "image" {
		t.Errorf("config %+v", r.Config)
	}
	out, code := run(t, c, "root", nil, `read x < /made; echo "$x"; [ -e /etc/motd ] || echo motd-gone; [ -e /gone ] || echo whiteout-ok; for f in /opq/*; do echo "$f"; done`)
	if code != 0 || out != "from-spec from-image\nmotd-gone\nwhiteout-ok\n/opq/new\n" {
		t.Errorf("imported sandbox: %q (exit %d)", out, code)
	}
	// The default user the API runs commands as was added.
	if out, code := run(t, c, "user", nil, `echo "$HOME"`); code != 0 || out != "/home/user\n" {
		t.Errorf("user in the imported image: %q (%d)", out, code)
	}
	tpl, err := e.b.Template(context.Background(), "t1", false, "imported")
	if err != nil || tpl.Source != "image" || tpl.BuildID != st.BuildID {
		t.Errorf("template %+v %v", tpl, err)
	}
	// Importing the same image again reuses its layers: no sandbox for the
	// cached RUN either.
	before := e.drv.creates.Load()
	st2 := e.mustBuild(t, Request{Name: "imported", Spec: spec, ImagePath: shellImage(t)})
	if e.drv.creates.Load() != before {
		t.Error("re-import with an unchanged spec started a sandbox")
	}
	b, _ := e.b.Build(context.Background(), "t1", false, st2.BuildID)
	if !strings.Contains(b.Log, "3 were in the store") && !strings.Contains(b.Log, "(3 were in the store)") {
		t.Errorf("re-import did not reuse the layers:\n%s", b.Log)
	}
}

// TestShippedTemplates checks the shipped templates that the shared test
// cache holds. Building them takes minutes and the Debian mirror, so it
// happens only when AIRLOCK_TEST_BUILD_SHIPPED names them (e.g. "node").
func TestShippedTemplates(t *testing.T) {
	checks := map[string]string{
		"python":           `python3 -c 'import numpy, pandas, matplotlib, requests; print("ok")'; pip3 --version >/dev/null && echo pip`,
		"node":             `node -e 'console.log("ok")'; npm --version >/dev/null && echo npm`,
		"code-interpreter": `python3 -c 'import ipykernel, numpy, pandas, scipy, sklearn, matplotlib; print("ok")'; echo pip`,
	}
	wantOut := map[string]string{"python": "ok\npip\n", "node": "ok\nnpm\n", "code-interpreter": "ok\npip\n"}
	build := os.Getenv("AIRLOCK_TEST_BUILD_SHIPPED")
	shared := template.NewStore(filepath.Join(testutil.DataDir(), "templates"))
	for _, name := range []string{"node", "python", "code-interpreter"} {
		t.Run(name, func(t *testing.T) {
			if _, _, ok := shared.Current(name); !ok && !strings.Contains(build, name) {
				t.Skipf("%s is not built in %s; set AIRLOCK_TEST_BUILD_SHIPPED=%s to build it (minutes, needs the Debian mirror)", name, testutil.DataDir(), name)
			}
			e := newEnv(t, nil)
			// The shipped template lives in the shared cache, like base.
			if err := os.Symlink(filepath.Join(testutil.DataDir(), "templates", name), filepath.Join(e.dataDir, "templates", name)); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
			defer cancel()
			if _, _, err := shared.EnsureShipped(ctx, name, os.Stderr); err != nil {
				t.Fatal(err)
			}
			st, err := e.b.BuildShipped(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			b, err := e.b.Wait(ctx, st.BuildID)
			if err != nil || b.Status != api.BuildReady {
				t.Fatalf("shipped build: %+v %v", b, err)
			}
			c, _ := e.sandbox(t, "t1", name)
			if out, code := run(t, c, "user", nil, checks[name]); code != 0 || out != wantOut[name] {
				t.Errorf("%s: %q (exit %d)", name, out, code)
			}
		})
	}
}

func TestShippedNotBuiltIsBuiltOnDemand(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	_, err := e.b.Resolve(ctx, "t1", "code-interpreter", 0)
	if !errors.Is(err, ErrNotBuilt) {
		t.Fatalf("Resolve of an unbuilt shipped template: %v", err)
	}
	l, err := e.b.List(ctx, "t1", false)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tp := range l.Templates {
		if tp.Shipped {
			names = append(names, fmt.Sprintf("%s:%s", tp.Name, tp.Status))
		}
	}
	want := []string{"base:ready", "code-interpreter:not_built", "node:not_built", "python:not_built"}
	if !slices.Equal(names, want) {
		t.Errorf("shipped templates listed as %v, want %v", names, want)
	}
	if err := e.b.Delete(ctx, "t1", false, "base"); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("a tenant deleted a shipped template: %v", err)
	}
}

func ptr(s string) *string { return &s }

// BenchmarkRebuildCached measures a rebuild of an unchanged spec (every
// step a cache hit): the target is under 2 s.
func BenchmarkRebuildCached(b *testing.B) {
	e := newEnv(b, nil)
	ctxPath := fullContext(b)
	e.mustBuild(b, Request{Name: "bench", Spec: fullSpec, ContextPath: copyFileB(b, ctxPath)})
	b.ResetTimer()
	for b.Loop() {
		e.mustBuild(b, Request{Name: "bench", Spec: fullSpec, ContextPath: copyFileB(b, ctxPath)})
	}
}

func copyFileB(b *testing.B, p string) string {
	data, err := os.ReadFile(p)
	if err != nil {
		b.Fatal(err)
	}
	f, err := os.CreateTemp(b.TempDir(), "upload-")
	if err != nil {
		b.Fatal(err)
	}
	f.Write(data)
	f.Close()
	return f.Name()
}

// BenchmarkCreateFromTemplate starts sandboxes from base and from a
// template of 6 layers: read side by side, the layers must cost nothing
// measurable (they are mounted read-only and shared, never copied).
func BenchmarkCreateFromTemplate(b *testing.B) {
	e := newEnv(b, nil)
	e.mustBuild(b, Request{Name: "layered", Spec: fullSpec, ContextPath: fullContext(b)})
	for _, ref := range []string{"base", "layered"} {
		b.Run(ref, func(b *testing.B) {
			for b.Loop() {
				c, _, destroy := e.startSandbox(b, "t1", ref)
				if out, _ := run(b, c, "root", nil, "true"); out != "" {
					b.Fatal(out)
				}
				c.Close()
				destroy()
			}
		})
	}
}

func TestFailedBuildStepsKeptForRetry(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.LayerGrace = time.Hour })
	ctx := context.Background()
	_, res := e.build(t, Request{Name: "retry", Spec: "FROM debian:bookworm\nRUN echo slow step > /one\nRUN exit 1\n"})
	if res.Status != api.BuildFailed {
		t.Fatalf("build %s", res.Status)
	}
	if gc, err := e.b.GC(ctx); err != nil || len(gc.Layers) != 0 {
		t.Errorf("collection removed the failed build's finished step: %+v %v", gc, err)
	}
	before := e.drv.creates.Load()
	e.mustBuild(t, Request{Name: "retry", Spec: "FROM debian:bookworm\nRUN echo slow step > /one\nRUN true\n"})
	if n := e.drv.creates.Load() - before; n != 1 {
		t.Errorf("the retry started %d sandboxes, want 1 (the first step cached)", n)
	}
	// A deleted template's layers do not get the grace.
	if err := e.b.Delete(ctx, "t1", false, "retry"); err != nil {
		t.Fatal(err)
	}
	// Deleting also kicks the builder's own collector, which may take the
	// layers before (or after) this call does: what counts is that both go.
	collected := 0
	for range 10 {
		gc, err := e.b.GC(ctx)
		if err != nil {
			t.Fatal(err)
		}
		collected += len(gc.Layers)
		if collected >= 2 || contentLayers(t, e) == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := contentLayers(t, e); n != 0 {
		t.Errorf("%d content layers left after deleting the template (this call collected %d)", n, collected)
	}
}

// contentLayers counts the content layers in the env's layer store.
func contentLayers(t *testing.T, e *env) int {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(e.dataDir, "templates", "layers"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	n := 0
	for _, d := range ents {
		if template.LayerKeyRE.MatchString(d.Name()) {
			n++
		}
	}
	return n
}

// TestRecoverKeepsAnotherDaemonsUploads: two daemons may share a template
// store (the test daemons do); one that starts empties its own upload
// directory only, never the uploaded context of another's running build.
func TestRecoverKeepsAnotherDaemonsUploads(t *testing.T) {
	ctx := context.Background()
	tdir := t.TempDir()
	mk := func(name string) *Builder {
		st, err := store.Open(ctx, filepath.Join(t.TempDir(), "airlock.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		b, err := New(Config{Store: st, Templates: template.NewStore(tdir), UploadDir: filepath.Join(t.TempDir(), name),
			LayerGrace: -1, GCInterval: -1, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	a := mk("a")
	if err := a.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	f, err := a.TempFile()
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	b := mk("b")
	if err := b.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(f.Name()); err != nil {
		t.Fatalf("another daemon's start removed an upload: %v", err)
	}
	// Its own leftovers go.
	if err := a.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(f.Name()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a restart kept a dead build's upload: %v", err)
	}
}
