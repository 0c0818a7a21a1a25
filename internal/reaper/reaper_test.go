package reaper

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// forkExec starts argv as a direct child that nobody else waits for.
func forkExec(t *testing.T, argv ...string) int {
	t.Helper()
	path, err := exec.LookPath(argv[0])
	if err != nil {
		t.Skipf("requires %s: %v", argv[0], err)
	}
	pid, err := syscall.ForkExec(path, argv, &syscall.ProcAttr{Env: []string{"PATH=/usr/bin:/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Kill(pid, unix.SIGKILL) }) // only if the test failed before it ended
	return pid
}

func waitDone(t *testing.T, p *Process) Exit {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("pid %d: watch not done", p.Pid())
	}
	e, ok := p.Exit()
	if !ok {
		t.Fatalf("pid %d: Exit not ok after Done", p.Pid())
	}
	return e
}

func zombieGone(t *testing.T, pid int) {
	t.Helper()
	// After a reap the pid has no /proc entry (or, rarely, a new process).
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err == nil && strings.Contains(string(st), ") Z ") {
		t.Fatalf("pid %d still a zombie", pid)
	}
}

func TestWatchChild(t *testing.T) {
	tests := []struct {
		name string
		argv []string
		kill bool
		want Exit
	}{
		{"exit_code", []string{"sh", "-c", "exit 3"}, false, Exit{Known: true, Code: 3}},
		{"exit_zero", []string{"true"}, false, Exit{Known: true}},
		{"killed", []string{"sleep", "100"}, true, Exit{Known: true, Signal: unix.SIGKILL}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pid := forkExec(t, tc.argv...)
			p, err := Watch(pid)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if tc.kill {
				if _, ok := p.Exit(); ok {
					t.Fatal("Exit ok while the process runs")
				}
				unix.Kill(pid, unix.SIGKILL)
			}
			if got := waitDone(t, p); got != tc.want {
				t.Fatalf("exit = %+v (%v), want %+v", got, got, tc.want)
			}
			zombieGone(t, pid)
		})
	}
}

func TestSignal(t *testing.T) {
	pid := forkExec(t, "sleep", "100")
	p, err := Watch(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Signal(unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if got := waitDone(t, p); got != (Exit{Known: true, Signal: unix.SIGTERM}) {
		t.Fatalf("exit = %+v, want SIGTERM", got)
	}
	if err := p.Signal(unix.SIGKILL); !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("Signal after exit = %v, want ErrProcessDone", err)
	}
}

func TestWatchGone(t *testing.T) {
	pid := forkExec(t, "true")
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, 0, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := Watch(pid); !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("Watch of a reaped pid: err = %v, want ErrProcessDone", err)
	}
}

func TestCloseBeforeExit(t *testing.T) {
	pid := forkExec(t, "sleep", "100")
	p, err := Watch(pid)
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	if _, ok := p.Exit(); ok {
		t.Fatal("Exit ok after Close of a live process")
	}
	if err := unix.Kill(pid, 0); err != nil {
		t.Fatalf("Close touched the process: %v", err)
	}
	unix.Kill(pid, unix.SIGKILL)
	var ws unix.WaitStatus
	unix.Wait4(pid, &ws, 0, nil)
}

// TestOrphan starts a shell that leaves a background child behind and exits,
// so the child is reparented: to us as a subreaper (status known, and we must
// reap it), or elsewhere without one (only its end is known).
func TestOrphan(t *testing.T) {
	tests := []struct {
		name      string
		subreaper bool
		want      Exit
	}{
		{"subreaper", true, Exit{Known: true, Code: 7}},
		{"no_subreaper", false, Exit{Known: false}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			was := Enabled()
			var v uintptr
			if tc.subreaper {
				v = 1
			}
			if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, v, 0, 0, 0); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				var w uintptr
				if was {
					w = 1
				}
				unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, w, 0, 0, 0)
			})
			if Enabled() != tc.subreaper {
				t.Fatalf("Enabled() = %v, want %v", Enabled(), tc.subreaper)
			}
			out, err := exec.Command("sh", "-c", "(sleep 0.3; exit 7) >/dev/null 2>&1 & echo $!").Output()
			if err != nil {
				t.Fatal(err)
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Kill(pid, unix.SIGKILL) })
			p, err := Watch(pid)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if got := waitDone(t, p); got != tc.want {
				t.Fatalf("exit = %+v, want %+v", got, tc.want)
			}
			if tc.subreaper {
				zombieGone(t, pid)
			}
		})
	}
}

func TestEnable(t *testing.T) {
	was := Enabled()
	t.Cleanup(func() {
		if !was {
			unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
		}
	})
	if err := Enable(); err != nil {
		t.Fatal(err)
	}
	if !Enabled() {
		t.Fatal("Enabled() = false after Enable")
	}
}

func TestExitString(t *testing.T) {
	tests := []struct {
		e    Exit
		want string
	}{
		{Exit{}, "exited (status unknown)"},
		{Exit{Known: true, Code: 2}, "exited with code 2"},
		{Exit{Known: true, Signal: unix.SIGKILL}, "killed by SIGKILL"},
	}
	for _, tc := range tests {
		if got := tc.e.String(); got != tc.want {
			t.Errorf("%+v.String() = %q, want %q", tc.e, got, tc.want)
		}
	}
}
