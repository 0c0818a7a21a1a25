package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// Tool names (issue 17: the same in every airlock SDK's docs).
const (
	ToolCreateSandbox = "create_sandbox"
	ToolRunCommand    = "run_command"
	ToolRunCode       = "run_code"
	ToolReadFile      = "read_file"
	ToolWriteFile     = "write_file"
	ToolListFiles     = "list_files"
	ToolKillSandbox   = "kill_sandbox"
)

// Defaults of the tools' own arguments.
const (
	// defaultCommandTimeoutS bounds a command or a cell when the caller
	// gives no timeout_s: MCP clients give up on a call after a minute
	// (the TypeScript SDK's default), and a command should end, with its
	// output, before the call does.
	defaultCommandTimeoutS = 50
	// maxListDepth bounds list_files' depth (the entries are bounded too).
	maxListDepth = 5
)

// userHome is the home of a sandbox's default user: relative paths are
// taken from it (the API takes absolute paths only), as in the SDKs.
const userHome = "/home/user"

// absPath makes a tool's path argument absolute.
func absPath(p string) string {
	if p == "" || path.IsAbs(p) {
		return p
	}
	return path.Join(userHome, p)
}

func ptr[T any](v T) *T { return &v }

// register adds the seven tools to s.
func (p *plane) register(s *sdk.Server) {
	addTool(s, p, toolSpec{
		name:  ToolCreateSandbox,
		title: "Create a sandbox",
		description: "Create an isolated Linux sandbox and return its sandbox_id. Its resource limits and " +
			"time to live are the API key's tenant defaults unless timeout_s asks for another TTL (within the " +
			"tenant's maximum). Template \"base\" (the default) is a small Debian; \"code-interpreter\" has " +
			"Python with pandas and matplotlib, node and bash kernels for run_code. A template's first use " +
			"builds it, which can take minutes: the call waits for it.",
		annotations: &sdk.ToolAnnotations{OpenWorldHint: ptr(false)},
		input: func(s *jsonschema.Schema) {
			s.Properties["timeout_s"].Minimum = ptr(1.0)
		},
	}, p.createSandbox)
	addTool(s, p, toolSpec{
		name:  ToolRunCommand,
		title: "Run a shell command in a sandbox",
		description: "Run a command line with /bin/sh -c in the sandbox and wait for it. Returns exit_code " +
			"(null when killed), status (exited, timeout, killed, oom, error), stdout and stderr. A non-zero " +
			"exit is a result, not a tool error. Each stream keeps its first and last " +
			strconv.Itoa(p.limits.StreamBytes/2) + " bytes; more is dropped from the middle, with a note: " +
			"redirect large output to a file and read parts of it.",
		annotations: &sdk.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
		input: func(s *jsonschema.Schema) {
			s.Properties["timeout_s"].Minimum = ptr(0.001)
			s.Properties["timeout_s"].Default = json.RawMessage(strconv.Itoa(defaultCommandTimeoutS))
		},
	}, p.runCommand)
	addTool(s, p, toolSpec{
		name:  ToolRunCode,
		title: "Run code in a sandbox's interpreter",
		description: "Run a cell of Python, JavaScript or bash in a stateful interpreter (variables persist " +
			"between calls, as in a notebook) and return its stdout, stderr and results. Charts and images " +
			"(matplotlib figures, display(Image)) come as image content; text, HTML, Markdown and JSON results " +
			"as text. An exception in the cell makes the call a tool error with the traceback. Needs a sandbox " +
			"of the code-interpreter template.",
		annotations: &sdk.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
		input: func(s *jsonschema.Schema) {
			s.Properties["language"].Enum = []any{api.LanguagePython, api.LanguageJavaScript, api.LanguageBash}
			s.Properties["language"].Default = json.RawMessage(`"python"`)
			s.Properties["timeout_s"].Minimum = ptr(0.001)
			s.Properties["timeout_s"].Default = json.RawMessage(strconv.Itoa(defaultCommandTimeoutS))
		},
	}, p.runCode)
	addTool(s, p, toolSpec{
		name:  ToolReadFile,
		title: "Read a file from a sandbox",
		description: "Read a file of the sandbox. Text comes as UTF-8 (encoding \"utf-8\"), other bytes as " +
			"base64 (encoding \"base64\"); a PNG, JPEG, GIF or WebP image comes as image content. At most " +
			"max_bytes are returned from offset; truncated and next_offset say how to read on.",
		annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)},
		input: func(s *jsonschema.Schema) {
			s.Properties["offset"].Minimum = ptr(0.0)
			s.Properties["max_bytes"].Minimum = ptr(1.0)
			s.Properties["max_bytes"].Maximum = ptr(float64(max(MaxFileBytes, p.limits.FileBytes)))
			s.Properties["max_bytes"].Default = json.RawMessage(strconv.Itoa(p.limits.FileBytes))
		},
	}, p.readFile)
	addTool(s, p, toolSpec{
		name:  ToolWriteFile,
		title: "Write a file in a sandbox",
		description: "Write content to a file of the sandbox, creating its parent directories and replacing " +
			"the file if it exists. content is UTF-8 text, or base64 with encoding \"base64\".",
		annotations: &sdk.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(false)},
		input: func(s *jsonschema.Schema) {
			s.Properties["encoding"].Enum = []any{"utf-8", "base64"}
			s.Properties["encoding"].Default = json.RawMessage(`"utf-8"`)
			s.Properties["mode"].Pattern = `^0?[0-7]{3}$`
		},
	}, p.writeFile)
	addTool(s, p, toolSpec{
		name:  ToolListFiles,
		title: "List a directory of a sandbox",
		description: "List the entries of a directory of the sandbox (name, path, type, size, mode, " +
			"modified_at), depth levels deep. At most " + strconv.Itoa(p.limits.Entries) + " entries are returned.",
		annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)},
		input: func(s *jsonschema.Schema) {
			s.Properties["path"].Default = json.RawMessage(`"."`)
			s.Properties["depth"].Minimum = ptr(1.0)
			s.Properties["depth"].Maximum = ptr(float64(maxListDepth))
			s.Properties["depth"].Default = json.RawMessage(`1`)
		},
	}, p.listFiles)
	addTool(s, p, toolSpec{
		name:        ToolKillSandbox,
		title:       "Kill a sandbox",
		description: "Destroy the sandbox and everything in it. Killing one already gone succeeds.",
		annotations: &sdk.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, p.killSandbox)
}

