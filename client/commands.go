package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/airlockhq/airlock/api"
)

// signalTimeout bounds the SIGKILL a cancelled Run or Start sends: the
// caller has given up, so it must not wait long, but the kill should reach
// a server that is merely slow.
const signalTimeout = 5 * time.Second

// maxCaptured bounds how much of each stream a streamed command keeps for
// its result: the server's own cap (max_exec_output_bytes) is at most
// 64 MiB per stream, and past its cap it sends samples of the tail, which
// are not kept (the result's output is then fetched from the server).
const maxCaptured = 64 << 20

// RunOption adjusts one command (Run, RunArgs, Start), one code cell
// (RunCode) or one terminal (PTY); each says which it applies to. WithEnv
// is a RunOption too.
type RunOption interface{ applyRun(*runConfig) }

type runConfig struct {
	timeout   time.Duration
	user, cwd string
	env       map[string]string
	stdin     *string
	maxOutput int64
	onStdout  func(string)
	onStderr  func(string)
	onResult  func(api.CodeEvent)
	language  string
	codeCtx   string
	cols      uint16
	rows      uint16
	command   []string
}

type runOptionFunc func(*runConfig)

func (f runOptionFunc) applyRun(c *runConfig) { f(c) }

func runOptions(opts []RunOption) runConfig {
	var cfg runConfig
	for _, o := range opts {
		if o != nil {
			o.applyRun(&cfg)
		}
	}
	return cfg
}

// WithTimeout bounds a command or a cell (Run, RunArgs, Start, RunCode).
// The server enforces it even when no client is connected: past it the
// command's whole process tree is killed and the result's Status is
// timeout (an *ExecError matching ErrExecTimeout).
func WithTimeout(d time.Duration) RunOption {
	return runOptionFunc(func(c *runConfig) { c.timeout = d })
}

// WithUser runs a command or a terminal as user: "user" (uid 1000, the
// default) or "root" (root of the sandbox's own user namespace).
func WithUser(user string) RunOption {
	return runOptionFunc(func(c *runConfig) { c.user = user })
}

// WithCwd sets the working directory of a command or terminal (default the
// user's home); a relative one is taken from the home.
func WithCwd(dir string) RunOption {
	return runOptionFunc(func(c *runConfig) { c.cwd = dir })
}

// WithStdin gives a command its whole stdin, closed after it. Without it a
// Run's stdin is empty and a Start's stays open for SendStdin.
func WithStdin(data string) RunOption {
	return runOptionFunc(func(c *runConfig) { c.stdin = &data })
}

// WithMaxOutput sets how much of each of stdout and stderr the server keeps
// (max_output_bytes; default 1 MiB): past it the head and the tail are kept
// and the result says Truncated.
func WithMaxOutput(bytes int64) RunOption {
	return runOptionFunc(func(c *runConfig) { c.maxOutput = bytes })
}

// OnStdout calls f with each piece of a command's or cell's stdout as it
// happens (Run, RunArgs, Start, RunCode). The result holds the whole
// output all the same. Callbacks of one command run on one goroutine, in
// order.
func OnStdout(f func(chunk string)) RunOption {
	return runOptionFunc(func(c *runConfig) { c.onStdout = f })
}

// OnStderr calls f with each piece of stderr as it happens (see OnStdout).
func OnStderr(f func(chunk string)) RunOption {
	return runOptionFunc(func(c *runConfig) { c.onStderr = f })
}

// OnResult calls f with each result of a cell (RunCode) as it comes: the
// last expression's value and every display() output or figure.
func OnResult(f func(api.CodeEvent)) RunOption {
	return runOptionFunc(func(c *runConfig) { c.onResult = f })
}

// WithLanguage sets a cell's language: python (default), javascript or
// bash (RunCode).
func WithLanguage(lang string) RunOption {
	return runOptionFunc(func(c *runConfig) { c.language = lang })
}

// WithCodeContext runs a cell in the code context id (RunCode; see
// Sandbox.NewCodeContext) instead of the sandbox's default one of its
// language.
func WithCodeContext(id string) RunOption {
	return runOptionFunc(func(c *runConfig) { c.codeCtx = id })
}

// WithTerminalSize sets a terminal's initial size (PTY; default 80x24).
func WithTerminalSize(cols, rows uint16) RunOption {
	return runOptionFunc(func(c *runConfig) { c.cols, c.rows = cols, rows })
}

// WithCommand sets what a terminal runs (PTY; default the user's login
// shell).
func WithCommand(argv ...string) RunOption {
	return runOptionFunc(func(c *runConfig) { c.command = argv })
}

