package escape

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
)

// progAgentSocket replaces the agent's socket in /.airlock/run with a
// symlink to argv[1], or, without it, to the neighbour's agent socket: the
// host path of the run dir is in /proc/self/mountinfo, and the neighbour's
// id (argv[3]) replaces the sandbox's own (argv[2]) in it. The program
// assumes the neighbour's id leaked; everything else it finds itself.
const progAgentSocket = `
target, own, victim = sys.argv[1], sys.argv[2], sys.argv[3]
if not target:
    for line in open("/proc/self/mountinfo"):
        f = line.split()
        if len(f) > 4 and f[4] == "/.airlock/run":
            target = f[3].replace(own, victim) + "/agent.sock"
R["#target"] = target
R["replace"] = ot(os.unlink, "/.airlock/run/agent.sock")
R["symlink"] = ot(os.symlink, target, "/.airlock/run/agent.sock")
done()
`

// TestEscapeAgentSocket: root in a sandbox owns /.airlock/run, the
// directory holding the agent's socket, which is a bind mount of a host
// directory the daemon dials. It swaps the socket for a symlink, and the
// daemon restarts (an upgrade, a crash): the daemon must re-adopt the
// sandbox through its own agent or report it crashed, never connect to the
// symlink's target — a host socket, or another tenant's agent. Each case
// restarts the daemon, so they run one at a time.
func TestEscapeAgentSocket(t *testing.T) {
	e := startEnv(t)
	for _, rt := range e.runtimes(t) {
		t.Run(rt, func(t *testing.T) {
			s := newSuite(t, e, rt)
			s.attack(t, "SymlinkToHostSocket", false, s.agentSocketToHost)
			s.attack(t, "SymlinkToNeighbourAgent", false, s.agentSocketToNeighbour)
		})
	}
}

// decoy is a unix socket listening on the host that counts connections.
type decoy struct {
	path  string
	mu    sync.Mutex
	conns int
	first string // the first bytes received
}

func newDecoy(t *testing.T) *decoy {
	t.Helper()
	dir, err := os.MkdirTemp("", "airlock-escape-decoy-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	d := &decoy{path: filepath.Join(dir, "decoy.sock")}
	ln, err := net.Listen("unix", d.path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.SetReadDeadline(time.Now().Add(time.Second))
			buf := make([]byte, 256)
			n, _ := c.Read(buf)
			c.Close()
			d.mu.Lock()
			d.conns++
			if d.first == "" {
				d.first = string(buf[:n])
			}
			d.mu.Unlock()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return d
}

func (d *decoy) count() (int, string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.conns, d.first
}

// afterRestart reports how the attacker's sandbox looks once the daemon
// re-adopted it: its hostname and what `cat` of the neighbour's secret path
// gives, or ok false if it is gone (reported crashed).
func afterRestart(t *testing.T, b *sbx) (out string, ok bool) {
	t.Helper()
	var sb *api.Sandbox
	var err error
	eventually(10*time.Second, func() bool {
		sb, err = b.c().GetSandbox(t.Context(), b.id)
		return err == nil && sb.State != api.StateStarting
	})
	if err != nil || sb.State != api.StateRunning {
		t.Logf("attacker sandbox after the restart: %+v %v", sb, err)
		return "", false
	}
	script := "hostname; cat /home/user/secret /tmp/secret 2>&1; echo $NEIGHBOUR_TOKEN"
	r, err := b.c().Exec(t.Context(), b.id, api.ExecRequest{Shell: &script})
	if err != nil {
		t.Logf("exec in the attacker sandbox after the restart: %v", err)
		return "", false
	}
	return strings.TrimSpace(deref(r.Stdout)), true
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// agentSocketToHost: the symlink points at a unix socket on the host.
func (s *suite) agentSocketToHost(t *testing.T) {
	d := newDecoy(t)
	b := s.sandbox(t, api.CreateSandboxRequest{})
	got := b.py(t, "root", progAgentSocket, d.path, b.id, s.nb.id)
	t.Logf("the attacker replaced its agent socket: %v", got)
	s.e.restart()
	out, ok := afterRestart(t, b)
	if n, first := d.count(); n > 0 {
		t.Errorf("finding: after a daemon restart the daemon (host root) connected %d times to the host socket %s that root in sandbox %s "+
			"named by a symlink at /.airlock/run/agent.sock, and sent it %q: DialAgent follows symlinks in a directory the sandbox "+
			"owns (internal/driver/runc/driver.go DialAgent/dialUnix)", n, d.path, b.id, first)
	}
	if ok && strings.Fields(out)[0] != strings.ReplaceAll(b.id, "_", "-") {
		t.Errorf("after the restart the attacker's sandbox is served by something else: %q", out)
	}
}

// agentSocketToNeighbour: the symlink points at the neighbour's agent
// socket, by its host path.
func (s *suite) agentSocketToNeighbour(t *testing.T) {
	b := s.sandbox(t, api.CreateSandboxRequest{})
	got := b.py(t, "root", progAgentSocket, "", b.id, s.nb.id)
	t.Logf("the attacker replaced its agent socket: %v", got)
	s.e.restart()
	out, ok := afterRestart(t, b)
	if !ok {
		return // reported crashed: contained
	}
	own := strings.ReplaceAll(b.id, "_", "-")
	if f := strings.Fields(out); len(f) == 0 || f[0] != own || strings.Contains(out, s.nb.secret) || strings.Contains(out, s.nb.envSecret) {
		t.Errorf("finding: after a daemon restart, tenant %q's commands in its sandbox %s run in tenant %q's sandbox %s "+
			"(hostname and files of the neighbour: %q). Root in the attacker's sandbox replaced /.airlock/run/agent.sock with a "+
			"symlink to the neighbour's agent socket (host path from /proc/self/mountinfo, neighbour id assumed leaked); the "+
			"daemon re-dials through the symlink (internal/driver/runc/driver.go DialAgent/dialUnix) and never checks whose agent answered",
			b.tenant, b.id, s.nb.tenant, s.nb.id, out)
	}
}
