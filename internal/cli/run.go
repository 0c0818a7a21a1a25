package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// deleteTimeout bounds the clean-up delete of `run`: long enough for the
// server to kill and unmount (tens of ms normally), short enough that a gone
// server does not hang the CLI; the sandbox's own timeout is the backstop.
const deleteTimeout = 30 * time.Second

func (a *app) newRunCmd() *cobra.Command {
	var (
		cf createFlags
		ef execFlags
	)
	cmd := &cobra.Command{
		Use:         "run [flags] -- CMD [ARG…]",
		Annotations: map[string]string{sandboxRunner: "true"},
		Short:       "Create a sandbox, run one command in it, print its output, delete it",
		Long: `Create a sandbox, run one command in it streaming its output, and delete the
sandbox, also when interrupted (Ctrl-C). A template that is being built (the
first use of python or code-interpreter builds it, for a few minutes) is
waited for, its build's log shown on stderr; --wait-template=false fails at
once instead. With -o json the exec's result is printed as one JSON object,
as for exec.

` + exitCodesHelp,
		Example: `  airlock run -- python3 -c 'import sys; print(sys.version)'
  airlock run --template python --memory 1G --ttl 10m --timeout 2m --shell 'pip list | head'
  OPENAI_API_KEY=… airlock run --secret OPENAI_API_KEY -e MODE=test -- python3 agent.py`,
		RunE: func(cmd *cobra.Command, args []string) error {
			before, argv := splitDash(cmd, args)
			if len(before) > 0 {
				argv = append(before, argv...) // `run cmd args` without --
			}
			creq, err := cf.request(a.getenv)
			if err != nil {
				return err
			}
			ereq, err := ef.request(argv)
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			code, err := a.runOnce(cmd.Context(), c, creq, ereq, ef.stdinReader(a.stdin), cf.waitTemplate)
			if err != nil {
				return err
			}
			if code != 0 {
				return exitCodeError{code}
			}
			return nil
		},
	}
	cf.register(cmd, false)
	ef.register(cmd, false)
	return cmd
}

// runOnce creates a sandbox, runs req in it and deletes it whatever happens.
func (a *app) runOnce(ctx context.Context, c *client.Client, creq api.CreateSandboxRequest, ereq api.ExecRequest, stdin io.Reader, wait bool) (int, error) {
	sbx, aborted, err := a.createSandbox(ctx, c, creq, wait, client.WithIdempotencyKey(newIdempotencyKey()))
	if sbx != nil {
		defer a.deleteQuietly(ctx, c, sbx.ID)
	}
	if err != nil {
		return 0, err
	}
	if aborted {
		return exitInterrupted, nil
	}
	return a.streamExec(ctx, c, sbx.ID, ereq, stdin, false)
}

// createSandbox creates a sandbox with createInterruptibly. When the
// template is being built (template_building: a shipped template's first
// use, or a template whose first build runs) and wait is set, it says so,
// shows the build's log on stderr as it happens, and creates once the
// build is ready; an interrupt while it waits stops waiting (aborted).
func (a *app) createSandbox(ctx context.Context, c *client.Client, req api.CreateSandboxRequest, wait bool, opts ...client.CallOption) (*api.Sandbox, bool, error) {
	for {
		sbx, aborted, err := a.createInterruptibly(ctx, c, req, opts...)
		if err == nil || aborted || !wait || !client.TemplateBuilding(err) {
			return sbx, aborted, err
		}
		if aborted, err := a.waitForBuild(ctx, c, orDefault(req.Template, "base"), err); aborted || err != nil {
			return nil, aborted, err
		}
		// The build ended. Should another one have started meanwhile, the
		// server waits for it rather than refusing again.
		req.WaitForTemplate = true
	}
}