// ---- create_sandbox

type createSandboxIn struct {
	Template string            `json:"template,omitempty" jsonschema:"Template name, e.g. base (the server's default) or code-interpreter (for run_code)."`
	TimeoutS int64             `json:"timeout_s,omitempty" jsonschema:"Seconds the sandbox lives before it is killed. Default: the tenant's default TTL."`
	Env      map[string]string `json:"env,omitempty" jsonschema:"Environment variables of every command run in the sandbox."`
	Metadata map[string]string `json:"metadata,omitempty" jsonschema:"Labels kept with the sandbox (string values)."`
}

type resourcesOut struct {
	CPU      float64 `json:"cpu,omitempty" jsonschema:"CPU cores."`
	MemoryMB int64   `json:"memory_mb,omitempty"`
	DiskMB   int64   `json:"disk_mb,omitempty"`
}

type sandboxOut struct {
	SandboxID string       `json:"sandbox_id" jsonschema:"Pass this to the other tools."`
	Template  string       `json:"template"`
	Runtime   string       `json:"runtime" jsonschema:"The isolation runtime (runc, gvisor, ...)."`
	State     string       `json:"state"`
	ExpiresAt string       `json:"expires_at,omitempty" jsonschema:"When the sandbox will be killed (RFC 3339)."`
	Resources resourcesOut `json:"resources"`
}

func (p *plane) createSandbox(ctx context.Context, c *client.Client, in createSandboxIn) (*sandboxOut, result, error) {
	req := api.CreateSandboxRequest{Template: in.Template, Env: in.Env, Metadata: in.Metadata, WaitForTemplate: true}
	if in.TimeoutS > 0 {
		req.TimeoutS = &in.TimeoutS
	}
	sb, err := c.CreateSandbox(ctx, req)
	if err != nil {
		return nil, result{}, err
	}
	out := &sandboxOut{
		SandboxID: sb.ID, Template: sb.Template, Runtime: sb.Runtime, State: sb.State,
		Resources: resourcesOut{CPU: sb.Resources.CPU, MemoryMB: sb.Resources.MemoryMB, DiskMB: sb.Resources.DiskMB},
	}
	if sb.ExpiresAt != nil {
		out.ExpiresAt = sb.ExpiresAt.UTC().Format(time.RFC3339)
	}
	return out, result{}, nil
}

