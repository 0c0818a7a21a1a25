package code

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
	"github.com/airlockhq/airlock/internal/redact"
	"github.com/airlockhq/airlock/internal/service/sandbox"
)

// Code-interpreter processes. A context's kernel is
// driven by a long-lived "bridge" process in the sandbox. It is started as
// an agent exec but not recorded as one (no exec record, no audit event per
// process, no output kept by the daemon): the cells are audited instead.
//
// The exec's own stdout and stderr carry only the bridge's start-up line
// and crash messages, so its agent-side log is kept tiny. The cells' events
// travel over a FIFO in the sandbox that the daemon reads with a file read
// (the agent streams a FIFO as it is written and keeps none of it), so a
// context that lives for days neither hits the exec output cap nor grows
// anyone's memory. Requests go to the bridge's stdin, which is not logged.
const (
	// codeLogBytes caps the bridge exec's own output log in the agent: the
	// start-up line and a traceback fit; a kernel writing to its raw fds
	// past it is dropped, not kept.
	codeLogBytes = 64 << 10
	// codeStartTimeout bounds a bridge's start (an ipykernel takes about a
	// second on this host, more under load).
	codeStartTimeout = 60 * time.Second
	// ReadyLine is what a bridge writes to its stdout once it has opened
	// its FIFO for writing and its kernel answers.
	ReadyLine = "AIRLOCK-CODE-READY"
)

// codeFIFORE is the shape of a bridge FIFO's path: a fixed directory, so a
// caller cannot make the daemon open an arbitrary sandbox file.
var codeFIFORE = lazyregexp.New(`^/tmp/\.airlock-code-[a-z]+/[a-zA-Z0-9_]{1,64}\.fifo$`)

// ProcessSpec says how to start a bridge.
type ProcessSpec struct {
	// ID names the process (and its exec in the agent); unique per sandbox.
	ID string
	// Argv is the bridge's command. It must create FIFO, open it for
	// writing, then print ReadyLine on stdout.
	Argv []string
	// Cwd is the working directory (absolute; "" means the user's home).
	Cwd string
	// Env is merged over the sandbox's environment and secrets.
	Env map[string]string
	// FIFO is the path of the bridge's event FIFO (/tmp/.airlock-code-x/ID.fifo).
	FIFO string
}

// Sandboxes is what the code service's backend needs of the sandbox
// lifecycle.
type Sandboxes interface {
	// Running returns sandbox id if p may see it and it is running.
	Running(ctx context.Context, p auth.Principal, id string) (*sandbox.Live, error)
	// Lookup returns live sandbox id, nil if it is not live.
	Lookup(id string) *sandbox.Live
}

// SandboxBackend is the Backend of the code service on the sandbox
// lifecycle: bridges are agent execs of running sandboxes. Close it after
// the Service.
type SandboxBackend struct {
	sandboxes Sandboxes
	log       *slog.Logger
	ctx       context.Context // the processes' lifetime; cancelled by Close
	cancel    context.CancelFunc
	shutdown  chan struct{}
	wg        sync.WaitGroup
	closed    sync.Once
}

// NewBackend returns the SandboxBackend on sandboxes.
func NewBackend(sandboxes Sandboxes, log *slog.Logger) *SandboxBackend {
	if log == nil {
		log = slog.Default()
	}
	b := &SandboxBackend{sandboxes: sandboxes, log: log.With("component", "code"), shutdown: make(chan struct{})}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	return b
}

// Close ends the streams of the bridges (their kernels keep running until
// the next code service kills them) and waits for their goroutines.
func (m *SandboxBackend) Close() {
	m.closed.Do(func() {
		close(m.shutdown)
		m.cancel()
		m.wg.Wait()
	})
}

// goBackground runs fn as tracked background work.
func (m *SandboxBackend) goBackground(fn func()) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		fn()
	}()
}

