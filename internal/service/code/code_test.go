package code

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/redact"
	"github.com/airlockhq/airlock/internal/service/sandbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// localBackend runs bridges as host processes: the bridges' protocol, the
// event translation and the context handling are tested without a sandbox
// (the root e2e test in internal/plane/httpapi runs them in runc).
type localBackend struct {
	mu     sync.Mutex
	gone   chan struct{}
	audits []api.CodeAuditDetail
	resets int
}

func newLocal() *localBackend { return &localBackend{gone: make(chan struct{})} }

func (b *localBackend) Gone(ctx context.Context, p auth.Principal, id string) (<-chan struct{}, error) {
	if id != "sb1" {
		return nil, &sandbox.PublicError{Msg: "sandbox not found", Err: sandbox.ErrSandboxNotFound}
	}
	return b.gone, nil
}

func (b *localBackend) Audit(ctx context.Context, p auth.Principal, id string, d api.CodeAuditDetail) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.audits = append(b.audits, d)
}

type localProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	fifo  *os.File
	done  chan struct{}
}

func (b *localBackend) Start(ctx context.Context, p auth.Principal, id string, spec ProcessSpec) (Process, error) {
	cmd := exec.Command(spec.Argv[0], spec.Argv[1:]...)
	cmd.Dir = spec.Cwd
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	lp := &localProc{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != ReadyLine+"\n" {
		lp.Close(ctx)
		return nil, &sandbox.PublicError{Msg: "starting kernel: " + line, Err: errdefs.ErrUnavailable}
	}
	go func() {
		io.Copy(io.Discard, stdout)
		cmd.Wait()
		close(lp.done)
	}()
	f, err := os.Open(spec.FIFO)
	if err != nil {
		lp.Close(ctx)
		return nil, err
	}
	lp.fifo = f
	return lp, nil
}

func (lp *localProc) Events() io.Reader      { return lp.fifo }
func (lp *localProc) Done() <-chan struct{}  { return lp.done }
func (lp *localProc) Redact(s string) string { return strings.ReplaceAll(s, "s3cr3t", "*****") }
func (lp *localProc) TextStream() *redact.TextStream {
	return redact.NewTextStream(map[string]string{"S": "s3cr3t"})
}
func (lp *localProc) Send(ctx context.Context, p []byte) error {
	_, err := lp.stdin.Write(p)
	return err
}
func (lp *localProc) Interrupt(ctx context.Context) error {
	return syscall.Kill(-lp.cmd.Process.Pid, syscall.SIGINT)
}
func (lp *localProc) Close(ctx context.Context) {
	syscall.Kill(-lp.cmd.Process.Pid, syscall.SIGKILL)
	lp.stdin.Close()
	select {
	case <-lp.done:
	case <-time.After(5 * time.Second):
	}
	if lp.fifo != nil {
		lp.fifo.Close()
	}
}

var p0 = auth.Principal{Tenant: "t1"}

func run(t *testing.T, s *Service, req api.CodeRequest) []api.CodeEvent {
	t.Helper()
	var evs []api.CodeEvent
	err := s.Run(context.Background(), p0, "sb1", req, func(ev api.CodeEvent) error {
		evs = append(evs, ev)
		return nil
	})
	if err != nil {
		t.Fatalf("run %q: %v", req.Code, err)
	}
	if len(evs) == 0 || evs[len(evs)-1].Type != api.CodeEventEnd {
		t.Fatalf("run %q: no end event: %+v", req.Code, evs)
	}
	return evs
}

func stdout(evs []api.CodeEvent) string {
	var b strings.Builder
	for _, e := range evs {
		if e.Type == api.CodeEventStdout {
			b.WriteString(e.Text)
		}
	}
	return b.String()
}

func firstOf(evs []api.CodeEvent, typ string) *api.CodeEvent {
	for i := range evs {
		if evs[i].Type == typ {
			return &evs[i]
		}
	}
	return nil
}

func requires(t *testing.T, bin string) {
	if _, err := exec.LookPath(bin); err != nil {
		t.Skipf("%s not installed", bin)
	}
}

func ptr[T any](v T) *T { return &v }

func newService(t *testing.T) (*Service, *localBackend) {
	be := newLocal()
	s := New(Config{Backend: be})
	t.Cleanup(s.Close)
	return s, be
}

func TestBashContext(t *testing.T) {
	requires(t, "python3")
	s, be := newService(t)
	dir := t.TempDir()
	c, err := s.CreateContext(context.Background(), p0, "sb1", api.CodeContextRequest{Language: "bash", Cwd: dir})
	if err != nil {
		t.Fatal(err)
	}
	cid := &c.ID
	tests := []struct {
		name, code, out, errName string
	}{
		{"cwd", "pwd", dir + "\n", ""},
		{"set", "X=41; cd /; echo set", "set\n", ""},
		{"state", "echo $((X+1)) $PWD", "42 /\n", ""},
		{"partial-line", "printf abc", "abc", ""},
		{"exit-status", "false", "", "ExitStatus"},
		{"redacted", "echo s3cr3t", "******\n", ""},
		// A secret printed one byte per event, slowly, or split by a
		// pause longer than any hold: each event was masked alone before.
		{"redacted-slowly", "for c in s 3 c r 3 t; do printf %s $c; sleep 0.03; done; echo", "******\n", ""},
		{"redacted-split-by-pause", "printf s3c; sleep 0.5; printf 'r3t!'", "******!", ""},
		// What only looks like the start of a secret, before a pause, is
		// masked too: a cell's output is not kept to be corrected.
		{"lookalike-before-a-pause", "printf 's3'; sleep 0.3; printf 'x'", "**x", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs := run(t, s, api.CodeRequest{Code: tt.code, ContextID: cid})
			if got := stdout(evs); got != tt.out {
				t.Errorf("stdout %q, want %q (%+v)", got, tt.out, evs)
			}
			e := firstOf(evs, api.CodeEventError)
			if (e == nil) != (tt.errName == "") || (e != nil && e.Name != tt.errName) {
				t.Errorf("error event %+v, want name %q", e, tt.errName)
			}
		})
	}
	t.Run("timeout-keeps-state", func(t *testing.T) {
		evs := run(t, s, api.CodeRequest{Code: "sleep 30; echo after", ContextID: cid, TimeoutS: ptr(0.5)})
		if e := firstOf(evs, api.CodeEventError); e == nil {
			t.Fatalf("no error on timeout: %+v", evs)
		}
		if strings.Contains(stdout(evs), "after") {
			t.Errorf("the cell went on after its interrupt: %+v", evs)
		}
		evs = run(t, s, api.CodeRequest{Code: "echo $X", ContextID: cid})
		if got := stdout(evs); got != "41\n" {
			t.Errorf("after timeout: %q", got)
		}
	})
	t.Run("death", func(t *testing.T) {
		evs := run(t, s, api.CodeRequest{Code: "exit 3", ContextID: cid})
		if e := firstOf(evs, api.CodeEventError); e == nil || e.Name != api.CodeErrorKernelDied {
			t.Fatalf("want KernelDied: %+v", evs)
		}
		evs = run(t, s, api.CodeRequest{Code: "echo ${X:-unset}", ContextID: cid})
		if got := stdout(evs); got != "unset\n" {
			t.Errorf("after death: %q", got)
		}
		if firstOf(evs, api.CodeEventStderr) == nil {
			t.Errorf("restart not said: %+v", evs)
		}
	})
	be.mu.Lock()
	defer be.mu.Unlock()
	if len(be.audits) == 0 || be.audits[0].Code != "pwd" || be.audits[0].Language != "bash" {
		t.Errorf("audits %+v", be.audits)
	}
}