// ---- run_command

type runCommandIn struct {
	SandboxID string            `json:"sandbox_id" jsonschema:"The sandbox's id (sbx_...), as create_sandbox returned it."`
	Command   string            `json:"command" jsonschema:"The command line, run by /bin/sh -c."`
	Cwd       string            `json:"cwd,omitempty" jsonschema:"Working directory: absolute, or relative to the sandbox user's home. Default: the template's, else the home."`
	Env       map[string]string `json:"env,omitempty" jsonschema:"Extra environment variables for this command."`
	User      string            `json:"user,omitempty" jsonschema:"The sandbox user to run as: user (default) or root (root of the sandbox only)."`
	TimeoutS  float64           `json:"timeout_s,omitempty" jsonschema:"Seconds before the command and its children are killed (status timeout)."`
	Stdin     string            `json:"stdin,omitempty" jsonschema:"Text given to the command's standard input."`
}

type runCommandOut struct {
	ExitCode   *int   `json:"exit_code" jsonschema:"The exit status; null when the command was killed."`
	Status     string `json:"status" jsonschema:"exited, timeout, killed, oom or error."`
	Signal     string `json:"signal,omitempty"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	Error      string `json:"error,omitempty" jsonschema:"Why the command did not run or end normally."`
	DurationMS int64  `json:"duration_ms"`
	Truncated  bool   `json:"truncated,omitempty" jsonschema:"Output was dropped from the middle of a stream."`
	Note       string `json:"note,omitempty"`
}

func (p *plane) runCommand(ctx context.Context, c *client.Client, in runCommandIn) (*runCommandOut, result, error) {
	if in.Command == "" {
		return nil, result{}, badArgs("command is empty")
	}
	req := api.ExecRequest{
		Shell: &in.Command, Cwd: absPath(in.Cwd), Env: in.Env, User: in.User,
		TimeoutS:       &in.TimeoutS,
		MaxOutputBytes: ptr(int64(p.limits.StreamBytes)),
	}
	if in.Stdin != "" {
		req.Stdin = &in.Stdin
	}
	res, err := c.Exec(ctx, in.SandboxID, req)
	if err != nil {
		return nil, result{}, err
	}
	return p.commandResult(res), result{}, nil
}

// commandResult renders an exec result: streams decoded, each cut to the
// plane's bound (the API already cut them to it), with a marker where
// bytes were dropped.
func (p *plane) commandResult(res *api.ExecResult) *runCommandOut {
	out := &runCommandOut{
		ExitCode: res.ExitCode, Status: res.Status, Signal: res.Signal, Error: res.Error,
		DurationMS: res.DurationMS,
	}
	stdout, stderr := deref(res.Stdout), deref(res.Stderr)
	binary := false
	if res.Encoding == "base64" {
		so, err1 := base64.StdEncoding.DecodeString(stdout)
		se, err2 := base64.StdEncoding.DecodeString(stderr)
		if err1 == nil && err2 == nil {
			stdout, stderr = string(so), string(se)
			binary = !utf8.ValidString(stdout) || !utf8.ValidString(stderr)
		}
	}
	var cut1, cut2 bool
	out.Stdout, cut1 = keptStream(stdout, res.StdoutDroppedBytes, p.limits.StreamBytes, "stdout")
	out.Stderr, cut2 = keptStream(stderr, res.StderrDroppedBytes, p.limits.StreamBytes, "stderr")
	out.Truncated = res.Truncated || cut1 || cut2
	switch {
	case out.Truncated:
		out.Note = fmt.Sprintf("output was cut: each stream keeps its first and last %d bytes; "+
			"redirect it to a file and read parts of it (read_file with offset, or head, tail, grep)", p.limits.StreamBytes/2)
	case binary:
		out.Note = "the output is not valid UTF-8: invalid bytes are shown as U+FFFD; use od or base64 to see them"
	}
	return out
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// ---- run_code

type runCodeIn struct {
	SandboxID string  `json:"sandbox_id" jsonschema:"The sandbox's id (sbx_...), as create_sandbox returned it (template code-interpreter)."`
	Code      string  `json:"code" jsonschema:"The cell's source."`
	Language  string  `json:"language,omitempty" jsonschema:"python (default), javascript or bash."`
	ContextID string  `json:"context_id,omitempty" jsonschema:"Run in this interpreter context; default: the sandbox's default context of the language."`
	TimeoutS  float64 `json:"timeout_s,omitempty" jsonschema:"Seconds before the cell is interrupted (the context keeps its state)."`
}

type codeResultOut struct {
	IsMainResult bool   `json:"is_main_result" jsonschema:"The value of the cell's last expression (else a display() output or a figure)."`
	Text         string `json:"text,omitempty" jsonschema:"text/plain"`
	HTML         string `json:"html,omitempty"`
	Markdown     string `json:"markdown,omitempty"`
	LaTeX        string `json:"latex,omitempty"`
	SVG          string `json:"svg,omitempty"`
	JavaScript   string `json:"javascript,omitempty"`
	JSON         any    `json:"json,omitempty" jsonschema:"An application/json result."`
	Chart        any    `json:"chart,omitempty" jsonschema:"A matplotlib figure's data (type, title, elements)."`
	Data         any    `json:"data,omitempty" jsonschema:"A pandas DataFrame's columns."`
	Image        string `json:"image,omitempty" jsonschema:"The image content block of this result (its MIME type and size)."`
	Note         string `json:"note,omitempty"`
}

type codeErrorOut struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

type runCodeOut struct {
	Stdout         string          `json:"stdout"`
	Stderr         string          `json:"stderr"`
	Results        []codeResultOut `json:"results"`
	Error          *codeErrorOut   `json:"error,omitempty" jsonschema:"The cell's exception; the call is then a tool error."`
	ExecutionCount int             `json:"execution_count,omitempty"`
	Notes          []string        `json:"notes,omitempty" jsonschema:"What was left out of this result, and why."`
}

// maxResults bounds the results listed for one cell (each bounded too).
const maxResults = 64

func (p *plane) runCode(ctx context.Context, c *client.Client, in runCodeIn) (*runCodeOut, result, error) {
	req := api.CodeRequest{Code: in.Code, Language: in.Language, TimeoutS: &in.TimeoutS}
	if in.ContextID != "" {
		req.ContextID = &in.ContextID
	}
	cr := newCodeRender(p.limits)
	for ev, err := range c.RunCodeStream(ctx, in.SandboxID, req) {
		if err != nil {
			return nil, result{}, err
		}
		cr.add(ev)
	}
	return cr.finish()
}

// codeRender collects a cell's events into a bounded runCodeOut.
type codeRender struct {
	lim            Limits
	out            runCodeOut
	stdout, stderr *headTail
	images         []sdk.Content
	skipped        int // results past maxResults
	// budget is what is left of lim.TotalBytes for results and images.
	budget int
}

func newCodeRender(l Limits) *codeRender {
	return &codeRender{
		lim: l, budget: l.TotalBytes, out: runCodeOut{Results: []codeResultOut{}},
		stdout: newHeadTail(l.StreamBytes), stderr: newHeadTail(l.StreamBytes),
	}
}

func (r *codeRender) add(ev api.CodeEvent) {
	switch ev.Type {
	case api.CodeEventStdout:
		r.stdout.WriteString(ev.Text)
	case api.CodeEventStderr:
		r.stderr.WriteString(ev.Text)
	case api.CodeEventError:
		if r.out.Error == nil {
			tb, _ := clip(ev.Traceback, r.lim.StreamBytes, "traceback")
			val, _ := clip(ev.Value, r.lim.TextBytes, "error value")
			r.out.Error = &codeErrorOut{Name: ev.Name, Value: val, Traceback: tb}
		}
	case api.CodeEventResult:
		if len(r.out.Results) >= maxResults {
			r.skipped++
			return
		}
		r.out.Results = append(r.out.Results, r.result(ev))
	case api.CodeEventEnd:
		r.out.ExecutionCount = ev.ExecutionCount
	}
}

// result renders one result event, moving its PNG or JPEG to an image
// content block.
func (r *codeRender) result(ev api.CodeEvent) codeResultOut {
	var notes []string
	text := func(s, what string) string {
		if s == "" {
			return ""
		}
		limit := min(r.lim.TextBytes, r.budget)
		if r.budget < 64 {
			notes = append(notes, fmt.Sprintf("%s left out: the call's %d bytes are spent", what, r.lim.TotalBytes))
			return ""
		}
		v, cut := clip(s, limit, what)
		if cut {
			notes = append(notes, what+" cut to "+strconv.Itoa(limit)+" bytes")
		}
		r.budget -= len(v)
		return v
	}
	raw := func(m json.RawMessage, what string) any {
		limit := min(r.lim.TextBytes, r.budget)
		switch {
		case len(m) == 0:
			return nil
		case len(m) > limit:
			notes = append(notes, fmt.Sprintf("%s left out: %d bytes of JSON, more than %d", what, len(m), limit))
			return nil
		case !json.Valid(m):
			return nil
		}
		r.budget -= len(m)
		return m
	}
	out := codeResultOut{
		IsMainResult: ev.IsMainResult,
		Text:         text(ev.Text, "text"), HTML: text(ev.HTML, "html"), Markdown: text(ev.Markdown, "markdown"),
		LaTeX: text(ev.LaTeX, "latex"), JavaScript: text(ev.JavaScript, "javascript"),
		JSON: raw(ev.JSON, "json"), Chart: raw(ev.Chart, "chart"), Data: raw(ev.Data, "data"),
	}
	img, mime := ev.PNG, "image/png"
	if img == "" {
		img, mime = ev.JPEG, "image/jpeg"
	}
	if img != "" {
		out.Image, notes = r.image(img, mime, notes)
	}
	// An SVG goes as text, and only when there is no raster image: MCP
	// hosts do not all show SVG images, and it would double the size.
	if ev.SVG != "" && out.Image == "" {
		out.SVG = text(ev.SVG, "svg")
	}
	if len(notes) > 0 {
		out.Note = joinNotes(notes)
	}
	return out
}

// image adds a base64 image as a content block, unless it is over the
// bounds, and says which block it is.
func (r *codeRender) image(b64, mime string, notes []string) (string, []string) {
	if len(r.images) >= r.lim.Images {
		return "", append(notes, fmt.Sprintf("%s image left out: at most %d images per call", mime, r.lim.Images))
	}
	size := base64.StdEncoding.DecodedLen(len(b64))
	if limit := min(r.lim.ImageBytes, r.budget); size > limit+3 {
		return "", append(notes, fmt.Sprintf("%s image left out: about %d bytes, more than the %d left for it; save it to a file and read_file it instead", mime, size, limit))
	}
	data, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return "", append(notes, mime+" image left out: not valid base64")
	}
	r.budget -= len(data)
	r.images = append(r.images, &sdk.ImageContent{Data: data, MIMEType: mime})
	return fmt.Sprintf("%s, %d bytes: image content block %d", mime, len(data), len(r.images)), notes
}

func (r *codeRender) finish() (*runCodeOut, result, error) {
	var cut1, cut2 bool
	r.out.Stdout, cut1 = r.stdout.String("stdout")
	r.out.Stderr, cut2 = r.stderr.String("stderr")
	if cut1 || cut2 {
		r.out.Notes = append(r.out.Notes, fmt.Sprintf("output was cut: each stream keeps its first and last %d bytes", r.lim.StreamBytes/2))
	}
	if r.skipped > 0 {
		r.out.Notes = append(r.out.Notes, fmt.Sprintf("%d more results left out: at most %d per call", r.skipped, maxResults))
	}
	return &r.out, result{extra: r.images, isError: r.out.Error != nil}, nil
}

// ---- read_file

type readFileIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"The sandbox's id (sbx_...), as create_sandbox returned it."`
	Path      string `json:"path" jsonschema:"The file: absolute, or relative to the sandbox user's home."`
	Offset    int64  `json:"offset,omitempty" jsonschema:"The first byte to return."`
	MaxBytes  int    `json:"max_bytes,omitempty" jsonschema:"At most this many bytes are returned."`
}

