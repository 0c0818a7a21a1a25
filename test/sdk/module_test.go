package sdk_test

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// sdkModules are the only modules a program using the SDK may need besides
// its own: the SDK, the API types and the one library the SDK uses (PTY
// sessions over WebSocket).
var sdkModules = []string{
	"github.com/airlockhq/airlock/api",
	"github.com/airlockhq/airlock/client",
	"github.com/coder/websocket",
}

// daemonModules are module path prefixes of the daemon's dependencies that
// must never reach an SDK user, named so that a failure says what leaked.
var daemonModules = []string{
	"github.com/airlockhq/airlock ", // the root module itself
	"modernc.org/", "github.com/google/nftables", "github.com/mdlayher/", "github.com/vishvananda/",
	"go.opentelemetry.io/", "github.com/prometheus/", "google.golang.org/", "connectrpc.com/",
	"github.com/spf13/", "github.com/miekg/dns", "github.com/google/go-containerregistry",
	"github.com/opencontainers/", "github.com/hashicorp/yamux", "golang.org/x/",
}

// userProgram uses the SDK the way a user's program does: the client, its
// error classes and the API's request types.
const userProgram = `package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

func main() {
	c, err := client.New("", "", client.FromEnv())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_, err = c.CreateSandbox(context.Background(), api.CreateSandboxRequest{Template: "base"})
	if errors.Is(err, client.ErrUnavailable) {
		os.Exit(3)
	}
}
`

// TestSDKModuleStandsAlone makes a module outside the tree that requires
// the SDK (replaced by this tree's client/ and api/, as a published version
// would be fetched), tidies it offline from the module cache and checks that
// its go.sum and module graph hold only the SDK's modules, that it builds,
// and that the SDK's package graph has no airlock internal package.
func TestSDKModuleStandsAlone(t *testing.T) {
	goBin := goCommand(t)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gomod := "module example.com/sdkuser\n\ngo 1.25\n\n" +
		"require github.com/airlockhq/airlock/client v0.1.0\n\n" +
		"replace (\n" +
		"\tgithub.com/airlockhq/airlock/api => " + filepath.Join(root, "api") + "\n" +
		"\tgithub.com/airlockhq/airlock/client => " + filepath.Join(root, "client") + "\n" +
		")\n"
	writeFile(t, filepath.Join(dir, "go.mod"), gomod)
	writeFile(t, filepath.Join(dir, "main.go"), userProgram)

	// Offline: every module must come from the cache the root module's
	// build filled (GOPROXY=off), and no checksum database is asked
	// (GOSUMDB=off); the hashes are compared with the root's go.sum below.
	gocmd := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(goBin, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOSUMDB=off", "GOWORK=off",
			"GOTOOLCHAIN=local")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return string(out)
	}
	gocmd("mod", "tidy")

	sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	rootSum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range lines(string(sum)) {
		mod := strings.Fields(line)[0]
		checkModule(t, "go.sum", mod)
		// The hash of a module the root also uses is the root's: the cache
		// gave the SDK user the very same bytes.
		if !slices.Contains(lines(string(rootSum)), line) {
			t.Errorf("go.sum line %q differs from the root module's go.sum", line)
		}
	}
	for _, line := range lines(gocmd("list", "-m", "all")) {
		mod := strings.Fields(line)[0]
		if mod == "example.com/sdkuser" {
			continue
		}
		checkModule(t, "go list -m all", mod)
	}

	// The SDK's packages and everything they import: the standard library
	// and the SDK's modules, no airlock internal package.
	deps := lines(gocmd("list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}",
		"github.com/airlockhq/airlock/client", "github.com/airlockhq/airlock/api"))
	if !slices.Contains(deps, "github.com/airlockhq/airlock/client") {
		t.Fatalf("go list -deps of the SDK did not list the SDK: %q", deps)
	}
	for _, p := range deps {
		if strings.HasPrefix(p, "github.com/airlockhq/airlock/internal") || !inSDKModules(p) {
			t.Errorf("the SDK imports %s", p)
		}
	}

	gocmd("build", "-o", filepath.Join(dir, "sdkuser"), ".")
}

// checkModule fails the test when mod is not one of the SDK's modules.
func checkModule(t *testing.T, where, mod string) {
	t.Helper()
	mod = strings.TrimSuffix(mod, "/go.mod")
	if slices.Contains(sdkModules, mod) {
		return
	}
	for _, d := range daemonModules {
		if strings.HasPrefix(mod+" ", d) || strings.HasPrefix(mod, d) {
			t.Errorf("%s of a program using the SDK names %s, a dependency of the daemon", where, mod)
			return
		}
	}
	t.Errorf("%s of a program using the SDK names %s, which is not one of the SDK's modules %v", where, mod, sdkModules)
}

// inSDKModules reports whether package p belongs to one of sdkModules.
func inSDKModules(p string) bool {
	for _, m := range sdkModules {
		if p == m || strings.HasPrefix(p, m+"/") {
			return true
		}
	}
	return false
}

// goCommand returns the go command on PATH.
func goCommand(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command on PATH: %v", err)
	}
	return p
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// lines returns the non-empty lines of s.
func lines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	return out
}
