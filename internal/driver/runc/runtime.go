package runc

import (
	"os/exec"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/airlockhq/airlock/internal/driver"
)

// Runtime is the OCI runtime a Driver runs its bundles with. The zero value
// is runc; another runtime that speaks runc's command line (gVisor's runsc)
// reuses everything else of this driver (storage, uid ranges, cgroups,
// lifecycle, recovery) by describing here how it differs.
type Runtime struct {
	// Name is the driver's name, in Name() and in handles; default "runc".
	Name string
	// Isolation is what Capabilities reports; default container.
	Isolation driver.Isolation
	// Binary is the runtime's executable; default Config.RuncPath.
	Binary string
	// StateDir is the runtime's state directory (--root) under the data
	// dir; default "runc".
	StateDir string
	// GlobalArgs are flags given before every subcommand (runsc: the
	// platform).
	GlobalArgs []string
	// RunArgs returns the extra flags of a sandbox's run, decided at
	// Create from its spec and kept in its state (runsc: its network
	// stack, which depends on whether the sandbox joins a namespace).
	RunArgs func(spec driver.Spec) []string
	// ListenSocket makes the agent listen itself on a socket in a
	// per-sandbox host directory bind-mounted into the sandbox, for a
	// runtime that cannot pass the daemon's bound socket to init (runsc
	// has no --preserve-fds). See agentsock.go.
	ListenSocket bool
	// Helpers says the runtime leaves processes of its own in the
	// sandbox's cgroup that outlive init (runsc's Gofer): once init is
	// gone, whatever is left there is killed.
	Helpers bool
	// KeepOOMScore leaves init's OOM score alone: runsc's init is its
	// Sentry, whose score /proc refuses to lower and whose death is the
	// sandbox's anyway.
	KeepOOMScore bool
	// PausesItself says the runtime pauses a sandbox in its own kernel,
	// not with the cgroup freezer (runsc): a paused sandbox is resumed
	// through the runtime before it is killed, or its record cannot be
	// deleted afterwards.
	PausesItself bool
	// InterfacesAtStart is what Capabilities reports (runsc's netstack
	// learns the namespace's interfaces when it starts).
	InterfacesAtStart bool
	// CommandsInNetNS runs a sandbox's runtime subcommands (state, kill,
	// delete, pause, resume) inside the network namespace it was started
	// in, when it has one: runsc reaches its sandbox through an abstract
	// unix socket, which is per network namespace.
	CommandsInNetNS bool
	// ReadableAgent keeps the agent binary readable by the sandbox's
	// users (mode 0755) for a runtime that loads it as the sandbox's root
	// rather than with the host kernel's execve (runsc: the Sentry opens
	// the binary for reading, as the sandbox's root, through the Gofer).
	// The agent still makes itself non-dumpable as it starts
	// (internal/agent/nodump); see agentMode.
	ReadableAgent bool
	// EditSpec adjusts the bundle after it is built, before it is written;
	// dir is the sandbox's host directory, where it may put files the
	// bundle needs.
	EditSpec func(s *specs.Spec, spec driver.Spec, dir string) error
	// Launch, when set, runs the prepared `run` command of a sandbox in
	// place of cmd.Run, for a runtime that must be started from a
	// particular context (runsc's own network stack: from inside the
	// namespace the sandbox joins). netnsPath is that namespace, "" for a
	// fresh one; dir is the sandbox's host directory.
	Launch func(cmd *exec.Cmd, netnsPath, dir string) error
}

// rtName is the driver's name.
func (d *Driver) rtName() string {
	if d.cfg.Runtime.Name == "" {
		return Name
	}
	return d.cfg.Runtime.Name
}
