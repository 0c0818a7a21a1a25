package mcptest

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testutil"
	"github.com/airlockhq/airlock/internal/testutil/daemontest"
)

// Timeouts of the suite's own waits.
const (
	// npmTimeout bounds `npm ci` of the pinned client (98 small packages;
	// tens of seconds on a normal link).
	npmTimeout = 5 * time.Minute
	// buildTimeout bounds building bin/airlock (a minute on a loaded
	// machine with a cold cache).
	buildTimeout = 10 * time.Minute
	// clientTimeout bounds client.mjs: two sessions, each creating one
	// base sandbox (seconds).
	clientTimeout = 4 * time.Minute
	// listenTimeout bounds `airlock mcp --http` saying where it listens.
	listenTimeout = time.Minute
)

// nodeModules installs the pinned client (package-lock.json) with `npm
// ci` unless it is there, and returns the directory to run node in.
func nodeModules(t *testing.T) string {
	t.Helper()
	testutil.RequiresBinary(t, "node")
	testutil.RequiresBinary(t, "npm")
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")); err == nil {
		return dir
	}
	ctx, cancel := context.WithTimeout(context.Background(), npmTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		// The registry may be out of reach (an offline host): a skip there,
		// a failure in CI, which must be able to install the pinned client.
		testutil.HostLacks(t, "npm ci of the pinned MCP client failed (%v):\n%s", err, out)
	}
	return dir
}

// buildAirlock builds cmd/airlock (what `make build` puts in bin/) into a
// temp dir and returns its path.
func buildAirlock(t *testing.T) string {
	t.Helper()
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "airlock")
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", bin, "./cmd/airlock")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building airlock: %v\n%s", err, out)
	}
	return bin
}

// syncBuffer is a bytes.Buffer safe for a child's output and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var listening = regexp.MustCompile(`at (http://127\.0\.0\.1:\d+/mcp) for `)

// serveHTTP starts `airlock mcp --http 127.0.0.1:0` against url and
// returns its endpoint; the process is stopped (by its PID) when t ends.
func serveHTTP(t *testing.T, bin, url string) string {
	t.Helper()
	cmd := exec.Command(bin, "mcp", "--http", "127.0.0.1:0", "--url", url)
	// No key of its own: each request brings one.
	cmd.Env = daemontest.CleanEnv()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs.Write(append(sc.Bytes(), '\n'))
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("airlock mcp --http: %v\n%s", err, logs.String())
			}
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Errorf("airlock mcp --http did not stop on SIGINT\n%s", logs.String())
		}
	})
	select {
	case u := <-found:
		return u
	case <-time.After(listenTimeout):
		t.Fatalf("airlock mcp --http did not say where it listens\n%s", logs.String())
	}
	return ""
}

// TestTypeScriptClient runs client.mjs (node's test runner) with the
// official TypeScript MCP client against `airlock mcp` over stdio and over
// streamable HTTP, on a real daemon: list the tools, create a sandbox, run
// commands (exit code, streams, a bad input as a tool error), kill it.
func TestTypeScriptClient(t *testing.T) {
	e := daemontest.Start(t, daemontest.Options{})
	dir := nodeModules(t)
	bin := buildAirlock(t)
	key := e.Key(t, "mcp-ts")
	endpoint := serveHTTP(t, bin, e.URL())

	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-reporter=spec", "client.mjs")
	cmd.Dir = dir
	cmd.Env = append(daemontest.CleanEnv(),
		"AIRLOCK_BIN="+bin, "AIRLOCK_URL="+e.URL(), "AIRLOCK_API_KEY="+key, "AIRLOCK_MCP_HTTP="+endpoint)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test client.mjs: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "pass 2") {
		t.Fatalf("node --test did not pass both tests:\n%s", out)
	}
	t.Logf("%s", out)
}
