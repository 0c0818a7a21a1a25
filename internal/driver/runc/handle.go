package runc

import (
	"encoding/json"
	"fmt"

	"github.com/airlockhq/airlock/internal/driver"
)

// handle returns the driver.Handle the caller persists for this sandbox.
func (s *sandboxState) handle() (*driver.Handle, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encoding handle: %w", err)
	}
	return &driver.Handle{ID: s.ID, Driver: Name, Version: stateVersion, State: b}, nil
}
