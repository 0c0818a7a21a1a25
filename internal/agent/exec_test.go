package agent_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agent"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/testutil"
)

func TestExecCommands(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	noExecFile, badShebangFile := filepath.Join(dir, "script.sh"), filepath.Join(dir, "bad-shebang")
	tests := []struct {
		name       string
		req        agentproto.ExecRequest
		stdout     string
		stderr     string
		status     string
		exitCode   int
		signal     string
		errContain string
	}{
		{name: "argv", req: agentproto.ExecRequest{Argv: []string{"echo", "a b", "c"}}, stdout: "a b c\n", status: "exited"},
		{name: "argv_no_shell_expansion", req: agentproto.ExecRequest{Argv: []string{"echo", "$HOME", "*"}}, stdout: "$HOME *\n", status: "exited"},
		{name: "shell", req: agentproto.ExecRequest{Shell: "echo out; echo err >&2; exit 3"}, stdout: "out\n", stderr: "err\n", status: "exited", exitCode: 3},
		{name: "exit_zero", req: agentproto.ExecRequest{Argv: []string{"true"}}, status: "exited"},
		{name: "exit_nonzero", req: agentproto.ExecRequest{Argv: []string{"false"}}, status: "exited", exitCode: 1},
		{name: "own_signal", req: agentproto.ExecRequest{Shell: "kill -SEGV $$"}, status: "exited", exitCode: 128 + 11, signal: "SIGSEGV"},
		// A command that cannot start is an exec with status error and the
		// exit code a shell would give (127 not found, 126 not runnable).
		{name: "no_such_binary", req: agentproto.ExecRequest{Argv: []string{"no-such-binary-xyz"}}, status: "error", exitCode: 127, errContain: "executable file not found in PATH"},
		{name: "no_such_path", req: agentproto.ExecRequest{Argv: []string{"/nonexistent/bin"}}, status: "error", exitCode: 127, errContain: "no such file"},
		{name: "no_exec_bit", req: agentproto.ExecRequest{Argv: []string{noExecFile}}, status: "error", exitCode: 126, errContain: "permission denied"},
		{name: "no_exec_bit_in_path", req: agentproto.ExecRequest{Argv: []string{filepath.Base(noExecFile)}, Env: map[string]string{"PATH": filepath.Dir(noExecFile)}}, status: "error", exitCode: 126, errContain: "permission denied"},
		{name: "directory", req: agentproto.ExecRequest{Argv: []string{"/tmp"}}, status: "error", exitCode: 126, errContain: "is a directory"},
		{name: "missing_interpreter", req: agentproto.ExecRequest{Argv: []string{badShebangFile}}, status: "error", exitCode: 126, errContain: "interpreter"},
	}
	writeFile(t, noExecFile, "#!/bin/sh\necho ran\n")
	writeFile(t, badShebangFile, "#!/nonexistent/interpreter\necho ran\n")
	if err := os.Chmod(badShebangFile, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := e.run(tt.req)
			r := got.result
			if got.stdout.String() != tt.stdout || got.stderr.String() != tt.stderr {
				t.Errorf("stdout %q stderr %q, want %q %q", got.stdout.String(), got.stderr.String(), tt.stdout, tt.stderr)
			}
			if r.Status != tt.status || r.ExitCode != tt.exitCode || r.Signal != tt.signal {
				t.Errorf("result %+v, want status %s exit %d signal %q", r, tt.status, tt.exitCode, tt.signal)
			}
			if !strings.Contains(r.Error, tt.errContain) {
				t.Errorf("error %q, want it to contain %q", r.Error, tt.errContain)
			}
			if r.StdoutBytes != int64(len(tt.stdout)) || r.StderrBytes != int64(len(tt.stderr)) {
				t.Errorf("byte counts %d/%d", r.StdoutBytes, r.StderrBytes)
			}
			if r.EndedAt.Before(r.StartedAt) || r.StartedAt.IsZero() {
				t.Errorf("times %v .. %v", r.StartedAt, r.EndedAt)
			}
		})
	}
}

