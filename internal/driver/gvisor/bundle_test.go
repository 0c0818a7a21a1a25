package gvisor

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/airlockhq/airlock/internal/driver"
)

// TestEditBundle: the resolver file is copied into the sandbox dir (the
// Gofer opens bind sources as the sandbox's uid), /sys is gVisor's own, the
// host pids limit leaves room for the ptrace platform's tasks, and the
// agent is told the CPUs of its quota and to keep no idle threads.
func TestEditBundle(t *testing.T) {
	dir := t.TempDir()
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 10.0.0.1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cpu   float64
		procs string
	}{{0.5, "GOMAXPROCS=1"}, {1, "GOMAXPROCS=1"}, {1.5, "GOMAXPROCS=2"}, {4, "GOMAXPROCS=4"}} {
		pids := int64(256)
		s := &specs.Spec{
			Process: &specs.Process{Args: []string{"/.airlock/airlock-agent", "--listen", "unix:/.airlock/run/agent.sock"}, Env: []string{"PATH=/usr/bin:/bin"}},
			Mounts: []specs.Mount{
				{Destination: "/sys", Type: "bind", Source: filepath.Join(dir, "sys")},
				{Destination: "/etc/resolv.conf", Type: "bind", Source: resolv},
			},
			Linux: &specs.Linux{Resources: &specs.LinuxResources{Pids: &specs.LinuxPids{Limit: &pids}}},
		}
		if err := (&Driver{}).EditBundle(s, driver.Spec{ID: "sbx_a", Resources: driver.Resources{CPU: tc.cpu}}, dir); err != nil {
			t.Fatal(err)
		}
		if m := s.Mounts[0]; m.Type != "sysfs" || m.Source != "sysfs" {
			t.Errorf("/sys mount %+v, want gVisor's sysfs", m)
		}
		if m := s.Mounts[1]; m.Source != filepath.Join(dir, resolvConfName) {
			t.Errorf("resolv.conf from %s, want the sandbox dir's copy", m.Source)
		}
		if b, err := os.ReadFile(filepath.Join(dir, resolvConfName)); err != nil || string(b) != "nameserver 10.0.0.1\n" {
			t.Errorf("copy of resolv.conf: %q, %v", b, err)
		}
		if got := *s.Linux.Resources.Pids.Limit; got != hostTasksPerProcess*256+runtimeTasks {
			t.Errorf("host pids limit %d", got)
		}
		if !slices.Equal(s.Process.Env, []string{"PATH=/usr/bin:/bin", tc.procs}) {
			t.Errorf("CPU %v: agent env %v, want %s added", tc.cpu, s.Process.Env, tc.procs)
		}
		if want := []string{"/.airlock/airlock-agent", "--listen", "unix:/.airlock/run/agent.sock", "--spare-threads=0"}; !slices.Equal(s.Process.Args, want) {
			t.Errorf("agent args %v, want %v", s.Process.Args, want)
		}
	}
}
