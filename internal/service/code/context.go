package code

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/redact"
)

const (
	// maxLine bounds one event line from a bridge: the bridges cap a
	// result at 24 MiB; what is longer is not a bridge's doing and is
	// dropped.
	maxLine = 32 << 20
	// maxCellBytes bounds the event bytes one cell may send to the client;
	// past it the rest is dropped (the bridges cap themselves lower).
	maxCellBytes = 64 << 20
	// fifoDir holds the bridges' FIFOs in the sandbox.
	fifoDir = "/tmp/.airlock-code-user"
)

// wrapper makes the FIFO ($1) and then runs the bridge (the rest): the
// shell does what node cannot (mkfifo) and resolves the bridge on PATH.
const wrapper = `set -e; umask 077; mkdir -p "${1%/*}"; rm -f "$1"; mkfifo "$1"; shift; exec "$@"`

// kctx is one context: its kernel process (if started) and counters.
type kctx struct {
	s                   *Service
	sandboxID, id, lang string
	cwd                 string
	dflt                bool
	created             time.Time
	sem                 chan struct{} // one cell at a time
	mu                  sync.Mutex    // guards the fields below
	cur                 *proc
	gen                 int
	count               int
	busy, lost, closed  bool
}

// proc is a started bridge and its event reader.
type proc struct {
	p    Process
	ch   chan bridgeEvent // closed when the bridge's stream ends
	quit chan struct{}
	once sync.Once
}

func newKctx(s *Service, sandboxID, id, lang, cwd string, dflt bool) *kctx {
	return &kctx{s: s, sandboxID: sandboxID, id: id, lang: lang, cwd: cwd, dflt: dflt,
		created: s.now().UTC(), sem: make(chan struct{}, 1)}
}

func (k *kctx) view() api.CodeContext {
	k.mu.Lock()
	defer k.mu.Unlock()
	st := api.CodeContextIdle
	switch {
	case k.busy:
		st = api.CodeContextBusy
	case k.lost:
		st = api.CodeContextDead
	}
	return api.CodeContext{ID: k.id, Language: k.lang, Cwd: k.cwd, Default: k.dflt, State: st,
		ExecutionCount: k.count, CreatedAt: k.created}
}

// withLock runs fn holding the context's cell lock.
func (k *kctx) withLock(ctx context.Context, fn func() error) error {
	select {
	case k.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-k.sem }()
	return fn()
}

// ensure returns the running bridge, starting one if there is none or the
// last one died. Call with the cell lock held.
func (k *kctx) ensure(ctx context.Context, p auth.Principal) (*proc, error) {
	k.mu.Lock()
	cur, gen := k.cur, k.gen+1
	if k.closed {
		k.mu.Unlock()
		return nil, errContextNotFound
	}
	if cur != nil {
		select {
		case <-cur.p.Done():
		default:
			k.mu.Unlock()
			return cur, nil
		}
	}
	k.gen = gen
	k.mu.Unlock()
	if cur != nil {
		cur.close(context.WithoutCancel(ctx))
	}
	name := k.id + "_" + strconv.Itoa(gen)
	fifo := fifoDir + "/" + name + ".fifo"
	argv := []string{"/bin/sh", "-c", wrapper, "sh", fifo}
	switch k.lang {
	case api.LanguagePython, api.LanguageBash:
		argv = append(argv, "python3", "-u", "-c", bridgePy, k.lang, fifo)
	case api.LanguageJavaScript:
		argv = append(argv, "node", "-e", bridgeJS, fifo)
	}
	start := time.Now()
	pr, err := k.s.be.Start(ctx, p, k.sandboxID, ProcessSpec{ID: name, Argv: argv, Cwd: k.cwd, FIFO: fifo})
	if err != nil {
		return nil, err
	}
	k.s.log.Debug("kernel started", "sandbox_id", k.sandboxID, "context_id", k.id, "language", k.lang,
		"start_ms", time.Since(start).Milliseconds())
	np := &proc{p: pr, ch: make(chan bridgeEvent, 16), quit: make(chan struct{})}
	k.s.wg.Add(1)
	go func() {
		defer k.s.wg.Done()
		np.read()
	}()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		np.close(context.WithoutCancel(ctx))
		return nil, errContextNotFound
	}
	k.cur, k.count = np, 0
	return np, nil
}