// codeProcess is a running bridge of a code-interpreter context.
type codeProcess struct {
	m      *SandboxBackend
	sb     *sandbox.Live
	id     string
	c      *agentclient.Client
	events io.Reader
	cancel context.CancelFunc

	done     chan struct{}
	doneOnce sync.Once
}

// Start starts a bridge in running sandbox id as the sandbox's default
// user and returns once it is ready (Backend). A bridge that fails to
// start returns an errdefs.ErrUnavailable error whose message holds the
// start of its stderr.
func (m *SandboxBackend) Start(ctx context.Context, p auth.Principal, id string, spec ProcessSpec) (Process, error) {
	if !codeFIFORE.MatchString(spec.FIFO) || len(spec.Argv) == 0 {
		return nil, fmt.Errorf("code process: bad spec: %w", errdefs.ErrInvalidArgument)
	}
	if spec.Cwd != "" && !path.IsAbs(spec.Cwd) {
		return nil, errdefs.Publicf(errdefs.ErrInvalidArgument, "cwd must be an absolute path")
	}
	sb, err := m.sandboxes.Running(ctx, p, id)
	if err != nil {
		return nil, err
	}
	c, err := sb.Agent(ctx)
	if err != nil {
		return nil, err
	}
	env := sb.Env(spec.Env)
	// As the template's USER in its WORKDIR, like an exec naming neither.
	user, cwd := sb.ExecDefaults("", spec.Cwd)
	areq := agentproto.ExecRequest{
		ID: codeExecPrefix + spec.ID, Argv: spec.Argv, Cwd: cwd, Env: env, User: user,
		StdinOpen: true, MaxOutputBytes: codeLogBytes,
	}
	// The process outlives this request: its stream hangs off the
	// backend's context and is ended by Close or the sandbox's end.
	pctx, cancel := context.WithCancel(m.ctx)
	st, err := c.Exec(pctx, areq)
	clear(env)
	if err != nil {
		cancel()
		var refused *agentproto.Error
		if errdefs.IsInvalidArgument(err) && errors.As(err, &refused) {
			// A cwd that is not a directory (or a template USER the
			// sandbox lacks): the request's to change, not a kernel fault.
			return nil, errdefs.Publicf(errdefs.ErrInvalidArgument, "%s", sb.Redactor().Redact(sandbox.AgentText(refused.Message, 200)))
		}
		return nil, fmt.Errorf("starting code process: %w", err)
	}
	cp := &codeProcess{m: m, sb: sb, id: areq.ID, c: c, cancel: cancel, done: make(chan struct{})}
	ready := make(chan error, 1)
	m.goBackground(func() { cp.follow(st, ready) })
	m.goBackground(func() {
		select {
		case <-sb.Gone():
		case <-m.shutdown:
		case <-cp.done:
		}
		cp.finish()
	})
	sctx, scancel := context.WithTimeout(ctx, codeStartTimeout)
	defer scancel()
	select {
	case err = <-ready:
	case <-sctx.Done():
		err = fmt.Errorf("code process start: %w", sctx.Err())
	}
	if err == nil {
		// The bridge holds the FIFO open for writing, so this open does not
		// block, and the stream ends when the bridge exits.
		var r io.ReadCloser
		r, _, err = c.ReadFile(pctx, spec.FIFO, user)
		if err == nil {
			cp.events = &closingReader{r: r}
		}
	}
	if err != nil {
		cp.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return cp, nil
}

// follow reads the bridge exec's own output: it waits for the ready line,
// reports a failed start with the start of stderr, and marks the process
// done when the exec ends.
func (cp *codeProcess) follow(st *agentclient.Stream, ready chan<- error) {
	defer cp.finish()
	defer st.Close()
	var out, errOut bytes.Buffer
	var exit *agentproto.ExecResult
	readySent := false
	for {
		ev, err := st.Next()
		if err != nil {
			break
		}
		if ev.Type == agentproto.EventExit {
			exit = ev.Result
			if ev.Result != nil && ev.Result.Error != "" && errOut.Len() == 0 {
				errOut.WriteString(ev.Result.Error) // it never ran: bad cwd, say
			}
			break
		}
		if readySent {
			continue // a kernel's raw fd output: not ours to keep
		}
		switch ev.Stream {
		case agentproto.StreamStdout:
			out.Write(ev.Data)
			if n := out.Len(); n > 8<<10 {
				// Only the ready line is looked for: keep a tail that
				// can hold it, whatever the agent sends before.
				tail := append([]byte(nil), out.Bytes()[n-4<<10:]...)
				out.Reset()
				out.Write(tail)
			}
			if bytes.Contains(out.Bytes(), []byte(ReadyLine+"\n")) {
				readySent = true
				ready <- nil
			}
		case agentproto.StreamStderr:
			if errOut.Len() < 4<<10 {
				errOut.Write(ev.Data)
			}
		}
	}
	if !readySent {
		ready <- kernelStartError(exit, errOut.String(), cp.sb.Redactor().Redact)
	}
}

// missingKernel matches the last stderr line of a bridge whose template has
// no kernel for its language: python3 without jupyter_client or ipykernel
// (the base template), no python3 or node at all (the shell's 127).
var missingKernel = lazyregexp.New(`No module named '(jupyter_client|ipykernel|jupyter_core|zmq)|NoSuchKernel|No such kernel|: not found$|executable file not found`)

// kernelStartError is the error of a bridge that ended before it was
// ready. Only what may pass is retryable (503): a template without the
// kernel, or a start the agent refused (a cwd that does not exist), fails
// the same way every time, so it is a 400 saying what to change.
func kernelStartError(res *agentproto.ExecResult, stderr string, redact func(string) string) error {
	msg := lastLine(stderr)
	switch {
	case res != nil && strings.HasPrefix(res.Error, "cwd "):
		// It never ran: the context's cwd is missing or not a directory.
		return errdefs.Publicf(errdefs.ErrInvalidArgument, "starting kernel: %s", redact(msg))
	case (res != nil && res.ExitCode == 127) || missingKernel.MatchString(msg):
		return errdefs.Publicf(errdefs.ErrTemplateUnsupported, "the sandbox's template has no kernel for this language (%s): use the code-interpreter template or one that installs it", redact(msg))
	case msg == "":
		msg = "kernel exited at start"
	}
	return errdefs.Publicf(errdefs.ErrUnavailable, "starting kernel: %s", redact(msg))
}

// lastLine returns the last non-empty line of s (a Python traceback's
// last line names the error), cut to 200 bytes of valid UTF-8.
func lastLine(s string) string {
	lines := bytes.Split(bytes.TrimSpace([]byte(s)), []byte("\n"))
	l := string(bytes.TrimSpace(lines[len(lines)-1]))
	if len(l) > 200 {
		l = l[:200]
	}
	return string(bytes.ToValidUTF8([]byte(l), nil))
}

func (cp *codeProcess) finish() {
	cp.doneOnce.Do(func() { close(cp.done) })
}

// ID is the process's id as given in its spec, with the exec prefix.
func (cp *codeProcess) ID() string { return cp.id }

// Events is the bridge's event stream (the FIFO). It ends (io.EOF or an
// error) when the bridge exits. Its content is the sandbox's: untrusted.
func (cp *codeProcess) Events() io.Reader { return cp.events }

// Done is closed when the bridge exec ended, the sandbox stopped being
// live, or the process was closed.
func (cp *codeProcess) Done() <-chan struct{} { return cp.done }

// Send writes p to the bridge's stdin.
func (cp *codeProcess) Send(ctx context.Context, p []byte) error {
	if err := cp.c.WriteStdin(ctx, cp.id, p); err != nil {
		return fmt.Errorf("writing to kernel: %w", err)
	}
	return nil
}

// Interrupt sends SIGINT to the bridge's process tree: the kernel stops
// the running cell (the bridges ignore the signal themselves).
func (cp *codeProcess) Interrupt(ctx context.Context) error {
	return cp.c.Signal(ctx, cp.id, "SIGINT")
}

// Close kills the bridge and its kernel and releases the streams.
func (cp *codeProcess) Close(ctx context.Context) {
	select {
	case <-cp.done:
	default:
		kctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := cp.c.Signal(kctx, cp.id, "SIGKILL"); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			cp.m.log.Debug("killing code process", "sandbox_id", cp.sb.ID(), "exec_id", cp.id, "err", err)
		}
		cancel()
	}
	// Cancelling the stream's context ends a read in progress; the reader
	// releases the stream itself (see closingReader).
	cp.cancel()
	cp.finish()
}

