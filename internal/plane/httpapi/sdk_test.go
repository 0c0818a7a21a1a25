package httpapi_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// TestSDKContract drives the public Go SDK against the real server, so that
// the two cannot drift apart silently.
func TestSDKContract(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(h.url, h.key("acme"))
	if err != nil {
		t.Fatal(err)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Metadata: map[string]string{"k": "v"}}, client.WithIdempotencyKey("sdk-1"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Metadata: map[string]string{"k": "v"}}, client.WithIdempotencyKey("sdk-1"))
	if err != nil || again.ID != sb.ID {
		t.Fatalf("idempotent retry: %v %v", again, err)
	}
	res, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "sdk"}})
	if err != nil || strp(res.Stdout) != "sdk\n" {
		t.Fatalf("Exec: %+v %v", res, err)
	}
	var out bytes.Buffer
	var exit *api.ExecResult
	for ev, err := range c.ExecStream(ctx, sb.ID, api.ExecRequest{Shell: sh(`echo a; echo b >&2; exit 5`)}) {
		if err != nil {
			t.Fatal(err)
		}
		switch ev.Type {
		case client.EventStdout, client.EventStderr:
			out.Write(ev.Data)
		case client.EventExit:
			exit = ev.Result
		}
	}
	if out.Len() != 4 || exit == nil || intp(exit.ExitCode) != "5" {
		t.Fatalf("ExecStream: %q %+v", out.String(), exit)
	}
	id, err := c.ExecAsync(ctx, sb.ID, api.ExecRequest{Cmd: []string{"cat"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteStdin(ctx, sb.ID, id, strings.NewReader("piped")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseStdin(ctx, sb.ID, id); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	for ev, err := range c.Attach(ctx, sb.ID, id, 0) {
		if err != nil {
			t.Fatal(err)
		}
		out.Write(ev.Data)
	}
	if out.String() != "piped" {
		t.Fatalf("Attach: %q", out.String())
	}
	if _, err := c.WriteFile(ctx, sb.ID, "/home/user/f.txt", strings.NewReader("file")); err != nil {
		t.Fatal(err)
	}
	rc, err := c.ReadFile(ctx, sb.ID, "/home/user/f.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "file" {
		t.Fatalf("ReadFile: %q", b)
	}
	if _, err := c.Mkdir(ctx, sb.ID, "/home/user/d"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Move(ctx, sb.ID, "/home/user/f.txt", "/home/user/d/g.txt"); err != nil {
		t.Fatal(err)
	}
	if fi, err := c.Stat(ctx, sb.ID, "/home/user/d/g.txt"); err != nil || fi.Size != 4 {
		t.Fatalf("Stat: %+v %v", fi, err)
	}
	if err := c.Remove(ctx, sb.ID, "/home/user/d", true); err != nil {
		t.Fatal(err)
	}
	pty, err := c.PTY(ctx, sb.ID, client.PTYOptions{Cmd: []string{"/bin/sh", "-c", "echo from-pty; exit 3"}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(pty)
	pty.Close()
	if !strings.Contains(string(b), "from-pty") || pty.ExitResult() == nil || intp(pty.ExitResult().ExitCode) != "3" {
		t.Fatalf("PTY: %q %+v", b, pty.ExitResult())
	}
	// Typed errors.
	if _, err := c.GetSandbox(ctx, "sbx_missing"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("missing sandbox: %v", err)
	}
	if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"ls"}, Shell: sh("ls")}); !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("cmd and shell: %v", err)
	}
	if err := c.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}
