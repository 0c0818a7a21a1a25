package sandbox

// This file holds the manager's side of the package mirror (issue #6):
// it sits among the preview files only because of file ownership while
// they were written; it belongs with network.go and audit.go.

import (
	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/network"
)

// packageEnver is the optional part of a Network that points package
// managers at airlock's mirror (network.Manager.PackageEnv).
type packageEnver interface {
	PackageEnv(p network.Policy) map[string]string
}

// PackageEnv is the environment a sandbox with network n gets so that its
// package managers use the mirror (PIP_INDEX_URL, NPM_CONFIG_REGISTRY,
// GOPROXY…); nil without a mirror or registry sets. The create request's
// and template's own variables win over it.
func (m *Service) PackageEnv(n api.Network) map[string]string {
	pe, ok := m.net.(packageEnver)
	if !ok {
		return nil
	}
	return pe.PackageEnv(toPolicy(n))
}