// Redact masks the sandbox's secret values in s (as exec output is).
func (cp *codeProcess) Redact(s string) string {
	return cp.sb.Redactor().Redact(s)
}

// TextStream returns a redactor of one ordered text stream of the
// kernel's (a cell's stdout or stderr): a secret is masked in it however
// its pieces are spread over events and time.
func (cp *codeProcess) TextStream() *redact.TextStream { return cp.sb.Redactor().TextStream() }

// closingReader releases its stream when a read ends it, in the reading
// goroutine: a download stream may not be closed while another goroutine
// reads it.
type closingReader struct {
	r      io.ReadCloser
	closed bool
}

func (c *closingReader) Read(p []byte) (int, error) {
	if c.closed {
		return 0, io.EOF
	}
	n, err := c.r.Read(p)
	if err != nil {
		c.closed = true
		c.r.Close()
	}
	return n, err
}

// Gone returns a channel closed when sandbox id stops being live, so that
// the code service can drop its contexts (Backend).
func (m *SandboxBackend) Gone(ctx context.Context, p auth.Principal, id string) (<-chan struct{}, error) {
	sb, err := m.sandboxes.Running(ctx, p, id)
	if err != nil {
		return nil, err
	}
	return sb.Gone(), nil
}

// codeExecPrefix starts the agent exec ids of code processes.
const codeExecPrefix = "cx_"

