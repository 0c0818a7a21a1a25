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
		Use:   "run [flags] -- CMD [ARG…]",
		Short: "Create a sandbox, run one command in it, print its output, delete it",
		Long: `Create a sandbox, run one command in it streaming its output, and delete the
sandbox, also when interrupted (Ctrl-C). Exit status as for exec.`,
		Example: `  airlock run -- python3 -c 'import sys; print(sys.version)'
  airlock run --template python --memory 1G --timeout 2m --shell 'pip list | head'`,
		RunE: func(cmd *cobra.Command, args []string) error {
			before, argv := splitDash(cmd, args)
			if len(before) > 0 {
				argv = append(before, argv...) // `run cmd args` without --
			}
			creq, err := cf.request()
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
			code, err := a.runOnce(cmd.Context(), c, creq, ereq, ef.stdinReader(a.stdin))
			if err != nil {
				return err
			}
			if code != 0 {
				return exitCodeError{code}
			}
			return nil
		},
	}
	cf.register(cmd, "ttl", false)
	ef.register(cmd, false)
	return cmd
}

// runOnce creates a sandbox, runs req in it and deletes it whatever happens.
func (a *app) runOnce(ctx context.Context, c *client.Client, creq api.CreateSandboxRequest, ereq api.ExecRequest, stdin io.Reader) (int, error) {
	sbx, aborted, err := a.createInterruptibly(ctx, c, creq)
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

// createInterruptibly creates a sandbox. A first interrupt lets the create
// finish (so the sandbox can be deleted rather than leaked) and reports
// aborted; a second one gives up waiting.
func (a *app) createInterruptibly(ctx context.Context, c *client.Client, req api.CreateSandboxRequest) (*api.Sandbox, bool, error) {
	type result struct {
		sbx *api.Sandbox
		err error
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := make(chan result, 1)
	go func() {
		s, err := c.CreateSandbox(cctx, req, client.WithIdempotencyKey(newIdempotencyKey()))
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
