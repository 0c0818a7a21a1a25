// Package runc is the default airlock driver: each sandbox is an OCI bundle run by Debian's runc, on the shared OCI core (internal/driver/oci).
//
// The core does storage, uid ranges, cgroups, the bundle, the agent's socket,
// the lifecycle and recovery; this package says how runc runs it: the
// agent is the sandbox's init and gets the daemon's bound socket as a
// descriptor (oci.InheritedSocket), every process of the sandbox lives in
// its pid namespace, and runc's commands run from the daemon's namespaces.
// Layout under Config.DataDir is the core's, with runc's state in runc/.
package runc

import (
	"context"
	"log/slog"
	"os/exec"
	"strings"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/oci"
)

// Name is the runtime name of this driver.
const Name = "runc"

var (
	_ driver.Driver        = (*Driver)(nil)
	_ driver.Pauser        = (*Driver)(nil)
	_ driver.Stater        = (*Driver)(nil)
	_ driver.OOMCounter    = (*Driver)(nil)
	_ driver.LayerCapturer = (*Driver)(nil)
	_ driver.Lister        = (*Driver)(nil)
	_ oci.Runtime          = (*Driver)(nil)
)

// Config configures the runc driver. Zero fields take the documented defaults.
type Config struct {
	// DataDir holds sandboxes and runc state. Required.
	DataDir string
	// AgentPath is the host path of the static airlock-agent binary.
	AgentPath string
	// RuncPath is the runc binary; default "runc" on PATH, else /usr/sbin/runc.
	RuncPath string
	// CgroupParent, UIDRangeStart, IDCount and MaxSandboxes place the
	// sandboxes' cgroups and uid ranges, and HostPIDs, FileMax and
	// DiskReserveMB are the host-wide limits: oci.Config's, with its
	// defaults.
	CgroupParent  string
	UIDRangeStart uint32
	IDCount       uint32
	MaxSandboxes  int
	HostPIDs      int64
	FileMax       int64
	DiskReserveMB int64
	// Logger receives the driver's logs; default slog.Default().
	Logger *slog.Logger
}

// Driver runs sandboxes with runc. Create one per data dir with New.
type Driver struct {
	*oci.Core
}

// New returns a driver rooted at cfg.DataDir, creating its directories.
func New(cfg Config) (*Driver, error) {
	if cfg.RuncPath == "" {
		cfg.RuncPath = "runc"
	}
	if !strings.Contains(cfg.RuncPath, "/") {
		if p, err := exec.LookPath(cfg.RuncPath); err == nil {
			cfg.RuncPath = p
		} else {
			cfg.RuncPath = "/usr/sbin/runc"
		}
	}
	d := &Driver{}
	core, err := oci.New(oci.Config{
		Name: Name, DataDir: cfg.DataDir, AgentPath: cfg.AgentPath, Binary: cfg.RuncPath, StateDir: "runc",
		Socket:       oci.InheritedSocket{},
		CgroupParent: cfg.CgroupParent, UIDRangeStart: cfg.UIDRangeStart, IDCount: cfg.IDCount, MaxSandboxes: cfg.MaxSandboxes,
		HostPIDs: cfg.HostPIDs, FileMax: cfg.FileMax, DiskReserveMB: cfg.DiskReserveMB, Logger: cfg.Logger,
		ResetInPlace: true, FreezeCgroup: true,
	}, d)
	if err != nil {
		return nil, err
	}
	d.Core = core
	return d, nil
}

// Name is "runc".
func (d *Driver) Name() string { return Name }

// Capabilities of runc: container isolation, freezer pause, a disk quota
// through the loop-mounted writable layer, layer capture for template
// builds; no memory snapshots (no CRIU).
func (d *Driver) Capabilities() driver.Capabilities {
	return driver.Capabilities{
		Isolation:    driver.IsolationContainer,
		Pause:        true,
		DiskQuota:    true,
		NetworkModes: []driver.NetworkMode{driver.NetworkNone, driver.NetworkAllowlist, driver.NetworkOpen},
		LayerCapture: true,
	}
}

// Probe checks what the core needs of the host (root, runc, cgroups,
// idmapped mounts, the agent).
func (d *Driver) Probe(ctx context.Context) driver.Health { return d.ProbeHost(ctx) }
