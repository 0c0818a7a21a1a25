package api

import "time"

// Warm pools (issue 15). See docs/lifecycle.md.

// PutPoolRequest is the body of PUT /v1/pools/{name}: the pool's desired
// state, created or replaced.
type PutPoolRequest struct {
	// Template is a template name or name@version, as at create.
	Template string `json:"template"`
	// Runtime is as at create (the server's default when empty).
	Runtime string `json:"runtime,omitempty"`
	// Resources of every member (server defaults for zero fields).
	Resources *Resources `json:"resources,omitempty"`
	// Size is how many ready members the pool keeps (0 keeps none: a
	// pool that is drained but still defined).
	Size int `json:"size"`
}

// PoolStatus is a pool's observed state.
type PoolStatus struct {
	// Ready members wait for a claim; Starting ones are being made.
	Ready    int `json:"ready"`
	Starting int `json:"starting"`
	// Claimed counts the live sandboxes claimed from the pool.
	Claimed int `json:"claimed"`
	// Error is why the last refill failed (a missing template, the
	// tenant's quota), absent when it succeeded.
	Error string `json:"error,omitempty"`
}

// Pool is a warm pool: the body of PUT and GET /v1/pools/{name}. A create
// that names it (CreateSandboxRequest.Pool), or that matches its template,
// runtime and resources, claims a ready member and applies the request's
// env, secrets, network, limits and metadata to it before answering.
// Members belong to the pool's tenant, never ran a command before their
// claim and are never reused after it.
type Pool struct {
	// Name is the pool's, unique per tenant: 1 to 64 of [a-z0-9._-].
	Name string `json:"name"`
	// Tenant owns the pool and its members.
	Tenant string `json:"tenant"`
	// Template, Runtime, Resources and Size are the desired state (the
	// last PUT), Runtime and Resources with the server's defaults filled.
	Template  string    `json:"template"`
	Runtime   string    `json:"runtime"`
	Resources Resources `json:"resources"`
	Size      int       `json:"size"`
	// Status is the observed state.
	Status PoolStatus `json:"status"`
	// CreatedAt is the first PUT, UpdatedAt the last.
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// PoolList is the body of GET /v1/pools (by name).
type PoolList struct {
	// Pools are by name (an admin key's: by tenant, then name).
	Pools []Pool `json:"pools"`
}
