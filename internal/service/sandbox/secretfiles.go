package sandbox

import (
	"context"
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/airlockhq/airlock/internal/lazyregexp"
)

// secretsDir is where secrets given as files live inside a sandbox: a
// memory file system the driver mounts (driver.Spec.SecretsTmpfs).
const secretsDir = "/run/secrets"

// secretFileUser owns the secret files: the sandbox user, whom execs run as
// by default.
const secretFileUser = "user"

// secretFileRE is what a secret's name must be to become a file name: a
// variable name, so no "/", "..", dot files or odd bytes.
var secretFileRE = lazyregexp.New(`^[A-Za-z_][A-Za-z0-9_]*$`)

// envSecrets is what of secrets goes into every exec's environment: none
// when they are given as files.
func envSecrets(sp Spec, secrets map[string]string) map[string]string {
	if sp.SecretsAsFiles {
		return nil
	}
	return secrets
}

// writeSecretFiles writes each secret as /run/secrets/<NAME>, mode 0400,
// through the agent as the sandbox user, who so owns them. It runs before
// the sandbox is reported ready, so nothing of the tenant's has run yet.
func (m *Service) writeSecretFiles(ctx context.Context, sb *Live, secrets map[string]string) error {
	if len(secrets) == 0 {
		return nil
	}
	c, err := sb.agent(ctx)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(secrets))
	for k := range secrets {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		v := secrets[k]
		// The error names the secret, never its value.
		if _, err := c.WriteFile(ctx, path.Join(secretsDir, k), secretFileUser, 0o400, strings.NewReader(v), int64(len(v))); err != nil {
			return fmt.Errorf("writing secret file %s: %w", k, err)
		}
	}
	return nil
}
