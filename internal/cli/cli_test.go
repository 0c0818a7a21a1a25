package cli

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/airlockhq/airlock/api"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// cliRun is one CLI invocation's setup and outcome.
type cliRun struct {
	env        map[string]string
	stdin      string
	interrupts chan os.Signal
	home       string
	sys        sysProbe

	out *syncBuffer // live stdout, for tests that act on output

	code           int
	stdout, stderr string
}

// syncBuffer is a bytes.Buffer safe to read while the CLI writes it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitFor polls until s appears in b.
func (b *syncBuffer) waitFor(s string) {
	for !strings.Contains(b.String(), s) {
		time.Sleep(5 * time.Millisecond)
	}
}

// run executes the CLI in-process against url with the good key in the env.
func (r *cliRun) run(t *testing.T, url string, args ...string) *cliRun {
	t.Helper()
	env := map[string]string{"AIRLOCK_URL": url, "AIRLOCK_API_KEY": "ak_good"}
	for k, v := range r.env {
		env[k] = v
	}
	if r.interrupts == nil {
		r.interrupts = make(chan os.Signal, 2)
	}
	if r.home == "" {
		r.home = t.TempDir()
	}
	if r.sys == nil {
		r.sys = fakeSys{}
	}
	if r.out == nil {
		r.out = &syncBuffer{}
	}
	var stderr bytes.Buffer
	a := &app{
		stdin: strings.NewReader(r.stdin), stdout: r.out, stderr: &stderr,
		getenv:     func(k string) string { return env[k] },
		interrupts: r.interrupts, winch: make(chan os.Signal),
		homeDir: func() (string, error) { return r.home, nil },
		sys:     r.sys,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r.code = a.run(ctx, args)
	r.stdout, r.stderr = r.out.String(), stderr.String()
	return r
}

func runCLI(t *testing.T, url string, args ...string) *cliRun {
	t.Helper()
	return (&cliRun{}).run(t, url, args...)
}

func TestExecExitCodes(t *testing.T) {
	f, srv := newFakeAPI(t)
	f.addSandbox("sbx_1")
	tests := []struct {
		name       string
		args       []string
		stdin      string
		wantCode   int
		wantStdout string
		wantStderr string // substring
	}{
		{name: "success", args: []string{"exec", "sbx_1", "--", "echo", "hello", "world"}, wantCode: 0, wantStdout: "hello world\n"},
		{name: "exit code propagates", args: []string{"exec", "sbx_1", "--", "exit", "42"}, wantCode: 42, wantStdout: "out\n", wantStderr: "err\n"},
		{name: "exit 1 propagates", args: []string{"exec", "sbx_1", "--", "exit", "1"}, wantCode: 1, wantStdout: "out\n"},
		{name: "no dash", args: []string{"exec", "sbx_1", "echo", "x"}, wantCode: 0, wantStdout: "x\n"},
		{name: "shell", args: []string{"exec", "--shell", "exit 7", "sbx_1"}, wantCode: 7, wantStdout: "out\n"},
		// The docker/kubectl exec convention: 124 timeout, 125 airlock's
		// own failure, 126/127 cannot start, 128+N a signal.
		{name: "timeout", args: []string{"exec", "sbx_1", "--", "timeout"}, wantCode: 124, wantStderr: "command timed out (exec_timeout)"},
		{name: "killed", args: []string{"exec", "sbx_1", "--", "killed"}, wantCode: 137, wantStderr: "killed by SIGKILL (killed_by_user)"},
		{name: "killed by SIGTERM", args: []string{"exec", "sbx_1", "--", "term"}, wantCode: 143, wantStderr: "killed by SIGTERM (killed_by_user)"},
		{name: "oom", args: []string{"exec", "sbx_1", "--", "oom"}, wantCode: 137, wantStderr: "out of memory (out_of_memory)"},
		{name: "sandbox expired under it", args: []string{"exec", "sbx_1", "--", "expired"}, wantCode: 137, wantStderr: "sandbox stopped (sandbox_stopped)"},
		{name: "cannot start, old server", args: []string{"exec", "sbx_1", "--", "nosuch"}, wantCode: 127, wantStderr: `executable file not found (exec_failed)`},
		{name: "not found", args: []string{"exec", "sbx_1", "--", "notfound"}, wantCode: 127, wantStderr: `not found in $PATH (exec_failed)`},
		{name: "not executable", args: []string{"exec", "sbx_1", "--", "noexec"}, wantCode: 126, wantStderr: `permission denied (exec_failed)`},
		{name: "missing cwd is not a missing command", args: []string{"exec", "sbx_1", "--", "nocwd"}, wantCode: 126, wantStderr: `no such file or directory (exec_failed)`},
		{name: "cannot start, no reason", args: []string{"exec", "sbx_1", "--", "failed"}, wantCode: 126, wantStderr: `could not start (exec_failed)`},
		{name: "the server's exit code wins", args: []string{"exec", "sbx_1", "--", "badinterp"}, wantCode: 126, wantStderr: `interpreter /nope not found (exec_failed)`},
		{name: "agent lost", args: []string{"exec", "sbx_1", "--", "agentlost"}, wantCode: 125, wantStderr: "sandbox agent (agent_unavailable)"},
		{name: "no stdin without -i", args: []string{"exec", "sbx_1", "--", "cat"}, stdin: "not sent", wantCode: 0, wantStdout: ""},
		{name: "missing sandbox", args: []string{"exec", "sbx_nope", "--", "echo"}, wantCode: 125,
			wantStderr: "airlock: sandbox not found (sandbox_not_found)\n"},
		{name: "no command", args: []string{"exec", "sbx_1"}, wantCode: 125, wantStderr: "missing command"},
		{name: "two sandboxes", args: []string{"exec", "sbx_1", "sbx_2", "--", "echo"}, wantCode: 125, wantStderr: "exactly one SANDBOX before -- (usage)"},
		{name: "shell and argv", args: []string{"exec", "--shell", "ls", "sbx_1", "--", "ls"}, wantCode: 125, wantStderr: "not both (usage)"},
		{name: "bad env", args: []string{"exec", "-e", "NOEQUALS", "sbx_1", "--", "echo"}, wantCode: 125, wantStderr: "want KEY=VALUE (usage)"},
		{name: "unknown flag", args: []string{"exec", "--bogus", "sbx_1", "--", "echo"}, wantCode: 125, wantStderr: "unknown flag: --bogus (usage)"},
		{name: "bad output flag", args: []string{"exec", "-o", "yaml", "sbx_1", "--", "echo"}, wantCode: 125, wantStderr: "(usage)"},
		{name: "run: no server", args: []string{"run", "--url", "http://127.0.0.1:1", "--", "echo"}, wantCode: 125, wantStderr: "(unavailable)"},
		{name: "run: not found", args: []string{"run", "--", "notfound"}, wantCode: 127, wantStderr: "(exec_failed)"},
		// Commands that run nothing in a sandbox keep 1 for an error.
		{name: "other command's error", args: []string{"sandbox", "info", "sbx_nope"}, wantCode: 1, wantStderr: "(sandbox_not_found)"},
		{name: "other command's usage error", args: []string{"sandbox", "ls", "--bogus"}, wantCode: 1, wantStderr: "(usage)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := (&cliRun{stdin: tt.stdin}).run(t, srv.URL, tt.args...)
			if r.code != tt.wantCode {
				t.Errorf("exit code %d, want %d (stderr %q)", r.code, tt.wantCode, r.stderr)
			}
			if r.stdout != tt.wantStdout {
				t.Errorf("stdout %q, want %q", r.stdout, tt.wantStdout)
			}
			if !strings.Contains(r.stderr, tt.wantStderr) {
				t.Errorf("stderr %q, want it to contain %q", r.stderr, tt.wantStderr)
			}
			if (r.code == exitError || r.code == exitAirlock) && strings.Count(r.stderr, "\n") != 1 {
				t.Errorf("an error must be one line, got %q", r.stderr)
			}
		})
	}
	// The request carried the flags.
	r := runCLI(t, srv.URL, "exec", "--user", "root", "--cwd", "/tmp", "--timeout", "2m", "-e", "A=1", "sbx_1", "--", "echo")
	if r.code != 0 {
		t.Fatalf("exec: %d %s", r.code, r.stderr)
	}
	f.mu.Lock()
	last := f.execs[len(f.execs)-1]
	f.mu.Unlock()
	if last.User != "root" || last.Cwd != "/tmp" || last.TimeoutS == nil || *last.TimeoutS != 120 || last.Env["A"] != "1" {
		t.Errorf("exec request = %+v", last)
	}
	if last.Stdin == nil || *last.Stdin != "" {
		t.Errorf("without -i stdin must be given (empty) so the server closes it: %v", last.Stdin)
	}
}

