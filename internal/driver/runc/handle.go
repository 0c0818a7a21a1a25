package runc

import (
	"context"
)

// What runc does with a running sandbox's processes (oci.Runtime): its
// init is the agent itself, and every process of the sandbox lives in the
// sandbox's pid namespace, so killing init ends them all and nothing of
// runc's own outlives it.

// InitRunning lowers the agent's OOM score once runc started it: the
// kernel then kills user code first. A recovered sandbox kept its score.
func (d *Driver) InitRunning(st *State, pid int, recovered bool) {
	if !recovered {
		d.LowerOOMScore(st.ID, pid)
	}
}

// KillAll kills init through its pidfd; the pid namespace takes every
// other process with it (oci.Core.KillInit).
func (d *Driver) KillAll(ctx context.Context, id string, pid int) error {
	return d.KillInit(ctx, id, pid)
}

// ClearStopped has nothing to do: runc leaves no process of its own
// behind a stopped sandbox.
func (d *Driver) ClearStopped(context.Context, string) error { return nil }
