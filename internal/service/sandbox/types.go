package sandbox

import (
	"github.com/airlockhq/airlock/internal/agentproto"
)

// DefaultUser runs the execs and file operations of a request that names
// no user, in a sandbox whose template sets no USER.
const DefaultUser = agentproto.DefaultUser

// ExecIDEnv is the environment variable every exec gets (its exec id): a
// request may not set it.
const ExecIDEnv = agentproto.ExecIDEnv