func TestExecStreamsStdin(t *testing.T) {
	f, srv := newFakeAPI(t)
	f.addSandbox("sbx_1")
	// Binary, and larger than one stdin request.
	in := strings.Repeat("\x00\xffabc", 30000)
	r := (&cliRun{stdin: in}).run(t, srv.URL, "exec", "-i", "sbx_1", "--", "cat")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if r.stdout != in {
		t.Errorf("stdout has %d bytes, want the %d sent", len(r.stdout), len(in))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.stdinSizes) < 2 {
		t.Errorf("stdin went in %d request(s), want it chunked", len(f.stdinSizes))
	}
	if last := f.execs[len(f.execs)-1]; last.Stdin != nil {
		t.Errorf("-i must leave stdin open (no stdin in the request), got %q", *last.Stdin)
	}
}

func TestExecInterrupt(t *testing.T) {
	f, srv := newFakeAPI(t)
	f.addSandbox("sbx_1")
	r := &cliRun{interrupts: make(chan os.Signal, 2), out: &syncBuffer{}}
	go func() {
		// Once output arrived the CLI knows the exec id (start comes first).
		r.out.waitFor("started")
		r.interrupts <- os.Interrupt // forwarded as SIGINT
		time.Sleep(50 * time.Millisecond)
		r.interrupts <- os.Interrupt // detaches
	}()
	r.run(t, srv.URL, "exec", "sbx_1", "--", "hang")
	if r.code != exitInterrupted {
		t.Errorf("exit code %d, want %d; stderr %q", r.code, exitInterrupted, r.stderr)
	}
	if r.stdout != "started\n" {
		t.Errorf("stdout %q", r.stdout)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Equal(f.signals, []string{"ex_1:SIGINT"}) {
		t.Errorf("signals sent %v, want [ex_1:SIGINT]", f.signals)
	}
	if !strings.Contains(r.stderr, "detached") {
		t.Errorf("stderr %q should say the command keeps running", r.stderr)
	}
}

func TestRun(t *testing.T) {
	f, srv := newFakeAPI(t)
	r := runCLI(t, srv.URL, "run", "--template", "python", "--memory", "1G", "--ttl", "10m", "-e", "K=V", "--meta", "a=b", "--timeout", "30", "--", "exit", "3")
	if r.code != 3 || r.stdout != "out\n" {
		t.Fatalf("run: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	f.mu.Lock()
	created, idem, execs := f.created, f.idem, f.execs
	left := len(f.sandboxes)
	f.mu.Unlock()
	if len(created) != 1 {
		t.Fatalf("created %d sandboxes", len(created))
	}
	c := created[0]
	if c.Template != "python" || c.Resources == nil || c.Resources.MemoryMB != 1024 || c.TimeoutS == nil || *c.TimeoutS != 600 ||
		c.Env["K"] != "V" || c.Metadata["a"] != "b" {
		t.Errorf("create request = %+v", c)
	}
	if !strings.HasPrefix(idem[0], "cli-") {
		t.Errorf("run should create with an idempotency key, got %q", idem[0])
	}
	if execs[0].TimeoutS == nil || *execs[0].TimeoutS != 30 {
		t.Errorf("exec timeout = %v", execs[0].TimeoutS)
	}
	if left != 0 {
		t.Errorf("%d sandboxes left after run", left)
	}
	if !slices.Contains(f.callList(), "DELETE /v1/sandboxes/sbx_new1") {
		t.Errorf("no delete among calls %v", f.callList())
	}
}

func TestRunDeletesWhenInterrupted(t *testing.T) {
	f, srv := newFakeAPI(t)
	r := &cliRun{interrupts: make(chan os.Signal, 2)}
	go func() {
		<-f.execStarted
		r.interrupts <- os.Interrupt
	}()
	r.run(t, srv.URL, "run", "--", "hang")
	if r.code != exitInterrupted {
		t.Errorf("exit code %d, want %d (stderr %q)", r.code, exitInterrupted, r.stderr)
	}
	f.mu.Lock()
	left, signals := len(f.sandboxes), f.signals
	f.mu.Unlock()
	if left != 0 {
		t.Errorf("interrupted run left %d sandboxes", left)
	}
	if len(signals) != 0 {
		t.Errorf("run should delete, not signal: %v", signals)
	}
}

func TestRunDeletesWhenExecFails(t *testing.T) {
	f, srv := newFakeAPI(t)
	r := runCLI(t, srv.URL, "run", "--", "nosuch")
	if r.code != exitNotFound {
		t.Errorf("exit code %d, want %d", r.code, exitNotFound)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.sandboxes) != 0 {
		t.Error("sandbox left after a failed run")
	}
}

func TestCp(t *testing.T) {
	f, srv := newFakeAPI(t)
	f.addSandbox("sbx_1")
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("a.txt", "alpha", 0o600)
	write("proj/main.py", "print(1)\n", 0o755)
	write("proj/sub/data.csv", "x,y\n1,2\n", 0o644)
	os.Symlink("main.py", filepath.Join(dir, "proj", "link"))

	ok := func(r *cliRun) {
		t.Helper()
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
	}
	// File up, to an explicit name and into an existing directory.
	ok(runCLI(t, srv.URL, "cp", filepath.Join(dir, "a.txt"), "sbx_1:/tmp/b.txt"))
	ok(runCLI(t, srv.URL, "cp", filepath.Join(dir, "a.txt"), "sbx_1:/home/user"))
	ok(runCLI(t, srv.URL, "cp", filepath.Join(dir, "a.txt"), "sbx_1:rel.txt"))
	// Directory up as a tar.
	ok(runCLI(t, srv.URL, "cp", filepath.Join(dir, "proj"), "sbx_1:/home/user/proj"))
	// stdin up.
	ok((&cliRun{stdin: "from stdin"}).run(t, srv.URL, "cp", "-", "sbx_1:/tmp/in"))

	f.mu.Lock()
	got := map[string]string{}
	for p, e := range f.files {
		switch {
		case e.dir:
			got[p] = "dir"
		case e.link != "":
			got[p] = "-> " + e.link
		default:
			got[p] = string(e.data) + " " + e.mode
		}
	}
	f.mu.Unlock()
	want := map[string]string{
		"/home/user":                   "dir",
		"/tmp/b.txt":                   "alpha 0600",
		"/home/user/a.txt":             "alpha 0600",
		"/home/user/rel.txt":           "alpha 0600",
		"/home/user/proj":              "dir",
		"/home/user/proj/main.py":      "print(1)\n 0755",
		"/home/user/proj/link":         "-> main.py",
		"/home/user/proj/sub":          "dir",
		"/home/user/proj/sub/data.csv": "x,y\n1,2\n 0644",
		"/tmp/in":                      "from stdin 0644",
	}
	for p, w := range want {
		if got[p] != w {
			t.Errorf("sandbox %s = %q, want %q", p, got[p], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("sandbox has %d entries, want %d: %v", len(got), len(want), got)
	}

	// File down, to a name and into a directory; directory down; stdout.
	out := t.TempDir()
	ok(runCLI(t, srv.URL, "cp", "sbx_1:/tmp/b.txt", filepath.Join(out, "b")))
	ok(runCLI(t, srv.URL, "cp", "sbx_1:/tmp/b.txt", out))
	ok(runCLI(t, srv.URL, "cp", "sbx_1:/home/user/proj", filepath.Join(out, "p2")))
	r := runCLI(t, srv.URL, "cp", "sbx_1:/tmp/in", "-")
	ok(r)
	if r.stdout != "from stdin" {
		t.Errorf("cp to stdout = %q", r.stdout)
	}
	check := func(p, content string, mode os.FileMode) {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			return
		}
		fi, _ := os.Stat(p)
		if string(b) != content || fi.Mode().Perm() != mode {
			t.Errorf("%s = %q %v, want %q %v", p, b, fi.Mode().Perm(), content, mode)
		}
	}
	check(filepath.Join(out, "b"), "alpha", 0o600)
	check(filepath.Join(out, "b.txt"), "alpha", 0o600)
	check(filepath.Join(out, "p2", "main.py"), "print(1)\n", 0o755)
	check(filepath.Join(out, "p2", "sub", "data.csv"), "x,y\n1,2\n", 0o644)
	if l, err := os.Readlink(filepath.Join(out, "p2", "link")); err != nil || l != "main.py" {
		t.Errorf("symlink = %q, %v", l, err)
	}
	// Into an existing directory: under the source's name.
	ok(runCLI(t, srv.URL, "cp", "sbx_1:/home/user/proj", out))
	check(filepath.Join(out, "proj", "sub", "data.csv"), "x,y\n1,2\n", 0o644)

	// Errors.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"cp", "sbx_1:/nope", out}, "no such file or directory (not_found)"},
		{[]string{"cp", filepath.Join(dir, "nope"), "sbx_1:/tmp/x"}, "no such file or directory (not_found)"},
		{[]string{"cp", "a", "b"}, "(usage)"},
		{[]string{"cp", "sbx_1:/a", "sbx_2:/b"}, "(usage)"},
		{[]string{"cp", filepath.Join(dir, "a.txt"), "sbx_gone:/tmp/x"}, "sandbox not found (sandbox_not_found)"},
	} {
		r := runCLI(t, srv.URL, tc.args...)
		if r.code != 1 || !strings.Contains(r.stderr, tc.want) || !strings.HasPrefix(r.stderr, "airlock: ") {
			t.Errorf("%v: code %d stderr %q, want 1 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}

// tarOf builds a tar from entries (name, type, body-or-linkname).
func tarOf(t *testing.T, entries [][3]string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e[0], Mode: 0o644}
		switch e[1] {
		case "dir":
			h.Typeflag = tar.TypeDir
			h.Mode = 0o755
		case "symlink":
			h.Typeflag, h.Linkname = tar.TypeSymlink, e[2]
		case "hardlink":
			h.Typeflag, h.Linkname = tar.TypeLink, e[2]
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e[2]))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e[2]))
		}
	}
	tw.Close()
	return buf.Bytes()
}

// TestCpRejectsTarSlip: a hostile sandbox cannot make `cp` write outside
// the destination, by name or through a symlink it sent earlier.
func TestCpRejectsTarSlip(t *testing.T) {
	f, srv := newFakeAPI(t)
	f.addSandbox("sbx_1")
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	os.Mkdir(outside, 0o755)
	tests := []struct {
		name    string
		entries [][3]string
	}{
		{"dotdot", [][3]string{{"../outside/pwned", "file", "x"}}},
		{"absolute", [][3]string{{"/tmp/pwned-airlock-test", "file", "x"}}},
		{"through symlink", [][3]string{{"ln", "symlink", "../outside"}, {"ln/pwned", "file", "x"}}},
		{"through absolute symlink", [][3]string{{"ln", "symlink", outside}, {"ln/pwned", "file", "x"}}},
		{"hardlink out", [][3]string{{"hl", "hardlink", "../outside/victim"}}},
	}
	os.WriteFile(filepath.Join(outside, "victim"), []byte("keep"), 0o644)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := "/evil" + string(rune('a'+i))
			f.mu.Lock()
			f.evilTars[p] = tarOf(t, tt.entries)
			f.mu.Unlock()
			dest := filepath.Join(base, "dest"+string(rune('a'+i)))
			r := runCLI(t, srv.URL, "cp", "sbx_1:"+p, dest)
			if r.code != 1 {
				t.Errorf("exit %d, want 1 (stderr %q)", r.code, r.stderr)
			}
			if _, err := os.Stat(filepath.Join(outside, "pwned")); err == nil {
				t.Fatal("a file was written outside the destination")
			}
			if _, err := os.Stat("/tmp/pwned-airlock-test"); err == nil {
				os.Remove("/tmp/pwned-airlock-test")
				t.Fatal("a file was written at an absolute path")
			}
			if b, _ := os.ReadFile(filepath.Join(outside, "victim")); string(b) != "keep" {
				t.Fatal("a file outside the destination changed")
			}
		})
	}
	// A symlink to a file inside the destination is fine, and a later
	// regular entry of the same name replaces the link instead of writing
	// through it.
	f.mu.Lock()
	f.evilTars["/okay"] = tarOf(t, [][3]string{{"real", "file", "r"}, {"ln", "symlink", "real"}, {"ln", "file", "new"}})
	f.mu.Unlock()
	dest := filepath.Join(base, "okay")
	if r := runCLI(t, srv.URL, "cp", "sbx_1:/okay", dest); r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if b, _ := os.ReadFile(filepath.Join(dest, "real")); string(b) != "r" {
		t.Errorf("real = %q: written through the symlink", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dest, "ln")); string(b) != "new" {
		t.Errorf("ln = %q", b)
	}
}