func TestJavaScriptContext(t *testing.T) {
	requires(t, "node")
	s, _ := newService(t)
	tests := []struct {
		name, code, out, result, errName string
	}{
		{"decl", "let x = 41; var y = 1; console.log('hi')", "hi\n", "", ""},
		{"state", "x + y", "", "42", ""},
		{"object", "({a: 1})", "", "{ a: 1 }", ""},
		{"promise", "Promise.resolve(7)", "", "7", ""},
		{"throw", "null.f", "", "", "TypeError"},
		{"require", "require('os').EOL === '\\n'", "", "true", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs := run(t, s, api.CodeRequest{Code: tt.code, Language: "javascript"})
			if got := stdout(evs); got != tt.out {
				t.Errorf("stdout %q, want %q", got, tt.out)
			}
			r := firstOf(evs, api.CodeEventResult)
			if (r == nil) != (tt.result == "") || (r != nil && (r.Text != tt.result || !r.IsMainResult)) {
				t.Errorf("result %+v, want %q", r, tt.result)
			}
			e := firstOf(evs, api.CodeEventError)
			if (e == nil) != (tt.errName == "") || (e != nil && e.Name != tt.errName) {
				t.Errorf("error %+v, want %q", e, tt.errName)
			}
		})
	}
	t.Run("interrupt", func(t *testing.T) {
		evs := run(t, s, api.CodeRequest{Code: "while (true) {}", Language: "javascript", TimeoutS: ptr(0.3)})
		if firstOf(evs, api.CodeEventError) == nil {
			t.Fatalf("no error: %+v", evs)
		}
		evs = run(t, s, api.CodeRequest{Code: "x", Language: "javascript"})
		if r := firstOf(evs, api.CodeEventResult); r == nil || r.Text != "41" {
			t.Errorf("state lost: %+v", evs)
		}
	})
}