// kill ends the context's kernel, if any; the next cell starts a new one.
func (k *kctx) kill(ctx context.Context) {
	k.mu.Lock()
	cur := k.cur
	k.cur, k.lost = nil, false
	k.mu.Unlock()
	if cur != nil {
		cur.close(ctx)
	}
}

// shutdown kills the kernel for good (the context was deleted).
func (k *kctx) shutdown(ctx context.Context) {
	k.mu.Lock()
	k.closed = true
	k.mu.Unlock()
	k.kill(ctx)
}

func (pr *proc) close(ctx context.Context) {
	pr.once.Do(func() { close(pr.quit) })
	pr.p.Close(ctx)
}

// bridgeEvent is one line from a bridge (see bridge.py).
type bridgeEvent struct {
	ID        string                     `json:"id"`
	T         string                     `json:"t"`
	Text      string                     `json:"text"`
	Main      bool                       `json:"main"`
	Data      map[string]json.RawMessage `json:"data"`
	Name      string                     `json:"name"`
	Value     string                     `json:"value"`
	Traceback string                     `json:"traceback"`
	N         int                        `json:"n"`
	size      int
}

var errLineTooLong = errors.New("line too long")

// read parses the bridge's lines into pr.ch until the stream ends.
func (pr *proc) read() {
	defer close(pr.ch)
	br := bufio.NewReaderSize(pr.p.Events(), 64<<10)
	for {
		line, err := readLine(br, maxLine)
		if errors.Is(err, errLineTooLong) {
			continue
		}
		if err != nil {
			return
		}
		var ev bridgeEvent
		if json.Unmarshal(line, &ev) != nil || ev.ID == "" {
			continue
		}
		ev.size = len(line)
		select {
		case pr.ch <- ev:
		case <-pr.quit:
			return
		}
	}
}

// readLine returns the next line without its newline; a line longer than
// max is skipped whole and reported as errLineTooLong.
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var buf []byte
	tooLong := false
	for {
		frag, err := br.ReadSlice('\n')
		if !tooLong {
			if len(buf)+len(frag) > max+1 {
				tooLong, buf = true, nil
			} else {
				buf = append(buf, frag...)
			}
		}
		switch {
		case err == nil:
			if tooLong {
				return nil, errLineTooLong
			}
			return buf[:len(buf)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF && len(buf) > 0 && !tooLong:
			return nil, io.ErrUnexpectedEOF // a cut-off last line is not trusted
		default:
			return nil, err
		}
	}
}

// cell is what a cell runs: its source and its own env variables.
type cell struct {
	code string
	env  map[string]string
}

// runRequest is a bridge's request line (see bridge.py).
type runRequest struct {
	Op   string            `json:"op"`
	ID   string            `json:"id"`
	Code string            `json:"code"`
	Env  map[string]string `json:"env,omitempty"`
}

