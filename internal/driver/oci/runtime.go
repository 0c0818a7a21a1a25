package oci

import (
	"context"
	"os/exec"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/airlockhq/airlock/internal/driver"
)

// Runtime is what a driver built on the core says about its OCI runtime:
// the core calls it at each point where runc and runsc do not do the same,
// and does everything else itself (storage, uid slots, cgroups, the bundle,
// the agent's socket, recovery, stats, host limits). Each runtime's driver
// implements it with its own methods (internal/driver/runc,
// internal/driver/gvisor).
type Runtime interface {
	// EditBundle adapts the OCI spec the core built for spec, before it is
	// written; dir is the sandbox's host directory, where it may put files
	// the bundle needs.
	EditBundle(s *specs.Spec, spec driver.Spec, dir string) error
	// RunArgs returns the runtime flags of the sandbox's next run (before
	// the subcommand). The core keeps them in st.RunArgs, saved before the
	// run, so that Launch, Control and a restarted daemon see them.
	RunArgs(st *State) ([]string, error)
	// Launch runs cmd, the prepared `run --detach` of the sandbox whose
	// state is st, from wherever the runtime must start (plain: cmd.Run()).
	Launch(cmd *exec.Cmd, st *State) error
	// Control runs cmd, a short subcommand (state, kill, delete, pause,
	// resume) about sandbox id (plain: cmd.Run()).
	Control(cmd *exec.Cmd, id string) error
	// InitRunning is told that the sandbox's init runs as pid: after Start
	// (recovered false) or after Recover (true).
	InitRunning(st *State, pid int, recovered bool)
	// KillAll ends every process of sandbox id, the runtime's own
	// included, and returns once they are gone. pid is init's pid if
	// known, 0 to ask the runtime. Core.KillInit does it for a runtime
	// whose every process is in the sandbox's pid namespace.
	KillAll(ctx context.Context, id string, pid int) error
	// ClearStopped ends what the runtime left of a stopped sandbox before
	// the core deletes the runtime's record of it to start it again.
	ClearStopped(ctx context.Context, id string) error
}
