package testutil

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	agentOnce sync.Once
	agentBin  string
	agentErr  error
)

// BuildAgent builds cmd/airlock-agent (static) once per test binary and
// returns its path: <DataDir>/agent/airlock-agent-<hash of its content>.
// Each test binary rebuilds it (the Go build cache makes that quick) into a
// temporary name and renames it into place, so concurrent test binaries
// never see a half written file. The name is the content's: test binaries
// of different source trees (git worktrees sharing the cache) never replace
// each other's agent between this call and a driver's copy of it, which
// once gave a test the agent of another tree. Files unused for a week are
// removed.
func BuildAgent(tb testing.TB) string {
	tb.Helper()
	agentOnce.Do(func() { agentBin, agentErr = buildAgent() })
	if agentErr != nil {
		tb.Fatal(agentErr)
	}
	return agentBin
}

// agentKeep is how long an agent build nobody rebuilt stays in the cache.
const agentKeep = 7 * 24 * time.Hour

func buildAgent() (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(DataDir(), "agent")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("agent dir: %w", err)
	}
	tmp := filepath.Join(dir, ".airlock-agent-"+strconv.Itoa(os.Getpid()))
	cmd := exec.Command("go", "build", "-trimpath", "-o", tmp, "./cmd/airlock-agent")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("building airlock-agent: %v\n%s", err, out)
	}
	sum, err := fileHash(tmp)
	if err != nil {
		os.Remove(tmp)
		return "", err
	}
	final := filepath.Join(dir, "airlock-agent-"+sum)
	if err := os.Rename(tmp, final); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("installing airlock-agent: %w", err)
	}
	// Same content, same name: the rename replaced an equal file. The
	// mtime says when it was last built, for the pruning below.
	now := time.Now()
	_ = os.Chtimes(final, now, now)
	if old, err := filepath.Glob(filepath.Join(dir, "airlock-agent-*")); err == nil {
		for _, p := range old {
			if fi, err := os.Stat(p); err == nil && p != final && now.Sub(fi.ModTime()) > agentKeep {
				os.Remove(p)
			}
		}
	}
	return final, nil
}

// fileHash is the first 16 hex digits of p's SHA-256.
func fileHash(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hashing airlock-agent: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
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
