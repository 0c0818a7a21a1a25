package client

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestMain fails the run when a goroutine the tests started outlives them
// (a stream or a watch whose reader was not closed, a pinger left running).
// It is goleak's check written out, so that the SDK's module needs nothing
// but the standard library, the api module and coder/websocket.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if left := leftGoroutines(5 * time.Second); left != "" {
			fmt.Fprintf(os.Stderr, "goroutines left after the tests:\n\n%s\n", left)
			code = 1
		}
	}
	os.Exit(code)
}

// leftGoroutines waits up to wait for the tests' goroutines to end and
// returns the stacks of those still running, or "".
func leftGoroutines(wait time.Duration) string {
	deadline := time.Now().Add(wait)
	for {
		var left []string
		for _, g := range goroutineStacks()[1:] { // [0] is this one
			if !ignoredGoroutine(g) {
				left = append(left, g)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return strings.Join(left, "\n\n")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// goroutineStacks returns the stack of every goroutine, the caller's first.
func goroutineStacks() []string {
	buf := make([]byte, 64<<10)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(strings.TrimSpace(string(buf[:n])), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// ignoredGoroutine reports whether g belongs to the runtime or the testing
// package rather than to a test (goleak's default ignores).
func ignoredGoroutine(g string) bool {
	for _, fn := range []string{
		"testing.RunTests(", "testing.(*T).Run(", "testing.(*T).Parallel(", "testing.(*M).",
		"os/signal.signal_recv(", "os/signal.loop(", "runtime.ensureSigM(", "runtime/trace.",
	} {
		if strings.Contains(g, "\n"+fn) {
			return true
		}
	}
	return false
}
