package template

import (
	"context"
	"io"
	"slices"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// The shipped templates besides base. Each is a whole Debian rootfs made
// like base by debootstrap from debianSpec, then the packages installed by
// the tree's own apt-get in a chroot (base's own extras are not among them:
// changing them would rebuild every template for what base alone needs): Debian's packages from the host's mirror, their
// dependencies resolved by apt, their maintainer scripts run as
// debootstrap runs the base's. No sandbox network is needed (see
// docs/templates.md for the trade-off).
var shippedRecipes = []recipe{
	{
		name: "python",
		Spec: withPackages(debianSpec, 1,
			"python3-pip", "python3-venv", "python3-numpy", "python3-pandas", "python3-matplotlib", "python3-requests"),
		build: buildDebian,
	},
	{
		name:  "node",
		Spec:  withPackages(debianSpec, 1, "nodejs", "npm"),
		build: buildDebian,
	},
	{
		name: "code-interpreter",
		// Revision 2: nodejs for JavaScript contexts of the code interpreter.
		Spec: withPackages(debianSpec, 2,
			"python3-pip", "python3-venv", "python3-numpy", "python3-pandas", "python3-matplotlib", "python3-requests",
			"python3-ipykernel", "nodejs", "python3-scipy", "python3-sklearn", "python3-seaborn", "python3-sympy",
			"python3-openpyxl", "python3-pil"),
		build: buildDebian,
	},
}

// withPackages returns base's recipe with pkgs installed by apt-get after
// debootstrap, and its own revision.
func withPackages(base recipeSpec, revision int, pkgs ...string) recipeSpec {
	s := base
	s.Include = slices.Clone(base.Include)
	s.Apt = slices.Clone(pkgs)
	s.Revision = revision
	return s
}

// ShippedNames returns the names of the templates airlock ships: base
// first, then the ones built on demand.
func ShippedNames() []string {
	out := []string{debianBase.name}
	for _, r := range shippedRecipes {
		out = append(out, r.name)
	}
	return out
}

// IsShipped reports whether name is a shipped template's name. Tenants'
// own templates cannot take these names.
func IsShipped(name string) bool { return slices.Contains(ShippedNames(), name) }

// ShippedPackages returns the Debian packages a shipped template adds to
// debootstrap's minbase.
func (s *Store) ShippedPackages(name string) []string {
	if name == s.base.name {
		return append(slices.Clone(s.base.Spec.Include), s.base.Spec.Apt...)
	}
	if r, ok := s.shipped[name]; ok {
		return append(slices.Clone(r.Spec.Include), r.Spec.Apt...)
	}
	return nil
}

// EnsureShipped returns shipped template name (base included), building it
// first if no version made by its current recipe exists, with progress
// lines on progress. The result carries the recipe version and hash.
func (s *Store) EnsureShipped(ctx context.Context, name string, progress io.Writer) (driver.Template, Info, error) {
	r, ok := s.shipped[name]
	if name == s.base.name {
		r, ok = s.base, true
	}
	if !ok {
		return driver.Template{}, Info{}, errdefs.Wrap(errdefs.ErrNotFound, "no shipped template %q", name)
	}
	t, err := s.ensure(ctx, r, progress)
	if err != nil {
		return driver.Template{}, Info{}, err
	}
	m, err := readMeta(versionDir(s.dir, t.Name, t.Version))
	if err != nil {
		return driver.Template{}, Info{}, err
	}
	return t, m, nil
}

// Current reports the newest version of shipped template name made by its
// current recipe, if it was built.
func (s *Store) Current(name string) (driver.Template, Info, bool) {
	r, ok := s.shipped[name]
	if name == s.base.name {
		r, ok = s.base, true
	}
	if !ok {
		return driver.Template{}, Info{}, false
	}
	t, ok := s.findBuilt(r.name, r.hash())
	if !ok {
		return driver.Template{}, Info{}, false
	}
	m, err := readMeta(versionDir(s.dir, t.Name, t.Version))
	if err != nil {
		return driver.Template{}, Info{}, false
	}
	return t, m, true
}