type readFileOut struct {
	Path       string `json:"path"`
	Size       int64  `json:"size" jsonschema:"The whole file's size in bytes."`
	Offset     int64  `json:"offset"`
	Bytes      int    `json:"bytes" jsonschema:"How many bytes content holds."`
	Encoding   string `json:"encoding" jsonschema:"utf-8, base64, or image (the bytes are the image content block)."`
	Content    string `json:"content"`
	MIMEType   string `json:"mime_type,omitempty"`
	Truncated  bool   `json:"truncated,omitempty" jsonschema:"More of the file follows: read on from next_offset."`
	NextOffset int64  `json:"next_offset,omitempty"`
}

func (p *plane) readFile(ctx context.Context, c *client.Client, in readFileIn) (*readFileOut, result, error) {
	if in.Path == "" {
		return nil, result{}, badArgs("path is empty")
	}
	in.Path = absPath(in.Path)
	fi, err := c.Stat(ctx, in.SandboxID, in.Path)
	if err != nil {
		return nil, result{}, err
	}
	if fi.Type == "dir" {
		return nil, result{}, badArgs("%s is a directory: use list_files", fi.Path)
	}
	rc, err := c.ReadFile(ctx, in.SandboxID, in.Path)
	if err != nil {
		return nil, result{}, err
	}
	defer rc.Close()
	if in.Offset > 0 {
		if _, err := io.CopyN(io.Discard, rc, in.Offset); err != nil && !errors.Is(err, io.EOF) {
			return nil, result{}, err
		}
	}
	limit := in.MaxBytes
	if limit <= 0 {
		limit = p.limits.FileBytes
	}
	// An image is read whole (up to its own bound) when asked from the start.
	readMax := limit
	if in.Offset == 0 {
		readMax = max(limit, p.limits.ImageBytes)
	}
	buf, err := io.ReadAll(io.LimitReader(rc, int64(readMax)+1))
	if err != nil {
		return nil, result{}, err
	}
	out := &readFileOut{Path: fi.Path, Size: fi.Size, Offset: in.Offset}
	if in.Offset == 0 && len(buf) <= p.limits.ImageBytes {
		if mime := imageType(buf); mime != "" {
			out.Encoding, out.MIMEType, out.Bytes = "image", mime, len(buf)
			return out, result{extra: []sdk.Content{&sdk.ImageContent{Data: buf, MIMEType: mime}}}, nil
		}
	}
	more := len(buf) > limit
	if more {
		buf = buf[:limit]
	}
	chunk, enc := textOrBase64(buf, more)
	out.Content, out.Encoding, out.Bytes = chunk, enc, len(buf)
	if enc == "utf-8" {
		out.Bytes = len(chunk) // an incomplete character at the end waits for the next read
	}
	if more || in.Offset+int64(out.Bytes) < fi.Size {
		out.Truncated, out.NextOffset = true, in.Offset+int64(out.Bytes)
	}
	return out, result{}, nil
}