func TestBadRequests(t *testing.T) {
	s, _ := newService(t)
	tests := []struct {
		name string
		req  api.CodeRequest
		id   string
		want error
	}{
		{"language", api.CodeRequest{Code: "1", Language: "cobol"}, "sb1", errdefs.ErrInvalidArgument},
		{"context", api.CodeRequest{Code: "1", ContextID: ptr("ctx_nope")}, "sb1", errdefs.ErrNotFound},
		{"sandbox", api.CodeRequest{Code: "1"}, "sb2", sandbox.ErrSandboxNotFound},
		{"huge", api.CodeRequest{Code: strings.Repeat("x", MaxCodeBytes+1)}, "sb1", errdefs.ErrTooLarge},
		{"timeout", api.CodeRequest{Code: "1", TimeoutS: ptr(-1.0)}, "sb1", errdefs.ErrInvalidArgument},
		{"env-name", api.CodeRequest{Code: "1", Env: map[string]string{"A-B": "1"}}, "sb1", errdefs.ErrInvalidArgument},
		{"env-name-empty", api.CodeRequest{Code: "1", Env: map[string]string{"": "1"}}, "sb1", errdefs.ErrInvalidArgument},
		{"env-reserved", api.CodeRequest{Code: "1", Env: map[string]string{"AIRLOCK_EXEC_ID": "x"}}, "sb1", errdefs.ErrInvalidArgument},
		{"env-nul", api.CodeRequest{Code: "1", Env: map[string]string{"A": "a\x00b"}}, "sb1", errdefs.ErrInvalidArgument},
		{"env-count", api.CodeRequest{Code: "1", Env: manyEnv(MaxEnvVars+1, 1)}, "sb1", errdefs.ErrInvalidArgument},
		{"env-size", api.CodeRequest{Code: "1", Env: manyEnv(2, MaxEnvBytes/2)}, "sb1", errdefs.ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := s.Run(context.Background(), p0, tt.id, tt.req, func(api.CodeEvent) error {
				t.Error("emitted an event")
				return nil
			})
			if !errors.Is(err, tt.want) {
				t.Errorf("err %v, want %v", err, tt.want)
			}
		})
	}
}

// manyEnv makes n variables of size bytes each.
func manyEnv(n, size int) map[string]string {
	env := map[string]string{}
	for i := range n {
		env[fmt.Sprintf("V%d", i)] = strings.Repeat("v", size)
	}
	return env
}