func TestExecBadRequests(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	tests := []struct {
		name string
		req  agentproto.ExecRequest
		want error
	}{
		{"both_argv_and_shell", agentproto.ExecRequest{ID: "ex_b1", Argv: []string{"true"}, Shell: "true"}, errdefs.ErrInvalidArgument},
		{"neither", agentproto.ExecRequest{ID: "ex_b2"}, errdefs.ErrInvalidArgument},
		{"no_id", agentproto.ExecRequest{Argv: []string{"true"}}, errdefs.ErrInvalidArgument},
		{"output_cap_too_big", agentproto.ExecRequest{ID: "ex_b3", Argv: []string{"true"}, MaxOutputBytes: 65<<20 + 1}, errdefs.ErrInvalidArgument},
		{"bad_env_name", agentproto.ExecRequest{ID: "ex_b4", Argv: []string{"true"}, Env: map[string]string{"A=B": "c"}}, errdefs.ErrInvalidArgument},
		// The request names a user or a directory that is not there: the
		// request fails, no exec exists.
		{"unknown_user", agentproto.ExecRequest{ID: "ex_b5", Argv: []string{"true"}, User: "nobody-here"}, errdefs.ErrInvalidArgument},
		{"missing_cwd", agentproto.ExecRequest{ID: "ex_b6", Argv: []string{"true"}, Cwd: "/nonexistent-dir"}, errdefs.ErrInvalidArgument},
		{"cwd_is_file", agentproto.ExecRequest{ID: "ex_b7", Argv: []string{"true"}, Cwd: "/etc/passwd"}, errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.c.Exec(ctx, tt.req)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if tt.req.ID != "" {
				if _, err := e.c.Wait(ctx, tt.req.ID); !errors.Is(err, errdefs.ErrNotFound) {
					t.Fatalf("a refused exec exists: Wait = %v", err)
				}
			}
		})
	}
	t.Run("duplicate_id", func(t *testing.T) {
		e.run(agentproto.ExecRequest{ID: "ex_dup", Argv: []string{"true"}})
		_, err := e.c.Exec(ctx, agentproto.ExecRequest{ID: "ex_dup", Argv: []string{"true"}})
		if !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Fatalf("err = %v, want already exists", err)
		}
	})
}

func TestExecEnvCwdUser(t *testing.T) {
	testutil.RequiresRoot(t)
	e := newEnv(t)
	tests := []struct {
		name string
		req  agentproto.ExecRequest
		want string
	}{
		{"default_user_ids", agentproto.ExecRequest{Shell: "id -u; id -g; id -G"}, "1000\n1000\n1000 1500\n"},
		{"root", agentproto.ExecRequest{Shell: "id -u", User: "root"}, "0\n"},
		{"default_cwd_is_home", agentproto.ExecRequest{Argv: []string{"pwd"}}, e.home + "\n"},
		{"no_home_runs_in_root", agentproto.ExecRequest{Argv: []string{"pwd"}, User: "nohome"}, "/\n"},
		{"cwd", agentproto.ExecRequest{Argv: []string{"pwd"}, Cwd: "/tmp"}, "/tmp\n"},
		{"default_env", agentproto.ExecRequest{Shell: `echo "$HOME|$USER|$LOGNAME|$SHELL|$LANG|$PATH"`},
			e.home + "|user|user|/bin/sh|C.UTF-8|/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"},
		{"env_override", agentproto.ExecRequest{Shell: `echo "$FOO|$LANG"`, Env: map[string]string{"FOO": "bar", "LANG": "de_DE.UTF-8"}}, "bar|de_DE.UTF-8\n"},
		{"marker_not_overridable", agentproto.ExecRequest{ID: "ex_marker", Shell: `echo "$AIRLOCK_EXEC_ID"`, Env: map[string]string{"AIRLOCK_EXEC_ID": "forged"}}, "ex_marker\n"},
		{"new_session", agentproto.ExecRequest{Shell: `[ "$(cut -d' ' -f6 /proc/$$/stat)" = "$$" ] && echo leader`}, "leader\n"},
		{"oom_score_adj", agentproto.ExecRequest{Shell: `for i in $(seq 200); do [ "$(cat /proc/$$/oom_score_adj)" = 500 ] && break; sleep 0.01; done; cat /proc/$$/oom_score_adj`, User: "root"}, "500\n"},
		{"home_writable_by_user", agentproto.ExecRequest{Shell: `touch f && stat -c %u f`}, "1000\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := e.run(tt.req)
			if got.result.Status != agentproto.StatusExited || got.stdout.String() != tt.want {
				t.Fatalf("got %q (stderr %q, %+v), want %q", got.stdout.String(), got.stderr.String(), got.result, tt.want)
			}
		})
	}
}