// run runs one cell; see Service.Run.
func (k *kctx) run(ctx context.Context, p auth.Principal, c cell, timeout time.Duration, emit func(api.CodeEvent) error) error {
	code := c.code
	select {
	case k.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-k.sem }()
	started := time.Now()
	rid := auth.RandomID("r", 10)
	req, err := json.Marshal(runRequest{Op: "run", ID: rid, Code: code, Env: c.env})
	if err != nil {
		return fmt.Errorf("encoding cell: %w", err)
	}
	req = append(req, '\n')
	var pr *proc
	lost := false
	for attempt := 0; ; attempt++ {
		k.mu.Lock()
		lost = lost || k.lost
		if k.cur != nil {
			select {
			case <-k.cur.p.Done():
				lost = true // it died between cells
			default:
			}
		}
		k.mu.Unlock()
		var err error
		if pr, err = k.ensure(ctx, p); err != nil {
			return err
		}
		err = pr.p.Send(ctx, req)
		if err == nil {
			break
		}
		// A kernel that died a moment ago may not show as done yet: its
		// stdin is closed. Once more with a fresh one.
		k.kill(context.WithoutCancel(ctx))
		if attempt > 0 || ctx.Err() != nil {
			return fmt.Errorf("sending cell: %w", err)
		}
		lost = true
	}
	k.mu.Lock()
	k.busy, k.lost = true, false
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		k.busy = false
		k.mu.Unlock()
	}()

	var emitErr error
	send := func(ev api.CodeEvent) {
		if emitErr == nil {
			emitErr = emit(ev)
		}
	}
	// Each output stream is masked as one text across its events, so that
	// a secret printed in pieces, or slowly, is masked too: a piece that
	// could start a secret waits for the next one, at most RedactHold,
	// then goes out masked (redact.TextStream).
	streams := map[string]*redact.TextStream{}
	var hold *time.Timer
	var holdC <-chan time.Time
	defer func() {
		if hold != nil {
			hold.Stop()
		}
	}()
	sendText := func(typ, text string) {
		ts := streams[typ]
		if ts == nil {
			ts = pr.p.TextStream()
			streams[typ] = ts
		}
		if out := ts.Push(text); out != "" {
			send(api.CodeEvent{Type: typ, Text: out})
		}
		if ts.Pending() && holdC == nil {
			hold = time.NewTimer(redact.Hold)
			holdC = hold.C
		}
	}
	// release sends what the streams hold: masked when the hold timed out,
	// as it is when the cell's output is over (end).
	release := func(end bool) {
		for _, typ := range []string{api.CodeEventStdout, api.CodeEventStderr} {
			ts := streams[typ]
			if ts == nil || !ts.Pending() {
				continue
			}
			var out string
			if end {
				out = ts.End()
			} else {
				out = ts.Expire()
			}
			send(api.CodeEvent{Type: typ, Text: out})
		}
	}
	if lost {
		send(api.CodeEvent{Type: api.CodeEventStderr,
			Text: "[the context's previous kernel died: this cell runs in a new one and earlier state is lost]\n"})
	}
	var timeoutC, graceC <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timeoutC = t.C
	}
	interrupted, timedOut, sawError, cut := false, false, false, false
	var grace *time.Timer
	defer func() {
		if grace != nil {
			grace.Stop()
		}
	}()
	var reintC <-chan time.Time
	var reint *time.Ticker
	defer func() {
		if reint != nil {
			reint.Stop()
		}
	}()
	signal := func() {
		ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if err := pr.p.Interrupt(ictx); err != nil {
			k.s.log.Debug("interrupting cell", "sandbox_id", k.sandboxID, "context_id", k.id, "err", err)
		}
		cancel()
	}
	interrupt := func() {
		if interrupted {
			return
		}
		interrupted = true
		signal()
		grace = time.NewTimer(interruptGrace)
		graceC = grace.C
		// A SIGINT that lands while a shell forks its next command is lost
		// in the child; the interrupt is repeated until the cell ends.
		reint = time.NewTicker(interruptRepeat)
		reintC = reint.C
	}
	done := ctx.Done()
	bytes, count, status := 0, 0, "ok"
	for finished := false; !finished; {
		if emitErr != nil && !interrupted {
			interrupt()
		}
		select {
		case ev, ok := <-pr.ch:
			if !ok {
				// The bridge is gone: the kernel died, or was killed for
				// not stopping at its timeout, or the context was deleted.
				k.mu.Lock()
				if k.cur == pr {
					k.cur, k.lost = nil, true
				}
				k.mu.Unlock()
				pr.close(context.WithoutCancel(ctx))
				release(true)
				if timedOut {
					status = "timeout"
					send(api.CodeEvent{Type: api.CodeEventError, Name: api.CodeErrorTimeout,
						Value: fmt.Sprintf("the cell ran past its timeout of %s and did not stop when interrupted; the kernel was restarted and its state is lost", timeout)})
				} else {
					status = "kernel_died"
					send(api.CodeEvent{Type: api.CodeEventError, Name: api.CodeErrorKernelDied,
						Value: "the kernel died; its state is lost and the next cell starts a new kernel"})
				}
				finished = true
				continue
			}
			if ev.ID != rid {
				continue // a late line of an earlier cell
			}
			if ev.T == "end" {
				count = max(ev.N, 0)
				finished = true
				continue
			}
			out, ok := translate(pr.p, ev)
			if !ok {
				continue
			}
			if out.Type == api.CodeEventError {
				sawError = true
				if status == "ok" {
					status = "error"
				}
			}
			bytes += ev.size
			if bytes > maxCellBytes {
				if !cut {
					cut = true
					send(api.CodeEvent{Type: api.CodeEventError, Name: api.CodeErrorOutputLimit,
						Value: fmt.Sprintf("the cell's output passed %d bytes; the rest is dropped", maxCellBytes)})
				}
				continue
			}
			if out.Type == api.CodeEventStdout || out.Type == api.CodeEventStderr {
				sendText(out.Type, out.Text)
				continue
			}
			send(out)
		case <-holdC:
			holdC = nil
			release(false)
		case <-timeoutC:
			timeoutC, timedOut = nil, true
			interrupt()
		case <-reintC:
			signal()
		case <-graceC:
			graceC = nil
			// The cell ignored its interrupt: kill the kernel; the closed
			// stream then ends the cell.
			pr.close(context.WithoutCancel(ctx))
		case <-done:
			done = nil
			interrupt()
		}
	}
	release(true)
	if timedOut && status != "timeout" {
		status = "timeout"
		if !sawError {
			send(api.CodeEvent{Type: api.CodeEventError, Name: api.CodeErrorTimeout,
				Value: fmt.Sprintf("the cell ran past its timeout of %s and was interrupted", timeout)})
		}
	}
	k.mu.Lock()
	if count > 0 {
		k.count = count
	}
	if k.cur == pr && count == 0 {
		k.count++
	}
	n := k.count
	k.mu.Unlock()
	send(api.CodeEvent{Type: api.CodeEventEnd, ExecutionCount: n})
	k.s.be.Audit(context.WithoutCancel(ctx), p, k.sandboxID, api.CodeAuditDetail{
		ContextID: k.id, Language: k.lang, Code: code, EnvNames: envNames(c.env), Status: status,
		DurationMS: time.Since(started).Milliseconds(),
	})
	if emitErr != nil {
		return emitErr
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return nil
}

