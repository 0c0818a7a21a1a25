package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

var (
	agentOnce sync.Once
	agentBin  string
	agentErr  error
)

// BuildAgent builds cmd/airlock-agent (static) once per test binary and
// returns its path: <DataDir>/agent/airlock-agent. Each test binary
// rebuilds it (the Go build cache makes that quick) into a temporary name
// and renames it into place, so concurrent test binaries never see a half
// written file and nothing is left behind per run; a sandbox still running
// the previous file keeps its inode.
func BuildAgent(tb testing.TB) string {
	tb.Helper()
	agentOnce.Do(func() { agentBin, agentErr = buildAgent() })
	if agentErr != nil {
		tb.Fatal(agentErr)
	}
	return agentBin
}

func buildAgent() (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(DataDir(), "agent")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("agent dir: %w", err)
	}
	final := filepath.Join(dir, "airlock-agent")
	tmp := filepath.Join(dir, ".airlock-agent-"+strconv.Itoa(os.Getpid()))
	cmd := exec.Command("go", "build", "-trimpath", "-o", tmp, "./cmd/airlock-agent")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("building airlock-agent: %v\n%s", err, out)
	}
	if err := os.Rename(tmp, final); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("installing airlock-agent: %w", err)
	}
	return final, nil
}

// ModuleRoot is the directory of airlock's go.mod, found from the working
// directory up (tests run in their package's directory).
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the airlock module")
	}
	return filepath.Dir(mod), nil
}
