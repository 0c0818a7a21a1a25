package api

// Quota is a tenant's limits. In every field 0 means no limit.
type Quota struct {
	// Sandboxes bounds the tenant's live sandboxes (starting, running,
	// paused, stopping).
	Sandboxes int `json:"sandboxes"`
	// CPU, MemoryMB and DiskMB bound the sums of those resources of the
	// tenant's live sandboxes, as given at their create.
	CPU      float64 `json:"cpu"`
	MemoryMB int64   `json:"memory_mb"`
	DiskMB   int64   `json:"disk_mb"`
	// ExecsPerMinute bounds the execs the tenant starts in any 60 seconds.
	ExecsPerMinute int64 `json:"execs_per_minute"`
}

// QuotaOverride is the body of PUT /v1/tenants/{tenant}/quotas: the fields
// given replace the server's defaults for the tenant (0: no limit), the
// ones left out keep them. A PUT replaces the whole override.
type QuotaOverride struct {
	Sandboxes      *int     `json:"sandboxes,omitempty"`
	CPU            *float64 `json:"cpu,omitempty"`
	MemoryMB       *int64   `json:"memory_mb,omitempty"`
	DiskMB         *int64   `json:"disk_mb,omitempty"`
	ExecsPerMinute *int64   `json:"execs_per_minute,omitempty"`
}

// QuotaUsage is what a tenant uses now, against its Quota.
type QuotaUsage struct {
	Sandboxes int     `json:"sandboxes"`
	CPU       float64 `json:"cpu"`
	MemoryMB  int64   `json:"memory_mb"`
	DiskMB    int64   `json:"disk_mb"`
	// ExecsLastMinute is the execs started in the last 60 seconds.
	ExecsLastMinute int64 `json:"execs_last_minute"`
}

// TenantQuotas is the body of GET and PUT /v1/tenants/{tenant}/quotas.
type TenantQuotas struct {
	Tenant string `json:"tenant"`
	// Quota is what applies to the tenant: Default with Override on top.
	Quota Quota `json:"quota"`
	// Default is the server's default quota.
	Default Quota `json:"default"`
	// Override is what an admin set for the tenant, absent if nothing.
	Override *QuotaOverride `json:"override,omitempty"`
	Usage    QuotaUsage     `json:"usage"`
}