func TestErrorOutput(t *testing.T) {
	f, srv := newFakeAPI(t)
	f.addSandbox("sbx_1")
	// A port with nothing listening.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String()
	l.Close()
	tests := []struct {
		name  string
		url   string
		env   map[string]string
		args  []string
		want  string
		code  int
		exact bool
	}{
		{name: "not found", url: srv.URL, args: []string{"sandbox", "info", "sbx_x"},
			want: "airlock: sandbox not found (sandbox_not_found)\n", code: 1, exact: true},
		{name: "bad key", url: srv.URL, env: map[string]string{"AIRLOCK_API_KEY": "ak_bad"}, args: []string{"sandbox", "ls"},
			want: "airlock: missing or unknown api key (unauthenticated)\n", code: 1, exact: true},
		{name: "conflict", url: srv.URL, args: []string{"sandbox", "pause", "sbx_1"}, code: 0},
		{name: "conflict again", url: srv.URL, args: []string{"sandbox", "pause", "sbx_1"},
			want: "airlock: sandbox is paused (invalid_state)\n", code: 1, exact: true},
		{name: "no key at all", url: srv.URL, env: map[string]string{"AIRLOCK_API_KEY": ""}, args: []string{"sandbox", "ls"},
			want: "missing or unknown api key; no API key found: set AIRLOCK_API_KEY or ~/.config/airlock/key (see airlock --help) (unauthenticated)\n", code: 1},
		{name: "server down", url: dead, args: []string{"sandbox", "ls"}, want: "(unavailable)\n", code: 1},
		{name: "bad output flag", url: srv.URL, args: []string{"-o", "yaml", "sandbox", "ls"}, want: "(usage)\n", code: 1},
		{name: "unknown command", url: srv.URL, args: []string{"frobnicate"}, want: "(usage)\n", code: 1},
		{name: "bad memory", url: srv.URL, args: []string{"sandbox", "create", "--memory", "lots"}, want: "(usage)\n", code: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := (&cliRun{env: tt.env}).run(t, tt.url, tt.args...)
			if r.code != tt.code {
				t.Errorf("exit %d, want %d (stderr %q)", r.code, tt.code, r.stderr)
			}
			if tt.code == 0 {
				return
			}
			if (tt.exact && r.stderr != tt.want) || !strings.HasSuffix(r.stderr, tt.want) || !strings.HasPrefix(r.stderr, "airlock: ") {
				t.Errorf("stderr %q, want %q", r.stderr, tt.want)
			}
			if strings.Count(r.stderr, "\n") != 1 {
				t.Errorf("stderr is not one line: %q", r.stderr)
			}
		})
	}
}

