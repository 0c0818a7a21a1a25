package config

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestTenancySettings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(path, []byte(`{"tenant_quota": {"cpu": 8, "memory_mb": 4096, "disk_mb": 10240, "execs_per_minute": 60},
		"key_rate_limit_rps": 5, "key_rate_limit_burst": 10}`), 0o644)
	tests := []struct {
		name  string
		path  string
		env   map[string]string
		want  TenantQuota
		rps   float64
		burst int
	}{
		{"defaults", "", nil, Default().TenantQuota, Default().KeyRateLimitRPS, Default().KeyRateLimitBurst},
		{"file", path, nil, TenantQuota{CPU: 8, MemoryMB: 4096, DiskMB: 10240, ExecsPerMinute: 60}, 5, 10},
		{"env-beats-file", path, map[string]string{
			"AIRLOCK_TENANT_QUOTA_CPU": "2.5", "AIRLOCK_TENANT_QUOTA_MEMORY_MB": "1024", "AIRLOCK_TENANT_QUOTA_DISK_MB": "0",
			"AIRLOCK_TENANT_QUOTA_EXECS_PER_MINUTE": "30", "AIRLOCK_KEY_RATE_LIMIT_RPS": "0.5", "AIRLOCK_KEY_RATE_LIMIT_BURST": "3",
		}, TenantQuota{CPU: 2.5, MemoryMB: 1024, DiskMB: 0, ExecsPerMinute: 30}, 0.5, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(tt.path, env(tt.env))
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			if c.TenantQuota != tt.want || c.KeyRateLimitRPS != tt.rps || c.KeyRateLimitBurst != tt.burst {
				t.Fatalf("got %+v %g/%d, want %+v %g/%d", c.TenantQuota, c.KeyRateLimitRPS, c.KeyRateLimitBurst, tt.want, tt.rps, tt.burst)
			}
		})
	}
}

func TestTenancySettingsInvalid(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
	}{
		{"negative-cpu", func(c *Config) { c.TenantQuota.CPU = -1 }},
		{"negative-memory", func(c *Config) { c.TenantQuota.MemoryMB = -1 }},
		{"exec-rate-over-max", func(c *Config) { c.TenantQuota.ExecsPerMinute = MaxExecsPerMinute + 1 }},
		{"negative-rps", func(c *Config) { c.KeyRateLimitRPS = -1 }},
		{"rps-without-burst", func(c *Config) { c.KeyRateLimitBurst = 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.mod(&c)
			if err := c.Validate(); !errdefs.IsInvalidArgument(err) {
				t.Fatalf("err = %v, want invalid argument", err)
			}
		})
	}
	if _, err := Load("", env(map[string]string{"AIRLOCK_KEY_RATE_LIMIT_RPS": "fast"})); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("unparsable rps: %v", err)
	}
}
