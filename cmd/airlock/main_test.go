package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// Budgets of what package initialisation may allocate in the one binary,
// which every CLI command pays before its first request. They are bytes
// allocated (deterministic for a build), not times.
const (
	// initBudgetTotal bounds the whole binary's init (≈0.55 MB with this
	// change; 2.6 MB before, when the daemon compiled its patterns and
	// linked gRPC at start).
	initBudgetTotal = 1 << 20
	// initBudgetPackage bounds one airlock package's init; a package-level
	// regexp.MustCompile of a validation pattern takes more (lazyregexp).
	initBudgetPackage = 8 << 10
	// initBudgetGenerated bounds a generated protobuf package (the E2B
	// envd services), whose descriptors are registered at init.
	initBudgetGenerated = 64 << 10
)

// notLinked are module prefixes whose packages must not be initialised by
// the binary at all: gRPC and the generated OTLP types came with
// OpenTelemetry's OTLP exporter (internal/tracing has its own).
var notLinked = []string{
	"google.golang.org/grpc", "google.golang.org/genproto", "github.com/grpc-ecosystem/",
	"go.opentelemetry.io/proto/", "go.opentelemetry.io/otel/exporters/",
}

// inittrace matches a GODEBUG=inittrace=1 line:
// "init PKG @T ms, C ms clock, B bytes, A allocs".
var inittrace = regexp.MustCompile(`^init (\S+) @\S+ ms, \S+ ms clock, (\d+) bytes, (\d+) allocs$`)

// TestStartInitialisesNoDaemonWork builds the binary, runs `airlock
// version` (a client command) with GODEBUG=inittrace=1 and holds the
// package initialisation of everything linked to the budgets above.
func TestStartInitialisesNoDaemonWork(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	bin := filepath.Join(t.TempDir(), "airlock")
	if out, err := exec.Command(goBin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "version")
	// No server (a closed port): version says so and exits 0.
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1", "AIRLOCK_URL=http://127.0.0.1:1", "AIRLOCK_API_KEY=ak_x")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if out, err := cmd.Output(); err != nil {
		t.Fatalf("airlock version: %v\n%s%s", err, out, stderr.String())
	}
	var total, pkgs int
	sc := bufio.NewScanner(&stderr)
	for sc.Scan() {
		m := inittrace.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		pkgs++
		pkg := m[1]
		n, _ := strconv.Atoi(m[2])
		total += n
		for _, p := range notLinked {
			if strings.HasPrefix(pkg, p) {
				t.Errorf("%s is initialised by every command (%d bytes)", pkg, n)
			}
		}
		if !strings.HasPrefix(pkg, "github.com/airlockhq/airlock/") {
			continue
		}
		budget := initBudgetPackage
		if strings.HasSuffix(pkg, "pb") {
			budget = initBudgetGenerated
		}
		if n > budget {
			t.Errorf("%s allocates %d bytes at init, more than %d: make its package-level work lazy (lazyregexp, sync.OnceValue)", pkg, n, budget)
		}
	}
	if pkgs < 50 {
		t.Fatalf("only %d inittrace lines: GODEBUG=inittrace=1 not honoured?\n%s", pkgs, stderr.String())
	}
	if total > initBudgetTotal {
		t.Errorf("package init allocates %d bytes in all, more than %d", total, initBudgetTotal)
	}
	t.Logf("%d packages initialised, %d bytes allocated", pkgs, total)
}