// waitForBuild waits for the build that refusal (template_building) names,
// following its log on stderr. It returns a failed build as an error, and
// aborted when interrupted.
func (a *app) waitForBuild(ctx context.Context, c *client.Client, template string, refusal error) (bool, error) {
	id := client.BuildOf(refusal)
	if id == "" {
		// A server that names no build: wait as it asks, then try again.
		d, _ := client.RetryAfter(refusal)
		d = min(max(d, time.Second), 10*time.Second)
		fmt.Fprintf(a.stderr, "airlock: template %s is being built; trying again in %s…\n", template, d)
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-a.interrupts:
			return true, nil
		case <-time.After(d):
			return false, nil
		}
	}
	fmt.Fprintf(a.stderr, "airlock: template %s is being built (build %s; the first use of a shipped template takes a few minutes); waiting, Ctrl-C to stop:\n", template, id)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		b   api.TemplateBuild
		err error
	}
	ch := make(chan result, 1)
	logw := &indentWriter{w: a.stderr, indent: "  "}
	go func() {
		b, err := c.FollowTemplateBuild(wctx, id, logw)
		ch <- result{b, err}
	}()
	var r result
	select {
	case r = <-ch:
	case <-a.interrupts:
		cancel()
		<-ch
		logw.endLine()
		fmt.Fprintf(a.stderr, "airlock: stopped waiting; build %s goes on on the server\n", id)
		return true, nil
	}
	logw.endLine()
	switch {
	case r.err != nil && ctx.Err() != nil:
		return false, ctx.Err()
	case r.err != nil:
		// The log cannot be followed; the server waits for the build
		// instead (the next create asks it to).
		fmt.Fprintf(a.stderr, "airlock: cannot follow build %s (%s); waiting for it on the server\n", id, oneLine(r.err))
		return false, nil
	case r.b.Status != api.BuildReady:
		return false, buildFailedError{id: id, msg: r.b.Error}
	}
	fmt.Fprintf(a.stderr, "airlock: template %s is ready\n", template)
	return false, nil
}

// indentWriter writes each line with indent before it.
type indentWriter struct {
	w       io.Writer
	indent  string
	midLine bool
}

// endLine ends a last line the log left open.
func (iw *indentWriter) endLine() {
	if iw.midLine {
		_, _ = iw.w.Write([]byte("\n"))
		iw.midLine = false
	}
}

func (iw *indentWriter) Write(p []byte) (int, error) {
	var b []byte
	for _, c := range p {
		if !iw.midLine {
			b = append(b, iw.indent...)
			iw.midLine = true
		}
		b = append(b, c)
		if c == '\n' {
			iw.midLine = false
		}
	}
	if _, err := iw.w.Write(b); err != nil {
		return 0, err
	}
	return len(p), nil
}

// createInterruptibly creates a sandbox. A first interrupt lets the create
// finish (so the sandbox can be deleted rather than leaked) and reports
// aborted; a second one gives up waiting.
func (a *app) createInterruptibly(ctx context.Context, c *client.Client, req api.CreateSandboxRequest, opts ...client.CallOption) (*api.Sandbox, bool, error) {
	type result struct {
		sbx *api.Sandbox
		err error
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := make(chan result, 1)
	go func() {
		s, err := c.CreateSandbox(cctx, req, opts...)
		ch <- result{s, err}
	}()
	aborted := false
	for {
		select {
		case r := <-ch:
			if r.err != nil && aborted {
				return nil, true, nil
			}
			return r.sbx, aborted, r.err
		case <-a.interrupts:
			if !aborted {
				aborted = true
				fmt.Fprintln(a.stderr, "airlock: interrupted; deleting the sandbox once it is ready (Ctrl-C again to stop waiting)")
				continue
			}
			cancel()
			r := <-ch
			if r.sbx == nil {
				fmt.Fprintln(a.stderr, "airlock: stopped waiting; a sandbox being created ends at its timeout")
			}
			return r.sbx, true, nil
		}
	}
}

// deleteQuietly deletes a sandbox on a context that the interrupt that got
// us here cannot cancel, reporting a failure on stderr.
func (a *app) deleteQuietly(ctx context.Context, c *client.Client, id string) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deleteTimeout)
	defer cancel()
	if err := c.DeleteSandbox(dctx, id); err != nil {
		fmt.Fprintf(a.stderr, "airlock: deleting %s: %s\n", id, oneLine(err))
	}
}