func TestKeyDiscovery(t *testing.T) {
	f, srv := newFakeAPI(t)
	f.addSandbox("sbx_1")
	home := t.TempDir()
	os.MkdirAll(filepath.Join(home, ".config", "airlock"), 0o700)
	os.WriteFile(filepath.Join(home, ".config", "airlock", "key"), []byte("ak_good\n"), 0o600)
	keyFile := filepath.Join(t.TempDir(), "k")
	os.WriteFile(keyFile, []byte("ak_bad"), 0o600)
	tests := []struct {
		name string
		env  map[string]string
		args []string
		ok   bool
	}{
		{name: "config file", env: map[string]string{"AIRLOCK_API_KEY": ""}, ok: true},
		{name: "env wins over file", env: map[string]string{"AIRLOCK_API_KEY": "ak_bad"}, ok: false},
		{name: "flag wins over env", env: map[string]string{"AIRLOCK_API_KEY": "ak_bad"}, args: []string{"--api-key", "ak_good"}, ok: true},
		{name: "key file env wins over config file", env: map[string]string{"AIRLOCK_API_KEY": "", "AIRLOCK_API_KEY_FILE": keyFile}, ok: false},
		{name: "xdg config home", env: map[string]string{"AIRLOCK_API_KEY": "", "XDG_CONFIG_HOME": t.TempDir()}, ok: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := (&cliRun{env: tt.env, home: home}).run(t, srv.URL, append(tt.args, "sandbox", "info", "sbx_1")...)
			if (r.code == 0) != tt.ok {
				t.Errorf("exit %d (stderr %q), want success %v", r.code, r.stderr, tt.ok)
			}
		})
	}
	r := (&cliRun{env: map[string]string{"AIRLOCK_API_KEY": "", "AIRLOCK_API_KEY_FILE": "/nonexistent/k"}}).run(t, srv.URL, "sandbox", "ls")
	if r.code != 1 || !strings.Contains(r.stderr, "reading api key file") {
		t.Errorf("missing explicit key file: %d %q", r.code, r.stderr)
	}
}

