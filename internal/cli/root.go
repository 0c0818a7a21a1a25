// Package cli implements the `airlock` command line: a client of the HTTP API through the Go SDK, plus `doctor`; `serve` is internal/daemon's, added by cmd/airlock.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/airlockhq/airlock/client"
)

// Exit codes of the CLI besides a command's own. The commands that run
// something in a sandbox (exec, run, code, shell) follow docker's and
// kubectl's exec: 125 is airlock's own failure, 126 and 127 a command that
// could not start, 128+N a command killed by signal N; every other
// command exits 1 on an error (see exitCodesHelp).
const (
	exitError       = 1   // an error of a command that runs nothing in a sandbox
	exitTimeout     = 124 // the command hit its timeout (as timeout(1))
	exitAirlock     = 125 // airlock itself failed: a bad flag, an API error, no server
	exitCannotExec  = 126 // the command was found but could not be executed
	exitNotFound    = 127 // the command was not found
	exitSignal      = 128 // + N: the command was killed by signal N
	exitOOM         = exitSignal + 9
	exitInterrupted = exitSignal + 2 // Ctrl-C: the command got SIGINT, or airlock stopped waiting
)

// exitCodesHelp documents the exit status of exec, run, code and shell.
const exitCodesHelp = `Exit status (as docker and kubectl exec):
  the command's own   it exited by itself
  124                 it hit --timeout (as timeout(1))
  125                 airlock failed: a bad flag, an API error, no server,
                      the sandbox's agent lost
  126                 the command could not be executed (permission denied,
                      not an executable, …)
  127                 the command was not found
  128+N               it was killed by signal N: 137 (SIGKILL) also when it
                      ran out of memory or its sandbox stopped or expired
                      under it, 130 when interrupted with Ctrl-C`

// sandboxRunner marks the commands whose errors exit exitAirlock (125)
// rather than 1, since their own success codes are a command's.
const sandboxRunner = "airlock/runs-in-sandbox"

// app is one invocation of the CLI: its streams, environment and flags.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	// interrupts delivers SIGINT/SIGTERM; commands that must clean up
	// (run, exec) watch it instead of dying with the process.
	interrupts <-chan os.Signal
	// winch delivers SIGWINCH for `shell`.
	winch <-chan os.Signal
	// homeDir finds the user's home for the key file.
	homeDir func() (string, error)

	url    string
	apiKey string
	output string
	// wantJSON is -o json as found in the arguments before cobra parses
	// them, so that an error of parsing is JSON too.
	wantJSON bool
	// noKey records that no API key was found, to explain an unauthenticated answer.
	noKey bool
	// keySource says where the key was found (whoami).
	keySource string

	sys sysProbe // doctor's view of the host

	// serve builds `airlock serve`; nil leaves it out. cmd/airlock passes
	// internal/daemon's: this package imports nothing of the daemon, so
	// that the client commands' code and package graph stay the SDK's
	// (TestClientCommandsImportNoDaemon).
	serve func() *cobra.Command
}

// Execute runs the CLI with the process's arguments and exits with its
// code. serve builds the `serve` command (nil: none).
func Execute(serve func() *cobra.Command) {
	interrupts := make(chan os.Signal, 2)
	signal.Notify(interrupts, os.Interrupt, syscall.SIGTERM)
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	a := &app{
		stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr,
		getenv: os.Getenv, interrupts: interrupts, winch: winch,
		homeDir: os.UserHomeDir, sys: hostProbe{}, serve: serve,
	}
	os.Exit(a.run(context.Background(), os.Args[1:]))
}

// exitCodeError ends the CLI with a command's exit code and no message.
type exitCodeError struct{ code int }

