package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

func (a *app) newExecCmd() *cobra.Command {
	var f execFlags
	cmd := &cobra.Command{
		Use:         "exec SANDBOX [flags] -- CMD [ARG…]",
		Annotations: map[string]string{sandboxRunner: "true"},
		Short:       "Run a command in a sandbox, streaming its output",
		Long: `Run a command in a sandbox and stream its stdout and stderr as they happen.
If the connection drops, the output resumes where it stopped. With -o json
nothing is streamed: the exec's result, its stdout and stderr included, is
printed as one JSON object once it ended.

Ctrl-C sends SIGINT to the command (its whole process tree); a second
Ctrl-C detaches and leaves it running.

Without -i the command's stdin is empty; with -i this process's stdin is
streamed to it until EOF.

` + exitCodesHelp,
		Example: `  airlock exec sbx_… -- python3 -c 'print(1+1)'
  airlock exec --user root --cwd /tmp sbx_… -- ls -la
  airlock exec --shell 'cd /tmp && make' sbx_…
  echo hello | airlock exec -i sbx_… -- cat`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			before, argv := splitDash(cmd, args)
			if len(before) != 1 {
				if cmd.ArgsLenAtDash() >= 0 || len(before) == 0 {
					return usagef("want exactly one SANDBOX before --")
				}
				argv = before[1:] // `exec SANDBOX cmd` without --
			}
			req, err := f.request(argv)
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			code, err := a.streamExec(cmd.Context(), c, before[0], req, f.stdinReader(a.stdin), true)
			if err != nil {
				return err
			}
			if code != 0 {
				return exitCodeError{code}
			}
			return nil
		},
	}
	f.register(cmd, true)
	return cmd
}

// stdinChunk is the most one stdin request carries: big enough that a
// piped file goes in few requests, small enough to keep an interactive
// stream responsive.
const stdinChunk = 64 << 10

// pumpStdin copies r to the exec's stdin, then closes it. It returns when r
// ends or ctx is done; the goroutine reading r may stay blocked in Read (a
// terminal) but touches nothing else.
func (a *app) pumpStdin(ctx context.Context, c *client.Client, sandboxID, execID string, r io.Reader) {
	chunks := make(chan []byte)
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, stdinChunk)
			n, err := r.Read(buf)
			if n > 0 {
				select {
				case chunks <- buf[:n]:
				case <-ctx.Done():
					return
				}
			}
			if err != nil {
				return // EOF, or a broken stdin: either way the command gets EOF
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case b, ok := <-chunks:
			if !ok {
				// A command that already ended has no stdin to close: not an error.
				_ = c.CloseStdin(ctx, sandboxID, execID)
				return
			}
			if err := c.WriteStdin(ctx, sandboxID, execID, bytes.NewReader(b)); err != nil {
				return // the command ended or closed its stdin
			}
		}
	}
}

// streamExec runs req, copying its output to the CLI's stdout and stderr
// and stdin (when not nil) to the command, and returns the exit code the CLI
// should end with. With forwardInterrupt the first interrupt is sent to the
// command as SIGINT and a second one detaches; without, the first interrupt
// stops the stream at once. With -o json the output is collected instead
// and printed with the result as one JSON object.
func (a *app) streamExec(ctx context.Context, c *client.Client, sandboxID string, req api.ExecRequest, stdin io.Reader, forwardInterrupt bool) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if stdin == nil {
		// Given up front, even empty, stdin is closed at once: a command
		// that reads it sees EOF instead of waiting for input that never comes.
		empty := ""
		req.Stdin = &empty
	} else {
		req.Stdin = nil // kept open by the server for the pump
	}
	var (
		pump        sync.WaitGroup
		mu          sync.Mutex
		execID      string
		interrupted bool
	)
	outw, errw := a.stdout, a.stderr
	var outBuf, errBuf bytes.Buffer
	jsonOut := a.output == "json"
	if jsonOut {
		outw, errw = &outBuf, &errBuf
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		n := 0
		for {
			select {
			case <-done:
				return
			case <-a.interrupts:
				n++
				mu.Lock()
				interrupted = true
				id := execID
				mu.Unlock()
				if n == 1 && forwardInterrupt && id != "" {
					// The signal must reach the server even though the user
					// is impatient: its own short deadline, not ctx.
					sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
					if err := c.Signal(sctx, sandboxID, id, "SIGINT"); err != nil {
						fmt.Fprintf(a.stderr, "airlock: forwarding interrupt: %s\n", oneLine(err))
					}
					scancel()
					continue
				}
				cancel()
				return
			}
		}
	}()
	res, err := c.ExecWithHandlers(ctx, sandboxID, req, client.StreamHandlers{
		OnStart: func(id string) {
			mu.Lock()
			execID = id
			mu.Unlock()
			if stdin != nil {
				pump.Go(func() { a.pumpStdin(ctx, c, sandboxID, id, stdin) })
			}
		},
		// A failed write (a closed pipe) must not stop the command's
		// stream: keep draining so the exit status still arrives.
		OnStdout: func(p []byte) { _, _ = outw.Write(p) },
		OnStderr: func(p []byte) { _, _ = errw.Write(p) },
	})
	canceled := ctx.Err() != nil // by a second interrupt, before our own cancel
	cancel()                     // the stream is over: stop feeding stdin
	pump.Wait()
	mu.Lock()
	wasInterrupted := interrupted
	id := execID
	mu.Unlock()
	if err != nil {
		if wasInterrupted && canceled {
			if id != "" && forwardInterrupt {
				fmt.Fprintf(a.stderr, "airlock: detached; %s keeps running in %s\n", id, sandboxID)
			}
			return exitInterrupted, nil
		}
		return 0, err
	}
	if jsonOut {
		withOutput(res, outBuf.Bytes(), errBuf.Bytes())
		if err := printJSON(a.stdout, res); err != nil {
			return 0, err
		}
		code, _ := execExit(res) // the JSON says how it ended
		return code, nil
	}
	return a.resultCode(res, wasInterrupted), nil
}