// imageType is the MIME type of an image format MCP hosts show, by its
// magic number, or "".
func imageType(b []byte) string {
	switch {
	case bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")):
		return "image/png"
	case bytes.HasPrefix(b, []byte("\xff\xd8\xff")):
		return "image/jpeg"
	case bytes.HasPrefix(b, []byte("GIF87a")), bytes.HasPrefix(b, []byte("GIF89a")):
		return "image/gif"
	case len(b) >= 12 && string(b[:4]) == "RIFF" && string(b[8:12]) == "WEBP":
		return "image/webp"
	}
	return ""
}

// textOrBase64 returns b as text when it is UTF-8 (an incomplete character
// at its end, where the read stopped, is left for the next read), else as
// base64.
func textOrBase64(b []byte, cutAtEnd bool) (string, string) {
	t := b
	if cutAtEnd {
		t = trimPartialRune(t)
	}
	if utf8.Valid(t) && !bytes.ContainsRune(t, 0) {
		return string(t), "utf-8"
	}
	return base64.StdEncoding.EncodeToString(b), "base64"
}

// trimPartialRune drops an incomplete UTF-8 sequence at the end of b.
func trimPartialRune(b []byte) []byte {
	for i := 1; i < utf8.UTFMax && i <= len(b); i++ {
		if utf8.RuneStart(b[len(b)-i]) {
			if !utf8.FullRune(b[len(b)-i:]) {
				return b[:len(b)-i]
			}
			return b
		}
	}
	return b
}

