package cgroups

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// startSleeper starts a sleep and moves it into the cgroup directory dir.
func startSleeper(t *testing.T, dir string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "100")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killSleeper(t, cmd) })
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	return cmd
}

func killSleeper(t *testing.T, cmd *exec.Cmd) {
	if cmd.ProcessState != nil {
		return
	}
	cmd.Process.Kill()
	cmd.Wait()
}
