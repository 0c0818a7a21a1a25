package daemon

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// cliRunner runs the airlock binary against the test daemon.
func cliRunner(ctx context.Context, t *testing.T, env []string) func(args ...string) (stdout, stderr string, code int) {
	_, cli := buildBinaries(t)
	return func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.CommandContext(ctx, cli, args...)
		cmd.Env = env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			return out.String(), errb.String(), ee.ExitCode()
		case err != nil:
			t.Fatal(err)
		}
		return out.String(), errb.String(), 0
	}
}

// slowSpec is a template whose build takes seconds (its RUN sleeps), so
// that a create sent right after the build started finds it running. The
// tag keeps each one's step out of the others' cache.
func slowSpec(tag string) string {
	return fmt.Sprintf("FROM debian:bookworm\nRUN sleep 8 && echo built-%s > /built\n", tag)
}

// TestCreateWaitsForTemplateBuild: a create of a template whose first
// build runs answers template_building with the build's id (it was
// template_not_found, and a shipped template's first use an unstructured
// 503); with wait_for_template it waits and gets the sandbox; a failed
// build is template_build_failed; the CLI waits with the build's log.
func TestCreateWaitsForTemplateBuild(t *testing.T) {
	_, tc, _, cliEnv, _ := templateDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	build := func(name, spec string) api.TemplateBuildStarted {
		t.Helper()
		st, err := tc.BuildTemplate(ctx, api.TemplateBuildRequest{Name: name, Dockerfile: spec}, client.BuildUploads{})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	catBuilt := func(id, want string) {
		t.Helper()
		res, err := tc.Exec(ctx, id, api.ExecRequest{Cmd: []string{"cat", "/built"}})
		if err != nil || deref(res.Stdout) != want {
			t.Errorf("sandbox of the waited-for template: %+v %v, want %q", res, err, want)
		}
	}

	st := build("slow", slowSpec("a"))
	_, err := tc.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "slow"})
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusServiceUnavailable || ae.Code != api.CodeTemplateBuilding ||
		ae.BuildID != st.BuildID || ae.RetryAfter <= 0 || !client.TemplateBuilding(err) || client.BuildOf(err) != st.BuildID {
		t.Fatalf("create while the first build runs: %#v, want 503 template_building naming %s with Retry-After", err, st.BuildID)
	}
	sbx, err := tc.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "slow", WaitForTemplate: true})
	if err != nil {
		t.Fatalf("create with wait_for_template: %v", err)
	}
	if sbx.Template != "slow" || sbx.TemplateVersion != st.Version {
		t.Errorf("sandbox %+v, want slow@%d", sbx, st.Version)
	}
	catBuilt(sbx.ID, "built-a\n")
	if err := tc.DeleteSandbox(ctx, sbx.ID); err != nil {
		t.Error(err)
	}

	t.Run("failed-build", func(t *testing.T) {
		st := build("broken", "FROM debian:bookworm\nRUN sleep 3; exit 3\n")
		_, err := tc.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "broken", WaitForTemplate: true})
		var ae *client.APIError
		if !errors.As(err, &ae) || ae.StatusCode != http.StatusFailedDependency || ae.Code != api.CodeTemplateBuildFailed ||
			ae.BuildID != st.BuildID || !strings.Contains(ae.Message, "exited with status 3") {
			t.Fatalf("create waiting for a failing build: %#v, want 424 template_build_failed naming %s", err, st.BuildID)
		}
	})

	runCLI := cliRunner(ctx, t, cliEnv)
	t.Run("cli-sandbox-create", func(t *testing.T) {
		st := build("slow2", slowSpec("b"))
		out, errOut, code := runCLI("sandbox", "create", "--template", "slow2")
		id := strings.TrimSpace(out)
		if code != 0 || !strings.HasPrefix(id, "sbx_") {
			t.Fatalf("sandbox create: exit %d, stdout %q, stderr:\n%s", code, out, errOut)
		}
		defer tc.DeleteSandbox(ctx, id)
		for _, want := range []string{"template slow2 is being built (build " + st.BuildID, "\n  [", "step 1/1 (line 2) RUN sleep 8 && echo built-b", "template slow2 is ready"} {
			if !strings.Contains(errOut, want) {
				t.Errorf("stderr lacks %q:\n%s", want, errOut)
			}
		}
		catBuilt(id, "built-b\n")
	})
	t.Run("cli-run", func(t *testing.T) {
		build("slow3", slowSpec("c"))
		out, errOut, code := runCLI("run", "--template", "slow3", "--", "cat", "/built")
		if code != 0 || out != "built-c\n" || !strings.Contains(errOut, "template slow3 is being built") {
			t.Errorf("run: exit %d, stdout %q, stderr:\n%s", code, out, errOut)
		}
	})
}