// ---- write_file

type writeFileIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"The sandbox's id (sbx_...), as create_sandbox returned it."`
	Path      string `json:"path" jsonschema:"The file: absolute, or relative to the sandbox user's home."`
	Content   string `json:"content" jsonschema:"The file's content."`
	Encoding  string `json:"encoding,omitempty" jsonschema:"utf-8 (default): content is the text; base64: content is base64 of the bytes."`
	Mode      string `json:"mode,omitempty" jsonschema:"Permission bits in octal, e.g. 0755 for a script (default 0644)."`
}

type writeFileOut struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

func (p *plane) writeFile(ctx context.Context, c *client.Client, in writeFileIn) (*writeFileOut, result, error) {
	if in.Path == "" {
		return nil, result{}, badArgs("path is empty")
	}
	in.Path = absPath(in.Path)
	data := []byte(in.Content)
	if in.Encoding == "base64" {
		if base64.StdEncoding.DecodedLen(len(in.Content)) > p.limits.WriteBytes+3 {
			return nil, result{}, fmt.Errorf("content of about %d bytes is over the %d bytes one write_file takes: %w", base64.StdEncoding.DecodedLen(len(in.Content)), p.limits.WriteBytes, errTooLarge)
		}
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, result{}, badArgs("content is not valid base64: %v", err)
		}
	}
	if len(data) > p.limits.WriteBytes {
		return nil, result{}, fmt.Errorf("content of %d bytes is over the %d bytes one write_file takes: %w", len(data), p.limits.WriteBytes, errTooLarge)
	}
	var opts []client.FileOption
	if in.Mode != "" {
		m, err := strconv.ParseUint(in.Mode, 8, 32)
		if err != nil || m > 0o777 {
			return nil, result{}, badArgs("mode %q is not octal permission bits such as 0644", in.Mode)
		}
		opts = append(opts, client.WithMode(os.FileMode(m)))
	}
	w, err := c.WriteFile(ctx, in.SandboxID, in.Path, bytes.NewReader(data), opts...)
	if err != nil {
		return nil, result{}, err
	}
	return &writeFileOut{Path: w.Path, Size: w.Size}, result{}, nil
}

// ---- list_files

type listFilesIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"The sandbox's id (sbx_...), as create_sandbox returned it."`
	Path      string `json:"path,omitempty" jsonschema:"The directory: absolute, or relative to the sandbox user's home (default: the home)."`
	Depth     int    `json:"depth,omitempty" jsonschema:"1 lists the directory's entries, 2 also theirs, and so on."`
}

