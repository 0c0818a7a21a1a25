package daemon

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/network"
	"github.com/airlockhq/airlock/internal/network/fakenet"
)

// searchable are the data dir's directories that sandbox uids must
// traverse (x for others, never r): the data dir itself, to the agent
// binary and each sandbox's own directory.
var searchable = map[string]bool{
	".": true, "bin": true, "sandboxes": true, "gvisor": true, "gvisor/bin": true, "gvisor/sandboxes": true,
}

// sandboxReadable are files the drivers bind-mount into sandboxes (the
// agent binary, the runc driver's concern).
var sandboxReadable = map[string]bool{"bin/airlock-agent": true, "gvisor/bin/airlock-agent": true}

// TestDataDirModes is issue 13 point 4: nothing the daemon makes in its
// data dir is readable by other host users: the store (airlock.db, its
// -wal and -shm), keys, lock, claims are 0600, directories 0700, and the
// few that sandbox uids traverse are 0711. As root the drivers and the
// sandbox network (in a test namespace) make theirs too.
func TestDataDirModes(t *testing.T) {
	agent := filepath.Join(t.TempDir(), agentBinary)
	os.WriteFile(agent, []byte("#!/bin/sh\n"), 0o755)
	cfg := config.Default()
	cfg.DataDir, cfg.Listen, cfg.NoPrepare, cfg.AgentPath = t.TempDir(), "127.0.0.1:0", true, agent
	cfg.PreviewListen, cfg.ShutdownTimeoutS = "", 5
	// An older airlock made the data dir readable.
	os.Chmod(cfg.DataDir, 0o755)
	opts := Options{Stderr: &syncBuffer{}}
	if os.Geteuid() == 0 {
		host := fakenet.New(t, "host")
		opts.Network = func(c *network.Config) { c.HostNetNS, c.Upstream = host.Path(), []string{} }
	}
	_, stop := runDaemon(t, cfg, opts)
	defer stop()

	seen := 0
	err := filepath.WalkDir(cfg.DataDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(cfg.DataDir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		perm := fi.Mode().Perm()
		seen++
		switch {
		case d.Type()&fs.ModeSymlink != 0:
		case d.IsDir() && searchable[rel]:
			if perm&0o066 != 0 {
				t.Errorf("%s/ has mode %v: others may traverse it, never list or write it", rel, perm)
			}
		case d.IsDir():
			if perm&0o077 != 0 {
				t.Errorf("%s/ has mode %v, want 0700", rel, perm)
			}
		case sandboxReadable[rel]:
		default:
			if perm&0o077 != 0 {
				t.Errorf("%s has mode %v, want 0600", rel, perm)
			}
		}
		// Sandboxes' own directories are the drivers' (and none exist).
		if d.IsDir() && (rel == "sandboxes" || rel == "gvisor/sandboxes") {
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"airlock.db", "airlock.db-wal", "airlock.db-shm", "airlock.lock"} {
		if _, err := os.Stat(filepath.Join(cfg.DataDir, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	t.Logf("%d entries checked", seen)
}
