package sandbox

import (
	"github.com/airlockhq/airlock/internal/agentproto"
)

// This file holds the manager's own names for what the planes see of
// execs, watches and files: the agent's wire types (agentproto,
// agentclient) and the store's records stay below the manager. Where a
// value is the agent's, the constant is defined by it, so the two cannot
// drift apart.

// Types of Event.
const (
	EventOutput = agentproto.EventOutput
	EventExit   = agentproto.EventExit
)

// Output streams of an output Event.
const (
	StreamStdout = agentproto.StreamStdout
	StreamStderr = agentproto.StreamStderr
	// StreamPTY is a terminal's output: stdout and stderr merged.
	StreamPTY = agentproto.StreamPTY
)

// DefaultUser runs the execs and file operations of a request that names
// no user, in a sandbox whose template sets no USER.
const DefaultUser = agentproto.DefaultUser

// ExecIDEnv is the environment variable every exec gets (its exec id): a
// request may not set it.
const ExecIDEnv = agentproto.ExecIDEnv

// PTYSize is a terminal size in character cells.
type PTYSize struct {
	Cols, Rows uint16
}
