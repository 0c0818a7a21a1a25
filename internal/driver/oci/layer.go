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

// WritableLayer returns the writable layer of stopped or paused sandbox id: the
// overlay's upper directory of its storage, with the uid shift of its user
// namespace (driver.LayerCapturer).
func (c *Core) WritableLayer(ctx context.Context, id string) (driver.WritableLayer, error) {
	st, err := c.LoadState(id)
	if err != nil {
		return driver.WritableLayer{}, fmt.Errorf("sandbox %s writable layer: %w", id, err)
	}
	// Stopped, or paused (frozen: nothing writes; the contract allows
	// it). A paused sandbox's writes are in its upper directory already:
	// runc's processes write the host's file system, runsc's gofer too
	// (--overlay2=none) once the caller synced.
	cs, err := c.cli.State(ctx, id)
	switch {
	case errdefs.IsNotFound(err):
		// Never started, or its record is gone: nothing runs.
	case err != nil:
		return driver.WritableLayer{}, fmt.Errorf("sandbox %s writable layer: %w", id, err)
	case cs.Status == "paused":
	case cs.Status != "stopped":
		return driver.WritableLayer{}, errdefs.Wrap(errdefs.ErrInvalidState, "sandbox %s is %s: stop or pause it before its layer is read", id, cs.Status)
	default:
		if p := c.Init(id); p != nil {
			select {
			case <-p.Done():
			default:
				return driver.WritableLayer{}, errdefs.Wrap(errdefs.ErrInvalidState, "sandbox %s runs: stop it before its layer is read", id)
			}
		}
	}
	dir, err := storage.UpperDir(st.Dir)
	if err != nil {
		return driver.WritableLayer{}, fmt.Errorf("sandbox %s writable layer: %w", id, err)
	}
	return driver.WritableLayer{Dir: dir, UIDBase: st.UIDBase, IDCount: st.IDCount, RuntimeNames: slices.Clone(runtimeNames)}, nil
}
