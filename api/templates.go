package api

import "time"

// Template build statuses.
const (
	BuildBuilding = "building"
	BuildReady    = "ready"
	BuildFailed   = "failed"
)

// Template statuses as listed: a shipped template that was never built is
// listed with version 0 and status not_built (POST /v1/templates with its
// name, or a sandbox asking for it, builds it).
const (
	TemplateReady    = "ready"
	TemplateNotBuilt = "not_built"
)

// TemplateBuildRequest is the body of POST /v1/templates (or its `spec`
// part when the request is multipart/form-data, with the build context in
// a `context` part and an OCI image tarball in an `image` part).
//
// Dockerfile is the build spec, a Dockerfile subset (FROM, RUN, COPY, ENV,
// WORKDIR, USER). It may be empty to build a shipped template by name, or to
// import an uploaded image as it is.
type TemplateBuildRequest struct {
	Name       string `json:"name"`
	Dockerfile string `json:"dockerfile"`
	// ContextTarB64 is the build context (the sources of COPY) as a base64
	// tar; large contexts go as a multipart `context` part instead.
	ContextTarB64 *string `json:"context_tar_b64,omitempty"`
	// StartCmd is a shell command started in every sandbox of the template
	// before it is reported ready (a dev server, a kernel).
	StartCmd *string `json:"start_cmd,omitempty"`
	// ReadyCmd is a shell command retried until it exits 0; the sandbox is
	// reported ready only then.
	ReadyCmd *string `json:"ready_cmd,omitempty"`
}

// TemplateBuildStarted is the 202 answer of POST /v1/templates.
type TemplateBuildStarted struct {
	BuildID string `json:"build_id"`
	Name    string `json:"name"`
	Version int    `json:"version"`
}

// TemplateBuild is the body of GET /v1/templates/builds/{id}. With Accept
// text/event-stream the same endpoint streams `log` events ({"data",
// "offset"}) and ends with one `end` event carrying this object.
type TemplateBuild struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Version int    `json:"version"`
	// Status is building, ready or failed.
	Status string `json:"status"`
	// Error says why a failed build failed: the step, the instruction and
	// what went wrong.
	Error string `json:"error,omitempty"`
	// Log is the build's progress and the output of its steps (the tail
	// when it grew past the retained size).
	Log       string     `json:"log"`
	CreatedAt time.Time  `json:"created_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
}

// TemplateLogEvent is one `log` event of a build's event stream.
type TemplateLogEvent struct {
	Data   string `json:"data"`
	Offset int64  `json:"offset"`
}

// Template is one version of a template.
type Template struct {
	ID      string `json:"id,omitempty"`
	Name    string `json:"name"`
	Version int    `json:"version"`
	// Tenant owns the template; empty for the shipped ones.
	Tenant string `json:"tenant,omitempty"`
	// Status is ready, or not_built for a shipped template never built.
	Status string `json:"status"`
	// Source is spec (built from a Dockerfile subset), image (an imported
	// OCI image) or shipped (built by airlock from Debian's packages).
	Source    string    `json:"source"`
	Shipped   bool      `json:"shipped,omitempty"`
	CreatedAt time.Time `json:"created_at,omitzero"`
	// From is what the spec's FROM named (debian:bookworm, python@2, image).
	From      string            `json:"from,omitempty"`
	Layers    int               `json:"layers"`
	SizeBytes int64             `json:"size_bytes"`
	Env       map[string]string `json:"env,omitempty"`
	Workdir   string            `json:"workdir,omitempty"`
	User      string            `json:"user,omitempty"`
	StartCmd  string            `json:"start_cmd,omitempty"`
	ReadyCmd  string            `json:"ready_cmd,omitempty"`
	BuildID   string            `json:"build_id,omitempty"`
	// Versions lists the template's versions that can be used, newest first.
	Versions []int `json:"versions,omitempty"`
}

// TemplateList is the body of GET /v1/templates: the newest version of
// every template the caller can use, by name.
type TemplateList struct {
	Templates []Template `json:"templates"`
}
