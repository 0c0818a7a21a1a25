package api

// TenantNetwork is the body of GET and PUT /v1/tenants/{tenant}/network:
// the policy a tenant's sandboxes get when their create request names no
// network mode. A null or absent Network means the server's default.
type TenantNetwork struct {
	Tenant  string   `json:"tenant"`
	Network *Network `json:"network"`
}