// The bridge's names for a figure's chart and a DataFrame's columns (see
// bridge.py).
const (
	chartMIME = "application/vnd.airlock.chart+json"
	dataMIME  = "application/vnd.airlock.data+json"
)

// redactJSON masks the sandbox's secrets in the strings of a JSON value the
// kernel produced and returns it compacted, or nil if it is not valid JSON
// (or masking broke it).
func redactJSON(pr Process, raw json.RawMessage) json.RawMessage {
	if !json.Valid(raw) {
		return nil
	}
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return nil
	}
	out := []byte(pr.Redact(b.String()))
	if !json.Valid(out) {
		return nil
	}
	return out
}

// envNames returns env's names, sorted (nil for none).
func envNames(env map[string]string) []string {
	if len(env) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(env))
}

// translate turns a bridge event into an API event, keeping only known
// fields of known types and checking the encoded ones.
func translate(pr Process, ev bridgeEvent) (api.CodeEvent, bool) {
	switch ev.T {
	case "stdout", "stderr":
		if ev.Text == "" {
			return api.CodeEvent{}, false
		}
		// Masked by the cell's stream redactors (kctx.run): a secret may
		// span events.
		return api.CodeEvent{Type: ev.T, Text: ev.Text}, true
	case "error":
		return api.CodeEvent{Type: api.CodeEventError, Name: truncate(ev.Name, 256),
			Value: pr.Redact(ev.Value), Traceback: pr.Redact(ev.Traceback)}, true
	case "result":
		out := api.CodeEvent{Type: api.CodeEventResult, IsMainResult: ev.Main}
		any := false
		for mime, raw := range ev.Data {
			switch mime {
			case "application/json":
				if j := redactJSON(pr, raw); j != nil {
					out.JSON, any = j, true
				}
				continue
			case chartMIME, dataMIME:
				// Only an object is a chart or a frame's data.
				if j := redactJSON(pr, raw); j != nil && j[0] == '{' {
					if mime == chartMIME {
						out.Chart = j
					} else {
						out.Data = j
					}
					any = true
				}
				continue
			}
			var s string
			if json.Unmarshal(raw, &s) != nil {
				continue
			}
			switch mime {
			case "text/plain":
				out.Text = pr.Redact(s)
			case "text/html":
				out.HTML = pr.Redact(s)
			case "text/markdown":
				out.Markdown = pr.Redact(s)
			case "text/latex":
				out.LaTeX = pr.Redact(s)
			case "image/svg+xml":
				out.SVG = s
			case "application/javascript":
				out.JavaScript = s
			case "image/png", "image/jpeg":
				b64 := strings.Join(strings.Fields(s), "")
				if _, err := base64.StdEncoding.DecodeString(b64); err != nil {
					continue
				}
				if mime == "image/png" {
					out.PNG = b64
				} else {
					out.JPEG = b64
				}
			default:
				continue
			}
			any = true
		}
		return out, any
	}
	return api.CodeEvent{}, false
}
