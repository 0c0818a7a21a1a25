package sandbox

import (
	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/driver"
)

// durabilityOf says what the server keeps of a sandbox of driver d across
// pause, snapshot, fork and reset (DriverInfo.Durability): only what is
// served. A pause that keeps memory where d can pause; filesystem
// snapshots (and so forks and resets to a snapshot) where it can pause
// and hand out its writable layer; memory snapshots and memory forks
// where it checkpoints; reset on every driver (it re-creates the
// driver's sandbox in its namespace).
func durabilityOf(d driver.Driver) *api.Durability {
	c := d.Capabilities()
	_, pz := d.(driver.Pauser)
	_, lc := d.(driver.LayerCapturer)
	_, ck := d.(driver.Checkpointer)
	out := &api.Durability{PauseKeep: c.Pause, PauseDisk: PauseDiskKeeps(d), Reset: true}
	if c.Pause && pz && c.LayerCapture && lc {
		out.SnapshotFilesystem = true
		out.Fork = api.KeepsFilesystem
		if c.MemorySnapshot && ck {
			out.SnapshotMemory = true
			out.Fork = api.KeepsMemory
		}
	}
	return out
}