func TestReadLine(t *testing.T) {
	in := "short\n" + strings.Repeat("x", 100) + "\nnext\ncut"
	br := bufio.NewReaderSize(strings.NewReader(in), 16)
	var got []string
	for {
		l, err := readLine(br, 50)
		if errors.Is(err, errLineTooLong) {
			got = append(got, "<long>")
			continue
		}
		if err != nil {
			got = append(got, "<"+err.Error()+">")
			break
		}
		got = append(got, string(l))
	}
	want := "short,<long>,next,<unexpected EOF>"
	if strings.Join(got, ",") != want {
		t.Errorf("got %v, want %s", got, want)
	}
}

func TestLimitsAndLifecycle(t *testing.T) {
	requires(t, "python3")
	s, _ := newService(t)
	c, err := s.CreateContext(context.Background(), p0, "sb1", api.CodeContextRequest{Language: "bash"})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("output-limit", func(t *testing.T) {
		evs := run(t, s, api.CodeRequest{Code: "head -c 20000000 /dev/zero | tr '\\0' x; echo; echo done >&2", ContextID: &c.ID})
		if e := firstOf(evs, api.CodeEventError); e == nil || e.Name != api.CodeErrorOutputLimit {
			t.Fatalf("want %s, got %+v", api.CodeErrorOutputLimit, e)
		}
		if n := len(stdout(evs)); n > 9<<20 || n < 1<<20 {
			t.Errorf("stdout %d bytes", n)
		}
	})
	t.Run("client-gone-interrupts", func(t *testing.T) {
		run(t, s, api.CodeRequest{Code: "K=kept", ContextID: &c.ID})
		gone := errors.New("client gone")
		start := time.Now()
		err := s.Run(context.Background(), p0, "sb1", api.CodeRequest{Code: "echo first; sleep 30", ContextID: &c.ID},
			func(api.CodeEvent) error { return gone })
		if !errors.Is(err, gone) || time.Since(start) > 10*time.Second {
			t.Fatalf("err %v after %s", err, time.Since(start))
		}
		if got := stdout(run(t, s, api.CodeRequest{Code: "echo $K", ContextID: &c.ID})); got != "kept\n" {
			t.Errorf("state after interrupt: %q", got)
		}
	})
	t.Run("serialised", func(t *testing.T) {
		var wg sync.WaitGroup
		outs := make([]string, 2)
		for i := range outs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var b strings.Builder
				s.Run(context.Background(), p0, "sb1", api.CodeRequest{Code: "echo a; sleep 0.2; echo b", ContextID: &c.ID},
					func(ev api.CodeEvent) error { b.WriteString(ev.Text); return nil })
				outs[i] = b.String()
			}()
		}
		wg.Wait()
		for _, o := range outs {
			if o != "a\nb\n" {
				t.Errorf("interleaved cells: %q", outs)
			}
		}
	})
	t.Run("delete-running", func(t *testing.T) {
		done := make(chan []api.CodeEvent)
		go func() {
			var evs []api.CodeEvent
			s.Run(context.Background(), p0, "sb1", api.CodeRequest{Code: "echo started; sleep 30", ContextID: &c.ID},
				func(ev api.CodeEvent) error { evs = append(evs, ev); return nil })
			done <- evs
		}()
		time.Sleep(300 * time.Millisecond)
		if err := s.DeleteContext(context.Background(), p0, "sb1", c.ID); err != nil {
			t.Fatal(err)
		}
		evs := <-done
		if e := firstOf(evs, api.CodeEventError); e == nil || e.Name != api.CodeErrorKernelDied {
			t.Errorf("running cell of a deleted context: %+v", evs)
		}
		if l, _ := s.ListContexts(context.Background(), p0, "sb1"); len(l) != 0 {
			t.Errorf("contexts after delete: %+v", l)
		}
	})
}

func (b *localBackend) Reset(ctx context.Context, p auth.Principal, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.resets++
	return nil
}