// CommandResult is how a command ended, with its whole output.
type CommandResult struct {
	ID string // ex_…
	// Stdout and Stderr are the command's output (at most the server's cap
	// of each: its head and tail when Truncated).
	Stdout, Stderr string
	// ExitCode is the command's exit status; -1 when it did not exit by
	// itself (killed, timed out) and the server gave none.
	ExitCode int
	// Status is exited, timeout, killed, oom or error (api.Exec*).
	Status string
	// Truncated says that output past the cap was dropped between the head
	// and the tail (the server counts it in Result).
	Truncated bool
	Duration  time.Duration
	// Result is the server's record, as the API gives it.
	Result *api.ExecResult
}

// ExecError is a command that did not succeed: Run and Wait return one for
// a command that timed out (as the Python and TypeScript SDKs raise
// ExecTimeout); CommandResult.Err for every end but a zero exit. errors.Is
// matches it against ErrExecTimeout, ErrExecKilled, ErrOutOfMemory,
// ErrExecFailed or ErrExitStatus; Result holds what the command printed.
type ExecError struct {
	Status  string // exited, timeout, killed, oom, error
	Code    string // the exec's error_code: exec_timeout, out_of_memory, exec_failed…
	Message string // the server's reason, when it gave one
	Result  *CommandResult
}

// Error implements error: "command timed out (exec_timeout)".
func (e *ExecError) Error() string {
	msg := e.Message
	if e.Status == api.ExecExited {
		return fmt.Sprintf("command exited with status %d (exit_status)", e.Result.ExitCode)
	}
	if msg == "" {
		switch e.Status {
		case api.ExecTimeout:
			msg = "command timed out"
		case api.ExecKilled:
			msg = "command was killed"
		case api.ExecOOM:
			msg = "command ran out of memory"
		default:
			msg = "command failed"
		}
	}
	code := e.Code
	if code == "" {
		code = e.Status
	}
	return fmt.Sprintf("%s (%s)", msg, code)
}

// Is matches the error's class.
func (e *ExecError) Is(target error) bool {
	switch target {
	case ErrExecTimeout:
		return e.Status == api.ExecTimeout
	case ErrOutOfMemory:
		return e.Status == api.ExecOOM
	case ErrExecKilled:
		return e.Status == api.ExecKilled
	case ErrExecFailed:
		return e.Status == api.ExecError && (e.Code == api.ExecCodeExecFailed || e.Code == "")
	case ErrExitStatus:
		return e.Status == api.ExecExited
	case ErrUnavailable:
		return e.Code == api.ExecCodeAgentUnavailable
	}
	return false
}

// Run runs the shell command cmd (/bin/sh -c) as WithUser (default user) in
// WithCwd (default the home) and waits for it. How it ended is a result:
// a non-zero exit, a kill, running out of memory, a command not found (127)
// (check ExitCode and Status, or res.Err()); a timeout (WithTimeout) also
// returns an *ExecError matching ErrExecTimeout, with the result. When ctx
// ends first the command is killed.
func (s *Sandbox) Run(ctx context.Context, cmd string, opts ...RunOption) (*CommandResult, error) {
	return s.run(ctx, api.ExecRequest{Shell: &cmd}, opts)
}

// RunArgs is Run for an argv, run without a shell (no quoting, no
// expansion: what an untrusted argument needs).
func (s *Sandbox) RunArgs(ctx context.Context, argv []string, opts ...RunOption) (*CommandResult, error) {
	if len(argv) == 0 {
		return nil, fmt.Errorf("run: empty argv: %w", ErrInvalidArgument)
	}
	return s.run(ctx, api.ExecRequest{Cmd: argv}, opts)
}

// run starts req and waits for its follower, which ends with the command
// or, killing it, with ctx.
func (s *Sandbox) run(ctx context.Context, req api.ExecRequest, opts []RunOption) (*CommandResult, error) {
	cfg := runOptions(opts)
	c := &Command{sb: s, done: make(chan struct{})}
	// On the caller's goroutine: a foreground command needs no other.
	c.follow(ctx, execRequest(req, cfg, true), cfg, nil)
	if c.err != nil && ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	return c.res, c.err
}

// Start starts the shell command cmd in the background and returns once it
// runs; Wait, Kill, SendStdin and CloseStdin follow it. Its output goes to
// OnStdout and OnStderr as it happens. Its stdin stays open until
// CloseStdin (unless WithStdin gave it). When ctx ends before the command,
// the command is killed, as with exec.CommandContext.
func (s *Sandbox) Start(ctx context.Context, cmd string, opts ...RunOption) (*Command, error) {
	return s.start(ctx, api.ExecRequest{Shell: &cmd}, runOptions(opts), false)
}