// TestExecResultCwd: an exec's result names the directory it ran in, also
// one the request did not name (the user's home, or "/" for a user without
// one) and for a command that could not start, so that the daemon learns it
// without asking again.
func TestExecResultCwd(t *testing.T) {
	testutil.RequiresRoot(t)
	e := newEnv(t)
	tests := []struct {
		name   string
		req    agentproto.ExecRequest
		status string
		want   string
	}{
		{"home", agentproto.ExecRequest{Argv: []string{"pwd"}}, agentproto.StatusExited, e.home},
		{"no_home", agentproto.ExecRequest{Argv: []string{"pwd"}, User: "nohome"}, agentproto.StatusExited, "/"},
		{"asked", agentproto.ExecRequest{Argv: []string{"pwd"}, Cwd: "/tmp"}, agentproto.StatusExited, "/tmp"},
		{"not_started", agentproto.ExecRequest{Argv: []string{"/nonexistent-command"}, Cwd: "/tmp"}, agentproto.StatusError, "/tmp"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := e.run(tt.req)
			if got.result.Status != tt.status || got.result.Cwd != tt.want {
				t.Fatalf("status %s cwd %q (stdout %q), want %s %q", got.result.Status, got.result.Cwd, got.stdout.String(), tt.status, tt.want)
			}
			if tt.status == agentproto.StatusExited && got.stdout.String() != tt.want+"\n" {
				t.Fatalf("ran in %q, result says %q", got.stdout.String(), got.result.Cwd)
			}
		})
	}
}

// TestExecOffsets checks that stdout and stderr share one log with
// consecutive offsets, in the order the output happened.
func TestExecOffsets(t *testing.T) {
	e := newEnv(t)
	got := e.run(agentproto.ExecRequest{Shell: `for i in 1 2 3; do printf "out$i "; sleep 0.02; printf "err$i " >&2; sleep 0.02; done`})
	var next int64
	var combined strings.Builder
	for _, ev := range got.events {
		if ev.Type != agentproto.EventOutput {
			if ev.Offset != next {
				t.Errorf("exit event offset %d, want %d", ev.Offset, next)
			}
			continue
		}
		if ev.Offset != next {
			t.Fatalf("event at %d, want %d", ev.Offset, next)
		}
		next += int64(len(ev.Data))
		combined.Write(ev.Data)
	}
	if combined.String() != "out1 err1 out2 err2 out3 err3 " {
		t.Fatalf("combined %q", combined.String())
	}
	if got.stdout.String() != "out1 out2 out3 " || got.stderr.String() != "err1 err2 err3 " {
		t.Fatalf("stdout %q stderr %q", got.stdout.String(), got.stderr.String())
	}
}

