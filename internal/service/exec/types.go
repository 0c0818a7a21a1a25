package exec

import "github.com/airlockhq/airlock/internal/agentproto"

// The exec service's names for what the planes see of execs: the agent's
// wire types stay below the services. Where a value is the agent's, the
// constant is defined by it, so the two cannot drift apart.

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

// PTYSize is a terminal size in character cells.
type PTYSize struct {
	Cols, Rows uint16
}