// TestCellEnv checks that a cell's env is seen by that cell only, in each
// language the host can run, and that the context's own variables, its
// other state and the audit (names only) come out right.
func TestCellEnv(t *testing.T) {
	// A value with everything a quoting bug would trip on.
	const nasty = "it's $HOME \"q\" `id` \\ \n2nd line"
	t.Run("bash", func(t *testing.T) {
		requires(t, "python3")
		s, be := newService(t)
		c, err := s.CreateContext(context.Background(), p0, "sb1", api.CodeContextRequest{Language: "bash"})
		if err != nil {
			t.Fatal(err)
		}
		cid := &c.ID
		run(t, s, api.CodeRequest{Code: "export KEEP=ctx; PLAIN=plain; arr=(a 'b c')", ContextID: cid})
		tests := []struct {
			name, code string
			env        map[string]string
			out        string
		}{
			{"set", `echo "$A|$KEEP|$PLAIN|${arr[1]}"; printenv A KEEP PLAIN; printf '%s' "$Q"; Y=5`,
				map[string]string{"A": "one two", "KEEP": "cell", "PLAIN": "p2", "Q": nasty},
				"one two|cell|p2|b c\none two\ncell\np2\n" + nasty},
			{"restored", `echo "${A-unset}|$KEEP|$PLAIN|$Y|${Q-unset}"; printenv PLAIN || echo not-exported; printenv KEEP`,
				nil, "unset|ctx|plain|5|unset\nnot-exported\nctx\n"},
			{"array", `echo "${#arr[@]} ${arr[1]-none} $arr"; printenv arr`, map[string]string{"arr": "flat"}, "1 none flat\nflat\n"},
			{"integer", `declare -i n=3`, nil, ""},
			{"integer-env", `echo $n`, map[string]string{"n": "1+1"}, "1+1\n"},
			{"integer-restored", `n=2+2; echo $n`, nil, "4\n"},
			{"array-restored", `echo "${#arr[@]} ${arr[1]}"`, nil, "2 b c\n"},
			{"cell-changes-it", `KEEP=changed; echo $KEEP`, map[string]string{"KEEP": "cell"}, "changed\n"},
			{"change-undone", `echo $KEEP`, nil, "ctx\n"},
			{"failing-cell", `echo $A; false`, map[string]string{"A": "x"}, "x\n"},
			{"after-failure", `echo ${A-unset}`, nil, "unset\n"},
			{"readonly", `declare -r RO=1; set -eu`, nil, ""},
			{"readonly-env", `echo "$RO ${NEW}"; printenv RO || echo not-exported`, map[string]string{"RO": "2", "NEW": "n"}, "1 n\nnot-exported\n"},
			{"readonly-restored", `echo "$RO ${NEW-unset}"; set +eu`, nil, "1 unset\n"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				evs := run(t, s, api.CodeRequest{Code: tt.code, ContextID: cid, Env: tt.env})
				if got := stdout(evs); got != tt.out {
					t.Errorf("stdout %q, want %q (%+v)", got, tt.out, evs)
				}
			})
		}
		t.Run("timeout-restores", func(t *testing.T) {
			run(t, s, api.CodeRequest{Code: "sleep 30", ContextID: cid, Env: map[string]string{"T": "x"}, TimeoutS: ptr(0.5)})
			if got := stdout(run(t, s, api.CodeRequest{Code: "echo ${T-unset} $KEEP", ContextID: cid})); got != "unset ctx\n" {
				t.Errorf("after an interrupted cell: %q", got)
			}
		})
		t.Run("exit-status", func(t *testing.T) {
			evs := run(t, s, api.CodeRequest{Code: "false", ContextID: cid, Env: map[string]string{"A": "x"}})
			if e := firstOf(evs, api.CodeEventError); e == nil || e.Value != "exit status 1" {
				t.Errorf("error %+v, want exit status 1", e)
			}
		})
		be.mu.Lock()
		defer be.mu.Unlock()
		var names []string
		for _, a := range be.audits {
			if strings.Contains(a.Code, "$Q") {
				names = a.EnvNames
			}
			if b, _ := json.Marshal(a); strings.Contains(string(b), "one two") || strings.Contains(string(b), "p2") {
				t.Errorf("an env value is in the audit: %s", b)
			}
		}
		if strings.Join(names, ",") != "A,KEEP,PLAIN,Q" {
			t.Errorf("audited env names %v", names)
		}
	})
	t.Run("javascript", func(t *testing.T) {
		requires(t, "node")
		s, _ := newService(t)
		js := func(code string, env map[string]string) []api.CodeEvent {
			return run(t, s, api.CodeRequest{Code: code, Language: "javascript", Env: env})
		}
		js("process.env.KEEP = 'ctx'; delete process.env.A; let kept = 1", nil)
		tests := []struct {
			name, code string
			env        map[string]string
			out        string
		}{
			{"set", "console.log([process.env.A, process.env.KEEP, process.env.Q].join('|')); kept = 2",
				map[string]string{"A": "a", "KEEP": "cell", "Q": nasty}, "a|cell|" + nasty + "\n"},
			{"restored", "console.log(String(process.env.A), process.env.KEEP, 'A' in process.env, kept)", nil,
				"undefined ctx false 2\n"},
			{"awaited", "new Promise((r) => setTimeout(() => { console.log(process.env.A); r() }, 50))",
				map[string]string{"A": "late"}, "late\n"},
			{"throwing", "console.log(process.env.A); throw new Error('x')", map[string]string{"A": "t"}, "t\n"},
			{"after-throw", "console.log(String(process.env.A))", nil, "undefined\n"},
			{"child", "console.log(require('child_process').execSync('printenv A').toString().trim())",
				map[string]string{"A": "inherited"}, "inherited\n"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if got := stdout(js(tt.code, tt.env)); got != tt.out {
					t.Errorf("stdout %q, want %q", got, tt.out)
				}
			})
		}
	})
}

