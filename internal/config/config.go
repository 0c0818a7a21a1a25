// Package config holds the settings of `airlock serve` and loads them from defaults, a JSON file and AIRLOCK_* variables.
//
// Precedence, highest first: command-line flag > environment variable >
// config file > built-in default. The daemon applies the flags last, so Load
// covers the three lower layers.
package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/hostslot"
)

// Resources are sandbox limits (the api.Resources shape, kept here so config
// has no dependency on the HTTP types).
type Resources struct {
	CPU      float64 `json:"cpu,omitempty"`
	MemoryMB int64   `json:"memory_mb,omitempty"`
	DiskMB   int64   `json:"disk_mb,omitempty"`
	PIDs     int64   `json:"pids,omitempty"`
}

// Config is every setting of the daemon. The zero value is not usable: start
// from Default.
type Config struct {
	// Listen is the HTTP listen address. Only loopback by default: the API
	// runs arbitrary code, so exposing it is an explicit decision.
	Listen string `json:"listen"`
	// DataDir holds the store, templates and sandboxes.
	DataDir string `json:"data_dir"`
	// AgentPath is the host path of the static airlock-agent binary; empty
	// means look next to the running executable, then on $PATH.
	AgentPath string `json:"agent_path,omitempty"`
	// NoPrepare skips building the base template at start.
	NoPrepare bool `json:"no_prepare,omitempty"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `json:"log_level"`

	// DefaultRuntime is used when a create request names none.
	DefaultRuntime string `json:"default_runtime"`
	// DefaultTemplate is used when a create request names none.
	DefaultTemplate string `json:"default_template"`
	// DefaultTimeoutS and MaxTimeoutS bound a sandbox's time to live.
	DefaultTimeoutS int64 `json:"default_timeout_s"`
	MaxTimeoutS     int64 `json:"max_timeout_s"`
	// MaxSandboxes is the host capacity (live sandboxes of every tenant).
	MaxSandboxes int `json:"max_sandboxes"`
	// MaxSandboxesPerTenant is each tenant's quota of live sandboxes.
	MaxSandboxesPerTenant int `json:"max_sandboxes_per_tenant"`
	// TenantQuota is every tenant's default quota on the resources of its
	// live sandboxes and its exec rate (its sandbox count is
	// MaxSandboxesPerTenant); an admin overrides it per tenant with PUT
	// /v1/tenants/{tenant}/quotas.
	TenantQuota TenantQuota `json:"tenant_quota"`
	// KeyRateLimitRPS is each API key's default request rate (a token
	// bucket of KeyRateLimitBurst requests refilled at this rate per
	// second); 0 means no limit. A key may carry its own.
	KeyRateLimitRPS   float64 `json:"key_rate_limit_rps"`
	KeyRateLimitBurst int     `json:"key_rate_limit_burst"`
	// DefaultResources fill zero fields of a request; MaxResources bound it.
	DefaultResources Resources `json:"default_resources"`
	MaxResources     Resources `json:"max_resources"`

	// MaxUploadBytes bounds one file upload (PUT …/files).
	MaxUploadBytes int64 `json:"max_upload_bytes"`
	// MaxExecTimeoutS bounds an exec's timeout_s.
	MaxExecTimeoutS int64 `json:"max_exec_timeout_s"`
	// MaxExecOutputBytes bounds an exec's max_output_bytes.
	MaxExecOutputBytes int64 `json:"max_exec_output_bytes"`
	// MaxEnvBytes and MaxMetadataBytes bound the total size of a create
	// request's env+secrets and metadata.
	MaxEnvBytes      int `json:"max_env_bytes"`
	MaxMetadataBytes int `json:"max_metadata_bytes"`

	// RecordRetentionS is how long records of stopped sandboxes and ended
	// execs are kept.
	RecordRetentionS int64 `json:"record_retention_s"`
	// PausedKeepMaxS is how long a pause that keeps memory may hold the
	// host's RAM: then it moves to disk where the runtime checkpoints
	// memory (gVisor); 0 never moves one.
	PausedKeepMaxS int64 `json:"paused_keep_max_s"`
	// PausedRetentionS is how long a sandbox is kept paused at all: then it
	// is deleted (stop_reason expired); 0 keeps paused sandboxes until
	// they are resumed or deleted.
	PausedRetentionS int64 `json:"paused_retention_s"`
	// ShutdownTimeoutS bounds how long a graceful shutdown waits for
	// in-flight requests.
	ShutdownTimeoutS int64 `json:"shutdown_timeout_s"`

	// SampleIntervalS is how often every live sandbox's resource use is
	// sampled: the per-sandbox time series and usage metering both advance
	// by one sample, so it is also the most a daemon crash can lose.
	SampleIntervalS int64 `json:"sample_interval_s"`
	// Prices turn metered usage into cost; all zero means no cost.
	Prices Prices `json:"prices"`

	// OTLPEndpoint is the OTLP/HTTP collector that receives traces, e.g.
	// http://127.0.0.1:4318; empty disables tracing.
	OTLPEndpoint string `json:"otlp_endpoint,omitempty"`

	// GVisorPlatform is runsc's --platform for the gvisor runtime: ptrace
	// (works everywhere), systrap or kvm where the host supports them.
	GVisorPlatform string `json:"gvisor_platform"`

	// PreviewListen is the listen address of preview URLs (a sandbox's
	// port served through airlock), an origin apart from the API; empty
	// disables previews.
	PreviewListen string `json:"preview_listen,omitempty"`
	// PreviewDomain is the host name under which previews are addressed as
	// <port>-<sandbox id>.<domain>; default "localhost".
	PreviewDomain string `json:"preview_domain,omitempty"`
	// PackageCacheMB bounds the pull-through package cache under
	// <data_dir>/pkgcache; 0 disables the cache.
	PackageCacheMB int64 `json:"package_cache_mb"`
	// MaxDownloadMB is each sandbox's cap on bytes fetched from package
	// registries and allowed hosts; 0 means no cap.
	MaxDownloadMB int64 `json:"max_download_mb"`
	// HostSlot pins the daemon to one host slot (internal/hostslot: the
	// nftables table, veth prefix, subnet, cgroup parent and uid ranges it
	// uses); nil picks one: the slot the data dir had last, else slot 0
	// for the default data dir, else the lowest free one.
	HostSlot *int `json:"host_slot,omitempty"`
}

// TenantQuota is a tenant's quota besides its sandbox count. 0 means no
// limit on that dimension.
type TenantQuota struct {
	// CPU bounds the summed vCPUs of the tenant's live sandboxes.
	CPU float64 `json:"cpu"`
	// MemoryMB and DiskMB bound their summed memory and disk limits.
	MemoryMB int64 `json:"memory_mb"`
	DiskMB   int64 `json:"disk_mb"`
	// ExecsPerMinute bounds the execs the tenant starts in any 60 seconds.
	ExecsPerMinute int64 `json:"execs_per_minute"`
}

// MaxExecsPerMinute bounds an exec rate quota: the manager keeps one time
// stamp per exec of the last minute, so the bound is also its memory.
const MaxExecsPerMinute = 100000

// Prices is the price table of usage metering, in one currency of the
// operator's choosing.
type Prices struct {
	// VCPUSecond is per allocated vCPU-second (cpu limit x running seconds).
	VCPUSecond float64 `json:"vcpu_second,omitempty"`
	// GiBSecond is per GiB-second of memory limit while running.
	GiBSecond float64 `json:"gib_second,omitempty"`
	// DiskGiBHour is per GiB-hour of disk limit while the sandbox exists
	// (running or paused).
	DiskGiBHour float64 `json:"disk_gib_hour,omitempty"`
	// EgressGiB is per GiB sent out of the sandbox.
	EgressGiB float64 `json:"egress_gib,omitempty"`
	// SandboxSecond is per running sandbox-second.
	SandboxSecond float64 `json:"sandbox_second,omitempty"`
}

// Default returns the built-in defaults.
func Default() Config {
	return Config{
		Listen:                "127.0.0.1:7070",
		DataDir:               "/var/lib/airlock",
		LogLevel:              "info",
		DefaultRuntime:        "runc",
		DefaultTemplate:       "base",
		DefaultTimeoutS:       300,
		MaxTimeoutS:           24 * 3600,
		MaxSandboxes:          200,
		MaxSandboxesPerTenant: 50,
		DefaultResources:      Resources{CPU: 1, MemoryMB: 512, DiskMB: 1024, PIDs: 256},
		MaxResources:          Resources{CPU: 4, MemoryMB: 8192, DiskMB: 20480, PIDs: 4096},
		MaxUploadBytes:        1 << 30,
		MaxExecTimeoutS:       24 * 3600,
		MaxExecOutputBytes:    64 << 20,
		MaxEnvBytes:           256 << 10,
		MaxMetadataBytes:      16 << 10,
		RecordRetentionS:      7 * 24 * 3600,
		PausedKeepMaxS:        3600,
		PausedRetentionS:      30 * 24 * 3600,
		ShutdownTimeoutS:      30,
		SampleIntervalS:       5,
		GVisorPlatform:        "ptrace",
		PreviewListen:         "127.0.0.1:7071",
		PreviewDomain:         "localhost",
		PackageCacheMB:        10240,
		MaxDownloadMB:         4096,
		// The default quota lets a tenant fill its sandbox count with
		// default-sized sandboxes (50 × 1 cpu, 512 MiB, 1 GiB) and binds
		// first for large ones; the exec rate stops runaway loops, not
		// agents (an exec takes milliseconds, 100 a second is a flood).
		TenantQuota:       TenantQuota{CPU: 64, MemoryMB: 64 << 10, DiskMB: 256 << 10, ExecsPerMinute: 6000},
		KeyRateLimitRPS:   1000,
		KeyRateLimitBurst: 2000,
	}
}

// Load returns the defaults overlaid with the JSON file at path (if path is
// not empty) and then with AIRLOCK_* variables from lookup (os.LookupEnv in
// production). Unknown fields in the file are an error, so a typo is not
// silently ignored.
func Load(path string, lookup func(string) (string, bool)) (Config, error) {
	c := Default()
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return c, fmt.Errorf("reading config: %w", err)
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			return c, errdefs.Wrap(errdefs.ErrInvalidArgument, "config file %s: %v", path, err)
		}
	}
	if lookup == nil {
		lookup = os.LookupEnv
	}
	if err := c.applyEnv(lookup); err != nil {
		return c, err
	}
	return c, nil
}

// EnvVars lists the variables Load reads, with the field each sets, for
// help text and docs. AIRLOCK_ADMIN_KEY is read by the daemon itself.
var EnvVars = []string{
	"AIRLOCK_LISTEN", "AIRLOCK_DATA_DIR", "AIRLOCK_AGENT_PATH", "AIRLOCK_NO_PREPARE",
	"AIRLOCK_LOG_LEVEL", "AIRLOCK_DEFAULT_RUNTIME", "AIRLOCK_DEFAULT_TEMPLATE",
	"AIRLOCK_DEFAULT_TIMEOUT_S", "AIRLOCK_MAX_TIMEOUT_S", "AIRLOCK_MAX_SANDBOXES",
	"AIRLOCK_MAX_SANDBOXES_PER_TENANT", "AIRLOCK_MAX_UPLOAD_BYTES", "AIRLOCK_MAX_EXEC_TIMEOUT_S",
	"AIRLOCK_MAX_EXEC_OUTPUT_BYTES", "AIRLOCK_RECORD_RETENTION_S", "AIRLOCK_SHUTDOWN_TIMEOUT_S",
	"AIRLOCK_SAMPLE_INTERVAL_S", "AIRLOCK_OTLP_ENDPOINT", "AIRLOCK_GVISOR_PLATFORM",
	"AIRLOCK_PREVIEW_LISTEN", "AIRLOCK_PREVIEW_DOMAIN", "AIRLOCK_PACKAGE_CACHE_MB", "AIRLOCK_MAX_DOWNLOAD_MB",
	"AIRLOCK_TENANT_QUOTA_CPU", "AIRLOCK_TENANT_QUOTA_MEMORY_MB", "AIRLOCK_TENANT_QUOTA_DISK_MB",
	"AIRLOCK_TENANT_QUOTA_EXECS_PER_MINUTE", "AIRLOCK_KEY_RATE_LIMIT_RPS", "AIRLOCK_KEY_RATE_LIMIT_BURST",
	"AIRLOCK_HOST_SLOT",
}

func (c *Config) applyEnv(lookup func(string) (string, bool)) error {
	str := func(name string, dst *string) {
		if v, ok := lookup(name); ok && v != "" {
			*dst = v
		}
	}
	var firstErr error
	fail := func(name, v string, err error) {
		if firstErr == nil {
			firstErr = errdefs.Wrap(errdefs.ErrInvalidArgument, "%s=%q: %v", name, v, err)
		}
	}
	i64 := func(name string, dst *int64) {
		if v, ok := lookup(name); ok && v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				fail(name, v, err)
				return
			}
			*dst = n
		}
	}
	integer := func(name string, dst *int) {
		var n int64 = int64(*dst)
		i64(name, &n)
		*dst = int(n)
	}
	float := func(name string, dst *float64) {
		if v, ok := lookup(name); ok && v != "" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				fail(name, v, err)
				return
			}
			*dst = f
		}
	}
	boolean := func(name string, dst *bool) {
		if v, ok := lookup(name); ok && v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				fail(name, v, err)
				return
			}
			*dst = b
		}
	}
	str("AIRLOCK_LISTEN", &c.Listen)
	str("AIRLOCK_DATA_DIR", &c.DataDir)
	str("AIRLOCK_AGENT_PATH", &c.AgentPath)
	boolean("AIRLOCK_NO_PREPARE", &c.NoPrepare)
	str("AIRLOCK_LOG_LEVEL", &c.LogLevel)
	str("AIRLOCK_DEFAULT_RUNTIME", &c.DefaultRuntime)
	str("AIRLOCK_DEFAULT_TEMPLATE", &c.DefaultTemplate)
	i64("AIRLOCK_DEFAULT_TIMEOUT_S", &c.DefaultTimeoutS)
	i64("AIRLOCK_MAX_TIMEOUT_S", &c.MaxTimeoutS)
	integer("AIRLOCK_MAX_SANDBOXES", &c.MaxSandboxes)
	integer("AIRLOCK_MAX_SANDBOXES_PER_TENANT", &c.MaxSandboxesPerTenant)
	i64("AIRLOCK_MAX_UPLOAD_BYTES", &c.MaxUploadBytes)
	i64("AIRLOCK_MAX_EXEC_TIMEOUT_S", &c.MaxExecTimeoutS)
	i64("AIRLOCK_MAX_EXEC_OUTPUT_BYTES", &c.MaxExecOutputBytes)
	i64("AIRLOCK_RECORD_RETENTION_S", &c.RecordRetentionS)
	i64("AIRLOCK_PAUSED_KEEP_MAX_S", &c.PausedKeepMaxS)
	i64("AIRLOCK_PAUSED_RETENTION_S", &c.PausedRetentionS)
	i64("AIRLOCK_SHUTDOWN_TIMEOUT_S", &c.ShutdownTimeoutS)
	i64("AIRLOCK_SAMPLE_INTERVAL_S", &c.SampleIntervalS)
	str("AIRLOCK_OTLP_ENDPOINT", &c.OTLPEndpoint)
	str("AIRLOCK_GVISOR_PLATFORM", &c.GVisorPlatform)
	if v, ok := lookup("AIRLOCK_PREVIEW_LISTEN"); ok {
		c.PreviewListen = v // empty disables previews
	}
	str("AIRLOCK_PREVIEW_DOMAIN", &c.PreviewDomain)
	i64("AIRLOCK_PACKAGE_CACHE_MB", &c.PackageCacheMB)
	i64("AIRLOCK_MAX_DOWNLOAD_MB", &c.MaxDownloadMB)
	float("AIRLOCK_TENANT_QUOTA_CPU", &c.TenantQuota.CPU)
	i64("AIRLOCK_TENANT_QUOTA_MEMORY_MB", &c.TenantQuota.MemoryMB)
	i64("AIRLOCK_TENANT_QUOTA_DISK_MB", &c.TenantQuota.DiskMB)
	i64("AIRLOCK_TENANT_QUOTA_EXECS_PER_MINUTE", &c.TenantQuota.ExecsPerMinute)
	float("AIRLOCK_KEY_RATE_LIMIT_RPS", &c.KeyRateLimitRPS)
	integer("AIRLOCK_KEY_RATE_LIMIT_BURST", &c.KeyRateLimitBurst)
	if v, ok := lookup("AIRLOCK_HOST_SLOT"); ok && v != "" {
		if n, err := strconv.Atoi(v); err != nil {
			fail("AIRLOCK_HOST_SLOT", v, err)
		} else {
			c.HostSlot = &n
		}
	}
	return firstErr
}

// Validate checks that the settings are usable together.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "config: "+format, args...)
	}
	switch {
	case c.Listen == "":
		return bad("listen is empty")
	case c.DataDir == "" || !strings.HasPrefix(c.DataDir, "/"):
		// A relative data dir would move with the working directory, and
		// sandboxes' mounts would be lost on the next start.
		return bad("data_dir must be an absolute path")
	case c.DefaultTimeoutS <= 0 || c.MaxTimeoutS < c.DefaultTimeoutS:
		return bad("need 0 < default_timeout_s <= max_timeout_s")
	case c.MaxSandboxes <= 0 || c.MaxSandboxesPerTenant <= 0:
		return bad("max_sandboxes and max_sandboxes_per_tenant must be positive")
	case c.MaxSandboxes > hostslot.UIDRanges:
		// Each runtime of a daemon has that many host uid ranges: the
		// ranges of every daemon on the host are disjoint.
		return bad("max_sandboxes is at most %d (the host uid ranges of one daemon)", hostslot.UIDRanges)
	case c.HostSlot != nil && (*c.HostSlot < 0 || *c.HostSlot >= hostslot.Count):
		return bad("host_slot must be between 0 and %d", hostslot.Count-1)
	case c.MaxUploadBytes <= 0 || c.MaxExecTimeoutS <= 0 || c.MaxExecOutputBytes <= 0:
		return bad("max_upload_bytes, max_exec_timeout_s and max_exec_output_bytes must be positive")
	case c.MaxEnvBytes <= 0 || c.MaxMetadataBytes <= 0:
		return bad("max_env_bytes and max_metadata_bytes must be positive")
	case c.SampleIntervalS <= 0:
		return bad("sample_interval_s must be positive")
	case c.PausedKeepMaxS < 0 || c.PausedRetentionS < 0:
		return bad("paused_keep_max_s and paused_retention_s must not be negative (0: no bound)")
	case c.PackageCacheMB < 0 || c.MaxDownloadMB < 0:
		return bad("package_cache_mb and max_download_mb must not be negative")
	}
	if q := c.TenantQuota; q.CPU < 0 || q.MemoryMB < 0 || q.DiskMB < 0 || q.ExecsPerMinute < 0 || q.ExecsPerMinute > MaxExecsPerMinute {
		return bad("tenant_quota values must be between 0 (no limit) and their maximum (execs_per_minute %d)", MaxExecsPerMinute)
	}
	if c.KeyRateLimitRPS < 0 || c.KeyRateLimitBurst < 0 || (c.KeyRateLimitRPS > 0 && c.KeyRateLimitBurst < 1) {
		return bad("key_rate_limit_rps must not be negative and key_rate_limit_burst must be at least 1 when it is set")
	}
	switch c.GVisorPlatform {
	case "ptrace", "systrap", "kvm":
	default:
		return bad("gvisor_platform %q is not ptrace, systrap or kvm", c.GVisorPlatform)
	}
	if p := c.Prices; p.VCPUSecond < 0 || p.GiBSecond < 0 || p.DiskGiBHour < 0 || p.EgressGiB < 0 || p.SandboxSecond < 0 {
		return bad("prices must not be negative")
	}
	d, m := c.DefaultResources, c.MaxResources
	if d.CPU <= 0 || d.MemoryMB <= 0 || d.DiskMB <= 0 || d.PIDs <= 0 {
		return bad("default_resources must all be positive")
	}
	if d.CPU > m.CPU || d.MemoryMB > m.MemoryMB || d.DiskMB > m.DiskMB || d.PIDs > m.PIDs {
		return bad("default_resources exceed max_resources")
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		return bad("log_level %q is not debug, info, warn or error", c.LogLevel)
	}
	return nil
}

// RecordRetention is RecordRetentionS as a duration.
func (c Config) RecordRetention() time.Duration {
	return time.Duration(c.RecordRetentionS) * time.Second
}

// SampleInterval is SampleIntervalS as a duration.
func (c Config) SampleInterval() time.Duration {
	return time.Duration(c.SampleIntervalS) * time.Second
}