func TestSandboxCommands(t *testing.T) {
	f, srv := newFakeAPI(t)
	f.addSandbox("sbx_a")
	f.addSandbox("sbx_b")
	r := runCLI(t, srv.URL, "sandbox", "create", "--template", "py", "--cpu", "0.5", "--disk", "2G", "--network", "allowlist", "--allow", "pypi.org", "--idempotency-key", "k1")
	if r.code != 0 || r.stdout != "sbx_new1\n" {
		t.Fatalf("create: %d %q %q", r.code, r.stdout, r.stderr)
	}
	f.mu.Lock()
	c, idem := f.created[0], f.idem[0]
	f.mu.Unlock()
	if c.Resources == nil || c.Resources.CPU != 0.5 || c.Resources.DiskMB != 2048 || c.Network == nil ||
		c.Network.Mode != "allowlist" || !slices.Equal(c.Network.Allow, []string{"pypi.org"}) || idem != "k1" {
		t.Errorf("create request %+v idem %q", c, idem)
	}
	r = runCLI(t, srv.URL, "sandbox", "ls")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 4 || !strings.HasPrefix(lines[0], "ID") || !strings.HasPrefix(lines[1], "sbx_a") ||
		!strings.Contains(lines[1], "user=u-42") || !strings.Contains(lines[3], "py@1") {
		t.Errorf("ls table:\n%s\n%s", r.stdout, r.stderr)
	}
	r = runCLI(t, srv.URL, "-o", "json", "sandbox", "ls", "--limit", "2")
	var list []api.Sandbox
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 2 || list[0].ID != "sbx_a" {
		t.Errorf("ls json: %v %q", err, r.stdout)
	}
	r = runCLI(t, srv.URL, "-o", "json", "sandbox", "info", "sbx_b")
	var s api.Sandbox
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil || s.ID != "sbx_b" || s.State != "running" {
		t.Errorf("info json: %v %q", err, r.stdout)
	}
	r = runCLI(t, srv.URL, "sandbox", "info", "sbx_b")
	if !strings.Contains(r.stdout, "state:") || !strings.Contains(r.stdout, "running") || !strings.Contains(r.stdout, "base@1") {
		t.Errorf("info table: %q", r.stdout)
	}
	// rm several: the missing one does not stop the others (delete is idempotent anyway).
	r = runCLI(t, srv.URL, "sandbox", "rm", "sbx_a", "sbx_b")
	if r.code != 0 || r.stdout != "sbx_a\nsbx_b\n" {
		t.Errorf("rm: %d %q %q", r.code, r.stdout, r.stderr)
	}
	f.mu.Lock()
	n := len(f.sandboxes)
	f.mu.Unlock()
	if n != 1 {
		t.Errorf("%d sandboxes after rm, want 1", n)
	}
}

