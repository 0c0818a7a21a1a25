// Package mcp is airlock's MCP plane: a Model Context Protocol server (the
// official github.com/modelcontextprotocol/go-sdk) whose tools create
// sandboxes, run commands and code, read, write and list files, and kill
// sandboxes.
//
// It is a client of the HTTP API through the Go SDK (package client), like
// the CLI: every tool call is a request made with the API key the session
// runs with, so the server's authentication, tenancy, quotas, tenant
// defaults (resource limits, TTL) and audit apply unchanged, and a session
// sees only its own tenant's sandboxes. It imports nothing of the daemon.
//
// Two transports: stdio (Serve with an io.Reader/io.Writer pair, one key
// for the process) and streamable HTTP (NewHTTPHandler: each request
// carries its own key as a bearer token, and a session is bound to the
// key that opened it).
//
// Nothing here does work at package initialisation: schemas are built by
// NewServer, so the CLI's other commands pay nothing for this package
// beyond the MCP SDK's own init.
package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// ServerName is the name the server gives itself in the MCP handshake.
const ServerName = "airlock"

// instructions is what the server tells an MCP host about its tools.
const instructions = `airlock runs untrusted code in isolated sandboxes.
Create a sandbox with create_sandbox (template "code-interpreter" for run_code), then use its
sandbox_id with run_command, run_code, read_file, write_file and list_files, and kill_sandbox
when done (a sandbox also expires by itself after its timeout). Paths are absolute or relative
to the sandbox user's home. Errors start with an error code such as sandbox_not_found.`

// Options configure a Server.
type Options struct {
	// Version is reported in the MCP handshake (serverInfo.version).
	Version string
	// Logger receives the server's own diagnostics (never a key, never
	// sandbox output); nil discards them.
	Logger *slog.Logger
	// Limits bound what a tool returns; zero fields take the defaults.
	Limits Limits
}

// Limits bound tool outputs, so that a result never grows with what a
// sandbox prints or holds: past a limit the output is cut, with a note
// saying how much was left out and how to get at the rest.
type Limits struct {
	// StreamBytes bounds the stdout and the stderr of run_command and
	// run_code (each): their first and last halves are kept.
	StreamBytes int
	// TextBytes bounds one text representation of a run_code result
	// (text/plain, html, markdown, json, ...).
	TextBytes int
	// Images bounds the images (charts) of one run_code call.
	Images int
	// ImageBytes bounds one image, decoded; a larger one is replaced by a
	// note (its size).
	ImageBytes int
	// FileBytes is the default and the most read_file returns at once.
	FileBytes int
	// Entries bounds the entries list_files returns.
	Entries int
	// WriteBytes bounds the decoded content of one write_file.
	WriteBytes int
	// TotalBytes bounds the results and images of one run_code call
	// together (its stdout and stderr are bounded apart): with
	// base64, a call's answer stays well under the 16 MiB a message may
	// have for the Go SDK's clients.
	TotalBytes int
}

// Default limits.
const (
	DefaultStreamBytes = 32 << 10
	DefaultTextBytes   = 32 << 10
	DefaultImages      = 8
	DefaultImageBytes  = 4 << 20
	DefaultFileBytes   = 64 << 10
	MaxFileBytes       = 1 << 20
	DefaultEntries     = 500
	DefaultWriteBytes  = 8 << 20
	DefaultTotalBytes  = 8 << 20
)

func (l Limits) withDefaults() Limits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.StreamBytes, DefaultStreamBytes)
	def(&l.TextBytes, DefaultTextBytes)
	def(&l.Images, DefaultImages)
	def(&l.ImageBytes, DefaultImageBytes)
	def(&l.FileBytes, DefaultFileBytes)
	def(&l.Entries, DefaultEntries)
	def(&l.WriteBytes, DefaultWriteBytes)
	def(&l.TotalBytes, DefaultTotalBytes)
	// The API keeps the first and last halves of a stream.
	l.StreamBytes += l.StreamBytes % 2
	return l
}

// ClientFunc returns the API client a tool call runs with: the process's
// for stdio, the request's bearer key for HTTP. An error ends the call as
// a tool error.
type ClientFunc func(ctx context.Context, req *sdk.CallToolRequest) (*client.Client, error)

// plane holds what every tool handler needs.
type plane struct {
	clientFor ClientFunc
	limits    Limits
	log       *slog.Logger
}

