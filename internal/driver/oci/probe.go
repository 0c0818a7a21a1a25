package oci

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/cgroups"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/idmap"
)

// ProbeHost checks that this host can run the driver's sandboxes now:
// root, the runtime's binary, the agent, cgroup controllers for the limits,
// user namespaces and idmapped mounts. A driver's Probe adds its runtime's
// own checks.
func (c *Core) ProbeHost(ctx context.Context) driver.Health {
	bin := filepath.Base(c.cli.path)
	if os.Geteuid() != 0 {
		return driver.Health{State: driver.HealthUndetected, Description: "the " + c.cfg.Name + " driver needs root"}
	}
	if _, err := os.Stat(c.cli.path); err != nil {
		return driver.Health{State: driver.HealthUndetected, Description: bin + " not found at " + c.cli.path + " (install the Debian package " + bin + ")"}
	}
	ver, err := c.cli.Version(ctx)
	if err != nil {
		return driver.Health{State: driver.HealthUnhealthy, Description: err.Error()}
	}
	var problems []string
	if c.agentErr != nil {
		problems = append(problems, "no agent binary: "+c.agentErr.Error())
	}
	h, err := cgroups.Load()
	if err != nil {
		problems = append(problems, err.Error())
	} else {
		var missing []string
		for _, c := range []string{"memory", "pids", "cpu"} {
			if !h.Has(c) {
				missing = append(missing, c)
			}
		}
		// cgroup v2 freezes with cgroup.freeze, not a controller.
		if h.Mode() != cgroups.ModeUnified && !h.Has("freezer") {
			missing = append(missing, "freezer")
		}
		if h.Mode() == cgroups.ModeNone {
			problems = append(problems, "no cgroup filesystem mounted")
		} else if len(missing) > 0 {
			problems = append(problems, fmt.Sprintf("cgroup (%s) controllers missing: %s", h.Mode(), strings.Join(missing, ", ")))
		}
	}
	if err := probeIDMap(c.cfg.DataDir, c.cfg.UIDRangeStart, c.cfg.IDCount); err != nil {
		problems = append(problems, "user namespaces with idmapped mounts unusable: "+err.Error())
	}
	if len(problems) > 0 {
		return driver.Health{State: driver.HealthUnhealthy, Description: bin + " " + ver + ": " + strings.Join(problems, "; ")}
	}
	return driver.Health{State: driver.HealthHealthy, Description: bin + " " + ver + ", cgroup " + h.Mode().String()}
}

// probeIDMap makes and removes an idmapped mount of a scratch directory with
// the first sandbox uid range, which also proves user namespaces work.
func probeIDMap(dataDir string, base, count uint32) error {
	src, err := os.MkdirTemp(dataDir, ".probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(src)
	dst := filepath.Join(src, "mnt")
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	if err := idmap.Mount(src, dst, base, count); err != nil {
		return err
	}
	var st unix.Stat_t
	serr := unix.Stat(dst, &st)
	if err := unix.Unmount(dst, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmounting probe: %w", err)
	}
	if serr != nil {
		return serr
	}
	if st.Uid != base {
		return fmt.Errorf("idmapped mount shows owner %d, want %d", st.Uid, base)
	}
	return nil
}
