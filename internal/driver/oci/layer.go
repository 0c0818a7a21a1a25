package oci

import (
	"context"
	"fmt"
	"slices"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/storage"
)

// runtimeNames are the top-level names of a writable layer that the
// runtime makes, not the sandbox's processes: mount points runc and runsc
// make when a template lacks them, and the agent's directory.
var runtimeNames = []string{"proc", "sys", "dev", ".airlock"}

// WritableLayer returns the writable layer of sandbox id, stopped or
// paused: the overlay's upper directory of its storage, with the uid shift
// of its user namespace (driver.LayerCapturer). What a paused sandbox's
// processes wrote is in it already: overlayfs writes through to the upper
// directory's file system, mounted on the host (a loop ext4 or a tmpfs),
// whose page cache the host shares (runc's frozen processes, even their
// shared mappings); runsc's Gofer writes to the same files on the
// Sentry's behalf (--overlay2=none: nothing stays in the Sentry's memory
// but its own /tmp, which is no part of the layer).
func (c *Core) WritableLayer(ctx context.Context, id string) (driver.WritableLayer, error) {
	st, err := c.LoadState(id)
	if err != nil {
		return driver.WritableLayer{}, fmt.Errorf("sandbox %s writable layer: %w", id, err)
	}
	running := false
	if p := c.Init(id); p != nil {
		select {
		case <-p.Done():
		default:
			running = true
		}
	}
	cs, err := c.cli.State(ctx, id)
	switch {
	case errdefs.IsNotFound(err) && !running:
		// Never started, or its record is gone: nothing runs.
	case err != nil && !errdefs.IsNotFound(err):
		return driver.WritableLayer{}, fmt.Errorf("sandbox %s writable layer: %w", id, err)
	case err == nil && cs.Status == "paused":
		// Frozen: nothing changes the layer until Resume.
	case running || cs.Status != "stopped":
		status := "running"
		if err == nil {
			status = cs.Status
		}
		return driver.WritableLayer{}, errdefs.Wrap(errdefs.ErrInvalidState, "sandbox %s is %s: stop or pause it before its layer is read", id, status)
	}
	dir, err := storage.UpperDir(st.Dir)
	if err != nil {
		return driver.WritableLayer{}, fmt.Errorf("sandbox %s writable layer: %w", id, err)
	}
	return driver.WritableLayer{Dir: dir, UIDBase: st.UIDBase, IDCount: st.IDCount, RuntimeNames: slices.Clone(runtimeNames)}, nil
}
