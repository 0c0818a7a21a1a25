package escape

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
)

// progAgentSocket tries to swap the agent's socket for a symlink to
// argv[1], or, without it, to the neighbour's agent socket. It finds the
// host paths itself: a mount of the agent's socket dir at /.airlock/run
// (the layout before the fix), else the sandbox's host dir, which the
// overlay's upperdir in /proc/self/mountinfo gives away; the neighbour's id
// (argv[3]) replaces its own (argv[2]) in them (the id is assumed leaked).
// It plants the symlink wherever such a path can be written from inside,
// and tries the agent's own listening socket through /proc/1/fd.
const progAgentSocket = `
target, own, victim = sys.argv[1], sys.argv[2], sys.argv[3]
run_mount, sbx_dir = "", ""
for line in open("/proc/self/mountinfo"):
    f = line.split()
    if len(f) > 4 and f[4] == "/.airlock/run":
        run_mount = f[3]
    tail = line.split(" - ", 1)[-1].split()
    if len(tail) > 2:
        for opt in tail[2].split(","):
            if opt.startswith("upperdir=") and "/storage/" in opt:
                sbx_dir = opt[len("upperdir="):].split("/storage/")[0]
R["#run_mount"] = run_mount
R["#sandbox_dir"] = sbx_dir
run_dir = run_mount or (sbx_dir + "/run")
if not target:
    target = run_dir.replace(own, victim) + "/agent.sock"
R["#target"] = target
for d in ("/.airlock/run", run_dir):
    try:
        os.makedirs(d, exist_ok=True)
    except OSError:
        pass
    ot(os.unlink, d + "/agent.sock")
    R["symlink " + d] = ot(os.symlink, target, d + "/agent.sock")
try:
    fds = os.listdir("/proc/1/fd")
except OSError as e:
    fds = []
    R["#agent_fds"] = en(e.errno)
for fd in fds:
    try:
        link = os.readlink("/proc/1/fd/" + fd)
    except OSError:
        continue
    if link.startswith("socket:"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        R["connect /proc/1/fd/" + fd] = ot(s.connect, "/proc/1/fd/" + fd)
        s.close()
done()
`

// TestEscapeAgentSocket: root in a sandbox goes for the socket the daemon
// dials to reach the sandbox's agent, to swap it for a symlink, and the
// daemon restarts (an upgrade, a crash): the daemon must re-adopt the
// sandbox through its own agent, never connect to the symlink's target — a
// host socket, or another tenant's agent. The socket lives in a root-only
// directory on the host that no sandbox mounts (the agent got it from runc
// as a descriptor), and the daemon checks that the sandbox's init answers
// (SO_PEERCRED). Each case restarts the daemon, so they run one at a time.
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

// checkAgentSocketAttack fails t if the attack found a host path of the
// agent's socket dir mounted inside, or reached the agent's listening
// socket, or if the socket the daemon dials was replaced.
func (s *suite) checkAgentSocketAttack(t *testing.T, b *sbx, got map[string]string) {
	t.Helper()
	if s.sentry() {
		// runsc cannot be handed the daemon's socket: the agent listens
		// in a host dir mounted at /.airlock/run (a tmpfs of the
		// sandbox's own), which the driver makes read-only once the
		// agent listens (internal/driver/runc/agentsock.go). Nothing may
		// be put in place of the socket, and the socket must stay.
		// (The program's other target, the mount's root as gVisor's
		// mountinfo names it, "/", is the sandbox's own root directory.)
		if got["symlink /.airlock/run"] == "OK" {
			t.Errorf("finding: root in sandbox %s replaced its agent socket with a symlink", b.id)
		}
		for k, v := range got {
			if strings.HasPrefix(k, "connect ") && v == "OK" {
				t.Errorf("root in sandbox %s connected to the agent's listening socket through %s", b.id, strings.TrimPrefix(k, "connect "))
			}
		}
		sock := filepath.Join(s.sandboxDir(b.id), "uds", "agent.sock")
		var st syscall.Stat_t
		if err := syscall.Lstat(sock, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFSOCK {
			t.Errorf("the agent socket %s the daemon dials is no longer a socket: mode %o (%v)", sock, st.Mode, err)
		}
		return
	}
	if got["#run_mount"] != "" {
		t.Errorf("finding: the agent's socket dir %s is mounted into sandbox %s at /.airlock/run: root inside can replace the "+
			"socket the daemon dials (internal/driver/runc/bundle.go)", got["#run_mount"], b.id)
	}
	for k, v := range got {
		if strings.HasPrefix(k, "connect ") && v == "OK" {
			t.Errorf("root in sandbox %s connected to the agent's listening socket through %s", b.id, strings.TrimPrefix(k, "connect "))
		}
	}
	sock := filepath.Join(s.e.cfg.DataDir, "sandboxes", b.id, "run", "agent.sock")
	var st syscall.Stat_t
	if err := syscall.Lstat(sock, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFSOCK || st.Uid != 0 {
		t.Errorf("the agent socket %s the daemon dials is no longer root's socket: mode %o uid %d (%v)", sock, st.Mode, st.Uid, err)
	}
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
	t.Logf("the attacker went for its agent socket: %v", got)
	s.checkAgentSocketAttack(t, b, got)
	s.e.restart()
	out, ok := afterRestart(t, b)
	if n, first := d.count(); n > 0 {
		t.Errorf("finding: after a daemon restart the daemon (host root) connected %d times to the host socket %s that root in sandbox %s "+
			"named by a symlink in place of its agent socket, and sent it %q (internal/driver/runc/agentsock.go)", n, d.path, b.id, first)
	}
	// The sandbox is re-adopted through its own agent: the attack cost it
	// nothing, and the restart did not lose it.
	if !ok {
		t.Errorf("the attacker's sandbox %s was not re-adopted after the daemon restart", b.id)
	} else if f := strings.Fields(out); len(f) == 0 || f[0] != strings.ReplaceAll(b.id, "_", "-") {
		t.Errorf("after the restart the attacker's sandbox is served by something else: %q", out)
	}
}

// agentSocketToNeighbour: the symlink points at the neighbour's agent
// socket, by its host path.
func (s *suite) agentSocketToNeighbour(t *testing.T) {
	b := s.sandbox(t, api.CreateSandboxRequest{})
	got := b.py(t, "root", progAgentSocket, "", b.id, s.nb.id)
	t.Logf("the attacker went for its agent socket: %v", got)
	s.checkAgentSocketAttack(t, b, got)
	s.e.restart()
	out, ok := afterRestart(t, b)
	if !ok {
		t.Fatalf("the attacker's sandbox %s was not re-adopted after the daemon restart", b.id)
	}
	own := strings.ReplaceAll(b.id, "_", "-")
	if f := strings.Fields(out); len(f) == 0 || f[0] != own || strings.Contains(out, s.nb.secret) || strings.Contains(out, s.nb.envSecret) {
		t.Errorf("finding: after a daemon restart, tenant %q's commands in its sandbox %s run in tenant %q's sandbox %s "+
			"(hostname and files of the neighbour: %q). Root in the attacker's sandbox replaced its agent socket with a "+
			"symlink to the neighbour's (host path from /proc/self/mountinfo, neighbour id assumed leaked) and the daemon "+
			"dialled through it without checking whose agent answered (internal/driver/runc/agentsock.go)",
			b.tenant, b.id, s.nb.tenant, s.nb.id, out)
	}
}
