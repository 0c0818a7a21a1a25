package runc

import (
	"encoding/json"
	"fmt"

	"github.com/airlockhq/airlock/internal/driver"
)

// handle returns the driver.Handle the caller persists for this sandbox,
// named after the driver that made it.
func (s *sandboxState) handle(driverName string) (*driver.Handle, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encoding handle: %w", err)
	}
	return &driver.Handle{ID: s.ID, Driver: driverName, Version: stateVersion, State: b}, nil
}
