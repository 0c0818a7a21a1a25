package sandbox

import (
	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/driver"
)

// durabilityOf says what the server keeps of a sandbox of driver d across
// pause, snapshot, fork and reset (DriverInfo.Durability): only what is
// served. Today that is a pause that keeps memory, where d can pause.
func durabilityOf(d driver.Driver) *api.Durability {
	return &api.Durability{PauseKeep: d.Capabilities().Pause}
}
