package sandbox

import (
	"context"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// Warm pools (issue 15): PUT /v1/pools/{name} keeps members ready; a
// create that matches a pool claims one (claim). Not served yet.

// checkPoolFields checks a create's pool fields.
func checkPoolFields(req api.CreateSandboxRequest) error {
	if req.Pool != "" {
		return public(errdefs.ErrCapabilityUnsupported, "warm pools are not available on this server yet")
	}
	return nil
}

// claim answers a create from a warm pool member when req matches a pool
// of p's tenant: ok is false when no member was claimed, and the create
// then starts cold.
func (m *Service) claim(ctx context.Context, p auth.Principal, req api.CreateSandboxRequest, idemKey string) (_ CreateResult, ok bool, _ error) {
	return CreateResult{}, false, nil
}
