package api

import (
	"encoding/json"
	"time"
)

// Code-interpreter languages (CodeRequest.Language, CodeContextRequest.Language).
const (
	LanguagePython     = "python"
	LanguageJavaScript = "javascript"
	LanguageBash       = "bash"
)

// Code event types (CodeEvent.Type).
const (
	CodeEventStdout = "stdout"
	CodeEventStderr = "stderr"
	CodeEventResult = "result"
	CodeEventError  = "error"
	CodeEventEnd    = "end"
)

// Error names the daemon itself puts in error events (besides the
// language's own exception names).
const (
	// CodeErrorKernelDied: the context's kernel exited during the cell (or
	// had exited before it); its state is lost and the next cell starts a
	// fresh kernel.
	CodeErrorKernelDied = "KernelDied"
	// CodeErrorTimeout: the cell ran past its timeout_s and the kernel
	// did not stop when interrupted, so it was restarted (state lost).
	CodeErrorTimeout = "TimeoutError"
	// CodeErrorOutputLimit: the cell's output went past the limit; the rest
	// was dropped.
	CodeErrorOutputLimit = "OutputLimitExceeded"
)

// AuditCode is the audit event type of a code cell (detail CodeAuditDetail).
const AuditCode = "code"

// CodeRequest is the body of POST /v1/sandboxes/{id}/code.
type CodeRequest struct {
	// Code is the cell's source.
	Code string `json:"code"`
	// Language selects the default context of that language when ContextID
	// is empty ("" means python); with ContextID it must match the
	// context's language or be empty.
	Language string `json:"language,omitempty"`
	// ContextID runs the cell in that context; empty means the sandbox's
	// default context of Language (created on first use).
	ContextID *string `json:"context_id,omitempty"`
	// TimeoutS bounds the cell; past it the cell is interrupted and the
	// context keeps its state. nil means the server's default.
	TimeoutS *float64 `json:"timeout_s,omitempty"`
	// Env is set in the cell's environment (os.environ in python,
	// process.env in javascript, exported variables in bash) for this cell
	// only: afterwards each variable has its earlier value again (or is
	// unset) and the context's other state is untouched. Names are like
	// an exec's env; the values are neither logged nor audited.
	Env map[string]string `json:"env,omitempty"`
}

// CodeEvent is one line of the application/x-ndjson answer of POST …/code.
// Which fields are set depends on Type:
//   - stdout, stderr: Text (a piece of the stream, in order).
//   - result: IsMainResult (true for the value of the cell's last
//     expression, false for display() outputs and figures) and one field per
//     representation: Text (text/plain), HTML, Markdown, SVG, PNG and JPEG
//     (base64), LaTeX, JSON, JavaScript, Chart for a matplotlib figure and
//     Data for a pandas DataFrame.
//   - error: Name, Value, Traceback (ANSI colour codes stripped).
//   - end: ExecutionCount; always the last event.
type CodeEvent struct {
	Type string `json:"type"`
	Text string `json:"text,omitempty"`

	IsMainResult bool            `json:"is_main_result,omitempty"`
	HTML         string          `json:"html,omitempty"`
	Markdown     string          `json:"markdown,omitempty"`
	SVG          string          `json:"svg,omitempty"`
	PNG          string          `json:"png,omitempty"`
	JPEG         string          `json:"jpeg,omitempty"`
	LaTeX        string          `json:"latex,omitempty"`
	JSON         json.RawMessage `json:"json,omitempty"`
	JavaScript   string          `json:"javascript,omitempty"`
	// Chart is a matplotlib figure's data in the shape of E2B's charts:
	// an object with type (line, scatter, bar, pie, superchart or
	// unknown), title and elements, and for line and scatter the axes'
	// labels, units, scales and ticks. It comes with the figure's PNG.
	Chart json.RawMessage `json:"chart,omitempty"`
	// Data is a pandas DataFrame's columns: an object of column name →
	// list of values (E2B's Result.data). It comes with the frame's HTML.
	Data json.RawMessage `json:"data,omitempty"`

	Name      string `json:"name,omitempty"`
	Value     string `json:"value,omitempty"`
	Traceback string `json:"traceback,omitempty"`

	ExecutionCount int `json:"execution_count,omitempty"`
}

// CodeContextRequest is the body of POST /v1/sandboxes/{id}/contexts.
type CodeContextRequest struct {
	// Language is python (default), javascript or bash.
	Language string `json:"language,omitempty"`
	// Cwd is the context's working directory (absolute; default the
	// sandbox user's home).
	Cwd string `json:"cwd,omitempty"`
}

// Context states (CodeContext.State).
const (
	// CodeContextIdle: no kernel runs yet or it waits for a cell.
	CodeContextIdle = "idle"
	// CodeContextBusy: a cell runs.
	CodeContextBusy = "busy"
	// CodeContextDead: the kernel died; the next cell starts a new one.
	CodeContextDead = "dead"
)

// CodeContext is a stateful interpreter context of a sandbox.
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	// Cwd is the working directory the context started in ("" for the
	// sandbox user's home).
	Cwd string `json:"cwd"`
	// Default is set on the sandbox's default context of its language.
	Default bool   `json:"default,omitempty"`
	State   string `json:"state"`
	// ExecutionCount is the number of cells run since the kernel started.
	ExecutionCount int       `json:"execution_count"`
	CreatedAt      time.Time `json:"created_at"`
}

// CodeContextList is the body of GET /v1/sandboxes/{id}/contexts.
type CodeContextList struct {
	Contexts []CodeContext `json:"contexts"`
}

// CodeAuditDetail is the Detail of a code event: the cell, never its output.
// Code has the sandbox's secret values masked and is cut at 4 KiB.
type CodeAuditDetail struct {
	ContextID string `json:"context_id"`
	Language  string `json:"language"`
	Code      string `json:"code"`
	// CodeBytes is the length of the whole cell.
	CodeBytes int `json:"code_bytes"`
	// EnvNames are the names of the cell's env variables, sorted; their
	// values are not recorded.
	EnvNames []string `json:"env_names,omitempty"`
	// Status is ok, error, timeout or kernel_died.
	Status     string `json:"status"`
	DurationMS int64  `json:"duration_ms"`
}

// MarshalJSON writes is_main_result on every result event, also when false.
func (e CodeEvent) MarshalJSON() ([]byte, error) {
	type plain CodeEvent
	if e.Type != CodeEventResult {
		return json.Marshal(plain(e))
	}
	return json.Marshal(struct {
		plain
		IsMainResult bool `json:"is_main_result"`
	}{plain(e), e.IsMainResult})
}