// StartArgs is Start for an argv, run without a shell.
func (s *Sandbox) StartArgs(ctx context.Context, argv []string, opts ...RunOption) (*Command, error) {
	if len(argv) == 0 {
		return nil, fmt.Errorf("start: empty argv: %w", ErrInvalidArgument)
	}
	return s.start(ctx, api.ExecRequest{Cmd: argv}, runOptions(opts), false)
}

// Command is a command started in a sandbox (Start). Its methods are safe
// for concurrent use.
type Command struct {
	sb *Sandbox
	id string

	done chan struct{} // closed when res, err are set
	res  *CommandResult
	err  error
}

// ID is the exec's id (ex_…).
func (c *Command) ID() string { return c.id }

// start sends req in the streaming mode and follows the command on a
// goroutine of its own; it returns once the server said the command runs.
func (s *Sandbox) start(ctx context.Context, req api.ExecRequest, cfg runConfig, foreground bool) (*Command, error) {
	req = execRequest(req, cfg, foreground)
	started := make(chan string, 1)
	c := &Command{sb: s, done: make(chan struct{})}
	go c.follow(ctx, req, cfg, started)
	select {
	case id := <-started:
		c.id = id
		return c, nil
	case <-c.done:
		select {
		case id := <-started: // it started, and ended at once
			c.id = id
			return c, nil
		default:
			return nil, c.err
		}
	}
}

// execRequest completes req with the options.
func execRequest(req api.ExecRequest, cfg runConfig, foreground bool) api.ExecRequest {
	req.User, req.Cwd, req.Env = cfg.user, cfg.cwd, cfg.env
	if req.Cwd != "" {
		req.Cwd = resolvePath(req.Cwd)
	}
	if cfg.timeout > 0 {
		secs := cfg.timeout.Seconds()
		req.TimeoutS = &secs
	}
	if cfg.maxOutput > 0 {
		req.MaxOutputBytes = &cfg.maxOutput
	}
	switch {
	case cfg.stdin != nil:
		req.Stdin = cfg.stdin
	case foreground:
		// Given, even empty, stdin is closed at once: a command that reads
		// it sees EOF rather than waiting for input no one can send.
		empty := ""
		req.Stdin = &empty
	}
	return req
}

// follow reads the command's stream to its end, calling the callbacks and
// keeping the output, and sets the result. It sends the exec's id on
// started (when not nil) once the server said the command runs.
func (c *Command) follow(ctx context.Context, req api.ExecRequest, cfg runConfig, started chan<- string) {
	defer close(c.done)
	var (
		stdout, stderr capture
		id             string
		res            *api.ExecResult
		err            error
	)
	for ev, e := range c.sb.c.ExecStream(ctx, c.sb.id, req) {
		if e != nil {
			err = e
			break
		}
		switch ev.Type {
		case EventStart:
			id = ev.ExecID
			if started != nil {
				started <- id
			}
		case EventStdout:
			stdout.add(ev.Data)
			if cfg.onStdout != nil {
				cfg.onStdout(string(ev.Data))
			}
		case EventStderr:
			stderr.add(ev.Data)
			if cfg.onStderr != nil {
				cfg.onStderr(string(ev.Data))
			}
		case EventExit:
			res = ev.Result
		}
	}
	if err != nil || res == nil {
		if err == nil {
			err = errors.New("exec stream ended without an exit event")
		}
		if id != "" && ctx.Err() != nil {
			// The caller gave up on the command: it must not run on
			// unseen (exec.CommandContext kills too).
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), signalTimeout)
			_ = c.sb.c.Signal(sctx, c.sb.id, id, "SIGKILL")
			cancel()
		}
		c.err = err
		return
	}
	if res.Truncated || stdout.over || stderr.over {
		// Past its cap the stream carried samples of the tail: the server's
		// record has the kept head and tail exactly.
		full, gerr := c.sb.c.GetExec(context.WithoutCancel(ctx), c.sb.id, res.ID)
		if gerr != nil {
			c.err = fmt.Errorf("exec %s: fetching its truncated output: %w", res.ID, gerr)
			return
		}
		o, e, derr := Output(full)
		if derr != nil {
			c.err = derr
			return
		}
		stdout.b, stderr.b = o, e
		res = full
	}
	c.res, c.err = commandResult(res, stdout.b, stderr.b)
}

// capture keeps a stream's bytes up to maxCaptured.
type capture struct {
	b    []byte
	over bool
}

func (c *capture) add(p []byte) {
	if c.over || len(c.b)+len(p) > maxCaptured {
		c.over = true
		return
	}
	c.b = append(c.b, p...)
}

