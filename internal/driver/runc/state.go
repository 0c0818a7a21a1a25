package runc

import (
	"os/exec"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/oci"
)

// State is what the driver keeps of a sandbox across daemon restarts: the
// core's state, as is (runc adds nothing to it). The handle the manager
// persists carries a copy; runc's own record of the container is in
// <data dir>/runc/<id>.
type State = oci.State

// EditBundle leaves the core's bundle as it is: it is runc's.
func (d *Driver) EditBundle(*specs.Spec, driver.Spec, string) error { return nil }

// RunArgs are none: runc runs every sandbox the same way.
func (d *Driver) RunArgs(*State) ([]string, error) { return nil, nil }

// Launch runs `runc run --detach` from the daemon's own namespaces: runc
// joins the bundle's.
func (d *Driver) Launch(cmd *exec.Cmd, _ *State) error { return cmd.Run() }

// Control runs runc's other subcommands as they are: runc finds its
// containers by its state directory.
func (d *Driver) Control(cmd *exec.Cmd, _ string) error { return cmd.Run() }
