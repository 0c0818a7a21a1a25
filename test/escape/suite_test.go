package escape

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/airlockhq/airlock/api"
)

// Tenants of the suite: attacks run as one, the neighbour belongs to another.
const (
	attackerTenant  = "attacker"
	neighbourTenant = "neighbour"
)

// suite is the attacks against one runtime: a host fixture, a neighbour
// sandbox with a canary, and a shared probe sandbox for attacks that change
// nothing in it.
type suite struct {
	e       *env
	runtime string
	host    *hostFixture
	nb      *neighbour
	probe   *sbx

	mu   sync.Mutex
	live map[string]*sbx // sandboxes whose processes are checked after each attack
}

func newSuite(t *testing.T, e *env, runtime string) *suite {
	t.Helper()
	s := &suite{e: e, runtime: runtime, live: map[string]*sbx{}}
	s.host = newHostFixture(t, filepath.Join(e.cfg.DataDir, "bin", "airlock-agent"))
	s.nb = newNeighbour(t, s)
	s.probe = s.sandbox(t, api.CreateSandboxRequest{})
	return s
}

// sandbox creates an attacker sandbox whose processes are checked after
// every attack while it lives.
func (s *suite) sandbox(t testing.TB, req api.CreateSandboxRequest) *sbx {
	t.Helper()
	return s.sandboxOf(t, attackerTenant, req)
}

func (s *suite) sandboxOf(t testing.TB, tenant string, req api.CreateSandboxRequest) *sbx {
	t.Helper()
	b := s.e.create(t, tenant, s.runtime, req)
	s.mu.Lock()
	s.live[b.id] = b
	s.mu.Unlock()
	// Registered after create's own cleanup, so it runs first: a sandbox
	// being deleted is no longer checked.
	t.Cleanup(func() {
		s.mu.Lock()
		delete(s.live, b.id)
		s.mu.Unlock()
	})
	return b
}

// attack runs f as the subtest name, then asserts that the host and the
// neighbour are unaffected and that no process left its sandbox.
func (s *suite) attack(t *testing.T, name string, parallel bool, f func(t *testing.T)) {
	t.Run(name, func(t *testing.T) {
		if parallel {
			t.Parallel()
		}
		before := s.nb.counter(t)
		f(t)
		s.host.check(t)
		s.checkProcs(t)
		s.nb.check(t, before)
	})
}

// checkProcs asserts every live sandbox's processes are where they belong.
func (s *suite) checkProcs(t testing.TB) {
	t.Helper()
	procs := hostProcs()
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, b := range s.live {
		b.host.contained(t, id, procs)
	}
}

// neighbour is a sandbox of another tenant that runs a canary: a loop
// writing an increasing counter to /home/user/canary. Its files and secret
// must stay intact and its counter must keep advancing whatever the
// attacker does.
type neighbour struct {
	*sbx
	secret    string // content of /home/user/secret and /tmp/secret
	envSecret string // a create-time secret, in every exec's environment
	mark      string // appears in the canary's command line
}

func newNeighbour(t *testing.T, s *suite) *neighbour {
	t.Helper()
	n := &neighbour{secret: "neighbour-file-" + token(), envSecret: "neighbour-env-" + token(), mark: "nbmark" + token()}
	n.sbx = s.sandboxOf(t, neighbourTenant, api.CreateSandboxRequest{Secrets: map[string]string{"NEIGHBOUR_TOKEN": n.envSecret}})
	n.mustSh(t, "", "echo "+n.secret+" > /home/user/secret; echo "+n.secret+" > /tmp/secret")
	script := ": " + n.mark + `; i=0; while :; do i=$((i+1)); echo $i > /home/user/.canary.tmp && mv -f /home/user/.canary.tmp /home/user/canary; sleep 0.05; done`
	timeout := 3600.0
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if _, err := n.c().ExecAsync(ctx, n.id, api.ExecRequest{Shell: &script, TimeoutS: &timeout}); err != nil {
		t.Fatal(err)
	}
	if !eventually(canaryWait, func() bool { v, err := n.read(); return err == nil && v > 0 }) {
		t.Fatal("the neighbour's canary does not start")
	}
	return n
}

// read returns the canary's counter.
func (n *neighbour) read() (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	b, err := n.readFile(ctx, "/home/user/canary")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// counter returns the canary's counter, failing t if it cannot be read.
func (n *neighbour) counter(t testing.TB) int64 {
	t.Helper()
	v, err := n.read()
	if err != nil {
		t.Fatalf("reading the neighbour's canary: %v", err)
	}
	return v
}

// check fails t unless the canary advanced past before and the neighbour's
// files and state are intact.
func (n *neighbour) check(t testing.TB, before int64) {
	t.Helper()
	var last int64
	var lastErr error
	if !eventually(canaryWait, func() bool { last, lastErr = n.read(); return lastErr == nil && last > before }) {
		t.Errorf("the neighbour's canary stopped at %d (was %d): %v", last, before, lastErr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	for _, p := range []string{"/home/user/secret", "/tmp/secret"} {
		if b, err := n.readFile(ctx, p); err != nil || string(b) != n.secret+"\n" {
			t.Errorf("the neighbour's %s changed: %q, %v", p, b, err)
		}
	}
	if sb, err := n.c().GetSandbox(ctx, n.id); err != nil || sb.State != api.StateRunning {
		t.Errorf("the neighbour is not running: %+v, %v", sb, err)
	}
}