// commandResult builds the result of res and, for a timeout, its
// *ExecError.
func commandResult(res *api.ExecResult, stdout, stderr []byte) (*CommandResult, error) {
	r := &CommandResult{
		ID: res.ID, Stdout: string(stdout), Stderr: string(stderr), ExitCode: -1,
		Status: res.Status, Truncated: res.Truncated,
		Duration: time.Duration(res.DurationMS) * time.Millisecond, Result: res,
	}
	if res.ExitCode != nil {
		r.ExitCode = *res.ExitCode
	}
	if res.Status == api.ExecTimeout {
		return r, r.Err()
	}
	return r, nil
}

// Err returns nil when the command exited with status 0, else an
// *ExecError saying how it ended (errors.Is: ErrExitStatus, ErrExecTimeout,
// ErrExecKilled, ErrOutOfMemory, ErrExecFailed).
func (r *CommandResult) Err() error {
	if r.Status == api.ExecExited && r.ExitCode == 0 {
		return nil
	}
	code, msg := "", ""
	if r.Result != nil {
		code, msg = r.Result.ErrorCode, r.Result.Error
	}
	return &ExecError{Status: r.Status, Code: code, Message: msg, Result: r}
}

// Wait waits for the command to end and returns its result (and, for a
// timeout, an *ExecError, as Run does). When ctx ends first Wait returns ctx's error and
// the command goes on.
func (c *Command) Wait(ctx context.Context) (*CommandResult, error) {
	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// Done is closed when the command has ended (or its stream was lost).
func (c *Command) Done() <-chan struct{} { return c.done }

// Kill sends SIGKILL to the command's whole process tree; Wait then
// returns its result with Status killed (res.Err() matches ErrExecKilled).
func (c *Command) Kill(ctx context.Context) error { return c.Signal(ctx, "SIGKILL") }

// Signal sends sig ("SIGTERM", "SIGINT", …) to the command's process tree.
func (c *Command) Signal(ctx context.Context, sig string) error {
	return c.sb.c.Signal(ctx, c.sb.id, c.id, sig)
}

// SendStdin writes data to the command's stdin.
func (c *Command) SendStdin(ctx context.Context, data string) error {
	return c.sb.c.WriteStdin(ctx, c.sb.id, c.id, strings.NewReader(data))
}

// CloseStdin closes the command's stdin: it reads EOF.
func (c *Command) CloseStdin(ctx context.Context) error {
	return c.sb.c.CloseStdin(ctx, c.sb.id, c.id)
}

// RunCode runs a cell in the sandbox's code interpreter (a template with
// one: code-interpreter) and returns its outcome: stdout, stderr, results
// (text, images, HTML, JSON…) and the exception it raised, if any, in
// Execution.Error (Execution.Err as an error). Options: WithLanguage,
// WithCodeContext, WithTimeout, WithEnv, OnStdout, OnStderr, OnResult.
func (s *Sandbox) RunCode(ctx context.Context, code string, opts ...RunOption) (*Execution, error) {
	cfg := runOptions(opts)
	req := api.CodeRequest{Code: code, Language: cfg.language, Env: cfg.env}
	if cfg.codeCtx != "" {
		req.ContextID = &cfg.codeCtx
	}
	if cfg.timeout > 0 {
		secs := math.Max(cfg.timeout.Seconds(), 0.001)
		req.TimeoutS = &secs
	}
	return s.c.RunCode(ctx, s.id, req, &CodeHandlers{OnStdout: cfg.onStdout, OnStderr: cfg.onStderr, OnResult: cfg.onResult})
}

// NewCodeContext makes a code-interpreter context of language (python,
// javascript or bash) working in dir ("" for the home; relative to it
// otherwise); WithCodeContext runs cells in it.
func (s *Sandbox) NewCodeContext(ctx context.Context, language, dir string) (*api.CodeContext, error) {
	if dir != "" {
		dir = resolvePath(dir)
	}
	return s.c.CreateContext(ctx, s.id, api.CodeContextRequest{Language: language, Cwd: dir})
}

// PTY opens an interactive terminal: WithCommand (default the login
// shell), WithUser, WithCwd, WithTerminalSize.
func (s *Sandbox) PTY(ctx context.Context, opts ...RunOption) (*PTY, error) {
	cfg := runOptions(opts)
	o := PTYOptions{Cols: cfg.cols, Rows: cfg.rows, Cmd: cfg.command, User: cfg.user}
	if cfg.cwd != "" {
		o.Cwd = resolvePath(cfg.cwd)
	}
	return s.c.PTY(ctx, s.id, o)
}