// TestTranslateResult checks what of a bridge's result reaches the client:
// known representations only, JSON and charts valid and with the
// sandbox's secrets masked.
func TestTranslateResult(t *testing.T) {
	tests := []struct {
		name      string
		data      string
		ok        bool
		json      string
		chart     string
		text, png string
		frame     string
	}{
		{"chart", `{"text/plain":"<Figure>","image/png":"iVBORw0KGgo=","` + chartMIME + `":{"type":"line","title":"s3cr3t plot","elements":[{"label":"Line 0","points":[[1,4],[2,1]]}]}}`,
			true, "", `{"type":"line","title":"***** plot","elements":[{"label":"Line 0","points":[[1,4],[2,1]]}]}`, "<Figure>", "iVBORw0KGgo=", ""},
		{"chart-only", `{"` + chartMIME + `":{"type":"pie","elements":[]}}`, true, "", `{"type":"pie","elements":[]}`, "", "", ""},
		{"chart-not-object", `{"text/plain":"x","` + chartMIME + `":[1,2]}`, true, "", "", "x", "", ""},
		{"chart-alone-not-object", `{"` + chartMIME + `":"line"}`, false, "", "", "", "", ""},
		{"json-masked", `{"application/json":{"key": "s3cr3t"}}`, true, `{"key":"*****"}`, "", "", "", ""},
		{"data", `{"text/html":"<table/>","` + dataMIME + `":{"a":[1,null],"b":["x","s3cr3t"]}}`, true, "", "", "", "", `{"a":[1,null],"b":["x","*****"]}`},
		{"data-not-object", `{"text/plain":"df","` + dataMIME + `":[1]}`, true, "", "", "df", "", ""},
		{"bad-png", `{"image/png":"not base64!"}`, false, "", "", "", "", ""},
		{"unknown-mime", `{"application/x-thing":"x"}`, false, "", "", "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ev bridgeEvent
			if err := json.Unmarshal([]byte(`{"id":"r1","t":"result","main":true,"data":`+tt.data+`}`), &ev); err != nil {
				t.Fatal(err)
			}
			out, ok := translate(&localProc{}, ev)
			if ok != tt.ok {
				t.Fatalf("ok %v, want %v (%+v)", ok, tt.ok, out)
			}
			if !ok {
				return
			}
			if string(out.Chart) != tt.chart || string(out.JSON) != tt.json || out.Text != tt.text || out.PNG != tt.png ||
				string(out.Data) != tt.frame {
				t.Errorf("got chart %s json %s text %q png %q data %s", out.Chart, out.JSON, out.Text, out.PNG, out.Data)
			}
			if !out.IsMainResult {
				t.Error("main result lost")
			}
		})
	}
}
