package cli

import (
	"os/exec"
	"strings"
	"testing"
)

// clientDeps are the only non-standard packages (by module or package
// prefix) the client commands may import: the SDK, cobra and the terminal.
// The daemon's (SQLite, OpenTelemetry, Prometheus, gRPC, protobuf, netlink,
// nftables, every other internal package) are linked into the one binary
// by cmd/airlock, never reached from here.
var clientDeps = []string{
	"github.com/airlockhq/airlock/api",
	"github.com/airlockhq/airlock/client",
	"github.com/airlockhq/airlock/internal/cli",
	// doctor lists the host slots daemons claimed: a reader of files
	// under /run/airlock and of cgroup directories, with no init work.
	"github.com/airlockhq/airlock/internal/hostslot",
	"github.com/airlockhq/airlock/internal/cgroups",
	"github.com/airlockhq/airlock/internal/mountinfo", // cgroups finds its hierarchies in the mount table
	"github.com/airlockhq/airlock/internal/errdefs",
	"github.com/airlockhq/airlock/internal/lazyregexp",
	"github.com/airlockhq/airlock/internal/version",
	// `airlock mcp`: the MCP plane (a client of the SDK too) and the
	// official MCP SDK with what it links (JSON schemas, its JSON codec,
	// URI templates; oauth2's types for its auth package, no network).
	"github.com/airlockhq/airlock/internal/plane/mcp",
	"github.com/modelcontextprotocol/go-sdk",
	"github.com/google/jsonschema-go",
	"github.com/segmentio/encoding",
	"github.com/segmentio/asm",
	"github.com/yosida95/uritemplate/v3",
	"golang.org/x/oauth2",
	"golang.org/x/sync/errgroup",
	"golang.org/x/time/rate",
	"github.com/coder/websocket",
	"github.com/spf13/cobra",
	"github.com/spf13/pflag",
	"golang.org/x/sys",
	"golang.org/x/term",
}

// TestClientCommandsImportNoDaemon fails when the CLI package pulls a
// daemon package back into its graph (e.g. importing internal/daemon for
// `serve` again, or internal/store for a type).
func TestClientCommandsImportNoDaemon(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	out, err := exec.Command(goBin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 {
		t.Fatal("go list -deps listed nothing")
	}
	for _, p := range deps {
		ok := false
		for _, d := range clientDeps {
			if p == d || strings.HasPrefix(p, d+"/") {
				ok = true
				break
			}
		}
		if !ok {
			t.Errorf("internal/cli imports %s, which is not one of the client's dependencies", p)
		}
	}
}
