package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/airlockhq/airlock/api"
)

// Exec event types, as named by the server's SSE `event:` field.
const (
	EventStart  = "start"
	EventStdout = "stdout"
	EventStderr = "stderr"
	EventExit   = "exit"
)

// ExecEvent is one event of an exec's stream.
type ExecEvent struct {
	Type   string // EventStart, EventStdout, EventStderr or EventExit
	ExecID string // set on every event
	// Data is the decoded output of a stdout/stderr event.
	Data []byte
	// Offset is the position of Data's first byte in the exec's combined
	// output; Offset+len(Data) is where a re-attach continues.
	Offset int64
	// Result is the outcome, on the exit event (without stdout/stderr).
	Result *api.ExecResult
}

// errStreamIdle marks a stream the watchdog closed for silence.
var errStreamIdle = errors.New("event stream idle: no event or heartbeat")

// Exec runs a command and waits for it (the JSON mode). A non-zero exit is
// a result, not an error: check Status and ExitCode.
func (c *Client) Exec(ctx context.Context, sandboxID string, req api.ExecRequest) (*api.ExecResult, error) {
	var out api.ExecResult
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(sandboxID, "exec"), nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ExecAsync starts a command and returns its id at once. Follow it with
// Attach, GetExec, WriteStdin, Signal.
func (c *Client) ExecAsync(ctx context.Context, sandboxID string, req api.ExecRequest) (string, error) {
	var out api.ExecStarted
	q := url.Values{"async": {"true"}}
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(sandboxID, "exec"), q, req, &out); err != nil {
		return "", err
	}
	if out.ID == "" {
		return "", errors.New("server returned no exec id")
	}
	return out.ID, nil
}

// ExecStream runs a command and yields its events as they happen: start,
// stdout/stderr chunks, then exit. If the connection drops after the start
// event, the stream re-attaches from the last offset it delivered, so no
// output is lost or repeated. The iteration ends after exit or after the
// first error, which it yields. Stopping the iteration early leaves the
// command running (see Signal).
func (c *Client) ExecStream(ctx context.Context, sandboxID string, req api.ExecRequest) iter.Seq2[ExecEvent, error] {
	return func(yield func(ExecEvent, error) bool) {
		body, err := json.Marshal(req)
		if err != nil {
			yield(ExecEvent{}, fmt.Errorf("encoding request: %w", err))
			return
		}
		st := &streamState{sandboxID: sandboxID}
		open := func(ctx context.Context) (*http.Response, error) {
			r, err := c.newRequest(ctx, http.MethodPost, sandboxPath(sandboxID, "exec"), nil, bytes.NewReader(body))
			if err != nil {
				return nil, err
			}
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Accept", "text/event-stream")
			return c.send(r)
		}
		c.follow(ctx, st, open, yield)
	}
}

// Attach follows an exec's output from fromOffset (0 replays everything the
// server still holds), then its exit. A dropped connection is re-attached
// from the last delivered offset.
func (c *Client) Attach(ctx context.Context, sandboxID, execID string, fromOffset int64) iter.Seq2[ExecEvent, error] {
	return func(yield func(ExecEvent, error) bool) {
		st := &streamState{sandboxID: sandboxID, execID: execID, next: fromOffset, started: true}
		c.follow(ctx, st, st.openEvents(c), yield)
	}
}

// StreamHandlers receive an exec's stream as callbacks (see Consume).
type StreamHandlers struct {
	OnStart  func(execID string)
	OnStdout func(p []byte)
	OnStderr func(p []byte)
}

// Consume drives events to h and returns the exec's result. It fails if the
// stream ends in an error or without an exit event.
func Consume(events iter.Seq2[ExecEvent, error], h StreamHandlers) (*api.ExecResult, error) {
	for ev, err := range events {
		if err != nil {
			return nil, err
		}
		switch ev.Type {
		case EventStart:
			if h.OnStart != nil {
				h.OnStart(ev.ExecID)
			}
		case EventStdout:
			if h.OnStdout != nil {
				h.OnStdout(ev.Data)
			}
		case EventStderr:
			if h.OnStderr != nil {
				h.OnStderr(ev.Data)
			}
		case EventExit:
			return ev.Result, nil
		}
	}
	return nil, errors.New("exec stream ended without an exit event")
}

// ExecWithHandlers runs a command, streaming its output to h, and returns
// its result once it ends. It is Consume(c.ExecStream(…), h).
func (c *Client) ExecWithHandlers(ctx context.Context, sandboxID string, req api.ExecRequest, h StreamHandlers) (*api.ExecResult, error) {
	return Consume(c.ExecStream(ctx, sandboxID, req), h)
}

// ExecListOptions pages GET …/execs.
type ExecListOptions struct {
	Limit  int
	Cursor string
}