// TestCopyKeepsMtimesAndChownsCreatedDirs: COPY keeps the context's file
// mtimes (it wrote 1970), and --chown owns the directories the copy
// created (they stayed root's) but not the ones that were there.
func TestCopyKeepsMtimesAndChownsCreatedDirs(t *testing.T) {
	_, tc, _, _, _ := templateDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	t1 := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i, e := range []struct{ name, data string }{{"app/", ""}, {"app/a.txt", "a\n"}, {"app/sub/", ""}, {"app/sub/b.txt", "b\n"}, {"top.txt", "top\n"}} {
		h := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), Typeflag: tar.TypeReg, ModTime: t1.Add(time.Duration(i) * time.Hour)}
		if strings.HasSuffix(e.name, "/") {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.data))
	}
	tw.Close()
	spec := "FROM debian:bookworm\nCOPY --chown=user:user app/ /opt/new/deeper/\nCOPY --chown=user top.txt /srv/made/top.txt\nCOPY top.txt /srv/plain/top.txt\n"
	st, err := tc.BuildTemplate(ctx, api.TemplateBuildRequest{Name: "copied", Dockerfile: spec}, client.BuildUploads{Context: bytes.NewReader(buf.Bytes())})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := tc.FollowTemplateBuild(ctx, st.BuildID, io.Discard); err != nil || b.Status != api.BuildReady {
		t.Fatalf("build: %+v %v", b, err)
	}
	sbx, err := tc.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "copied"})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.DeleteSandbox(ctx, sbx.ID)
	res, err := tc.Exec(ctx, sbx.ID, api.ExecRequest{Cmd: []string{"stat", "-c", "%n %U %Y",
		"/opt", "/opt/new", "/opt/new/deeper", "/opt/new/deeper/a.txt", "/opt/new/deeper/sub", "/opt/new/deeper/sub/b.txt",
		"/srv", "/srv/made", "/srv/made/top.txt", "/srv/plain", "/srv/plain/top.txt"}})
	if err != nil || res.ExitCode == nil || *res.ExitCode != 0 {
		t.Fatalf("stat: %+v %v", res, err)
	}
	got := map[string][2]string{}
	for _, l := range strings.Split(strings.TrimSpace(deref(res.Stdout)), "\n") {
		f := strings.Fields(l)
		got[f[0]] = [2]string{f[1], f[2]}
	}
	mtime := func(i int) string { return fmt.Sprint(t1.Add(time.Duration(i) * time.Hour).Unix()) }
	for p, want := range map[string][2]string{
		"/opt/new/deeper/a.txt": {"user", mtime(1)}, "/opt/new/deeper/sub/b.txt": {"user", mtime(3)},
		"/srv/made/top.txt": {"user", mtime(4)}, "/srv/plain/top.txt": {"root", mtime(4)},
	} {
		if got[p] != want {
			t.Errorf("%s: owner and mtime %v, want %v", p, got[p], want)
		}
	}
	for p, owner := range map[string]string{
		"/opt": "root", "/opt/new": "user", "/opt/new/deeper": "user", "/opt/new/deeper/sub": "user",
		"/srv": "root", "/srv/made": "user", "/srv/plain": "root",
	} {
		if got[p][0] != owner {
			t.Errorf("%s owned by %q, want %s", p, got[p][0], owner)
		}
	}
}

// TestCpKeepsMtimes: `airlock cp SBX:dir ./local` keeps the mtimes of the
// files and directories it copies out (it gave them the time of the copy).
func TestCpKeepsMtimes(t *testing.T) {
	_, tc, _, cliEnv, _ := templateDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sbx, err := tc.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.DeleteSandbox(ctx, sbx.ID)
	script := `set -e; cd /home/user; mkdir -p d/sub; echo a > d/sub/a.txt; echo f > f.txt
touch -d '2001-02-03 04:05:06 UTC' d/sub/a.txt f.txt
touch -d '2002-02-03 04:05:06 UTC' d/sub
touch -d '2003-02-03 04:05:06 UTC' d`
	if res, err := tc.Exec(ctx, sbx.ID, api.ExecRequest{Shell: &script}); err != nil || res.ExitCode == nil || *res.ExitCode != 0 {
		t.Fatalf("setup: %+v %v", res, err)
	}
	dst := t.TempDir()
	runCLI := cliRunner(ctx, t, cliEnv)
	for _, args := range [][]string{{"cp", sbx.ID + ":d", filepath.Join(dst, "d")}, {"cp", sbx.ID + ":f.txt", dst}} {
		if _, errOut, code := runCLI(args...); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
	}
	at := func(y int) time.Time { return time.Date(y, 2, 3, 4, 5, 6, 0, time.UTC) }
	for p, want := range map[string]time.Time{"d": at(2003), "d/sub": at(2002), "d/sub/a.txt": at(2001), "f.txt": at(2001)} {
		fi, err := os.Stat(filepath.Join(dst, p))
		if err != nil {
			t.Fatal(err)
		}
		if !fi.ModTime().Equal(want) {
			t.Errorf("%s: mtime %v, want %v", p, fi.ModTime().UTC(), want)
		}
	}
}
