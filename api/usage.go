package api

import "time"

// MetricsSample is one point of a sandbox's metrics time series.
type MetricsSample struct {
	Time        time.Time `json:"t"`
	CPUSeconds  float64   `json:"cpu_seconds"`
	MemoryBytes uint64    `json:"memory_bytes"`
	PIDs        uint64    `json:"pids"`
	DiskBytes   uint64    `json:"disk_bytes"`
	NetRxBytes  uint64    `json:"net_rx_bytes"`
	NetTxBytes  uint64    `json:"net_tx_bytes"`
}

// SandboxMetrics is the body of GET /v1/sandboxes/{id}/metrics: the
// current values and the samples taken while the sandbox lived (oldest
// first; bounded, so the oldest fall off a long-lived sandbox's series).
type SandboxMetrics struct {
	Metrics
	SampleIntervalS float64         `json:"sample_interval_s"`
	Series          []MetricsSample `json:"series"`
}

// Usage group_by values.
const (
	UsageBySandbox  = "sandbox"
	UsageByTemplate = "template"
	UsageByDay      = "day"
)

// UsageAmounts are metered usage and its cost under the daemon's prices.
type UsageAmounts struct {
	// RunningS and PausedS are sandbox-seconds in each state.
	RunningS float64 `json:"running_s"`
	PausedS  float64 `json:"paused_s"`
	// PausedDiskS is the part of PausedS paused to disk (the sandbox's RAM
	// released: no memory is held for it).
	PausedDiskS float64 `json:"paused_disk_s,omitempty"`
	// VCPUAllocatedS is cpu limit x running seconds; VCPUUsedS the cpu
	// time the sandbox's processes actually used.
	VCPUAllocatedS float64 `json:"vcpu_allocated_s"`
	VCPUUsedS      float64 `json:"vcpu_used_s"`
	// MemoryGiBS is memory limit (GiB) x running seconds.
	MemoryGiBS float64 `json:"memory_gib_s"`
	// DiskGiBHours is disk limit (GiB) x hours the sandbox existed.
	DiskGiBHours float64 `json:"disk_gib_hours"`
	// EgressBytes were sent out of the sandbox.
	EgressBytes float64 `json:"egress_bytes"`
	// Cost is the amounts priced by the daemon's price table.
	Cost float64 `json:"cost"`
}

// UsageGroup is the usage of one group (a sandbox, template or UTC day).
type UsageGroup struct {
	Key    string `json:"key"`
	Tenant string `json:"tenant"`
	UsageAmounts
}

// UsageReport is the body of GET /v1/usage.
type UsageReport struct {
	From    *time.Time   `json:"from,omitempty"`
	To      *time.Time   `json:"to,omitempty"`
	GroupBy string       `json:"group_by"`
	Groups  []UsageGroup `json:"groups"`
	Total   UsageAmounts `json:"total"`
}
