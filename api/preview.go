package api

// AuditPreview is the audit event type of preview URLs: one made public or
// private, removed, or opened by a client (detail: PreviewAuditDetail).
const AuditPreview = "preview"

// PreviewRequest is the body of POST /v1/sandboxes/{id}/previews: expose
// a TCP port of the sandbox (something listening on its loopback or any
// address) at a preview URL.
type PreviewRequest struct {
	// Port is the sandbox's TCP port, 1-65535.
	Port int `json:"port"`
	// Public opens the URL without the sandbox's preview token.
	Public bool `json:"public,omitempty"`
}

// Preview is one exposed port of a sandbox.
type Preview struct {
	// URL is http://<port>-<sandbox id>.<preview domain>:<preview port>/.
	URL string `json:"url"`
	// Token opens a private preview: as ?token= once (the server sets a
	// cookie for the preview's host and redirects) or as the
	// X-Airlock-Preview-Token header. The same for every port of a sandbox.
	Token string `json:"token"`
	Port  int    `json:"port"`
	// Public is true when no token is needed.
	Public bool `json:"public"`
}

// PreviewList is the body of GET /v1/sandboxes/{id}/previews.
type PreviewList struct {
	Previews []Preview `json:"previews"`
}

// PreviewTokenHeader carries a preview token on a request to a preview URL.
const PreviewTokenHeader = "X-Airlock-Preview-Token"

// PreviewAuditDetail is the detail of a preview audit event.
type PreviewAuditDetail struct {
	// Action is "expose", "unexpose" or "open".
	Action string `json:"action"`
	Port   int    `json:"port"`
	Public bool   `json:"public"`
	// Remote is the client address of an open.
	Remote string `json:"remote,omitempty"`
	// Via is how an open was allowed: "token", "cookie" or "public".
	Via string `json:"via,omitempty"`
}
