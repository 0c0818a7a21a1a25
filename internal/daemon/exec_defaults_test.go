package daemon

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// TestTemplateWorkdirAndUserApplyToExecs: a template built FROM base with
// WORKDIR and USER runs its sandboxes' execs there and as that user, as
// docker exec does: plain execs, PTY execs and code contexts; the request's
// own cwd and user win, and the exec record names what was used.
func TestTemplateWorkdirAndUserApplyToExecs(t *testing.T) {
	_, tc, _, _, _ := templateDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	spec := "FROM base\nRUN useradd -m -u 1234 -s /bin/sh app\nWORKDIR /opt/app\nUSER app\n"
	st, err := tc.BuildTemplate(ctx, api.TemplateBuildRequest{Name: "workdir-user", Dockerfile: spec}, client.BuildUploads{})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := tc.FollowTemplateBuild(ctx, st.BuildID, io.Discard); err != nil || b.Status != api.BuildReady {
		t.Fatalf("build %+v %v", b, err)
	}
	sbx, err := tc.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "workdir-user"})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.DeleteSandbox(context.Background(), sbx.ID)

	tests := []struct {
		name string
		req  api.ExecRequest
		want string
	}{
		{"defaults", api.ExecRequest{Shell: sh("pwd; id -un")}, "/opt/app\napp\n"},
		{"explicit-cwd", api.ExecRequest{Shell: sh("pwd; id -un"), Cwd: "/tmp"}, "/tmp\napp\n"},
		{"explicit-user", api.ExecRequest{Shell: sh("pwd; id -un"), User: "root"}, "/opt/app\nroot\n"},
		{"explicit-both", api.ExecRequest{Shell: sh("pwd; id -un"), User: "user", Cwd: "/home/user"}, "/home/user\nuser\n"},
		{"pty", api.ExecRequest{Shell: sh("pwd; id -un"), PTY: true}, "/opt/app\r\napp\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := tc.Exec(ctx, sbx.ID, tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != api.ExecExited || deref(res.Stdout) != tt.want {
				t.Fatalf("exec: %+v stdout %q, want %q", res, deref(res.Stdout), tt.want)
			}
			wantCwd, wantUser, _ := strings.Cut(strings.ReplaceAll(strings.TrimSpace(tt.want), "\r", ""), "\n")
			rec, err := tc.GetExec(ctx, sbx.ID, res.ID)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Cwd != wantCwd || rec.User != wantUser {
				t.Fatalf("record cwd %q user %q, want %q %q", rec.Cwd, rec.User, wantCwd, wantUser)
			}
		})
	}
	t.Run("code-context", func(t *testing.T) {
		out, err := tc.RunCode(ctx, sbx.ID, api.CodeRequest{Code: "pwd; id -un", Language: "bash"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if out.Stdout != "/opt/app\napp\n" || out.Error != nil {
			t.Fatalf("code cell: stdout %q stderr %q error %+v", out.Stdout, out.Stderr, out.Error)
		}
	})
}

func sh(s string) *string { return &s }
