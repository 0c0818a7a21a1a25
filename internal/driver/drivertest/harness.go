// Package drivertest is the conformance suite every airlock driver runs: each case creates real sandboxes through the driver.Driver contract and asserts isolation, limits and lifecycle through the agent.
package drivertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/driver"
)

// Option tunes the suite for one driver.
type Option func(*options)

type options struct {
	reopen        func(t *testing.T) driver.Driver
	leakRoots     []string
	teardownCount int
	// checkpointCycles is how many checkpoints and restores the
	// CheckpointCycles case makes of one sandbox (default 20).
	checkpointCycles int
}

// WithReopen gives the suite a way to build a second driver on the same data
// dir, as a daemon restart would; without it the Recover case is skipped.
func WithReopen(f func(t *testing.T) driver.Driver) Option {
	return func(o *options) { o.reopen = f }
}

// WithLeakRoots names host directories (the driver's data dir) in which the
// teardown case checks that no file is left behind.
func WithLeakRoots(dirs ...string) Option {
	return func(o *options) { o.leakRoots = append(o.leakRoots, dirs...) }
}

// WithTeardownCount sets how many sandboxes the teardown case creates and
// destroys (default 50).
func WithTeardownCount(n int) Option {
	return func(o *options) { o.teardownCount = n }
}

// WithCheckpointCycles sets how many checkpoints and restores the
// CheckpointCycles case makes (default 20).
func WithCheckpointCycles(n int) Option {
	return func(o *options) { o.checkpointCycles = n }
}

// opTimeout bounds one driver call or exec of the suite: generous, because
// the suite may share a small machine with other work, and a hang must fail
// the test rather than the whole binary.
const opTimeout = 2 * time.Minute

// sandbox is a started sandbox with a connected agent client.
type sandbox struct {
	t    *testing.T
	d    driver.Driver
	id   string
	h    *driver.Handle
	c    *agentclient.Client
	spec driver.Spec
}

// newID returns a fresh sandbox id.
func newID(prefix string) string {
	b := make([]byte, 10)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// token returns a random string to look for in outputs.
func token() string { return newID("marker-") }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	t.Cleanup(cancel)
	return ctx
}

// create creates and starts a sandbox, connects to its agent and registers
// its destruction with t.Cleanup.
func create(t *testing.T, d driver.Driver, tmpl driver.Template, res driver.Resources) *sandbox {
	t.Helper()
	spec := driver.Spec{ID: newID("sbx_t"), Template: tmpl, Resources: res, Hostname: "conformance"}
	s := &sandbox{t: t, d: d, id: spec.ID, spec: spec}
	ctx := ctxT(t)
	h, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	s.h = h
	t.Cleanup(func() { s.destroy(t) })
	if err := d.Start(ctx, spec.ID); err != nil {
		t.Fatalf("Start: %v", err)
	}
	s.connect(t, d)
	return s
}

// connect dials the agent through d and replaces the sandbox's client.
func (s *sandbox) connect(t *testing.T, d driver.Driver) {
	t.Helper()
	dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := d.DialAgent(dctx, s.id)
	if err != nil {
		t.Fatalf("DialAgent: %v", err)
	}
	c, err := agentclient.New(conn)
	if err != nil {
		t.Fatalf("agent handshake: %v", err)
	}
	if s.c != nil {
		s.c.Close()
	}
	s.c = c
	s.d = d
}

// start starts the stopped sandbox again and connects to its new agent.
func (s *sandbox) start(t *testing.T) {
	t.Helper()
	if err := s.d.Start(ctxT(t), s.id); err != nil {
		t.Fatalf("Start of a stopped sandbox: %v", err)
	}
	s.c = nil // the old client died with the old agent
	s.connect(t, s.d)
}