func (e exitCodeError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// usageError is a mistake on the command line.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// noJSON marks a command whose output cannot be JSON (a terminal, a shell
// script): with -o json it fails at once with a usage error saying why.
const noJSON = "airlock/no-json"

// codedError is an error of the CLI's own with a code, reported as
// "message (code)" (or in JSON) like the server's.
type codedError struct{ code, msg string }

func (e codedError) Error() string { return e.msg }

// run executes args and returns the process exit code.
func (a *app) run(ctx context.Context, args []string) int {
	a.wantJSON = jsonRequested(args)
	root := a.newRoot()
	root.SetArgs(args)
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	var ec exitCodeError
	if errors.As(err, &ec) {
		return ec.code
	}
	var ae *client.APIError
	if a.noKey && errors.As(err, &ae) && ae.Code == "unauthenticated" {
		ae.Message += "; no API key found: set AIRLOCK_API_KEY or ~/.config/airlock/key (see airlock --help)"
	}
	if a.jsonOut() {
		_ = json.NewEncoder(a.stderr).Encode(errorJSON(err))
	} else {
		fmt.Fprintf(a.stderr, "airlock: %s\n", oneLine(err))
	}
	if cmd != nil && cmd.Annotations[sandboxRunner] != "" {
		return exitAirlock
	}
	return exitError
}

// oneLine renders err as "message (code)" on a single line.
func oneLine(err error) string {
	var ae *client.APIError
	var msg string
	switch {
	case errors.As(err, &ae):
		msg = ae.Error() // "message (code)"
		if ae.RequestID != "" && ae.Code == "internal" {
			msg = fmt.Sprintf("%s (%s, request %s)", ae.Message, ae.Code, ae.RequestID)
		}
	default:
		msg = fmt.Sprintf("%s (%s)", err.Error(), localCode(err))
	}
	return strings.Join(strings.Fields(msg), " ")
}

// jsonOut reports whether the output is JSON: -o json, also when the
// arguments could not be parsed.
func (a *app) jsonOut() bool { return a.output == "json" || (a.output == "table" && a.wantJSON) }

// jsonRequested finds -o json / --output json among args (before a --).
func jsonRequested(args []string) bool {
	for i, arg := range args {
		switch {
		case arg == "--":
			return false
		case arg == "-o" || arg == "--output":
			if i+1 < len(args) && args[i+1] == "json" {
				return true
			}
		case arg == "-ojson" || arg == "-o=json" || arg == "--output=json":
			return true
		}
	}
	return false
}

// jsonError is an error as -o json reports it on stderr: the API's error
// body, with the CLI's own codes (usage, …) for errors of its own.
type jsonError struct {
	Error struct {
		Code        string `json:"code"`
		Message     string `json:"message"`
		Status      int    `json:"status,omitempty"`
		RequestID   string `json:"request_id,omitempty"`
		SandboxID   string `json:"sandbox_id,omitempty"`
		BuildID     string `json:"build_id,omitempty"`
		RetryAfterS int64  `json:"retry_after_s,omitempty"`
	} `json:"error"`
}

func errorJSON(err error) jsonError {
	var out jsonError
	var ae *client.APIError
	if errors.As(err, &ae) {
		out.Error.Code, out.Error.Message, out.Error.Status = ae.Code, ae.Message, ae.StatusCode
		out.Error.RequestID, out.Error.SandboxID, out.Error.BuildID = ae.RequestID, ae.SandboxID, ae.BuildID
		out.Error.RetryAfterS = int64(ae.RetryAfter.Seconds())
		if out.Error.Message == "" {
			out.Error.Message = ae.Error()
		}
		return out
	}
	out.Error.Code, out.Error.Message = localCode(err), strings.Join(strings.Fields(err.Error()), " ")
	return out
}

// localCode names an error that did not come from the server's error body.
func localCode(err error) string {
	var ue usageError
	var ce codedError
	switch {
	case errors.As(err, &ce):
		return ce.code
	case errors.As(err, &ue), strings.HasPrefix(err.Error(), "unknown command"):
		return "usage"
	case isBuildFailed(err):
		return "build_failed"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	case errors.Is(err, client.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, client.ErrNotFound):
		return "not_found"
	case errors.Is(err, client.ErrInvalidArgument):
		return "invalid_argument"
	case errors.Is(err, os.ErrNotExist):
		return "not_found"
	case errors.Is(err, os.ErrPermission):
		return "permission_denied"
	}
	return "error"
}

func (a *app) newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "airlock",
		Short: "Self-hosted sandboxes for untrusted code",
		Long: `airlock runs untrusted, AI-generated code in isolated sandboxes.

Start the server with "airlock serve" (as root), then use the other commands,
which talk to it over its HTTP API.

Server address: --url, else $AIRLOCK_URL, else ` + client.DefaultURL + `.
API key, the first found of:
  --api-key
  $AIRLOCK_API_KEY
  the file named by $AIRLOCK_API_KEY_FILE
  $XDG_CONFIG_HOME/airlock/key (default ~/.config/airlock/key)
The server prints its admin key once, on its first start; store it in one of
these places (e.g. install -m 600 /dev/stdin ~/.config/airlock/key).

Errors are reported on stderr as one line "airlock: <message> (<code>)"; with
-o json as one JSON object {"error": {"code", "message", …}} (the API's error
body), and every command prints JSON on stdout (see airlock help -o json).
Exit status: 0, or 1 for an error; exec, run, code and shell exit with the
command's own status, 124 for its timeout, 125 for an error of airlock's,
126/127 for a command that could not start, 128+N for a command killed by
signal N (see airlock exec --help).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// Parsing errors are usage errors; cobra reports them as plain errors.
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err.Error()} })
	pf := root.PersistentFlags()
	pf.StringVar(&a.url, "url", "", "server URL (env AIRLOCK_URL, default "+client.DefaultURL+")")
	pf.StringVar(&a.apiKey, "api-key", "", "API key (env AIRLOCK_API_KEY; see --help for key files)")
	pf.StringVarP(&a.output, "output", "o", "table", "output format: table or json")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if a.output != "table" && a.output != "json" {
			return usagef("--output must be table or json, not %q", a.output)
		}
		for c := cmd; c != nil; c = c.Parent() {
			if why := c.Annotations[noJSON]; why != "" && a.output == "json" {
				return usagef("%s %s: -o json does not apply", cmd.CommandPath(), why)
			}
		}
		return nil
	}
	textHelp := root.HelpFunc()
	root.SetHelpFunc(func(cmd *cobra.Command, args []string) {
		if a.jsonOut() {
			_ = printJSON(a.stdout, commandDoc(cmd))
			return
		}
		textHelp(cmd, args)
	})
	root.SetHelpCommand(&cobra.Command{
		Use:   "help [COMMAND]…",
		Short: "Help about any command (with -o json: its usage, flags and subcommands as JSON)",
		RunE: func(cmd *cobra.Command, args []string) error {
			target, rest, err := cmd.Root().Find(args)
			if err != nil || target == nil || len(rest) > 0 {
				return usagef("no help for %q: unknown command", strings.Join(args, " "))
			}
			return target.Help()
		},
	})
	root.AddCommand(
		a.newSandboxCmd(),
		a.newExecCmd(),
		a.newRunCmd(),
		a.newCpCmd(),
		a.newShellCmd(),
		a.newKeysCmd(),
		a.newQuotaCmd(),
		a.newPreviewCmd(),
		a.newCodeCmd(),
		a.newMCPCmd(),
		a.newTemplateCmd(),
		a.newAuditCmd(),
		a.newUsageCmd(),
		a.newTopCmd(),
		a.newDoctorCmd(),
		a.newVersionCmd(),
		a.newWhoamiCmd(),
	)
	// Snapshots, fork and reset (snapshot.go); warm pools (pool.go).
	root.AddCommand(a.snapshotCommands()...)
	root.AddCommand(a.poolCommands()...)
	if a.serve != nil {
		root.AddCommand(a.serve())
	}
	// The completion command cobra adds, made now so that it is in the
	// tree like the others: a shell script, never JSON.
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			c.Annotations = map[string]string{noJSON: "prints a shell script"}
		}
	}
	markUsageErrors(root)
	return root
}

// cmdDoc is a command's help as -o json prints it.
type cmdDoc struct {
	Command     string    `json:"command"`
	Short       string    `json:"short"`
	Long        string    `json:"long,omitempty"`
	Usage       string    `json:"usage"`
	Example     string    `json:"example,omitempty"`
	Aliases     []string  `json:"aliases,omitempty"`
	Flags       []flagDoc `json:"flags"`
	Subcommands []subDoc  `json:"subcommands,omitempty"`
}

type flagDoc struct {
	Name      string `json:"name"`
	Shorthand string `json:"shorthand,omitempty"`
	Type      string `json:"type"`
	Default   string `json:"default,omitempty"`
	Usage     string `json:"usage"`
}

type subDoc struct {
	Name  string `json:"name"`
	Short string `json:"short"`
}

func commandDoc(cmd *cobra.Command) cmdDoc {
	d := cmdDoc{Command: cmd.CommandPath(), Short: cmd.Short, Long: cmd.Long, Usage: cmd.UseLine(),
		Example: cmd.Example, Aliases: cmd.Aliases, Flags: []flagDoc{}}
	add := func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		d.Flags = append(d.Flags, flagDoc{Name: f.Name, Shorthand: f.Shorthand, Type: f.Value.Type(), Default: f.DefValue, Usage: f.Usage})
	}
	cmd.LocalFlags().VisitAll(add)
	cmd.InheritedFlags().VisitAll(add)
	for _, sub := range cmd.Commands() {
		if sub.IsAvailableCommand() {
			d.Subcommands = append(d.Subcommands, subDoc{Name: sub.Name(), Short: sub.Short})
		}
	}
	return d
}

// groupRunE is the RunE of a command that only groups subcommands: help
// without arguments, a usage error for an unknown subcommand.
func groupRunE(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unknown command %q for %q", args[0], cmd.CommandPath())
	}
	return cmd.Help()
}

// markUsageErrors makes argument-count errors of every command usage errors.
func markUsageErrors(cmd *cobra.Command) {
	if v := cmd.Args; v != nil {
		cmd.Args = func(c *cobra.Command, args []string) error {
			if err := v(c, args); err != nil {
				return usageError{err.Error() + "; see " + c.CommandPath() + " --help"}
			}
			return nil
		}
	}
	for _, sub := range cmd.Commands() {
		markUsageErrors(sub)
	}
}

// client builds the SDK client from flags, environment and key files.
func (a *app) client() (*client.Client, error) {
	u := a.url
	if u == "" {
		u = a.getenv(client.EnvURL)
	}
	key, err := a.findKey()
	if err != nil {
		return nil, err
	}
	a.noKey = key == ""
	return client.New(u, key, client.WithUserAgent("airlock-cli/"+versionString()))
}

// findKey returns the API key by the precedence documented in the root help.
func (a *app) findKey() (string, error) {
	if a.apiKey != "" {
		a.keySource = "--api-key"
		return a.apiKey, nil
	}
	if k := a.getenv(client.EnvAPIKey); k != "" {
		a.keySource = "$" + client.EnvAPIKey
		return k, nil
	}
	if f := a.getenv("AIRLOCK_API_KEY_FILE"); f != "" {
		a.keySource = f + " ($AIRLOCK_API_KEY_FILE)"
		return readKeyFile(f, true)
	}
	dir := a.getenv("XDG_CONFIG_HOME")
	if dir == "" {
		home, err := a.homeDir()
		if err != nil {
			return "", nil // no home: go on without a key, the server will say unauthenticated
		}
		dir = filepath.Join(home, ".config")
	}
	f := filepath.Join(dir, "airlock", "key")
	k, err := readKeyFile(f, false)
	if k != "" {
		a.keySource = f
	}
	return k, err
}

// readKeyFile reads a key file. A missing default file is no key; a file
// named explicitly must exist.
func readKeyFile(path string, must bool) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		if !must && errors.Is(err, os.ErrNotExist) {
			return "", nil
		}
		return "", fmt.Errorf("reading api key file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}