// Execs lists the sandbox's exec records, newest first.
func (c *Client) Execs(ctx context.Context, sandboxID string, opts ExecListOptions) (*api.ExecList, error) {
	q := url.Values{}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	if opts.Cursor != "" {
		q.Set("cursor", opts.Cursor)
	}
	var out api.ExecList
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(sandboxID, "execs"), q, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetExec returns an exec's status, and once it ended its captured output.
func (c *Client) GetExec(ctx context.Context, sandboxID, execID string) (*api.ExecResult, error) {
	var out api.ExecResult
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(sandboxID, "execs", url.PathEscape(execID)), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// WriteStdin sends r's bytes to the exec's stdin. Stdin stays open for this
// when the exec was started in a streaming mode (ExecStream, ExecAsync)
// without a Stdin of its own; CloseStdin ends it.
func (c *Client) WriteStdin(ctx context.Context, sandboxID, execID string, r io.Reader) error {
	req, err := c.newRequest(ctx, http.MethodPost, sandboxPath(sandboxID, "execs", url.PathEscape(execID), "stdin"), nil, r)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return decodeBody(resp, nil)
}

// CloseStdin closes the exec's stdin: the command reads EOF.
func (c *Client) CloseStdin(ctx context.Context, sandboxID, execID string) error {
	q := url.Values{"eof": {"true"}}
	req, err := c.newRequest(ctx, http.MethodPost, sandboxPath(sandboxID, "execs", url.PathEscape(execID), "stdin"), q, http.NoBody)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return decodeBody(resp, nil)
}

// Signal delivers sig ("SIGTERM", "SIGKILL", …) to the exec's whole process tree.
func (c *Client) Signal(ctx context.Context, sandboxID, execID, sig string) error {
	return c.doJSON(ctx, http.MethodPost, sandboxPath(sandboxID, "execs", url.PathEscape(execID), "signal"), nil,
		api.SignalRequest{Signal: sig}, nil)
}

// Output decodes a result's captured stdout and stderr (base64 when the
// server marked them so).
func Output(r *api.ExecResult) (stdout, stderr []byte, err error) {
	dec := func(p *string) ([]byte, error) {
		if p == nil {
			return nil, nil
		}
		if r.Encoding == "base64" {
			return base64.StdEncoding.DecodeString(*p)
		}
		return []byte(*p), nil
	}
	if stdout, err = dec(r.Stdout); err != nil {
		return nil, nil, fmt.Errorf("decoding stdout: %w", err)
	}
	if stderr, err = dec(r.Stderr); err != nil {
		return nil, nil, fmt.Errorf("decoding stderr: %w", err)
	}
	return stdout, stderr, nil
}

// streamState is what a stream knows to re-attach: the exec and the offset
// of the next byte it has not delivered.
type streamState struct {
	sandboxID  string
	execID     string
	next       int64
	started    bool // the start event was delivered (or is not expected)
	progressed bool // the current attempt delivered something
}

func (st *streamState) openEvents(c *Client) func(ctx context.Context) (*http.Response, error) {
	return func(ctx context.Context) (*http.Response, error) {
		q := url.Values{"from_offset": {strconv.FormatInt(st.next, 10)}}
		r, err := c.newRequest(ctx, http.MethodGet, sandboxPath(st.sandboxID, "execs", url.PathEscape(st.execID), "events"), q, nil)
		if err != nil {
			return nil, err
		}
		r.Header.Set("Accept", "text/event-stream")
		return c.send(r)
	}
}

// follow runs attempts until the stream ends, re-attaching after drops.
func (c *Client) follow(ctx context.Context, st *streamState, open func(context.Context) (*http.Response, error), yield func(ExecEvent, error) bool) {
	failures := 0
	for {
		stop, err := c.attempt(ctx, st, open, yield)
		if stop {
			return
		}
		if ctx.Err() != nil {
			yield(ExecEvent{}, context.Cause(ctx))
			return
		}
		if st.execID == "" {
			// Without an id there is nothing to re-attach to, and re-sending
			// the exec could run the command twice.
			yield(ExecEvent{}, fmt.Errorf("exec stream ended before the exec started: %w", err))
			return
		}
		if st.progressed {
			failures, st.progressed = 0, false
		}
		failures++
		if failures > c.resumeAttempts {
			yield(ExecEvent{}, fmt.Errorf("exec %s: stream lost after %d attempts: %w", st.execID, failures, err))
			return
		}
		delay := min(c.resumeBackoff<<(failures-1), 5*time.Second)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			yield(ExecEvent{}, context.Cause(ctx))
			return
		case <-t.C:
		}
		open = st.openEvents(c)
	}
}

// attempt reads one connection's events. stop is true when the iteration is
// over (exit delivered, consumer stopped, or a fatal error yielded); else
// err says why the connection dropped and the caller may re-attach.
func (c *Client) attempt(ctx context.Context, st *streamState, open func(context.Context) (*http.Response, error), yield func(ExecEvent, error) bool) (stop bool, err error) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	touch := func() {}
	if c.streamIdle > 0 {
		timer := time.AfterFunc(c.streamIdle, func() { cancel(errStreamIdle) })
		defer timer.Stop()
		touch = func() { timer.Reset(c.streamIdle) }
	}
	resp, err := open(actx)
	if err != nil {
		if ctx.Err() == nil && resumable(err) {
			if errors.Is(context.Cause(actx), errStreamIdle) {
				err = errStreamIdle
			}
			return false, err
		}
		yield(ExecEvent{}, err)
		return true, err
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !isEventStream(ct) {
		err := fmt.Errorf("exec stream: server answered %q, not text/event-stream", ct)
		yield(ExecEvent{}, err)
		return true, err
	}
	r := newSSEReader(resp.Body, touch)
	defer r.release()
	for {
		ev, err := r.next()
		if err != nil {
			if ctx.Err() != nil {
				return false, err // follow yields the caller's cancellation
			}
			if errors.Is(context.Cause(actx), errStreamIdle) {
				err = errStreamIdle
			}
			if err == io.EOF {
				err = io.ErrUnexpectedEOF // the stream must end with exit
			}
			return false, err
		}
		out, done, err := st.handle(ev)
		if err != nil {
			yield(ExecEvent{}, err)
			return true, err
		}
		if out != nil && !yield(*out, nil) {
			return true, nil
		}
		if done {
			return true, nil
		}
	}
}

// handle turns one SSE event into an ExecEvent to deliver (nil: nothing to
// deliver) and says whether it ended the stream.
func (st *streamState) handle(ev sseEvent) (out *ExecEvent, done bool, err error) {
	switch ev.Event {
	case EventStart:
		var s api.ExecStarted
		if err := json.Unmarshal([]byte(ev.Data), &s); err != nil {
			return nil, false, fmt.Errorf("decoding start event: %w", err)
		}
		if st.execID == "" {
			st.execID = s.ID
		}
		if st.started {
			return nil, false, nil // a re-attach may announce the exec again
		}
		st.started = true
		return &ExecEvent{Type: EventStart, ExecID: st.execID}, false, nil
	case EventStdout, EventStderr:
		var o api.OutputEvent
		if err := json.Unmarshal([]byte(ev.Data), &o); err != nil {
			return nil, false, fmt.Errorf("decoding %s event: %w", ev.Event, err)
		}
		data := []byte(o.Data)
		if o.Encoding == "base64" {
			if data, err = base64.StdEncoding.DecodeString(o.Data); err != nil {
				return nil, false, fmt.Errorf("decoding %s event data: %w", ev.Event, err)
			}
		}
		off := o.Offset
		// After a re-attach the server may replay from the start of a chunk
		// we already delivered in part: skip what the caller has seen.
		if off < st.next {
			skip := st.next - off
			if skip >= int64(len(data)) {
				return nil, false, nil
			}
			data, off = data[skip:], st.next
		}
		if len(data) == 0 {
			return nil, false, nil
		}
		st.next = off + int64(len(data))
		st.progressed = true
		return &ExecEvent{Type: ev.Event, ExecID: st.execID, Data: data, Offset: off}, false, nil
	case EventExit:
		var res api.ExecResult
		if err := json.Unmarshal([]byte(ev.Data), &res); err != nil {
			return nil, false, fmt.Errorf("decoding exit event: %w", err)
		}
		if res.ID == "" {
			res.ID = st.execID
		}
		st.progressed = true
		return &ExecEvent{Type: EventExit, ExecID: st.execID, Offset: st.next, Result: &res}, true, nil
	case "error":
		return nil, true, streamError(ev.Data)
	default:
		return nil, false, nil // unknown events are for newer clients
	}
}

// streamError decodes an `error` event (the API's error body) into an *APIError.
func streamError(data string) error {
	var body api.ErrorBody
	if err := json.Unmarshal([]byte(data), &body); err != nil || body.Error.Code == "" {
		var d api.ErrorDetail
		if err := json.Unmarshal([]byte(data), &d); err != nil || d.Code == "" {
			return &APIError{Code: api.CodeInternal, Message: "exec stream failed"}
		}
		body.Error = d
	}
	return &APIError{
		Code: body.Error.Code, Message: body.Error.Message,
		RequestID: body.Error.RequestID, SandboxID: body.Error.SandboxID,
	}
}

// resumable reports whether opening a stream failed in a way a later
// attempt may fix: no answer, or a gateway/unavailable status without a
// specific code. A 404 (exec gone) or 401 will not get better.
func resumable(err error) bool {
	if errors.Is(err, errStreamIdle) {
		return true
	}
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Class() == ErrUnavailable
	}
	return isNetErr(err)
}
