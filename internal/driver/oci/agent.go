package oci

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/storage"
)

// agentMode is the agent binary's mode in the data dir: executable by the
// sandboxes' uids, readable by nobody but host root. An exec of a binary
// its process cannot read is non-dumpable from its first instruction, and
// its memory belongs to the host's user namespace (would_dump in
// fs/exec.c): no process of the sandbox, root included, can then read or
// write the agent's memory, environment or descriptors through /proc, and
// no user of the sandbox can read the binary. Root inside holds
// CAP_DAC_OVERRIDE only over files of uids its user namespace maps, and
// host root is not one of them. The agent also makes itself non-dumpable
// as it starts (internal/agent/nodump), which holds where the binary must
// stay readable (Config.AgentMode; runsc loads it as the sandbox's root).
const agentMode = 0o711

// installAgent copies the agent binary into the data dir, host root's with
// mode (agentMode), by an atomic rename: running sandboxes keep the inode
// they bind-mounted, so an upgrade never changes a binary under a running
// agent, and the copy is reachable by sandbox uids wherever the original
// lives.
func installAgent(src, dst string, mode os.FileMode) (string, error) {
	if src == "" {
		return "", errors.New("no agent path configured")
	}
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".agent-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	_, err = io.Copy(tmp, in)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), mode)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		return "", fmt.Errorf("installing agent: %w", err)
	}
	return dst, nil
}

// The agent's log. The agent's stdout and stderr are one file the daemon
// opens for it, agentLogName in the sandbox's storage.PrivateDir: on the
// sandbox's own writable layer (its loop-mounted ext4 image or its tmpfs),
// outside the overlay, so the sandbox cannot see it and everything written
// to it, by the agent or by whatever made the agent (or, under gVisor, root
// inside, through /proc/1/fd/1) write, counts against the sandbox's disk
// quota: at worst the sandbox fills its own quota, never the host's disk.
// The agent still empties the file before it passes 1 MiB (--log-max), so
// that its log takes little of the quota. <sandbox>/agent.log is a symlink
// to it for whoever debugs on the host.
const agentLogName = "agent.log"

// openAgentLog opens the agent's log of the sandbox in dir for appending,
// creating it (host root's, 0600) and the symlink to it. Without a mounted
// writable layer there is no log (and no start): it would be on the host's
// own disk.
func openAgentLog(dir string) (*os.File, error) {
	priv, err := storage.PrivateDir(dir)
	if err != nil {
		return nil, fmt.Errorf("agent log: %w", err)
	}
	p := filepath.Join(priv, agentLogName)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening agent log: %w", err)
	}
	rel, err := filepath.Rel(dir, p)
	if err == nil {
		// Best effort, for people: only where nothing is yet (a sandbox
		// of an earlier daemon keeps its old log file there).
		_ = os.Symlink(rel, filepath.Join(dir, agentLogName))
	}
	return f, nil
}

// capLegacyLog truncates the agent.log of a runc sandbox an earlier daemon
// made, a regular file on the data dir's file system, once it exceeds
// legacyLogMax (the manager's sweep inspects every sandbox every 30 s):
// such a sandbox runs the agent it started with until its next start,
// which moves the log onto its own storage. (A gVisor one's is on a 2 MiB
// tmpfs of its own, log/, which its teardown unmounts.) The agent opened
// it O_APPEND, so its next line lands at the new end.
func (c *Core) capLegacyLog(dir string) {
	p := filepath.Join(dir, agentLogName)
	if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() && fi.Size() > legacyLogMax {
		if err := os.Truncate(p, 0); err == nil {
			c.log.Info("legacy agent log truncated", "path", p, "size", fi.Size())
		}
	}
}
