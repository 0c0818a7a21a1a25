package cli

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

func (a *app) newShellCmd() *cobra.Command {
	var user, cwd string
	cmd := &cobra.Command{
		Use:         "shell SANDBOX [-- CMD [ARG…]]",
		Annotations: map[string]string{sandboxRunner: "true", noJSON: "is an interactive terminal (use exec -o json)"},
		Short:       "Open an interactive terminal in a sandbox",
		Long: `Open an interactive terminal in a sandbox (a PTY over a WebSocket). The local
terminal is put in raw mode, so Ctrl-C and friends reach the sandbox, and its
size follows the local window.

` + exitCodesHelp,
		Example: `  airlock shell sbx_…
  airlock shell --user root sbx_… -- /usr/bin/python3 -q`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			before, argv := splitDash(cmd, args)
			if len(before) != 1 {
				return usagef("want exactly one SANDBOX, then optionally -- CMD ARGS…")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			inFd, inTTY := ttyFd(a.stdin)
			outFd, outTTY := ttyFd(a.stdout)
			opts := client.PTYOptions{Cmd: argv, User: user, Cwd: cwd}
			if outTTY {
				if w, h, err := term.GetSize(outFd); err == nil {
					opts.Cols, opts.Rows = uint16(w), uint16(h)
				}
			}
			p, err := c.PTY(cmd.Context(), before[0], opts)
			if err != nil {
				return err
			}
			defer p.Close()
			if inTTY {
				old, err := term.MakeRaw(inFd)
				if err != nil {
					return fmt.Errorf("setting the terminal to raw mode: %w", err)
				}
				// Restore before anything else is printed (deferred calls
				// run last-in first-out: this runs before p.Close).
				defer term.Restore(inFd, old)
			}
			done := make(chan struct{})
			defer close(done)
			go func() {
				for {
					select {
					case <-done:
						return
					case <-a.winch:
						if !outTTY {
							continue
						}
						if w, h, err := term.GetSize(outFd); err == nil {
							_ = p.Resize(uint16(w), uint16(h))
						}
					case <-a.interrupts:
						// SIGTERM or SIGINT from outside (a raw terminal
						// sends Ctrl-C as a byte instead): end the session.
						p.Close()
						return
					}
				}
			}()
			go func() {
				// Ends with stdin's EOF, or with the process.
				_, _ = io.Copy(p, a.stdin)
			}()
			if _, err := io.Copy(a.stdout, p); err != nil {
				return err
			}
			return shellExit(p.ExitResult())
		},
	}
	cmd.Flags().StringVar(&user, "user", "", "user inside the sandbox: user (default) or root")
	cmd.Flags().StringVar(&cwd, "cwd", "", "working directory (default the user's home)")
	return cmd
}

// ttyFd returns the descriptor of f when it is a terminal.
func ttyFd(f any) (int, bool) {
	file, ok := f.(*os.File)
	if !ok {
		return 0, false
	}
	fd := int(file.Fd())
	return fd, term.IsTerminal(fd)
}

// shellExit turns the terminal process's result into the CLI's exit, as
// exec's (exitCodesHelp).
func shellExit(res *api.ExecResult) error {
	if res == nil || (res.Status == "" && res.ExitCode == nil) {
		return nil // the server did not say; the session ended normally
	}
	if code, _ := execExit(res); code != 0 {
		return exitCodeError{code}
	}
	return nil
}
