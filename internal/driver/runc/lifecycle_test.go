package runc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/drivertest"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/reaper"
	"github.com/airlockhq/airlock/internal/testutil"
)

// TestInitExitStatus: once the agent dies, Inspect says stopped and, with
// the daemon as subreaper, how it died.
func TestInitExitStatus(t *testing.T) {
	requireHost(t)
	tmpl := drivertest.BaseTemplate(t)
	d := newDriver(t, newHost(t))
	id := "sbx_exit" + strconv.Itoa(os.Getpid())
	drivertest.Started(t, d, driver.Spec{ID: id, Template: tmpl})
	ctx := context.Background()
	st, err := d.Inspect(ctx, id)
	if err != nil || st.State != driver.StateRunning || st.Pid == 0 {
		t.Fatalf("Inspect = %+v, %v", st, err)
	}
	if err := unix.Kill(st.Pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.Init(id).Done():
	case <-time.After(10 * time.Second):
		t.Fatal("init not reaped")
	}
	st, err = d.Inspect(ctx, id)
	if err != nil || st.State != driver.StateStopped || st.Pid != 0 {
		t.Fatalf("Inspect after kill = %+v, %v", st, err)
	}
	if st.ExitSignal != "SIGKILL" {
		t.Errorf("ExitSignal = %q, want SIGKILL", st.ExitSignal)
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := d.DialAgent(dctx, id); err == nil {
		t.Error("DialAgent to a dead sandbox succeeded")
	}
}

// TestWithoutSubreaper: without a subreaper the init is reparented to the
// host's PID 1; everything still works and Destroy leaves no process.
func TestWithoutSubreaper(t *testing.T) {
	requireHost(t)
	tmpl := drivertest.BaseTemplate(t)
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reaper.Enable() })
	d := newDriver(t, newHost(t))
	id := "sbx_noreaper" + strconv.Itoa(os.Getpid())
	c := drivertest.Started(t, d, driver.Spec{ID: id, Template: tmpl})
	if out := drivertest.Output(t, c, "echo ok"); out != "ok\n" {
		t.Fatalf("echo printed %q", out)
	}
	st, err := d.Inspect(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := d.Destroy(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	// The host's PID 1 (or another subreaper above us) reaps it in its own
	// time: a zombie is dead enough.
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(st.Pid) + "/stat")
		if err != nil || strings.Contains(string(b), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("init %d alive after Destroy: %s", st.Pid, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestJoinNetNS: a sandbox joins a network namespace the caller prepared.
func TestJoinNetNS(t *testing.T) {
	requireHost(t)
	ip := testutil.RequiresBinary(t, "ip")
	tmpl := drivertest.BaseTemplate(t)
	name := "airlock-runc-test-" + strconv.Itoa(os.Getpid())
	if out, err := exec.Command(ip, "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command(ip, "netns", "del", name).Run() })
	if out, err := exec.Command(ip, "-n", name, "link", "add", "airlockdummy0", "type", "veth", "peer", "name", "airlockdummy1").CombinedOutput(); err != nil {
		testutil.HostLacks(t, "no veth interfaces: %v: %s", err, out)
	}
	d := newDriver(t, newHost(t))
	c := drivertest.Started(t, d, driver.Spec{ID: "sbx_netns" + strconv.Itoa(os.Getpid()), Template: tmpl, NetNSPath: filepath.Join("/run/netns", name)})
	out := drivertest.Output(t, c, "cat /proc/net/dev; ls /sys/class/net")
	if strings.Count(out, "airlockdummy") != 4 {
		t.Fatalf("the sandbox does not see the namespace's interfaces in /proc and /sys:\n%s", out)
	}
	// /sys shows the joined namespace, not the host's interfaces.
	host, _ := os.ReadDir("/sys/class/net")
	for _, e := range host {
		if e.Name() != "lo" && strings.Contains(out, e.Name()+"\n") {
			t.Errorf("the sandbox sees host interface %s", e.Name())
		}
	}
}

// TestOwnNetNS: without NetNSPath a sandbox has loopback only, and it is up.
func TestOwnNetNS(t *testing.T) {
	requireHost(t)
	tmpl := drivertest.BaseTemplate(t)
	d := newDriver(t, newHost(t))
	c := drivertest.Started(t, d, driver.Spec{ID: "sbx_ownnet" + strconv.Itoa(os.Getpid()), Template: tmpl})
	out := drivertest.Output(t, c, "ls /sys/class/net; cat /sys/class/net/lo/operstate /sys/class/net/lo/flags")
	f := strings.Fields(out)
	if len(f) != 3 || f[0] != "lo" {
		t.Fatalf("interfaces: %q, want lo only", out)
	}
	if flags, _ := strconv.ParseUint(strings.TrimPrefix(f[2], "0x"), 16, 32); flags&unix.IFF_UP == 0 {
		t.Errorf("lo is down: flags %s", f[2])
	}
}

// TestSandboxHardening checks from inside what the spec promises: seccomp
// on, no new privileges, the capability set, masked /proc files, and only
// PATH in the agent's environment.
func TestSandboxHardening(t *testing.T) {
	requireHost(t)
	tmpl := drivertest.BaseTemplate(t)
	d := newDriver(t, newHost(t))
	t.Setenv("AIRLOCK_SECRET_TEST_VAR", "leak")
	c := drivertest.Started(t, d, driver.Spec{ID: "sbx_hard" + strconv.Itoa(os.Getpid()), Template: tmpl})
	status := drivertest.Output(t, c, "grep -E '^(Seccomp|NoNewPrivs|CapEff|CapBnd|CapAmb):' /proc/1/status")
	for _, want := range []string{"Seccomp:\t2", "NoNewPrivs:\t1", "CapEff:\t00000000200405fb", "CapBnd:\t00000000200405fb", "CapAmb:\t0000000000000000"} {
		if !strings.Contains(status, want) {
			t.Errorf("agent status lacks %q:\n%s", want, status)
		}
	}
	// runc adds HOME from the sandbox's passwd; nothing of the daemon's.
	// Read from the host: inside, the agent's environment is not readable.
	st, err := d.LoadState("sbx_hard" + strconv.Itoa(os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", st.Pid))
	if err != nil {
		t.Fatal(err)
	}
	env := strings.ReplaceAll(string(b), "\x00", "\n")
	if !strings.Contains(env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n") || strings.Contains(env, "AIRLOCK_SECRET_TEST_VAR") || len(strings.Fields(env)) > 2 {
		t.Errorf("agent environment %q, want PATH (and runc's HOME) only", env)
	}
	// Root inside cannot read or write the agent's memory, environment,
	// descriptors or binary: the agent is non-dumpable and its binary is
	// host root's, mode 0711. No CAP_SYS_PTRACE (bit 19) either, above.
	if out := drivertest.Output(t, c, "for p in /proc/1/mem /proc/1/environ /proc/1/maps /.airlock/airlock-agent; do "+
		"head -c1 $p >/dev/null 2>&1 && echo read:$p; done; ls /proc/1/fd >/dev/null 2>&1 && echo listed-fds; "+
		"readlink /proc/1/fd/0 /proc/1/exe >/dev/null 2>&1 && echo read-links; "+
		"python3 -c 'import os; os.open(\"/proc/1/mem\", os.O_RDWR)' 2>/dev/null && echo opened-mem; echo done"); out != "done\n" {
		t.Errorf("root inside reaches into the agent: %q", out)
	}
	var bin unix.Stat_t
	if err := unix.Stat(d.AgentPath(), &bin); err != nil || bin.Uid != 0 || bin.Mode&0o7777 != 0o711 {
		t.Errorf("agent binary %s: uid %d mode %o (%v), want host root's, 0711", d.AgentPath(), bin.Uid, bin.Mode&0o7777, err)
	}
	// What the non-dumpable agent does for its children still works: they
	// are dumpable again after execve (their own /proc is theirs), and a
	// PTY is their controlling terminal.
	// (Read once the child runs sleep: mid-execve its environment is empty.)
	if out := drivertest.Output(t, c, "sleep 30 & p=$!; i=0; while [ $i -lt 200 ] && [ \"$(readlink /proc/$p/exe 2>/dev/null)\" != /usr/bin/sleep ]; "+
		"do i=$((i+1)); sleep 0.01; done; tr '\\0' '\\n' < /proc/$p/environ | grep -q '^PATH=' && echo child-dumpable; kill $p"); out != "child-dumpable\n" {
		t.Errorf("an exec cannot read its sibling's /proc (children of the agent stay non-dumpable?): %q", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st2, err := c.Exec(ctx, agentproto.ExecRequest{ID: "ex_pty", Shell: "tty; stty size", User: "root", PTY: &agentproto.PTYSize{Cols: 91, Rows: 27}})
	if err != nil {
		t.Fatal(err)
	}
	var pty strings.Builder
	for {
		ev, err := st2.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		pty.Write(ev.Data)
	}
	if got := pty.String(); !strings.Contains(got, "/dev/pts/") || !strings.Contains(got, "27 91") {
		t.Errorf("PTY exec printed %q, want its terminal and size", got)
	}
	if kc := drivertest.Output(t, c, "wc -c < /proc/kcore; cat /proc/keys | wc -c"); strings.Fields(kc)[0] != "0" {
		t.Errorf("/proc/kcore readable: %q", kc)
	}
	// The denied syscalls fail: unshare(1) of a user namespace and mount.
	if out := drivertest.Output(t, c, "unshare -U true 2>&1; echo rc=$?; mount -t tmpfs x /mnt 2>&1; echo rc=$?"); strings.Count(out, "rc=0") != 0 {
		t.Errorf("unshare or mount worked:\n%s", out)
	}
	if out := drivertest.Output(t, c, "mknod /tmp/null c 1 3 2>&1; echo rc=$?"); !strings.Contains(out, "rc=1") {
		t.Errorf("mknod worked: %s", out)
	}
	// The device cgroup (v1) allows reading and writing the safe set only.
	if list := drivertest.Output(t, c, "cat /sys/fs/cgroup/devices/devices.list 2>/dev/null"); list != "" {
		t.Logf("devices.list:\n%s", list)
		for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
			f := strings.Fields(line) // type major:minor access
			if len(f) != 3 || !strings.ContainsAny(f[2], "rw") {
				continue
			}
			if f[0] != "c" || !safeDevice(f[1]) {
				t.Errorf("device rule %q allows access beyond the safe set", line)
			}
		}
	}
	// runc 1.1 always allows tun (10:200) in the device cgroup; without a
	// node (no CAP_MKNOD) and without CAP_NET_ADMIN it is unusable.
	if out := drivertest.Output(t, c, "ls /dev; test -e /dev/net/tun && echo tun-present"); strings.Contains(out, "tun-present") {
		t.Errorf("/dev/net/tun exists in the sandbox:\n%s", out)
	}
}

func TestProbeProblems(t *testing.T) {
	requireHost(t)
	tests := []struct {
		name  string
		cfg   Config
		state driver.HealthState
		desc  string
	}{
		{"no_runc", Config{RuncPath: "/nonexistent/runc", AgentPath: "/bin/true"}, driver.HealthUndetected, "runc not found"},
		{"no_agent", Config{AgentPath: "/nonexistent/airlock-agent"}, driver.HealthUnhealthy, "no agent binary"},
		{"healthy", Config{AgentPath: "/bin/true"}, driver.HealthHealthy, "runc 1."},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg = hostConfig(newHost(t), tc.cfg)
			tc.cfg.Logger = slog.New(slog.DiscardHandler)
			d, err := New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			h := d.Probe(context.Background())
			if h.State != tc.state || !strings.Contains(h.Description, tc.desc) {
				t.Fatalf("Probe = %+v, want %s with %q", h, tc.state, tc.desc)
			}
		})
	}
}

// safeDevice reports whether a devices.list major:minor is one of the
// standard safe devices (null, zero, full, random, urandom, tty, console,
// ptmx, pts) or tun, which runc 1.1 adds on its own (see the caller).
func safeDevice(mm string) bool {
	switch mm {
	case "1:3", "1:5", "1:7", "1:8", "1:9", "5:0", "5:1", "5:2", "136:*", "10:200":
		return true
	}
	return false
}

// TestDestroyAfterRestart: a driver that never recovered a running sandbox
// (the daemon restarted and the store says to delete it) destroys it from
// the data dir alone.
func TestDestroyAfterRestart(t *testing.T) {
	requireHost(t)
	tmpl := drivertest.BaseTemplate(t)
	h := newHost(t)
	d := newDriver(t, h)
	ctx := context.Background()
	id := "sbx_restart" + strconv.Itoa(os.Getpid())
	if _, err := d.Create(ctx, driver.Spec{ID: id, Template: tmpl}); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	st, err := d.Inspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	d2 := newDriver(t, h)
	if err := d2.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(st.Pid) + "/stat"); err == nil && !strings.Contains(string(b), ") Z ") {
		t.Fatalf("init alive after Destroy: %s", b)
	}
	if _, err := d2.Inspect(ctx, id); !errdefs.IsNotFound(err) {
		t.Errorf("Inspect after Destroy = %v", err)
	}
	if _, err := os.Stat(d2.Dir(id)); !os.IsNotExist(err) {
		t.Errorf("sandbox dir left: %v", err)
	}
}
