package api

import (
	"encoding/json"
	"time"
)

// Audit event types (AuditEvent.Type). Stable: add, never rename.
const (
	AuditCreate         = "create"
	AuditExec           = "exec"
	AuditFileWrite      = "file_write"
	AuditPackageInstall = "package_install"
	AuditEgress         = "egress"
	AuditNetworkUpdate  = "network_update"
	AuditPause          = "pause"
	AuditResume         = "resume"
	AuditSnapshot       = "snapshot"
	AuditDelete         = "delete"
	AuditExpiry         = "expiry"
	AuditAuthFailure    = "auth_failure"
	AuditError          = "error"
)

// AuditEvent is one entry of the audit trail (GET /v1/audit). Detail's
// fields depend on Type; secret values of the sandbox are masked in it.
type AuditEvent struct {
	ID        string          `json:"id"`
	Time      time.Time       `json:"time"`
	Type      string          `json:"type"`
	Tenant    string          `json:"tenant,omitempty"`
	SandboxID string          `json:"sandbox_id,omitempty"`
	Template  string          `json:"template,omitempty"`
	RequestID string          `json:"request_id,omitempty"`
	Detail    json.RawMessage `json:"detail"`
}

// AuditList is the body of GET /v1/audit: events oldest first.
// NextCursor is always set: pass it as cursor for the next page, or, once
// HasMore is false, to poll for events written since.
type AuditList struct {
	Events     []AuditEvent `json:"events"`
	NextCursor string       `json:"next_cursor"`
	HasMore    bool         `json:"has_more"`
}

// ExecAuditDetail is the Detail of an exec event.
type ExecAuditDetail struct {
	ExecID     string     `json:"exec_id"`
	Cmd        []string   `json:"cmd,omitempty"`
	Shell      *string    `json:"shell,omitempty"`
	User       string     `json:"user"`
	Cwd        string     `json:"cwd,omitempty"`
	PTY        bool       `json:"pty,omitempty"`
	Status     string     `json:"status"`
	ExitCode   *int       `json:"exit_code"`
	Signal     string     `json:"signal,omitempty"`
	Error      string     `json:"error,omitempty"`
	StartedAt  time.Time  `json:"started_at"`
	EndedAt    *time.Time `json:"ended_at,omitempty"`
	DurationMS int64      `json:"duration_ms"`
	StdoutB    int64      `json:"stdout_bytes"`
	StderrB    int64      `json:"stderr_bytes"`
	Truncated  bool       `json:"truncated,omitempty"`
}

// EgressAuditDetail is the Detail of an egress event: one decision of the
// sandbox's network policy.
type EgressAuditDetail struct {
	// Kind is dns (a query), http or tls (a connection through the egress
	// proxy, named by its Host or SNI) or connect (a direct connection).
	Kind    string `json:"kind"`
	Domain  string `json:"domain,omitempty"`
	IP      string `json:"ip,omitempty"`
	Port    int    `json:"port,omitempty"`
	Proto   string `json:"proto,omitempty"`
	Allowed bool   `json:"allowed"`
	// Reason is allowed, not_allowed, private_address, host_address,
	// resolves_private, offline, no_server_name, network_disabled, …
	Reason string `json:"reason"`
	// BytesIn (received by the sandbox) and BytesOut of a proxied
	// connection, reported when it closed.
	BytesIn  int64 `json:"bytes_in,omitempty"`
	BytesOut int64 `json:"bytes_out,omitempty"`
	// Registry names the package registry set the domain belongs to.
	Registry string `json:"registry,omitempty"`
}

// FileAuditDetail is the Detail of a file_write event.
type FileAuditDetail struct {
	// Op is write, untar, mkdir, move or remove.
	Op        string `json:"op"`
	Path      string `json:"path"`
	To        string `json:"to,omitempty"`
	User      string `json:"user,omitempty"`
	Bytes     int64  `json:"bytes,omitempty"`
	Recursive bool   `json:"recursive,omitempty"`
	OK        bool   `json:"ok"`
	// Code is the API error code of a refused operation.
	Code string `json:"code,omitempty"`
}
