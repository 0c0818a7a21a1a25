package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"net/url"
	"strings"

	"github.com/airlockhq/airlock/api"
)

// maxCodeLine bounds one event line of a code stream (a large figure).
const maxCodeLine = 64 << 20

// RunCodeStream runs a cell and yields its events as they come: stdout,
// stderr, result and error events, then end. The iteration ends after end
// or after the first error, which it yields. Stopping early (or cancelling
// ctx) closes the connection, which interrupts the cell; the context keeps
// its state.
func (c *Client) RunCodeStream(ctx context.Context, sandboxID string, req api.CodeRequest) iter.Seq2[api.CodeEvent, error] {
	return func(yield func(api.CodeEvent, error) bool) {
		body, err := json.Marshal(req)
		if err != nil {
			yield(api.CodeEvent{}, fmt.Errorf("encoding request: %w", err))
			return
		}
		r, err := c.newRequest(ctx, http.MethodPost, sandboxPath(sandboxID, "code"), nil, bytes.NewReader(body))
		if err != nil {
			yield(api.CodeEvent{}, err)
			return
		}
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Accept", "application/x-ndjson")
		resp, err := c.send(r)
		if err != nil {
			yield(api.CodeEvent{}, err)
			return
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 0, 64<<10), maxCodeLine)
		for sc.Scan() {
			if len(bytes.TrimSpace(sc.Bytes())) == 0 {
				continue
			}
			var ev api.CodeEvent
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				yield(api.CodeEvent{}, fmt.Errorf("decoding code event: %w", err))
				return
			}
			if !yield(ev, nil) || ev.Type == api.CodeEventEnd {
				return
			}
		}
		err = sc.Err()
		if err == nil {
			err = errors.New("code stream ended without an end event")
		}
		yield(api.CodeEvent{}, fmt.Errorf("reading code stream: %w", err))
	}
}

// Execution is the collected outcome of a cell (RunCode).
type Execution struct {
	// Stdout and Stderr are the cell's streams, concatenated.
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// Results are the result events in order; the main one (the last
	// expression's value) has IsMainResult set.
	Results []api.CodeEvent `json:"results"`
	// Error is the cell's first error event, if any.
	Error *api.CodeEvent `json:"error,omitempty"`
	// ExecutionCount is the end event's count.
	ExecutionCount int `json:"execution_count"`
}

// CodeError is the exception a cell raised (Execution.Err).
type CodeError struct {
	Name, Value, Traceback string
}

// Error implements error: "ZeroDivisionError: division by zero".
func (e *CodeError) Error() string {
	if e.Value == "" {
		return e.Name
	}
	return e.Name + ": " + e.Value
}

// Err returns the cell's exception as a *CodeError, or nil when it raised
// none.
func (e *Execution) Err() error {
	if e.Error == nil {
		return nil
	}
	return &CodeError{Name: e.Error.Name, Value: e.Error.Value, Traceback: e.Error.Traceback}
}

// PNGs returns the decoded PNG images of the results (figures), in order.
func (e *Execution) PNGs() ([][]byte, error) {
	var out [][]byte
	for _, r := range e.Results {
		if r.PNG == "" {
			continue
		}
		b, err := base64.StdEncoding.DecodeString(r.PNG)
		if err != nil {
			return nil, fmt.Errorf("decoding a png result: %w", err)
		}
		out = append(out, b)
	}
	return out, nil
}

// Text returns the main result's text/plain, or "".
func (e *Execution) Text() string {
	for _, r := range e.Results {
		if r.IsMainResult {
			return r.Text
		}
	}
	return ""
}

// CodeHandlers receive a cell's events as they come (RunCode); any may be nil.
type CodeHandlers struct {
	OnStdout func(text string)
	OnStderr func(text string)
	OnResult func(ev api.CodeEvent)
	OnError  func(ev api.CodeEvent)
}

// RunCode runs a cell, calls h (if given) with each event as it comes, and
// returns the collected outcome. An exception in the cell is not an error
// of the call: it is Execution.Error.
func (c *Client) RunCode(ctx context.Context, sandboxID string, req api.CodeRequest, h *CodeHandlers) (*Execution, error) {
	if h == nil {
		h = &CodeHandlers{}
	}
	var out Execution
	var stdout, stderr strings.Builder
	for ev, err := range c.RunCodeStream(ctx, sandboxID, req) {
		if err != nil {
			return nil, err
		}
		switch ev.Type {
		case api.CodeEventStdout:
			stdout.WriteString(ev.Text)
			if h.OnStdout != nil {
				h.OnStdout(ev.Text)
			}
		case api.CodeEventStderr:
			stderr.WriteString(ev.Text)
			if h.OnStderr != nil {
				h.OnStderr(ev.Text)
			}
		case api.CodeEventResult:
			out.Results = append(out.Results, ev)
			if h.OnResult != nil {
				h.OnResult(ev)
			}
		case api.CodeEventError:
			if out.Error == nil {
				e := ev
				out.Error = &e
			}
			if h.OnError != nil {
				h.OnError(ev)
			}
		case api.CodeEventEnd:
			out.ExecutionCount = ev.ExecutionCount
		}
	}
	out.Stdout, out.Stderr = stdout.String(), stderr.String()
	return &out, nil
}

// CreateContext makes a code-interpreter context (language python,
// javascript or bash) and starts its kernel.
func (c *Client) CreateContext(ctx context.Context, sandboxID string, req api.CodeContextRequest) (*api.CodeContext, error) {
	var out api.CodeContext
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(sandboxID, "contexts"), nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListContexts returns the sandbox's contexts, oldest first.
func (c *Client) ListContexts(ctx context.Context, sandboxID string) ([]api.CodeContext, error) {
	var out api.CodeContextList
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(sandboxID, "contexts"), nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Contexts, nil
}

// DeleteContext kills a context's kernel and forgets the context.
func (c *Client) DeleteContext(ctx context.Context, sandboxID, contextID string) error {
	return c.doJSON(ctx, http.MethodDelete, sandboxPath(sandboxID, "contexts", url.PathEscape(contextID)), nil, nil, nil)
}

// RestartContext replaces a context's kernel with a fresh one (state is lost).
func (c *Client) RestartContext(ctx context.Context, sandboxID, contextID string) (*api.CodeContext, error) {
	var out api.CodeContext
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(sandboxID, "contexts", url.PathEscape(contextID), "restart"), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