// destroy destroys the sandbox (idempotent) and closes its client.
func (s *sandbox) destroy(t *testing.T) {
	t.Helper()
	if s.c != nil {
		s.c.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := s.d.Destroy(ctx, s.id); err != nil {
		t.Errorf("Destroy %s: %v", s.id, err)
	}
}

// result is a finished exec with its output split by stream.
type result struct {
	agentproto.ExecResult
	// Stdout and Stderr are what a reader keeps of the streams under the
	// exec's cap (head and tail per stream, as the daemon's OutputLog);
	// Streamed counts every output byte the agent sent, which past the cap
	// includes paced samples of the tail.
	Stdout, Stderr string
	Streamed       int64
}

func (r result) String() string {
	return "status=" + r.Status + " code=" + strconv.Itoa(r.ExitCode) + " err=" + r.Error +
		" stdout=" + clip(r.Stdout) + " stderr=" + clip(r.Stderr)
}

func clip(s string) string {
	if len(s) > 300 {
		return strconv.Quote(s[:300]) + "…"
	}
	return strconv.Quote(s)
}

// exec runs req to its end and collects its output.
func (s *sandbox) exec(t *testing.T, req agentproto.ExecRequest) result {
	t.Helper()
	r, err := s.run(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// errNoExit means an exec's stream ended without its exit event: the
// agent, or the whole sandbox, went away under it.
var errNoExit = errors.New("stream ended without an exit event")

// run is exec for a goroutine that must not call t.Fatal: it returns what
// went wrong instead.
func (s *sandbox) run(ctx context.Context, req agentproto.ExecRequest) (result, error) {
	if req.ID == "" {
		req.ID = newID("ex_")
	}
	st, err := s.c.Exec(ctx, req)
	if err != nil {
		return result{}, fmt.Errorf("exec %v%q: %w", req.Argv, req.Shell, err)
	}
	defer st.Close()
	var r result
	kept := agentproto.NewOutputLog(req.MaxOutputBytes)
	for {
		ev, err := st.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return r, fmt.Errorf("exec %q stream: %w", req.Shell, err)
		}
		switch ev.Type {
		case agentproto.EventOutput:
			kept.Add(ev.Stream, ev.Offset, ev.Data)
			r.Streamed += int64(len(ev.Data))
		case agentproto.EventExit:
			if ev.Result != nil {
				r.ExecResult = *ev.Result
			}
		}
	}
	out, _ := kept.Stream(agentproto.StreamStdout)
	if pty, _ := kept.Stream(agentproto.StreamPTY); len(pty) > 0 {
		out = append(out, pty...)
	}
	errb, _ := kept.Stream(agentproto.StreamStderr)
	r.Stdout, r.Stderr = string(out), string(errb)
	if r.Status == "" {
		return r, fmt.Errorf("exec %q: %w", req.Shell, errNoExit)
	}
	return r, nil
}

// sh runs a shell command as user ("" = the default user).
func (s *sandbox) sh(t *testing.T, user, cmd string) result {
	t.Helper()
	return s.exec(t, agentproto.ExecRequest{Shell: cmd, User: user, TimeoutMS: 60_000})
}

// mustSh runs cmd and fails unless it exits 0.
func (s *sandbox) mustSh(t *testing.T, user, cmd string) string {
	t.Helper()
	r := s.sh(t, user, cmd)
	if r.Status != agentproto.StatusExited || r.ExitCode != 0 {
		t.Fatalf("%q: %v", cmd, r)
	}
	return r.Stdout
}

// writeFile writes content to path in the sandbox through the agent's file
// operations, as the default user.
func (s *sandbox) writeFile(t *testing.T, path, content string) {
	t.Helper()
	if _, err := s.c.WriteFile(ctxT(t), path, "", 0o644, strings.NewReader(content), 0); err != nil {
		t.Fatalf("WriteFile %s: %v", path, err)
	}
}

// readFile reads path in the sandbox through the agent's file operations.
func (s *sandbox) readFile(t *testing.T, path string) string {
	t.Helper()
	rc, _, err := s.c.ReadFile(ctxT(t), path, "")
	if err != nil {
		t.Fatalf("ReadFile %s: %v", path, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("ReadFile %s: %v", path, err)
	}
	return string(b)
}

// alive checks the sandbox still runs commands.
func (s *sandbox) alive(t *testing.T) {
	t.Helper()
	if out := s.mustSh(t, "", "echo alive"); strings.TrimSpace(out) != "alive" {
		t.Fatalf("echo alive printed %q", out)
	}
}

// initPid is the host pid of the sandbox's init, from Inspect.
func (s *sandbox) initPid(t *testing.T) int {
	t.Helper()
	st, err := s.d.Inspect(ctxT(t), s.id)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if st.Pid <= 0 {
		t.Fatalf("Inspect: no init pid (%+v)", st)
	}
	return st.Pid
}

// hostProc is a host process, identified by pid and start time so that a
// recycled pid is not mistaken for it.
type hostProc struct {
	Pid   int
	Start uint64
	Comm  string
	UID   int
}

// readHostProc reads /proc/<pid> of the host; ok is false if it is gone or a
// zombie.
func readHostProc(pid int) (hostProc, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return hostProc{}, false
	}
	s := string(b)
	i, j := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if i < 0 || j < i {
		return hostProc{}, false
	}
	f := strings.Fields(s[j+1:])
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return hostProc{}, false
	}
	start, _ := strconv.ParseUint(f[19], 10, 64)
	p := hostProc{Pid: pid, Start: start, Comm: s[i+1 : j], UID: -1}
	if st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status"); err == nil {
		for _, line := range strings.Split(string(st), "\n") {
			if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
				if f := strings.Fields(rest); len(f) > 0 {
					p.UID, _ = strconv.Atoi(f[0])
				}
			}
		}
	}
	return p, true
}

// pidnsProcs lists the live host processes in the pid namespace of pid.
func pidnsProcs(t *testing.T, pid int) []hostProc {
	t.Helper()
	if _, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/pid"); err != nil {
		t.Fatalf("pid namespace of %d: %v", pid, err)
	}
	return pidnsProcsErr(pid)
}

// stillAlive returns the processes of procs that still run.
func stillAlive(procs []hostProc) []hostProc {
	var left []hostProc
	for _, p := range procs {
		if now, ok := readHostProc(p.Pid); ok && now.Start == p.Start {
			left = append(left, now)
		}
	}
	return left
}

// eventually polls cond every 20 ms until it is true or timeout passes.
func eventually(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// hostVisible reports whether the driver's sandbox processes are host
// processes (container isolation), so host-side process checks apply.
func hostVisible(d driver.Driver) bool {
	return d.Capabilities().Isolation == driver.IsolationContainer
}
