package daemon

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/airlockhq/airlock/internal/config"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if binDir != "" {
			os.RemoveAll(binDir)
		}
		os.Exit(code)
	}))
}

// syncBuffer is a bytes.Buffer safe for the daemon's concurrent writes.
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

func TestResolveConfigPrecedence(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(path, []byte(`{"listen": "127.0.0.1:1", "data_dir": "/from/file", "log_level": "warn"}`), 0o644)
	lookup := func(k string) (string, bool) {
		v, ok := map[string]string{"AIRLOCK_LISTEN": "127.0.0.1:2", "AIRLOCK_DATA_DIR": "/from/env"}[k]
		return v, ok
	}
	cmd := NewServeCommand()
	if err := cmd.Flags().Parse([]string{"--listen", "127.0.0.1:3"}); err != nil {
		t.Fatal(err)
	}
	flags := config.Config{Listen: "127.0.0.1:3"}
	c, err := resolveConfig(cmd.Flags(), flags, path, lookup)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:3" || c.DataDir != "/from/env" || c.LogLevel != "warn" || c.MaxSandboxes != config.Default().MaxSandboxes {
		t.Fatalf("flag > env > file > default violated: %+v", c)
	}
}

func TestFindAgent(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, agentBinary)
	os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755)
	notExe := filepath.Join(dir, "plain")
	os.WriteFile(notExe, []byte("x"), 0o644)
	if p, err := findAgent(exe); err != nil || p != exe {
		t.Fatalf("configured: %q %v", p, err)
	}
	if _, err := findAgent(notExe); err == nil {
		t.Fatal("a non-executable agent accepted")
	}
	t.Setenv("PATH", dir)
	if p, err := findAgent(""); err != nil || p != exe {
		t.Fatalf("from PATH: %q %v", p, err)
	}
	t.Setenv("PATH", t.TempDir())
	if _, err := findAgent(""); err == nil || !strings.Contains(err.Error(), "--agent-path") {
		t.Fatalf("missing agent: %v", err)
	}
}

var keyRE = regexp.MustCompile(`ak_[a-z2-7]{52}`)

// runDaemon starts Run and returns its address and a stop function.
func runDaemon(t *testing.T, cfg config.Config, opts Options) (addr string, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan net.Addr, 1)
	done := make(chan error, 1)
	opts.Ready = func(a net.Addr) { addrc <- a }
	if opts.Network == nil {
		// A test daemon never touches the host's network: sandbox
		// networking runs only inside a namespace the test made.
		opts.NoNetwork = true
	}
	go func() { done <- Run(ctx, cfg, opts) }()
	select {
	case a := <-addrc:
		return a.String(), func() error { cancel(); return <-done }
	case err := <-done:
		cancel()
		t.Fatalf("daemon exited: %v", err)
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatal("daemon did not start")
	}
	return "", nil
}

func get(t *testing.T, url, key string) int {
	t.Helper()
	r, _ := http.NewRequest("GET", url, nil)
	if key != "" {
		r.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

func TestRunGeneratesKeyOnceAndShutsDown(t *testing.T) {
	agent := filepath.Join(t.TempDir(), agentBinary)
	os.WriteFile(agent, []byte("#!/bin/sh\n"), 0o755)
	cfg := config.Default()
	cfg.DataDir, cfg.Listen, cfg.NoPrepare, cfg.AgentPath = t.TempDir(), "127.0.0.1:0", true, agent
	cfg.ShutdownTimeoutS = 5

	var out1 syncBuffer
	addr, stop := runDaemon(t, cfg, Options{Stderr: &out1})
	keys := keyRE.FindAllString(out1.String(), -1)
	if len(keys) != 1 {
		t.Fatalf("want the generated key printed once, stderr:\n%s", out1.String())
	}
	if get(t, "http://"+addr+"/healthz", "") != 200 || get(t, "http://"+addr+"/v1/info", keys[0]) != 200 {
		t.Fatal("daemon does not serve")
	}
	if get(t, "http://"+addr+"/v1/info", "") != 401 {
		t.Fatal("unauthenticated request accepted")
	}
	if !strings.Contains(out1.String(), `"request_id":"req_`) {
		t.Fatalf("no JSON request log with request_id:\n%s", out1.String())
	}
	// A second daemon on the same data dir is refused.
	cfg2 := cfg
	if err := Run(context.Background(), cfg2, Options{Stderr: io.Discard, NoNetwork: true}); err == nil || !strings.Contains(err.Error(), "another airlock serve") {
		t.Fatalf("second daemon on one data dir: %v", err)
	}
	if err := stop(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	// The next start prints no key; the first one still works.
	var out2 syncBuffer
	addr, stop = runDaemon(t, cfg, Options{Stderr: &out2})
	defer stop()
	if keyRE.MatchString(out2.String()) {
		t.Fatalf("key printed again:\n%s", out2.String())
	}
	if get(t, "http://"+addr+"/v1/info", keys[0]) != 200 {
		t.Fatal("generated key lost across restart")
	}
}

func TestRunWithEnvAdminKey(t *testing.T) {
	agent := filepath.Join(t.TempDir(), agentBinary)
	os.WriteFile(agent, []byte("#!/bin/sh\n"), 0o755)
	cfg := config.Default()
	cfg.DataDir, cfg.Listen, cfg.NoPrepare, cfg.AgentPath = t.TempDir(), "127.0.0.1:0", true, agent
	key := "admin-key-from-the-environment-0123"
	var out syncBuffer
	addr, stop := runDaemon(t, cfg, Options{Stderr: &out, AdminKey: key})
	defer stop()
	if keyRE.MatchString(out.String()) || strings.Contains(out.String(), key) {
		t.Fatalf("a key was printed:\n%s", out.String())
	}
	if get(t, "http://"+addr+"/metrics", key) != 200 {
		t.Fatal("AIRLOCK_ADMIN_KEY is not an admin key")
	}
}