func TestAttachReplay(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	id := newID()
	s, err := e.c.Exec(ctx, agentproto.ExecRequest{ID: id, StdinOpen: true,
		Shell: `echo one; read x; echo two >&2; read y; echo three`})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	next := func(s interface {
		Next() (agentproto.Event, error)
	}) agentproto.Event {
		t.Helper()
		ev, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	if ev := next(s); string(ev.Data) != "one\n" || ev.Offset != 0 {
		t.Fatalf("first event %+v", ev)
	}
	// While it runs: an attach from the middle of a chunk gets its tail.
	a1, err := e.c.Attach(ctx, id, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer a1.Close()
	if ev := next(a1); string(ev.Data) != "e\n" || ev.Offset != 2 || ev.Stream != "stdout" {
		t.Fatalf("attach at 2: %+v", ev)
	}
	if err := e.c.WriteStdin(ctx, id, []byte("go\n")); err != nil {
		t.Fatal(err)
	}
	// Both attachments see the live output.
	for _, st := range []interface {
		Next() (agentproto.Event, error)
	}{s, a1} {
		if ev := next(st); string(ev.Data) != "two\n" || ev.Offset != 4 || ev.Stream != "stderr" {
			t.Fatalf("live event %+v", ev)
		}
	}
	if err := e.c.WriteStdin(ctx, id, []byte("go\n")); err != nil {
		t.Fatal(err)
	}
	first := collect(t, s)
	if first.stdout.String() != "three\n" || first.result.Status != "exited" {
		t.Fatalf("rest %q %+v", first.stdout.String(), first.result)
	}
	collect(t, a1)

	// After the end: replays from any offset.
	tests := []struct {
		from   int64
		stdout string
		stderr string
	}{
		{0, "one\nthree\n", "two\n"},
		{4, "three\n", "two\n"},
		{9, "hree\n", ""},
		{14, "", ""},
		{1000, "", ""},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("from_%d", tt.from), func(t *testing.T) {
			a, err := e.c.Attach(ctx, id, tt.from)
			if err != nil {
				t.Fatal(err)
			}
			got := collect(t, a)
			if got.stdout.String() != tt.stdout || got.stderr.String() != tt.stderr || got.result.Status != "exited" {
				t.Fatalf("from %d: %q %q %+v", tt.from, got.stdout.String(), got.stderr.String(), got.result)
			}
		})
	}
	res, err := e.c.Wait(ctx, id)
	if err != nil || res.ID != id || res.Status != "exited" || res.StdoutBytes != 10 || res.StderrBytes != 4 {
		t.Fatalf("Wait: %+v %v", res, err)
	}
}

func TestManyAttachers(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	id := newID()
	s, err := e.c.Exec(ctx, agentproto.ExecRequest{ID: id, Shell: `i=0; while [ $i -lt 200 ]; do echo line$i; i=$((i+1)); done`})
	if err != nil {
		t.Fatal(err)
	}
	want := collect(t, s).stdout.String()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		c := e.connect()
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := c.Attach(ctx, id, 0)
			if err != nil {
				errs <- err
				return
			}
			var out bytes.Buffer
			for {
				ev, err := a.Next()
				if err != nil {
					break
				}
				out.Write(ev.Data)
			}
			if out.String() != want {
				errs <- fmt.Errorf("attacher got %d bytes, want %d", out.Len(), len(want))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestOutputCap: a stream past the cap keeps its head and its tail; the
// other stream is capped on its own, so what a program says on stderr after
// flooding stdout is kept.
func TestOutputCap(t *testing.T) {
	e := newEnv(t)
	id := newID()
	got := e.run(agentproto.ExecRequest{ID: id, Shell: `echo first; head -c 5000000 /dev/zero; echo last; echo 'Traceback: boom' >&2; exit 1`, MaxOutputBytes: 1000})
	r := got.result
	if r.Status != "exited" || r.ExitCode != 1 {
		t.Fatalf("result %+v", r)
	}
	const total = 6 + 5000000 + 5
	if !r.Truncated || r.StdoutBytes != total || r.StderrBytes != 16 || r.StdoutDropped != total-1000 || r.StderrDropped != 0 {
		t.Fatalf("result %+v", r)
	}
	// A live follower sees the head, then (paced) what the tail holds: at
	// least the end, never more than the whole output.
	if !strings.HasPrefix(got.stdout.String(), "first\n") || !strings.HasSuffix(got.stdout.String(), "\x00last\n") || got.stderr.String() != "Traceback: boom\n" {
		t.Fatalf("followed stdout %q… stderr %q", got.stdout.String()[:min(20, got.stdout.Len())], got.stderr.String())
	}
	// A replay after the end has exactly head and tail, with the offsets
	// of the whole output: the gap is a jump.
	a, err := e.c.Attach(ctxT(t), id, 0)
	if err != nil {
		t.Fatal(err)
	}
	replay := collect(t, a)
	out := replay.stdout.String()
	if len(out) != 1000 || !strings.HasPrefix(out, "first\n") || !strings.HasSuffix(out, "\x00last\n") || replay.stderr.String() != "Traceback: boom\n" {
		t.Fatalf("replayed %d bytes of stdout, stderr %q", len(out), replay.stderr.String())
	}
	var offs []int64
	for _, ev := range replay.events {
		if ev.Type == agentproto.EventOutput {
			offs = append(offs, ev.Offset)
		}
	}
	// (stderr may arrive between two reads of stdout: its offset is
	// wherever it came.)
	if len(offs) < 3 || offs[0] != 0 || offs[1] < 1000 {
		t.Fatalf("replay offsets %v: want 0, then a jump past the dropped bytes", offs)
	}
	if ev := replay.events[len(replay.events)-1]; ev.Offset != total+16 {
		t.Fatalf("exit event offset %d, want %d", ev.Offset, total+16)
	}
	small := e.run(agentproto.ExecRequest{Argv: []string{"echo", "hi"}})
	if small.result.Truncated {
		t.Fatal("small output marked truncated")
	}
}

func TestStdin(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	t.Run("streaming_and_eof", func(t *testing.T) {
		id := newID()
		s, err := e.c.Exec(ctx, agentproto.ExecRequest{ID: id, Argv: []string{"cat"}, Stdin: []byte("first "), StdinOpen: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, chunk := range []string{"abc ", "def"} {
			if err := e.c.WriteStdin(ctx, id, []byte(chunk)); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.c.CloseStdin(ctx, id); err != nil {
			t.Fatal(err)
		}
		got := collect(t, s)
		if got.stdout.String() != "first abc def" || got.result.Status != "exited" {
			t.Fatalf("got %q %+v", got.stdout.String(), got.result)
		}
		if err := e.c.WriteStdin(ctx, id, []byte("late")); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("write after end: %v", err)
		}
	})
	t.Run("up_front", func(t *testing.T) {
		got := e.run(agentproto.ExecRequest{Argv: []string{"wc", "-c"}, Stdin: []byte("12345")})
		if strings.TrimSpace(got.stdout.String()) != "5" {
			t.Fatalf("got %q", got.stdout.String())
		}
	})
	t.Run("none_is_eof", func(t *testing.T) {
		got := e.run(agentproto.ExecRequest{Argv: []string{"cat"}})
		if got.stdout.String() != "" || got.result.Status != "exited" {
			t.Fatalf("got %q %+v", got.stdout.String(), got.result)
		}
	})
	t.Run("large", func(t *testing.T) {
		id := newID()
		s, err := e.c.Exec(ctx, agentproto.ExecRequest{ID: id, Argv: []string{"wc", "-c"}, StdinOpen: true})
		if err != nil {
			t.Fatal(err)
		}
		big := bytes.Repeat([]byte("x"), 3<<20)
		if err := e.c.WriteStdin(ctx, id, big); err != nil {
			t.Fatal(err)
		}
		if err := e.c.CloseStdin(ctx, id); err != nil {
			t.Fatal(err)
		}
		got := collect(t, s)
		if strings.TrimSpace(got.stdout.String()) != strconv.Itoa(len(big)) {
			t.Fatalf("got %q", got.stdout.String())
		}
	})
}

func TestPTY(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	id := newID()
	s, err := e.c.Exec(ctx, agentproto.ExecRequest{ID: id, PTY: &agentproto.PTYSize{Cols: 80, Rows: 24}, StdinOpen: true,
		Shell: `test -t 0 && test -t 1 && echo "tty $TERM"; stty size; read x; stty size`})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out strings.Builder
	readUntil := func(want string) {
		t.Helper()
		for !strings.Contains(out.String(), want) {
			ev, err := s.Next()
			if err != nil {
				t.Fatalf("waiting for %q in %q: %v", want, out.String(), err)
			}
			if ev.Type == agentproto.EventOutput && ev.Stream != agentproto.StreamPTY {
				t.Fatalf("stream %q on a pty", ev.Stream)
			}
			out.Write(ev.Data)
		}
	}
	readUntil("24 80")
	if !strings.Contains(out.String(), "tty xterm-256color") {
		t.Fatalf("not a tty: %q", out.String())
	}
	if err := e.c.Resize(ctx, id, 100, 30); err != nil {
		t.Fatal(err)
	}
	if err := e.c.WriteStdin(ctx, id, []byte("\n")); err != nil {
		t.Fatal(err)
	}
	readUntil("30 100")
	res, err := e.c.Wait(ctx, id)
	if err != nil || res.Status != "exited" || res.ExitCode != 0 {
		t.Fatalf("wait %+v %v", res, err)
	}
	if err := e.c.Resize(ctx, id, 10, 10); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("resize after end: %v", err)
	}
	plain := e.run(agentproto.ExecRequest{ID: newID(), Argv: []string{"true"}})
	if err := e.c.Resize(ctx, plain.result.ID, 10, 10); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("resize of a non-pty exec: %v", err)
	}
}

func TestPTYCloseStdinSendsEOF(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	id := newID()
	s, err := e.c.Exec(ctx, agentproto.ExecRequest{ID: id, PTY: &agentproto.PTYSize{Cols: 80, Rows: 24}, StdinOpen: true,
		Shell: `cat >/dev/null; echo got-eof`})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.c.CloseStdin(ctx, id); err != nil {
		t.Fatal(err)
	}
	got := collect(t, s)
	if !strings.Contains(got.pty.String(), "got-eof") || got.result.Status != "exited" {
		t.Fatalf("got %q %+v", got.pty.String(), got.result)
	}
}

// readPids reads n pids, one per line, from the exec's output.
func readPids(t *testing.T, s interface {
	Next() (agentproto.Event, error)
}, n int) []int {
	t.Helper()
	var buf strings.Builder
	for strings.Count(buf.String(), "\n") < n {
		ev, err := s.Next()
		if err != nil {
			t.Fatalf("reading pids from %q: %v", buf.String(), err)
		}
		buf.Write(ev.Data)
	}
	var pids []int
	for _, f := range strings.Fields(buf.String()) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("bad pid %q", f)
		}
		pids = append(pids, pid)
	}
	return pids
}

// alive reports whether pid is a live (non-zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && i+2 < len(b) && b[i+2] != 'Z'
}