// withOutput sets res's stdout and stderr as the API's JSON mode gives
// them: text, or both base64 with encoding "base64" when either is not
// UTF-8.
func withOutput(res *api.ExecResult, stdout, stderr []byte) {
	o, e := string(stdout), string(stderr)
	res.Encoding = ""
	if !utf8.Valid(stdout) || !utf8.Valid(stderr) {
		o, e = base64.StdEncoding.EncodeToString(stdout), base64.StdEncoding.EncodeToString(stderr)
		res.Encoding = "base64"
	}
	res.Stdout, res.Stderr = &o, &e
}

// resultCode maps an exec's outcome to the CLI's exit code (exitCodesHelp),
// explaining on stderr any end that was not a plain exit.
func (a *app) resultCode(res *api.ExecResult, interrupted bool) int {
	if res.Truncated {
		fmt.Fprintln(a.stderr, "airlock: output was truncated at the server's cap (truncated)")
	}
	code, why := execExit(res)
	if why != "" && !(interrupted && res.Status == api.ExecKilled) {
		fmt.Fprintf(a.stderr, "airlock: %s\n", why)
	}
	return code
}

// execExit is the exit code of an exec's outcome and, for an end that was
// not a plain exit, why in one line "message (code)".
func execExit(res *api.ExecResult) (int, string) {
	codeOr := func(def string) string { return orDefault(res.ErrorCode, def) }
	switch res.Status {
	case api.ExecExited:
		if res.ExitCode == nil {
			return exitAirlock, "the server reported no exit code (internal)"
		}
		return *res.ExitCode, ""
	case api.ExecTimeout:
		return exitTimeout, "command timed out (" + codeOr(api.ExecCodeTimeout) + ")"
	case api.ExecOOM:
		return exitOOM, "command ran out of memory (" + codeOr(api.ExecCodeOOM) + ")"
	case api.ExecKilled:
		if n := signalNumber(res.Signal); n > 0 {
			return exitSignal + n, fmt.Sprintf("command killed by %s (%s)", res.Signal, codeOr(api.ExecCodeSignaled))
		}
		// No signal of its own: its sandbox stopped or expired under it,
		// and took it down with SIGKILL.
		return exitSignal + int(unix.SIGKILL), fmt.Sprintf("command killed: %s (%s)", orDefault(res.Error, "its sandbox stopped"), codeOr(api.ExecCodeSandboxStopped))
	case api.ExecError:
		switch res.ErrorCode {
		case api.ExecCodeExecFailed, "":
			why := orDefault(res.Error, "command could not start")
			// The server says 126 or 127 as a shell would; an older one
			// gave no code and only the reason.
			if res.ExitCode != nil && (*res.ExitCode == exitCannotExec || *res.ExitCode == exitNotFound) {
				return *res.ExitCode, why + " (" + api.ExecCodeExecFailed + ")"
			}
			return cannotRunCode(why), why + " (" + api.ExecCodeExecFailed + ")"
		}
		// The platform's failure (agent lost, sandbox crashed), not the
		// command's.
		return exitAirlock, fmt.Sprintf("%s (%s)", orDefault(res.Error, "the exec failed"), res.ErrorCode)
	}
	if res.ExitCode != nil {
		return *res.ExitCode, ""
	}
	return exitAirlock, fmt.Sprintf("command ended with status %q (%s)", res.Status, codeOr(res.Status))
}

// cannotRunCode tells a command that was not found (127) from one that was
// found but could not be executed (126) by the reason the server gave, as
// a shell would; an unclear reason is 126.
func cannotRunCode(reason string) int {
	r := strings.ToLower(reason)
	switch {
	case strings.Contains(r, "cwd"), strings.Contains(r, "chdir"), strings.Contains(r, "working directory"):
		return exitCannotExec // the directory is missing, not the command
	case strings.Contains(r, "not found"), strings.Contains(r, "no such file"):
		return exitNotFound
	}
	return exitCannotExec
}

// signalNumber reads "SIGKILL", "KILL" or "9".
func signalNumber(s string) int {
	if n, err := strconv.Atoi(s); err == nil {
		return n
	}
	s = strings.ToUpper(s)
	if !strings.HasPrefix(s, "SIG") {
		s = "SIG" + s
	}
	return int(unix.SignalNum(s))
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
