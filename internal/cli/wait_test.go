package cli

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
)

// TestCreateWaitsForTemplateBuild: a create refused with template_building
// says so, shows the build's log, and creates once the build ended; a
// failed build is an error naming it; --wait-template=false fails at once.
func TestCreateWaitsForTemplateBuild(t *testing.T) {
	const log = "[   1.0s] debootstrap bookworm\n[  90.0s] apt-get install 6 packages\n"
	tests := []struct {
		name       string
		args       []string
		failed     bool
		wantCode   int
		wantStdout string
		wantStderr []string
		wantWaits  []bool // wait_for_template of each create
	}{
		{name: "sandbox create", args: []string{"sandbox", "create", "--template", "python"}, wantStdout: "sbx_new2\n",
			wantStderr: []string{"template python is being built (build bld_py", "  [   1.0s] debootstrap bookworm\n  [  90.0s] apt-get", "template python is ready"},
			wantWaits:  []bool{false, true}},
		{name: "run", args: []string{"run", "--template", "python", "--", "echo", "hi"}, wantStdout: "hi\n",
			wantStderr: []string{"is being built (build bld_py", "  [  90.0s] apt-get install"}, wantWaits: []bool{false, true}},
		{name: "code", args: []string{"code", "--template", "python", "1+1"}, wantStdout: "hi\n2\n",
			wantStderr: []string{"is being built (build bld_py", "apt-get install"}, wantWaits: []bool{false, true}},
		{name: "failed build", args: []string{"run", "--template", "python", "--", "echo", "hi"}, failed: true, wantCode: exitAirlock,
			wantStderr: []string{"apt-get install", "bld_py", "(build_failed)"}, wantWaits: []bool{false}},
		{name: "sandbox create without waiting", args: []string{"sandbox", "create", "--template", "python", "--wait-template=false"},
			wantCode: exitError, wantStderr: []string{"(template_building)"}, wantWaits: []bool{false}},
		{name: "run without waiting", args: []string{"run", "--template", "python", "--wait-template=false", "--", "echo"},
			wantCode: exitAirlock, wantStderr: []string{"(template_building)"}, wantWaits: []bool{false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, srv := newFakeAPI(t)
			f.builds["python"] = &fakeBuild{id: "bld_py", log: log, failed: tt.failed}
			r := runCLI(t, srv.URL, tt.args...)
			if r.code != tt.wantCode || (tt.wantStdout != "" && r.stdout != tt.wantStdout) {
				t.Errorf("exit %d stdout %q, want %d %q; stderr %q", r.code, r.stdout, tt.wantCode, tt.wantStdout, r.stderr)
			}
			for _, w := range tt.wantStderr {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr %q lacks %q", r.stderr, w)
				}
			}
			f.mu.Lock()
			var waits []bool
			for _, c := range f.created {
				waits = append(waits, c.WaitForTemplate)
			}
			f.mu.Unlock()
			if len(waits) != len(tt.wantWaits) {
				t.Fatalf("creates asked to wait %v, want %v", waits, tt.wantWaits)
			}
			for i := range waits {
				if waits[i] != tt.wantWaits[i] {
					t.Errorf("creates asked to wait %v, want %v", waits, tt.wantWaits)
				}
			}
		})
	}
}

