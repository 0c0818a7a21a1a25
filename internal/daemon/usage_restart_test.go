package daemon

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/hostcheck"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testutil"
)

// servedProc is one real `airlock serve` process started by a test.
type servedProc struct {
	cmd    *exec.Cmd
	logs   *syncBuffer
	done   chan error // receives Wait's result once
	exited bool       // done was received (only the test goroutine reads or sets it)
}

// startServe runs the built airlock binary on dataDir and waits until
// /healthz answers on addr.
func startServe(t *testing.T, bin, agent, dataDir, addr, key string, sampleS int) *servedProc {
	t.Helper()
	return startServeEnv(t, bin, agent, dataDir, addr, key, "AIRLOCK_SAMPLE_INTERVAL_S="+strconv.Itoa(sampleS), EnvNoNetwork+"=1")
}

// startServeEnv is startServe with the daemon's extra environment (e.g.
// EnvTestHostNetNS instead of EnvNoNetwork).
func startServeEnv(t *testing.T, bin, agent, dataDir, addr, key string, env ...string) *servedProc {
	t.Helper()
	cmd := exec.Command(bin, "serve", "--listen", addr, "--data-dir", dataDir, "--agent-path", agent,
		"--no-prepare", "--log-level", "info")
	cmd.Env = append(append(os.Environ(), "AIRLOCK_ADMIN_KEY="+key, "AIRLOCK_SHUTDOWN_TIMEOUT_S=5"), env...)
	p := &servedProc{cmd: cmd, logs: &syncBuffer{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- cmd.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-p.done:
			p.exited = true
			t.Fatalf("airlock serve exited: %v\n%s", err, p.logs.String())
		default:
		}
		if res, err := http.Get("http://" + addr + "/healthz"); err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return p
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.kill()
	t.Fatalf("airlock serve did not start\n%s", p.logs.String())
	return nil
}

// kill SIGKILLs exactly the process this test started, by PID, and reaps it.
func (p *servedProc) kill() {
	if p.exited {
		return
	}
	_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	p.exited = true
}

// term stops the process gracefully (SIGTERM by PID) and returns its exit.
func (p *servedProc) term() error {
	if p.exited {
		return nil
	}
	p.exited = true
	_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case err := <-p.done:
		return err
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL)
		return fmt.Errorf("serve did not stop on SIGTERM: %v", <-p.done)
	}
}

func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// restartDataDir makes a data dir for daemons that a test restarts on it:
// the shared cache's base template linked in, removed at the end, and a
// leak check of its sandboxes taken now (the caller asserts it once the
// last daemon is gone).
func restartDataDir(t *testing.T, ctx context.Context, prefix string) (string, hostcheck.Snapshot) {
	t.Helper()
	shared := filepath.Join(testutil.DataDir(), "templates")
	if _, err := template.NewStore(shared).EnsureBase(ctx, os.Stderr); err != nil {
		t.Fatalf("base template: %v", err)
	}
	dataDir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dataDir, 0o711)
	t.Cleanup(func() { os.RemoveAll(dataDir) })
	os.MkdirAll(filepath.Join(dataDir, "templates"), 0o700)
	if err := os.Symlink(filepath.Join(shared, "base"), filepath.Join(dataDir, "templates", "base")); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(dataDir, "sandboxes"), 0o711)
	return dataDir, hostcheck.Take(t, filepath.Join(dataDir, "sandboxes"))
}

// TestUsageSurvivesDaemonKill is issue #7 point 5: a daemon SIGKILLed
// mid-run and restarted on the same data dir neither loses nor double
// counts the running seconds of a sandbox that lived through it.
func TestUsageSurvivesDaemonKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real airlock serve processes and a runc sandbox")
	}
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "runc")
	agent, bin := buildBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	dataDir, leaks := restartDataDir(t, ctx, "airlock-usage-restart-")

	const (
		key     = "admin-key-for-the-usage-restart-test-42"
		sampleS = 1
		// tolerance covers the sampler's tick jitter and the time between
		// reading the clock here and the daemon's last sample.
		tolerance = 1.5
	)
	addr := freeLoopbackAddr(t)
	d1 := startServe(t, bin, agent, dataDir, addr, key, sampleS)
	var d2 *servedProc
	c, err := client.New("http://"+addr, key)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base"})
	if err != nil {
		d1.kill()
		t.Fatalf("create: %v\n%s", err, d1.logs.String())
	}
	t.Cleanup(func() {
		// Whatever failed, the sandbox goes and the daemon this test
		// started stops; then nothing of the sandbox may be left.
		if d2 == nil {
			d1.kill()
			d2 = startServe(t, bin, agent, dataDir, addr, key, sampleS)
		}
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		if err := c.DeleteSandbox(dctx, sb.ID); err != nil {
			t.Errorf("delete: %v", err)
		}
		if err := d2.term(); err != nil {
			t.Errorf("second daemon: %v", err)
		}
		if t.Failed() {
			t.Logf("second daemon log:\n%s", d2.logs.String())
		}
		reapAdopted(t)
		leaks.AssertNoLeaks(t)
	})

	time.Sleep(4 * time.Second)
	d1.kill()
	// Down for a while: this time is billed too (the sandbox kept
	// running), but only once, by the restarted daemon's first sample.
	time.Sleep(3 * time.Second)
	d2 = startServe(t, bin, agent, dataDir, addr, key, sampleS)
	time.Sleep(4 * time.Second)

	got, err := c.GetSandbox(ctx, sb.ID)
	if err != nil || got.State != api.StateRunning {
		t.Fatalf("sandbox after restart: %+v %v", got, err)
	}
	rep, err := c.Usage(ctx, client.UsageOptions{})
	wall := time.Since(sb.CreatedAt).Seconds()
	if err != nil {
		t.Fatal(err)
	}
	var running float64
	for _, g := range rep.Groups {
		if g.Key == sb.ID {
			running = g.RunningS
		}
	}
	// Accounted up to the last sample: at most one interval behind the
	// wall clock, never ahead of it.
	if running < wall-sampleS-tolerance || running > wall+tolerance {
		t.Fatalf("running_s = %.2f, wall since create = %.2f (interval %ds): lost or double counted", running, wall, sampleS)
	}
	if math.Abs(rep.Total.RunningS-running) > 1e-6 {
		t.Fatalf("total %.2f != the sandbox's %.2f", rep.Total.RunningS, running)
	}
	t.Logf("running_s %.2f over %.2f s of wall time", running, wall)
}

// reapAdopted reaps zombie children this test process inherited. An
// in-process daemon of an earlier test in this package made the test
// process a child subreaper, so the sandbox init that the SIGKILLed daemon
// had adopted was reparented here, not to host PID 1; once the restarted
// daemon destroyed the sandbox it is a zombie that only its parent (this
// process) can reap. Only zombies are waited for, by pid, so no exec.Cmd of
// the test loses its status.
func reapAdopted(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		adopted := 0
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
			if err != nil {
				continue
			}
			st := string(b)
			open, end := strings.IndexByte(st, '('), strings.LastIndexByte(st, ')')
			if open < 0 || end < open || end+4 > len(st) {
				continue
			}
			var state byte
			var ppid int
			if _, err := fmt.Sscanf(st[end+2:], "%c %d", &state, &ppid); err != nil || ppid != os.Getpid() {
				continue
			}
			if st[open+1:end] != "airlock-agent" {
				continue
			}
			adopted++
			if state == 'Z' {
				var ws syscall.WaitStatus
				_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
			}
		}
		if adopted == 0 || time.Now().After(deadline) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