// NewServer returns an MCP server with airlock's tools, each calling the
// API with the client clientFor gives for the call.
func NewServer(clientFor ClientFunc, opts Options) *sdk.Server {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	version := opts.Version
	if version == "" {
		version = "dev"
	}
	p := &plane{clientFor: clientFor, limits: opts.Limits.withDefaults(), log: log}
	s := sdk.NewServer(&sdk.Implementation{Name: ServerName, Title: "airlock sandboxes", Version: version},
		&sdk.ServerOptions{Instructions: instructions, Logger: log})
	p.register(s)
	return s
}

// Serve runs one MCP session over r and w (stdio: the host writes requests
// to our stdin and reads our stdout) with the client c, until the host
// closes r or ctx ends.
func Serve(ctx context.Context, c *client.Client, r io.Reader, w io.Writer, opts Options) error {
	s := NewServer(func(context.Context, *sdk.CallToolRequest) (*client.Client, error) { return c, nil }, opts)
	// As s.Run, without its error log when told to stop: a host stopping
	// its server is no error.
	tr := &drainTransport{Transport: &sdk.IOTransport{Reader: io.NopCloser(r), Writer: nopWriteCloser{w}}}
	ss, err := s.Connect(ctx, tr, nil)
	if err != nil {
		return err
	}
	ended := make(chan error, 1)
	go func() { ended <- ss.Wait() }()
	select {
	case err := <-ended:
		if errors.Is(err, io.EOF) {
			return nil // the host closed the session
		}
		return err
	case <-ctx.Done():
		ss.Close()
		<-ended
		return nil
	}
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// drainTimeout bounds how long a session whose input ended still waits
// for the answers to the requests it read (the host then sends SIGTERM).
const drainTimeout = 2 * time.Minute

// drainTransport makes the end of the input wait for the answers to the
// requests read before it: the SDK otherwise cancels them, so that
// `printf '…' | airlock mcp` or a host that closes stdin after its last
// request would lose answers.
type drainTransport struct{ sdk.Transport }

func (t *drainTransport) Connect(ctx context.Context) (sdk.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	idle := make(chan struct{})
	close(idle)
	return &drainConn{Connection: c, idle: idle, closed: make(chan struct{})}, nil
}

// drainConn counts the calls read and the responses written.
type drainConn struct {
	sdk.Connection
	mu        sync.Mutex
	pending   int
	idle      chan struct{} // closed while pending is 0
	closed    chan struct{}
	closeOnce sync.Once
}

func (c *drainConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if err == nil {
		if req, ok := msg.(*jsonrpc.Request); ok && req.ID.IsValid() {
			c.mu.Lock()
			if c.pending++; c.pending == 1 {
				c.idle = make(chan struct{})
			}
			c.mu.Unlock()
		}
		return msg, nil
	}
	c.mu.Lock()
	idle := c.idle
	c.mu.Unlock()
	t := time.NewTimer(drainTimeout)
	defer t.Stop()
	select {
	case <-idle:
	case <-c.closed:
	case <-ctx.Done():
	case <-t.C:
	}
	return nil, err
}

func (c *drainConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	err := c.Connection.Write(ctx, msg)
	if _, ok := msg.(*jsonrpc.Response); ok {
		c.mu.Lock()
		if c.pending > 0 {
			if c.pending--; c.pending == 0 {
				close(c.idle)
			}
		}
		c.mu.Unlock()
	}
	return err
}

func (c *drainConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Connection.Close()
}

// toolSpec describes one tool for register.
type toolSpec struct {
	name, title, description string
	annotations              *sdk.ToolAnnotations
	// input tunes the schema inferred from the input type (enums,
	// bounds, defaults).
	input func(*jsonschema.Schema)
}

// result is what a tool handler returns besides its structured output:
// extra content blocks after the JSON text (images), and whether the call
// is a tool error (a failing cell) although it has an output.
type result struct {
	extra   []sdk.Content
	isError bool
}

// addTool registers a tool whose arguments decode into In and whose
// structured output is Out. Arguments are validated against the input
// schema first; a mismatch, like every error of the handler, is a tool
// error whose text starts with the API's error code, never a protocol
// error or a crash.
func addTool[In, Out any](s *sdk.Server, p *plane, spec toolSpec, h func(ctx context.Context, c *client.Client, in In) (*Out, result, error)) {
	in, err := jsonschema.For[In](nil)
	if err != nil {
		panic(fmt.Sprintf("mcp: tool %s: input schema: %v", spec.name, err))
	}
	// These are never empty (a mistake the schema can name); a file's
	// content may be.
	for _, name := range []string{"sandbox_id", "path", "command", "code"} {
		if ps := in.Properties[name]; ps != nil && slices.Contains(in.Required, name) {
			ps.MinLength = ptr(1)
		}
	}
	if spec.input != nil {
		spec.input(in)
	}
	inResolved, err := in.Resolve(&jsonschema.ResolveOptions{ValidateDefaults: true})
	if err != nil {
		panic(fmt.Sprintf("mcp: tool %s: resolving input schema: %v", spec.name, err))
	}
	out, err := jsonschema.For[Out](nil)
	if err != nil {
		panic(fmt.Sprintf("mcp: tool %s: output schema: %v", spec.name, err))
	}
	tool := &sdk.Tool{
		Name: spec.name, Title: spec.title, Description: spec.description,
		Annotations: spec.annotations, InputSchema: in, OutputSchema: out,
	}
	s.AddTool(tool, func(ctx context.Context, req *sdk.CallToolRequest) (res *sdk.CallToolResult, _ error) {
		// A bug in a tool is that call's error, never the end of every
		// session of the process.
		defer func() {
			if v := recover(); v != nil {
				p.log.Error("tool panicked", "tool", spec.name, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
				res = toolError(&client.APIError{Code: api.CodeInternal, Message: "the MCP server failed on this call"})
			}
		}()
		var args In
		if err := decodeArgs(req.Params.Arguments, inResolved, &args); err != nil {
			return toolError(err), nil
		}
		c, err := p.clientFor(ctx, req)
		if err != nil {
			return toolError(err), nil
		}
		o, r, err := h(ctx, c, args)
		if err != nil {
			if ctx.Err() == nil {
				p.log.Debug("tool error", "tool", spec.name, "code", errorCode(err))
			}
			return toolError(err), nil
		}
		b, err := json.Marshal(o)
		if err != nil {
			return toolError(fmt.Errorf("encoding the result: %w", err)), nil
		}
		content := append([]sdk.Content{&sdk.TextContent{Text: string(b)}}, r.extra...)
		return &sdk.CallToolResult{Content: content, StructuredContent: json.RawMessage(b), IsError: r.isError}, nil
	})
}

// argError is arguments that do not fit a tool's input schema.
type argError struct{ msg string }

func (e *argError) Error() string { return e.msg }

func badArgs(format string, args ...any) error { return &argError{fmt.Sprintf(format, args...)} }

// decodeArgs validates raw against the schema (after its defaults) and
// decodes it into v.
func decodeArgs(raw json.RawMessage, schema *jsonschema.Resolved, v any) error {
	m := map[string]any{}
	if len(raw) > 0 && string(raw) != "null" {
		if err := json.Unmarshal(raw, &m); err != nil {
			return badArgs("arguments must be a JSON object: %v", err)
		}
	}
	if err := schema.ApplyDefaults(&m); err != nil {
		return badArgs("arguments: %v", err)
	}
	if err := schema.Validate(m); err != nil {
		return badArgs("arguments: %v", err)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return badArgs("arguments: %v", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return badArgs("arguments: %v", err)
	}
	return nil
}

// errorCode names err as the API does (docs/api.md's codes).
func errorCode(err error) string {
	var ae *client.APIError
	var arg *argError
	switch {
	case errors.As(err, &ae):
		return ae.Code
	case errors.As(err, &arg):
		return api.CodeInvalidArgument
	case errors.Is(err, errTooLarge):
		return api.CodePayloadTooLarge
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	case errors.Is(err, client.ErrUnavailable):
		return api.CodeUnavailable
	case errors.Is(err, client.ErrNotFound):
		return api.CodeNotFound
	case errors.Is(err, client.ErrInvalidArgument):
		return api.CodeInvalidArgument
	}
	return api.CodeInternal
}

// errTooLarge marks an argument over one of the plane's own bounds.
var errTooLarge = errors.New("too large")

// toolError is the result of a failed call: one text block "code:
// message", with what helps the caller decide (retry after, the build a
// template waits for, the request id of an internal error).
func toolError(err error) *sdk.CallToolResult {
	code := errorCode(err)
	msg := err.Error()
	var ae *client.APIError
	if errors.As(err, &ae) {
		msg = ae.Message
		if msg == "" {
			msg = strings.ReplaceAll(code, "_", " ")
		}
		var hints []string
		if ae.BuildID != "" {
			hints = append(hints, "template build "+ae.BuildID)
		}
		if ae.RetryAfter > 0 {
			hints = append(hints, "retry after "+ae.RetryAfter.Round(time.Second).String())
		}
		if ae.RequestID != "" && code == api.CodeInternal {
			hints = append(hints, "request "+ae.RequestID)
		}
		if len(hints) > 0 {
			msg += " (" + strings.Join(hints, ", ") + ")"
		}
	}
	msg = strings.Join(strings.Fields(msg), " ")
	return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: code + ": " + msg}}}
}