// TestExecJSON: -o json prints the exec's result with its output as one
// JSON object instead of streaming, with the same exit status.
func TestExecJSON(t *testing.T) {
	f, srv := newFakeAPI(t)
	f.addSandbox("sbx_1")
	r := runCLI(t, srv.URL, "exec", "-o", "json", "sbx_1", "--", "exit", "3")
	if r.code != 3 {
		t.Fatalf("exit %d, want 3; stderr %q", r.code, r.stderr)
	}
	var res api.ExecResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, r.stdout)
	}
	if res.Status != api.ExecExited || res.ExitCode == nil || *res.ExitCode != 3 ||
		res.Stdout == nil || *res.Stdout != "out\n" || res.Stderr == nil || *res.Stderr != "err\n" || res.Encoding != "" {
		t.Errorf("result %+v", res)
	}
	if r.stderr != "" {
		t.Errorf("the command's stderr went to stderr too: %q", r.stderr)
	}
	// Bytes that are not UTF-8: base64, as the API's JSON mode.
	r = runCLI(t, srv.URL, "exec", "-o", "json", "sbx_1", "--", "binary")
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || r.code != 0 {
		t.Fatalf("exit %d, stdout %q: %v", r.code, r.stdout, err)
	}
	out, _ := base64.StdEncoding.DecodeString(*res.Stdout)
	errOut, _ := base64.StdEncoding.DecodeString(*res.Stderr)
	if res.Encoding != "base64" || string(out) != "\xff\xfe" || string(errOut) != "warn\n" {
		t.Errorf("binary result %+v", res)
	}
	// A status other than exited is in the object, and the exit code.
	r = runCLI(t, srv.URL, "exec", "-o", "json", "sbx_1", "--", "oom")
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || r.code != exitOOM || res.Status != api.ExecOOM {
		t.Errorf("oom: exit %d, stdout %q (%v)", r.code, r.stdout, err)
	}
}

// TestShellExit: a terminal's end maps to the exit status as exec's.
func TestShellExit(t *testing.T) {
	code := func(n int) *int { return &n }
	tests := []struct {
		name string
		res  *api.ExecResult
		want int
	}{
		{"no result", nil, 0},
		{"exit 0", &api.ExecResult{Status: api.ExecExited, ExitCode: code(0)}, 0},
		{"exit 3", &api.ExecResult{Status: api.ExecExited, ExitCode: code(3)}, 3},
		{"hangup", &api.ExecResult{Status: api.ExecKilled, Signal: "SIGHUP"}, 129},
		{"sandbox stopped", &api.ExecResult{Status: api.ExecKilled, ErrorCode: api.ExecCodeSandboxStopped}, 137},
		{"oom", &api.ExecResult{Status: api.ExecOOM}, 137},
		{"not found", &api.ExecResult{Status: api.ExecError, ErrorCode: "exec_failed", Error: "executable file not found"}, 127},
		{"agent lost", &api.ExecResult{Status: api.ExecError, ErrorCode: api.ExecCodeAgentUnavailable}, 125},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := 0
			if err := shellExit(tt.res); err != nil {
				got = err.(exitCodeError).code
			}
			if got != tt.want {
				t.Errorf("exit %d, want %d", got, tt.want)
			}
		})
	}
}

// TestCpDownloadKeepsMtimes: files and directories copied out of a
// sandbox keep their modification times.
func TestCpDownloadKeepsMtimes(t *testing.T) {
	f, srv := newFakeAPI(t)
	f.addSandbox("sbx_1")
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	older := old.Add(-24 * time.Hour)
	f.mu.Lock()
	f.files["/home/user/out"] = &fakeFile{dir: true, mode: "0755", mtime: older}
	f.files["/home/user/out/sub"] = &fakeFile{dir: true, mode: "0755", mtime: older.Add(time.Hour)}
	f.files["/home/user/out/sub/a.txt"] = &fakeFile{data: []byte("a"), mode: "0644", mtime: old}
	f.files["/home/user/one.txt"] = &fakeFile{data: []byte("1"), mode: "0644", mtime: old.Add(time.Minute)}
	f.mu.Unlock()
	dst := t.TempDir()
	for _, args := range [][]string{{"cp", "sbx_1:out", filepath.Join(dst, "out")}, {"cp", "sbx_1:one.txt", dst}} {
		if r := runCLI(t, srv.URL, args...); r.code != 0 {
			t.Fatalf("%v: exit %d: %s", args, r.code, r.stderr)
		}
	}
	for p, want := range map[string]time.Time{
		"out": older, "out/sub": older.Add(time.Hour), "out/sub/a.txt": old, "one.txt": old.Add(time.Minute),
	} {
		fi, err := os.Stat(filepath.Join(dst, p))
		if err != nil {
			t.Fatal(err)
		}
		if !fi.ModTime().Equal(want) {
			t.Errorf("%s: mtime %v, want %v", p, fi.ModTime().UTC(), want)
		}
	}
}