func TestKeysCommands(t *testing.T) {
	_, srv := newFakeAPI(t)
	r := runCLI(t, srv.URL, "keys", "create", "--tenant", "acme", "--name", "ci")
	if r.code != 0 || r.stdout != "ak_newsecret\n" || !strings.Contains(r.stderr, "key_2") {
		t.Errorf("keys create: %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, srv.URL, "keys", "create")
	if r.code != 1 || !strings.Contains(r.stderr, "--tenant is required (usage)") {
		t.Errorf("keys create without tenant: %d %q", r.code, r.stderr)
	}
	r = runCLI(t, srv.URL, "keys", "ls")
	if r.code != 0 || !strings.Contains(r.stdout, "key_1") || strings.Contains(r.stdout, "ak_good") {
		t.Errorf("keys ls: %q", r.stdout)
	}
}

// TestKeysCreateFormat: --format e2b asks the daemon for an e2b_ key and
// prints it; native is the default and is sent as no field at all (what a
// daemon before formats accepts); a daemon that ignores the field gets its
// native key revoked and the command fails.
func TestKeysCreateFormat(t *testing.T) {
	f, srv := newFakeAPI(t)
	r := runCLI(t, srv.URL, "keys", "create", "--tenant", "acme", "--format", "e2b")
	if r.code != 0 || r.stdout != "e2b_0123456789abcdef0123456789abcdef01234567\n" {
		t.Errorf("--format e2b: %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, srv.URL, "keys", "create", "--tenant", "acme", "--format", "native")
	if r.code != 0 || r.stdout != "ak_newsecret\n" {
		t.Errorf("--format native: %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, srv.URL, "keys", "create", "--tenant", "acme", "--format", "hex")
	if r.code != 1 || !strings.Contains(r.stderr, "--format must be native or e2b (usage)") {
		t.Errorf("--format hex: %d %q", r.code, r.stderr)
	}
	f.mu.Lock()
	got := slices.Clone(f.keyRequests)
	f.ignoreKeyFormat = true
	f.mu.Unlock()
	if len(got) != 2 || got[0].Format != "e2b" || got[1].Format != "" {
		t.Errorf("requests %+v, want format e2b then none", got)
	}
	r = runCLI(t, srv.URL, "keys", "create", "--tenant", "acme", "--format", "e2b")
	if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, "does not issue e2b keys") {
		t.Errorf("daemon without formats: %d %q %q", r.code, r.stdout, r.stderr)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Equal(f.keysDeleted, []string{"key_2"}) {
		t.Errorf("keys revoked %v, want the native key the daemon made", f.keysDeleted)
	}
}

func TestShell(t *testing.T) {
	f, srv := newFakeAPI(t)
	f.addSandbox("sbx_1")
	// Not a terminal: the session still works, without raw mode.
	r := (&cliRun{stdin: "ls\nexit 5\n"}).run(t, srv.URL, "shell", "sbx_1")
	if r.code != 5 {
		t.Errorf("exit %d, want 5 (stderr %q)", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "LS\n") || !strings.Contains(r.stdout, "EXIT 5") {
		t.Errorf("stdout %q", r.stdout)
	}
	r = runCLI(t, srv.URL, "shell", "sbx_none")
	if r.code != exitAirlock || r.stderr != "airlock: sandbox not found (sandbox_not_found)\n" {
		t.Errorf("shell on a missing sandbox: %d %q", r.code, r.stderr)
	}
}

func TestVersion(t *testing.T) {
	_, srv := newFakeAPI(t)
	r := runCLI(t, srv.URL, "version")
	if r.code != 0 || !strings.Contains(r.stdout, "airlock dev") || !strings.Contains(r.stdout, "server  9.9.9") {
		t.Errorf("version: %q", r.stdout)
	}
	r = runCLI(t, "http://127.0.0.1:1", "version")
	if r.code != 0 || !strings.Contains(r.stdout, "server  unknown") {
		t.Errorf("version without a server must still succeed: %d %q", r.code, r.stdout)
	}
}
