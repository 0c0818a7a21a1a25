package sdk_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/testutil/daemontest"
)

// TestGoSDKSandbox drives the Sandbox handle against the real daemon, as
// a program using the SDK does: created from AIRLOCK_URL and
// AIRLOCK_API_KEY, commands (streamed, background, stdin, timeouts, kill,
// a run whose ctx ends), files by relative paths, a watch, pause and
// resume, a terminal, the code interpreter, typed errors and WhoAmI.
func TestGoSDKSandbox(t *testing.T) {
	e := daemontest.Start(t, daemontest.Options{Templates: []string{"code-interpreter"}})
	key := e.Key(t, "gosdk")
	t.Setenv(client.EnvURL, e.URL())
	t.Setenv(client.EnvAPIKey, key)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	sb, err := client.Create(ctx, client.WithTemplate("base"), client.WithTTL(10*time.Minute),
		client.WithEnv("GREETING", "hello"), client.WithSecret("API_TOKEN", "tok-"+daemontest.Token()),
		client.WithMetadata("suite", "gosdk"))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if info := sb.Info(); info.State != api.StateRunning || info.Runtime == "" || info.Metadata["suite"] != "gosdk" {
		t.Fatalf("created %+v", info)
	}

	t.Run("run", func(t *testing.T) {
		res, err := sb.Run(ctx, `echo "$GREETING $(id -un)"; pwd; echo oops >&2; exit 3`)
		if err != nil {
			t.Fatal(err)
		}
		if res.Stdout != "hello user\n/home/user\n" || res.Stderr != "oops\n" || res.ExitCode != 3 || res.Status != api.ExecExited ||
			!errors.Is(res.Err(), client.ErrExitStatus) {
			t.Errorf("result %+v", res)
		}
		// The secret is in the command's environment, masked in its output.
		res, err = sb.RunArgs(ctx, []string{"sh", "-c", `printf %s "$API_TOKEN" | wc -c; echo "$API_TOKEN"`}, client.WithUser("root"), client.WithCwd("/tmp"))
		if err != nil || res.ExitCode != 0 || strings.Contains(res.Stdout, "tok-") {
			t.Errorf("secret: %+v, %v", res, err)
		}
	})

	t.Run("streamed run keeps its output", func(t *testing.T) {
		var chunks []string
		res, err := sb.Run(ctx, `for i in 1 2 3; do echo line$i; sleep 0.1; done; echo done >&2`,
			client.OnStdout(func(s string) { chunks = append(chunks, s) }))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(chunks, "") != "line1\nline2\nline3\n" || len(chunks) < 2 {
			t.Errorf("streamed %q, want the lines as they came", chunks)
		}
		if res.Stdout != "line1\nline2\nline3\n" || res.Stderr != "done\n" || res.ExitCode != 0 {
			t.Errorf("a streamed run returned %+v", res)
		}
	})

	t.Run("truncated output is the server's head and tail", func(t *testing.T) {
		res, err := sb.Run(ctx, `head -c 300000 /dev/zero | tr '\0' a; echo; echo END`, client.WithMaxOutput(64<<10),
			client.OnStdout(func(string) {}))
		if err != nil {
			t.Fatal(err)
		}
		if !res.Truncated || len(res.Stdout) > 64<<10 || !strings.HasPrefix(res.Stdout, "aaaa") || !strings.HasSuffix(res.Stdout, "a\nEND\n") {
			t.Errorf("truncated %v, %d bytes, tail %q", res.Truncated, len(res.Stdout), res.Stdout[max(0, len(res.Stdout)-10):])
		}
	})

	t.Run("timeout and could-not-start are typed", func(t *testing.T) {
		res, err := sb.Run(ctx, "echo before; sleep 30", client.WithTimeout(time.Second))
		var ee *client.ExecError
		if !errors.Is(err, client.ErrExecTimeout) || !errors.As(err, &ee) || ee.Code != api.ExecCodeTimeout {
			t.Fatalf("timeout: %v", err)
		}
		if res == nil || res.Status != api.ExecTimeout || res.Stdout != "before\n" {
			t.Errorf("timed-out result %+v", res)
		}
		res, err = sb.RunArgs(ctx, []string{"no-such-command"})
		if err != nil || res.ExitCode != 127 || !errors.Is(res.Err(), client.ErrExecFailed) {
			t.Errorf("missing command: %+v, %v", res, err)
		}
	})

	t.Run("background command with stdin, and kill", func(t *testing.T) {
		cmd, err := sb.Start(ctx, "tr a-z A-Z")
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.SendStdin(ctx, "hello "); err != nil {
			t.Fatal(err)
		}
		if err := cmd.SendStdin(ctx, "stdin\n"); err != nil {
			t.Fatal(err)
		}
		if err := cmd.CloseStdin(ctx); err != nil {
			t.Fatal(err)
		}
		res, err := cmd.Wait(ctx)
		if err != nil || res.Stdout != "HELLO STDIN\n" || res.ExitCode != 0 {
			t.Errorf("tr: %+v, %v", res, err)
		}

		started := make(chan struct{}, 1)
		cmd, err = sb.Start(ctx, "echo up; exec sleep 300", client.OnStdout(func(string) {
			select {
			case started <- struct{}{}:
			default:
			}
		}))
		if err != nil {
			t.Fatal(err)
		}
		<-started
		if err := cmd.Kill(ctx); err != nil {
			t.Fatal(err)
		}
		res, err = cmd.Wait(ctx)
		if err != nil || res.Status != api.ExecKilled || !errors.Is(res.Err(), client.ErrExecKilled) || res.Stdout != "up\n" {
			t.Errorf("killed: %+v, %v", res, err)
		}
	})

	t.Run("a run whose ctx ends kills its command", func(t *testing.T) {
		rctx, rcancel := context.WithCancel(ctx)
		var id string
		res, err := sb.Run(rctx, "echo up; exec sleep 300", client.OnStdout(func(string) { rcancel() }))
		rcancel()
		if res != nil || !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled run: %+v, %v", res, err)
		}
		l, err := sb.Client().Execs(ctx, sb.ID(), client.ExecListOptions{Limit: 1})
		if err != nil || len(l.Execs) != 1 {
			t.Fatalf("execs: %+v, %v", l, err)
		}
		id = l.Execs[0].ID
		var rec *api.ExecResult
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if rec, err = sb.Client().GetExec(ctx, sb.ID(), id); err != nil || rec.Status != api.ExecRunning {
				break
			}
		}
		if err != nil || rec.Status != api.ExecKilled {
			t.Errorf("the abandoned command is %+v, %v; want killed", rec, err)
		}
	})

	t.Run("files by relative paths", func(t *testing.T) {
		fs := sb.Files()
		w, err := fs.Watch(ctx, "", client.WatchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if res, err := fs.Write(ctx, "task.py", []byte("import json\nprint(json.dumps({'n': 6*7}))\n")); err != nil || res.Path != "/home/user/task.py" {
			t.Fatalf("write: %+v, %v", res, err)
		}
		ev, err := w.Next()
		if err != nil || ev.Path != "/home/user/task.py" {
			t.Errorf("watch: %+v, %v", ev, err)
		}
		res, err := sb.RunArgs(ctx, []string{"python3", "task.py"}, client.WithTimeout(30*time.Second))
		if err != nil || res.Stdout != "{\"n\": 42}\n" {
			t.Errorf("python3 task.py: %+v, %v", res, err)
		}
		if b, err := fs.Read(ctx, "task.py"); err != nil || !bytes.Contains(b, []byte("6*7")) {
			t.Errorf("read: %q, %v", b, err)
		}
		if _, err := fs.MakeDir(ctx, "out/deep"); err != nil {
			t.Fatal(err)
		}
		if _, err := fs.Write(ctx, "out/deep/r.txt", []byte("r")); err != nil {
			t.Fatal(err)
		}
		l, err := fs.List(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		names := map[string]string{}
		for _, e := range l {
			names[e.Path] = e.Type
		}
		if names["/home/user/task.py"] != "file" || names["/home/user/out"] != "dir" {
			t.Errorf("list: %v", names)
		}
		if ok, err := fs.Exists(ctx, "out/deep/r.txt"); !ok || err != nil {
			t.Errorf("exists: %v, %v", ok, err)
		}
		if err := fs.Remove(ctx, "out"); err != nil {
			t.Fatal(err)
		}
		if ok, err := fs.Exists(ctx, "out"); ok || err != nil {
			t.Errorf("exists after remove: %v, %v", ok, err)
		}
	})

	t.Run("terminal", func(t *testing.T) {
		p, err := sb.PTY(ctx, client.WithCommand("sh", "-c", "echo pty-$((6*7)); exit 4"), client.WithTerminalSize(100, 30))
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		out, err := io.ReadAll(p)
		if err != nil || !strings.Contains(string(out), "pty-42") {
			t.Errorf("pty output %q, %v", out, err)
		}
		if r := p.ExitResult(); r == nil || r.ExitCode == nil || *r.ExitCode != 4 {
			t.Errorf("pty exit %+v", r)
		}
	})

	t.Run("pause and resume", func(t *testing.T) {
		if err := sb.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		if sb.Info().State != api.StatePaused {
			t.Errorf("state after pause %s", sb.Info().State)
		}
		if err := sb.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		if res, err := sb.Run(ctx, "echo awake"); err != nil || res.Stdout != "awake\n" {
			t.Errorf("after resume: %+v, %v", res, err)
		}
		if err := sb.SetTTL(ctx, 20*time.Minute); err != nil || sb.Info().ExpiresAt == nil || time.Until(*sb.Info().ExpiresAt) < 15*time.Minute {
			t.Errorf("SetTTL: %v, %+v", err, sb.Info().ExpiresAt)
		}
	})

	t.Run("code interpreter", func(t *testing.T) {
		ci, err := client.Create(ctx, client.WithTemplate("code-interpreter"))
		if err != nil {
			t.Fatal(err)
		}
		defer ci.Close()
		var printed strings.Builder
		ex, err := ci.RunCode(ctx, "x = 6\nprint('x is', x)\nx * 7", client.OnStdout(func(s string) { printed.WriteString(s) }))
		if err != nil {
			t.Fatal(err)
		}
		if ex.Text() != "42" || ex.Stdout != "x is 6\n" || printed.String() != "x is 6\n" || ex.Err() != nil {
			t.Errorf("cell: %+v (streamed %q)", ex, printed.String())
		}
		ex, err = ci.RunCode(ctx, "x / 0")
		var ce *client.CodeError
		if err != nil || !errors.As(ex.Err(), &ce) || ce.Name != "ZeroDivisionError" {
			t.Errorf("raising cell: %+v, %v", ex, err)
		}
	})

	t.Run("typed errors", func(t *testing.T) {
		_, err := client.Connect(ctx, "sbx_doesnotexist0000000000")
		var ae *client.APIError
		if !errors.Is(err, client.ErrSandboxNotFound) || !errors.Is(err, client.ErrNotFound) || !errors.As(err, &ae) ||
			ae.Code != api.CodeSandboxNotFound || ae.StatusCode != http.StatusNotFound || ae.RequestID == "" {
			t.Errorf("connect to a missing sandbox: %#v", err)
		}
		// Another tenant's sandbox is not found either.
		other := e.Client(e.Key(t, "gosdk-other"))
		if _, err := other.ConnectSandbox(ctx, sb.ID()); !errors.Is(err, client.ErrSandboxNotFound) {
			t.Errorf("another tenant's sandbox: %v", err)
		}
		// A tenant quota: the second live sandbox is refused, with a time
		// to retry after.
		one := 1
		if _, err := e.Admin().SetTenantQuotas(ctx, "gosdk-quota", api.QuotaOverride{Sandboxes: &one}); err != nil {
			t.Fatal(err)
		}
		qc := e.Client(e.Key(t, "gosdk-quota"))
		first, err := qc.NewSandbox(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer first.Close()
		_, err = qc.NewSandbox(ctx)
		if !errors.Is(err, client.ErrQuotaExceeded) || !errors.As(err, &ae) || ae.StatusCode != http.StatusTooManyRequests || ae.RetryAfter <= 0 {
			t.Errorf("over quota: %#v", err)
		}
		bad, err := client.New(e.URL(), "ak_wrong")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := bad.NewSandbox(ctx); !errors.Is(err, client.ErrUnauthenticated) {
			t.Errorf("wrong key: %v", err)
		}
		if _, err := client.Create(ctx, client.WithTemplate("no-such-template")); !errors.Is(err, client.ErrTemplateNotFound) {
			t.Errorf("missing template: %v", err)
		}
	})

	t.Run("whoami", func(t *testing.T) {
		c, err := client.NewFromEnv()
		if err != nil {
			t.Fatal(err)
		}
		id, err := c.WhoAmI(ctx)
		if err != nil || id.Tenant != "gosdk" || id.Admin || id.KeyID == "" || id.URL != e.URL() {
			t.Errorf("tenant key: %+v, %v", id, err)
		}
		id, err = e.Admin().WhoAmI(ctx)
		if err != nil || !id.Admin || id.KeyID == "" {
			t.Errorf("admin key: %+v, %v", id, err)
		}
	})

	t.Run("close deletes", func(t *testing.T) {
		tmp, err := client.Create(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := tmp.Close(); err != nil {
			t.Fatal(err)
		}
		if err := tmp.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		s, err := tmp.Refresh(ctx)
		if err == nil && s.State != api.StateStopped {
			t.Errorf("after Close the sandbox is %s", s.State)
		}
		if err != nil && !errors.Is(err, client.ErrSandboxNotFound) {
			t.Errorf("after Close: %v", err)
		}
	})
}

// BenchmarkGoSDKExecOverhead measures an exec round trip against the real
// daemon, raw net/http (the JSON mode) next to Sandbox.Run, alternating
// them in each iteration so that both see the same load; it reports each
// one's mean and the difference, the SDK's overhead (budget: 0.5 ms):
//
//	flock /tmp/airlock-roottest.lock go test -run '^$' -bench BenchmarkGoSDKExecOverhead -benchtime 200x ./test/sdk
func BenchmarkGoSDKExecOverhead(b *testing.B) {
	e := daemontest.Start(b, daemontest.Options{})
	key := e.Key(b, "bench")
	ctx := context.Background()
	c := e.Client(key)
	sb, err := c.NewSandbox(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer sb.Close()
	hc := &http.Client{Transport: e.Transport()}
	body := []byte(`{"cmd":["true"]}`)
	raw := func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+"/v1/sandboxes/"+sb.ID()+"/exec", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		var res api.ExecResult
		err = json.NewDecoder(resp.Body).Decode(&res)
		resp.Body.Close()
		if err != nil || res.Status != api.ExecExited {
			b.Fatalf("raw exec: %+v, %v", res, err)
		}
	}
	// The same exec in the streaming mode, read to its exit event by hand:
	// what the server's SSE mode costs apart from the SDK.
	rawSSE := func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+"/v1/sandboxes/"+sb.ID()+"/exec", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "text/event-stream")
		resp, err := hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		all, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !bytes.Contains(all, []byte("event: exit")) {
			b.Fatalf("raw sse exec: %q, %v", all, err)
		}
	}
	sdk := func() {
		if res, err := sb.RunArgs(ctx, []string{"true"}); err != nil || res.ExitCode != 0 {
			b.Fatalf("sdk exec: %+v, %v", res, err)
		}
	}
	raw() // warm every path up
	rawSSE()
	sdk()
	var rawTotal, sseTotal, sdkTotal time.Duration
	for b.Loop() {
		t0 := time.Now()
		raw()
		t1 := time.Now()
		rawSSE()
		t2 := time.Now()
		sdk()
		rawTotal += t1.Sub(t0)
		sseTotal += t2.Sub(t1)
		sdkTotal += time.Since(t2)
	}
	n := float64(b.N)
	b.ReportMetric(float64(rawTotal.Microseconds())/n, "raw-µs/op")
	b.ReportMetric(float64(sseTotal.Microseconds())/n, "raw-sse-µs/op")
	b.ReportMetric(float64(sdkTotal.Microseconds())/n, "sdk-µs/op")
	b.ReportMetric(float64((sdkTotal-rawTotal).Microseconds())/n, "overhead-µs/op")
}
