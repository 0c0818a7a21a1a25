// Package servicetest provides fakes for the services' and planes' tests: the fake driver (internal/driver/fake), a fixed template catalogue, and Env: the whole service graph over them.
package servicetest

import (
	"fmt"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/fake"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// Driver is the fake driver: see internal/driver/fake.
type Driver = fake.Driver

// New returns a fake driver named name whose sandboxes live under dir
// (fake.New).
func New(name, dir string) *Driver { return fake.New(name, dir) }

// Templates is a fixed template catalogue.
type Templates map[string][]driver.Template

// Get implements templates.Catalog.
func (t Templates) Get(name string, version int) (driver.Template, error) {
	vs := t[name]
	if len(vs) == 0 {
		return driver.Template{}, fmt.Errorf("%w: template %q", errdefs.ErrNotFound, name)
	}
	if version == 0 {
		return vs[len(vs)-1], nil
	}
	for _, v := range vs {
		if v.Version == version {
			return v, nil
		}
	}
	return driver.Template{}, fmt.Errorf("%w: template %s@%d", errdefs.ErrNotFound, name, version)
}
