package escape

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

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

// sentry reports whether the runtime answers system calls with its own
// kernel (gVisor's Sentry): a namespace, device node, extended attribute or
// kernel log there is the Sentry's object, never the host kernel's, so
// several attacks get another answer than under runc, where the suite
// accepts it (each place says why). Containment is asserted the same way:
// by the host and neighbour checks after every attack.
func (s *suite) sentry() bool { return s.runtime == "gvisor" }

// sandboxDir is the host directory of sandbox id: each driver has its own
// data dir (gvisor's below the daemon's, see internal/daemon/runtimes.go).
func (s *suite) sandboxDir(id string) string {
	if s.runtime == "gvisor" {
		return filepath.Join(s.e.cfg.DataDir, "gvisor", "sandboxes", id)
	}
	return filepath.Join(s.e.cfg.DataDir, "sandboxes", id)
}

// accept drops from got the probes among keys whose outcome is in ok
// ("OK" matches "OK:" and data too), so that expect then checks the rest.
func accept(got map[string]string, ok errnos, keys ...string) {
	for _, k := range keys {
		v, found := got[k]
		if !found {
			continue
		}
		if ok.has(v) || (ok.has("OK") && strings.HasPrefix(v, "OK")) {
			delete(got, k)
		}
	}
}

// crashed checks that b, whose user-space kernel an attack ended, is
// reported as crashed by the API (its own loss, nothing else's).
func (s *suite) crashed(t *testing.T, b *sbx) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	var sb *api.Sandbox
	var err error
	eventually(20*time.Second, func() bool {
		sb, err = b.c().GetSandbox(ctx, b.id)
		return err == nil && sb.State != api.StateRunning
	})
	if err != nil || sb.State != api.StateError || sb.Error == nil || sb.Error.Code != "sandbox_crashed" {
		t.Errorf("sandbox %s after its kernel ended: %+v, %v; want error sandbox_crashed", b.id, sb, err)
	}
}

// readPidFile reads a pid file of a driver's sandbox dir; 0 if none.
func readPidFile(t testing.TB, p string) int {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Errorf("reading %s: %v", p, err)
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// procUID is the real host uid of pid, -1 if unknown.
func procUID(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil || pid <= 0 {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				n, err := strconv.Atoi(f[0])
				if err == nil {
					return n
				}
			}
		}
	}
	return -1
}

// keysWith lists the keys of got that start with prefix.
func keysWith(got map[string]string, prefix string) []string {
	var out []string
	for k := range got {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	return out
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
