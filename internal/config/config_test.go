package config

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestDefaultsAreValid(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestPrecedenceFileThenEnv(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(path, []byte(`{"listen": "127.0.0.1:1", "max_sandboxes": 7, "default_timeout_s": 60, "default_resources": {"cpu": 0.5, "memory_mb": 256, "disk_mb": 100, "pids": 64}}`), 0o644)
	c, err := Load(path, env(map[string]string{"AIRLOCK_LISTEN": "127.0.0.1:2", "AIRLOCK_NO_PREPARE": "true"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:2" { // env beats file
		t.Errorf("listen = %q", c.Listen)
	}
	if c.MaxSandboxes != 7 || c.DefaultTimeoutS != 60 || c.DefaultResources.CPU != 0.5 { // file beats default
		t.Errorf("file values lost: %+v", c)
	}
	if c.DataDir != "/var/lib/airlock" || c.MaxTimeoutS != 86400 { // defaults stay
		t.Errorf("defaults lost: %+v", c)
	}
	if !c.NoPrepare {
		t.Error("AIRLOCK_NO_PREPARE ignored")
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	typo := filepath.Join(dir, "typo.json")
	os.WriteFile(typo, []byte(`{"max_sandboxs": 3}`), 0o644)
	tests := []struct {
		name string
		path string
		env  map[string]string
	}{
		{"unknown-field", typo, nil},
		{"missing-file", filepath.Join(dir, "nope.json"), nil},
		{"bad-int", "", map[string]string{"AIRLOCK_MAX_SANDBOXES": "lots"}},
		{"bad-bool", "", map[string]string{"AIRLOCK_NO_PREPARE": "maybe"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Load(tt.path, env(tt.env)); err == nil {
				t.Fatal("no error")
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
	}{
		{"relative-data-dir", func(c *Config) { c.DataDir = "data" }},
		{"default-timeout-over-max", func(c *Config) { c.DefaultTimeoutS = c.MaxTimeoutS + 1 }},
		{"zero-capacity", func(c *Config) { c.MaxSandboxes = 0 }},
		{"defaults-over-max", func(c *Config) { c.DefaultResources.MemoryMB = c.MaxResources.MemoryMB + 1 }},
		{"bad-log-level", func(c *Config) { c.LogLevel = "loud" }},
		{"zero-upload", func(c *Config) { c.MaxUploadBytes = 0 }},
		{"more-sandboxes-than-uid-ranges", func(c *Config) { c.MaxSandboxes = 1025 }},
		{"host-slot-out-of-range", func(c *Config) { n := 16; c.HostSlot = &n }},
		{"negative-host-slot", func(c *Config) { n := -1; c.HostSlot = &n }},
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
}

func TestOTLPEndpoint(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(path, []byte(`{"otlp_endpoint": "http://127.0.0.1:1"}`), 0o644)
	tests := []struct {
		name string
		path string
		env  map[string]string
		want string
	}{
		{"default-off", "", nil, ""},
		{"file", path, nil, "http://127.0.0.1:1"},
		{"env-beats-file", path, map[string]string{"AIRLOCK_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, "http://127.0.0.1:4318"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(tt.path, env(tt.env))
			if err != nil {
				t.Fatal(err)
			}
			if c.OTLPEndpoint != tt.want {
				t.Fatalf("otlp_endpoint = %q, want %q", c.OTLPEndpoint, tt.want)
			}
		})
	}
}

func TestHostSlot(t *testing.T) {
	c, err := Load("", func(string) (string, bool) { return "", false })
	if err != nil || c.HostSlot != nil {
		t.Fatalf("default host slot %v %v, want none (picked at start)", c.HostSlot, err)
	}
	c, err = Load("", func(k string) (string, bool) { return "3", k == "AIRLOCK_HOST_SLOT" })
	if err != nil || c.HostSlot == nil || *c.HostSlot != 3 || c.Validate() != nil {
		t.Fatalf("AIRLOCK_HOST_SLOT=3: %v %v", c.HostSlot, err)
	}
	if _, err := Load("", func(k string) (string, bool) { return "one", k == "AIRLOCK_HOST_SLOT" }); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("AIRLOCK_HOST_SLOT=one: %v", err)
	}
}
