package gvisor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"

	"github.com/airlockhq/airlock/internal/driver/oci"
)

// State is what the driver keeps of a sandbox across daemon restarts: the
// core's state, whose RunArgs say which network stack its last run got
// (flagNetstack or flagNoNet) and so where runsc's commands reach it, and
// whose NetNS is the namespace the network layer prepared. A sandbox dir
// adds netstack.json, the addresses runsc took from that namespace (see
// restoreAddrs).
type State = oci.State

// RunArgs chooses runsc's network stack for the sandbox's next run. A
// sandbox that joins a namespace the daemon prepared, with an interface in
// it, gets gVisor's own stack (netstack) on that namespace's interfaces:
// its packets leave through the namespace's veth, where the network
// layer's resolver, proxy and filter (all on the host side) apply as to a
// runc sandbox, and Launch starts runsc from inside the namespace. A
// sandbox without one, or whose namespace has loopback only (network mode
// none), gets gVisor's loopback only (--network=none), started from the
// daemon's own namespaces: the same sandbox, without the namespace dance
// of Launch and with runsc's commands run as they are (Control). A
// namespace that gains an interface later (a PUT …/network from none) is
// used from the sandbox's next start on.
//
// runsc's other way, the host kernel's stack (--network=host), cannot work
// here: it runs the Sentry in the bundle's user namespace as the unmapped
// host root, without the capabilities to set up its chroot (EPERM).
func (d *Driver) RunArgs(st *State) ([]string, error) {
	if st.NetNS == "" {
		return []string{flagNoNet}, nil
	}
	// What runsc stripped from the namespace in an earlier run is put
	// back first, so that the interfaces are seen for what they are.
	links, err := restoreAddrs(st.NetNS, filepath.Join(st.Dir, netConfigName))
	if err != nil {
		return nil, err
	}
	if links == 0 {
		return []string{flagNoNet}, nil
	}
	return []string{flagNetstack}, nil
}

// netstack reports whether the last run of the sandbox st got gVisor's
// netstack in its namespace: runsc then runs, and is reached, from inside
// that namespace.
func netstack(st *State) bool {
	return st.NetNS != "" && slices.Contains(st.RunArgs, flagNetstack)
}

// Launch runs runsc's `run` of a sandbox: from inside its namespace with
// netstack (see launch in netstack.go), else as it is.
func (d *Driver) Launch(cmd *exec.Cmd, st *State) error {
	if !netstack(st) {
		return cmd.Run()
	}
	visible := filepath.Join(st.Dir, procDirName)
	if err := os.Mkdir(visible, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("creating proc dir: %w", err)
	}
	if err := wrapInNamespaces(cmd, st.NetNS, visible); err != nil {
		return err
	}
	return cmd.Run()
}

// Control runs runsc's other subcommands about sandbox id (state, kill,
// delete, pause, resume) where they reach it: runsc's control socket is an
// abstract unix socket, which exists only in the network namespace runsc
// ran in. Without netstack that is the daemon's; with it the sandbox's,
// and the command runs under nsenter --net, or a restarted daemon would
// find its gVisor sandboxes "stopped".
func (d *Driver) Control(cmd *exec.Cmd, id string) error {
	st, err := d.LoadState(id)
	if err != nil || !netstack(st) {
		return cmd.Run()
	}
	return runInNetNS(cmd, st.NetNS)
}

// runInNetNS runs cmd inside the network namespace at path, through
// nsenter: a child process enters it, never a thread of the daemon (one
// that changed namespaces may be the main thread, whose view /proc/self
// shows to the whole daemon).
func runInNetNS(cmd *exec.Cmd, path string) error {
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return fmt.Errorf("entering network namespace: %w", err)
	}
	cmd.Args = append([]string{nsenter, "--net=" + path, "--", cmd.Path}, cmd.Args[1:]...)
	cmd.Path = nsenter
	return cmd.Run()
}