type fileOut struct {
	Name       string `json:"name"`
	Path       string `json:"path"`
	Type       string `json:"type" jsonschema:"file, dir, symlink or other."`
	Size       int64  `json:"size"`
	Mode       string `json:"mode" jsonschema:"Permission bits in octal."`
	ModifiedAt string `json:"modified_at"`
	LinkTarget string `json:"link_target,omitempty"`
}

type listFilesOut struct {
	Path      string    `json:"path"`
	Entries   []fileOut `json:"entries"`
	Total     int       `json:"total" jsonschema:"How many entries there are; more than listed when truncated."`
	Truncated bool      `json:"truncated,omitempty"`
}

func (p *plane) listFiles(ctx context.Context, c *client.Client, in listFilesIn) (*listFilesOut, result, error) {
	in.Path = absPath(in.Path)
	if in.Path == "" {
		in.Path = userHome
	}
	entries, err := c.List(ctx, in.SandboxID, in.Path, in.Depth)
	if err != nil {
		return nil, result{}, err
	}
	out := &listFilesOut{Path: in.Path, Total: len(entries), Entries: make([]fileOut, 0, min(len(entries), p.limits.Entries))}
	for i, e := range entries {
		if i >= p.limits.Entries {
			out.Truncated = true
			break
		}
		out.Entries = append(out.Entries, fileOut{
			Name: e.Name, Path: e.Path, Type: e.Type, Size: e.Size, Mode: e.Mode,
			ModifiedAt: e.ModifiedAt.UTC().Format(time.RFC3339), LinkTarget: e.LinkTarget,
		})
	}
	return out, result{}, nil
}

// ---- kill_sandbox

type killSandboxIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"The sandbox's id (sbx_...), as create_sandbox returned it."`
}

type killSandboxOut struct {
	SandboxID string `json:"sandbox_id"`
	Killed    bool   `json:"killed"`
}

func (p *plane) killSandbox(ctx context.Context, c *client.Client, in killSandboxIn) (*killSandboxOut, result, error) {
	if err := c.DeleteSandbox(ctx, in.SandboxID); err != nil {
		return nil, result{}, err
	}
	return &killSandboxOut{SandboxID: in.SandboxID, Killed: true}, result{}, nil
}