// waitGone waits until none of pids is alive.
func waitGone(t *testing.T, pids []int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var left []int
		for _, pid := range pids {
			if alive(pid) {
				left = append(left, pid)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes still alive: %v", left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A shell whose children ignore SIGTERM (ignored signals survive exec).
const stubbornTree = `trap '' TERM; sleep 1000 & echo $!; (trap '' TERM; sleep 1000) & echo $!; echo $$; wait`

func TestSignalTree(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	id := newID()
	s, err := e.c.Exec(ctx, agentproto.ExecRequest{ID: id, Shell: stubbornTree})
	if err != nil {
		t.Fatal(err)
	}
	pids := readPids(t, s, 3)
	if err := e.c.Signal(ctx, id, "TERM"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	for _, pid := range pids {
		if !alive(pid) {
			t.Fatalf("pid %d died of an ignored SIGTERM", pid)
		}
	}
	if err := e.c.Signal(ctx, id, "SIGKILL"); err != nil {
		t.Fatal(err)
	}
	got := collect(t, s)
	if got.result.Status != agentproto.StatusKilled || got.result.Signal != "SIGKILL" || got.result.ExitCode != 137 {
		t.Fatalf("result %+v", got.result)
	}
	waitGone(t, pids)
}

func TestSignalNames(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	for _, tt := range []struct {
		sig  string
		want string
	}{{"SIGTERM", "SIGTERM"}, {"TERM", "SIGTERM"}, {"15", "SIGTERM"}, {"sigint", "SIGINT"}, {"9", "SIGKILL"}} {
		t.Run(tt.sig, func(t *testing.T) {
			id := newID()
			s, err := e.c.Exec(ctx, agentproto.ExecRequest{ID: id, Shell: `echo up; exec sleep 1000`})
			if err != nil {
				t.Fatal(err)
			}
			readUntilOutput(t, s)
			if err := e.c.Signal(ctx, id, tt.sig); err != nil {
				t.Fatal(err)
			}
			got := collect(t, s)
			if got.result.Status != agentproto.StatusKilled || got.result.Signal != tt.want {
				t.Fatalf("result %+v", got.result)
			}
		})
	}
	t.Run("unknown", func(t *testing.T) {
		got := e.run(agentproto.ExecRequest{Argv: []string{"true"}})
		if err := e.c.Signal(ctx, got.result.ID, "SIGFOO"); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("err = %v", err)
		}
	})
}

func readUntilOutput(t *testing.T, s interface {
	Next() (agentproto.Event, error)
}) {
	t.Helper()
	ev, err := s.Next()
	if err != nil || ev.Type != agentproto.EventOutput {
		t.Fatalf("want output, got %+v %v", ev, err)
	}
}

func TestTimeoutKillsTree(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	id := newID()
	start := time.Now()
	s, err := e.c.Exec(ctx, agentproto.ExecRequest{ID: id, Shell: stubbornTree, TimeoutMS: 300})
	if err != nil {
		t.Fatal(err)
	}
	pids := readPids(t, s, 3)
	// No client needs to stay: the agent enforces the timeout itself.
	s.Close()
	res, err := e.c.Wait(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != agentproto.StatusTimeout {
		t.Fatalf("result %+v", res)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("timeout took %v", d)
	}
	waitGone(t, pids)
}

func TestTimeoutPoliteProcess(t *testing.T) {
	e := newEnv(t)
	got := e.run(agentproto.ExecRequest{Argv: []string{"sleep", "1000"}, TimeoutMS: 100})
	if got.result.Status != agentproto.StatusTimeout || got.result.Signal != "SIGTERM" {
		t.Fatalf("result %+v", got.result)
	}
}

// A daemon that double-forked into a session of its own is still found (by
// its environment marker) and killed with its exec.
func TestDoubleForkedDaemonKilled(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	for _, how := range []string{"signal", "timeout"} {
		t.Run(how, func(t *testing.T) {
			id := newID()
			req := agentproto.ExecRequest{ID: id, Shell: `(setsid sh -c 'echo $$; exec sleep 1000' &) ; sleep 1000`}
			if how == "timeout" {
				req.TimeoutMS = 500
			}
			s, err := e.c.Exec(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			pids := readPids(t, s, 1)
			daemon := pids[0]
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", daemon))
			if err != nil {
				t.Fatal(err)
			}
			fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
			if fields[3] != strconv.Itoa(daemon) {
				t.Fatalf("daemon %d is not a session leader (sid %s)", daemon, fields[3])
			}
			if how == "signal" {
				if err := e.c.Signal(ctx, id, "KILL"); err != nil {
					t.Fatal(err)
				}
			}
			got := collect(t, s)
			want := map[string]string{"signal": agentproto.StatusKilled, "timeout": agentproto.StatusTimeout}[how]
			if got.result.Status != want {
				t.Fatalf("result %+v", got.result)
			}
			waitGone(t, []int{daemon})
		})
	}
}

// A background child that keeps stdout open must not keep the exec running.
func TestBackgroundChildDoesNotHang(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	id := newID()
	start := time.Now()
	got := e.run(agentproto.ExecRequest{ID: id, Shell: `sleep 1000 & echo $!; echo done`})
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("exec took %v", d)
	}
	if got.result.Status != agentproto.StatusExited || !strings.HasSuffix(got.stdout.String(), "done\n") {
		t.Fatalf("got %q %+v", got.stdout.String(), got.result)
	}
	bg, err := strconv.Atoi(strings.Fields(got.stdout.String())[0])
	if err != nil {
		t.Fatal(err)
	}
	if !alive(bg) {
		t.Fatal("background child was killed with the exec")
	}
	// The tree of an ended exec can still be signalled.
	if err := e.c.Signal(ctx, id, "KILL"); err != nil {
		t.Fatal(err)
	}
	waitGone(t, []int{bg})
}

func TestUnknownExec(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	calls := map[string]func() error{
		"attach": func() error { _, err := e.c.Attach(ctx, "ex_nope", 0); return err },
		"wait":   func() error { _, err := e.c.Wait(ctx, "ex_nope"); return err },
		"signal": func() error { return e.c.Signal(ctx, "ex_nope", "TERM") },
		"stdin":  func() error { return e.c.WriteStdin(ctx, "ex_nope", []byte("x")) },
		"close":  func() error { return e.c.CloseStdin(ctx, "ex_nope") },
		"resize": func() error { return e.c.Resize(ctx, "ex_nope", 80, 24) },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			if err := call(); !errors.Is(err, errdefs.ErrNotFound) {
				t.Fatalf("err = %v, want not found", err)
			}
		})
	}
}

func TestListExecs(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	done := e.run(agentproto.ExecRequest{ID: "ex_list_done", Argv: []string{"true"}})
	s, err := e.c.Exec(ctx, agentproto.ExecRequest{ID: "ex_list_run", Shell: "echo up; exec sleep 1000"})
	if err != nil {
		t.Fatal(err)
	}
	readUntilOutput(t, s)
	list, err := e.c.ListExecs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]agentproto.ExecInfo{}
	for _, x := range list {
		byID[x.ID] = x
	}
	if x := byID["ex_list_done"]; x.Status != "exited" || x.EndedAt.IsZero() || x.Pid == 0 || x.Argv[0] != "true" {
		t.Fatalf("done exec %+v", x)
	}
	if x := byID["ex_list_run"]; x.Status != "running" || x.Pid == 0 || x.Shell == "" || x.User != "user" {
		t.Fatalf("running exec %+v", x)
	}
	_ = done
	if err := e.c.Signal(ctx, "ex_list_run", "KILL"); err != nil {
		t.Fatal(err)
	}
	collect(t, s)
}

// The daemon may restart: a new session finds every exec, still running.
func TestReconnect(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	first := e.connect()
	id := newID()
	s, err := first.Exec(ctx, agentproto.ExecRequest{ID: id, StdinOpen: true, Shell: `echo before; read x; echo after`})
	if err != nil {
		t.Fatal(err)
	}
	readUntilOutput(t, s)
	first.Close()
	second := e.connect()
	if err := second.WriteStdin(ctx, id, []byte("\n")); err != nil {
		t.Fatal(err)
	}
	a, err := second.Attach(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := collect(t, a)
	if got.stdout.String() != "before\nafter\n" || got.result.Status != "exited" {
		t.Fatalf("got %q %+v", got.stdout.String(), got.result)
	}
}

// TestOOM runs a shell in a small memory cgroup (v1) until the kernel
// OOM-kills it; the agent must report oom, not a plain kill.
func TestOOM(t *testing.T) {
	testutil.RequiresRoot(t)
	base := "/sys/fs/cgroup/memory"
	if _, err := os.Stat(filepath.Join(base, "memory.oom_control")); err != nil {
		t.Skip("requires the cgroup v1 memory controller")
	}
	cg, err := os.MkdirTemp(base, "airlock-agent-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Processes are dead by now; rmdir may race their exit briefly.
		for range 50 {
			if err := os.Remove(cg); err == nil || os.IsNotExist(err) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("cgroup %s left behind", cg)
	})
	writeFile(t, filepath.Join(cg, "memory.limit_in_bytes"), "16777216")
	if _, err := os.Stat(filepath.Join(cg, "memory.memsw.limit_in_bytes")); err == nil {
		writeFile(t, filepath.Join(cg, "memory.memsw.limit_in_bytes"), "16777216")
	}
	e := newEnv(t, func(c *agent.Config) { c.OOMCounterFile = filepath.Join(cg, "memory.oom_control") })
	got := e.run(agentproto.ExecRequest{User: "root", TimeoutMS: 20000,
		Shell: fmt.Sprintf(`echo $$ > %s/cgroup.procs; x=$(head -c 200000000 /dev/zero | tr '\0' x); echo survived`, cg)})
	if got.result.Status != agentproto.StatusOOM {
		t.Fatalf("result %+v stdout %q stderr %q", got.result, got.stdout.String(), got.stderr.String())
	}
}

// TestOOMShellChild: the kernel OOM-kills a shell's child, the shell
// reports it as exit status 137. The exec is oom: the sandbox's OOM kill
// count grew while it ran, whatever process of its tree was the victim.
func TestOOMShellChild(t *testing.T) {
	testutil.RequiresRoot(t)
	base := "/sys/fs/cgroup/memory"
	if _, err := os.Stat(filepath.Join(base, "memory.oom_control")); err != nil {
		t.Skip("requires the cgroup v1 memory controller")
	}
	cg, err := os.MkdirTemp(base, "airlock-agent-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 50 {
			if err := os.Remove(cg); err == nil || os.IsNotExist(err) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("cgroup %s left behind", cg)
	})
	writeFile(t, filepath.Join(cg, "memory.limit_in_bytes"), "16777216")
	if _, err := os.Stat(filepath.Join(cg, "memory.memsw.limit_in_bytes")); err == nil {
		writeFile(t, filepath.Join(cg, "memory.memsw.limit_in_bytes"), "16777216")
	}
	e := newEnv(t, func(c *agent.Config) { c.OOMCounterFile = filepath.Join(cg, "memory.oom_control") })
	got := e.run(agentproto.ExecRequest{User: "root", TimeoutMS: 20000,
		Shell: fmt.Sprintf(`echo $$ > %s/cgroup.procs; sh -c 'x=$(head -c 200000000 /dev/zero | tr "\0" x); echo survived'; st=$?; echo "child status $st"; exit $st`, cg)})
	if got.result.Status != agentproto.StatusOOM || got.result.ExitCode != 137 || got.stdout.String() != "child status 137\n" {
		t.Fatalf("result %+v stdout %q stderr %q", got.result, got.stdout.String(), got.stderr.String())
	}
}

// TestOOMJudgement: with a counter file the test controls, an exec is oom
// only when the count grew while it ran and it ended as an OOM-killed
// process does (SIGKILL, or 137 from a shell); a kill -9 or an exit 137
// without an OOM kill, and an exec that exits otherwise while one happens
// (another exec's process may have been the victim), keep their status.
func TestOOMJudgement(t *testing.T) {
	counter := filepath.Join(t.TempDir(), "memory.events")
	writeFile(t, counter, "oom 0\noom_kill 0\n")
	os.Chmod(filepath.Dir(counter), 0o777)
	os.Chmod(counter, 0o666)
	e := newEnv(t, func(c *agent.Config) { c.OOMCounterFile = counter })
	n := 0
	bump := func() string {
		n++
		return fmt.Sprintf(`sleep 0.05; printf 'oom %d\noom_kill %d\n' > %s; `, n, n, counter)
	}
	tests := []struct {
		name   string
		shell  string
		status string
		code   int
	}{
		{"exit_137_no_kill", `exit 137`, "exited", 137},
		{"sigkill_no_kill", `kill -9 $$`, "exited", 137},
		{"exit_137_with_kill", bump() + `exit 137`, "oom", 137},
		{"sigkill_with_kill", bump() + `kill -9 $$`, "oom", 137},
		{"exit_1_with_kill", bump() + `exit 1`, "exited", 1},
		{"exit_0_with_kill", bump() + `exit 0`, "exited", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := e.run(agentproto.ExecRequest{Shell: tt.shell})
			if got.result.Status != tt.status || got.result.ExitCode != tt.code {
				t.Fatalf("result %+v (stderr %q), want %s %d", got.result, got.stderr.String(), tt.status, tt.code)
			}
		})
	}
}