// Reset kills every code process still running in sandbox id: those a
// previous daemon started (contexts live in the daemon's memory, so after
// a restart their kernels only hold the sandbox's memory). The code
// service calls it before its first Start in a sandbox (Backend).
func (m *SandboxBackend) Reset(ctx context.Context, p auth.Principal, id string) error {
	sb, err := m.sandboxes.Running(ctx, p, id)
	if err != nil {
		return err
	}
	c, err := sb.Agent(ctx)
	if err != nil {
		return err
	}
	infos, err := c.ListExecs(ctx)
	if err != nil {
		return fmt.Errorf("listing code processes: %w", err)
	}
	for _, in := range infos {
		if strings.HasPrefix(in.ID, codeExecPrefix) && in.Status == agentproto.StatusRunning {
			if err := c.Signal(ctx, in.ID, "SIGKILL"); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				return fmt.Errorf("killing code process: %w", err)
			}
		}
	}
	return nil
}

// codeAuditMax bounds the cell text kept in an audit event.
const codeAuditMax = 4 << 10

// Audit records a code cell of sandbox id (its text with the sandbox's
// secrets masked and cut to 4 KiB; never its output) (Backend).
func (m *SandboxBackend) Audit(ctx context.Context, p auth.Principal, id string, d api.CodeAuditDetail) {
	sb := m.sandboxes.Lookup(id)
	if sb == nil || !p.CanSee(sb.Tenant()) {
		return
	}
	d.CodeBytes = len(d.Code)
	// Mask before cutting: a cut could split a secret past recognition.
	d.Code = sb.Redactor().Redact(d.Code)
	if len(d.Code) > codeAuditMax {
		cut := codeAuditMax
		for cut > 0 && !utf8.RuneStart(d.Code[cut]) {
			cut--
		}
		d.Code = d.Code[:cut]
	}
	sb.Audit(ctx, api.AuditCode, d)
}
