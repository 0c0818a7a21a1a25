package drivertest

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/hostcheck"
)

// Run runs the conformance suite against d, whose sandboxes start from tmpl.
// Cases that check limits and isolation run in parallel; the teardown case
// runs last, alone, so that its leak check sees only its own sandboxes.
//
// A case needs what it checks: a capability the driver declares (pause,
// disk quota, layer capture), a boundary around the sandbox (every driver
// but the tests' fake, whose Isolation is none: its sandboxes are
// processes of the host, where a fork bomb or a host-file probe would test
// the host, or harm it), or host processes to look at (container
// isolation). A case whose need the driver lacks is skipped with that
// reason; a driver that declares a capability it does not implement fails.
func Run(t *testing.T, d driver.Driver, tmpl driver.Template, opts ...Option) {
	o := options{teardownCount: 50, checkpointCycles: 20}
	for _, f := range opts {
		f(&o)
	}
	t.Run("Probe", func(t *testing.T) { testProbe(t, d) })
	t.Run("Contract", func(t *testing.T) { testContract(t, d, tmpl) })
	t.Run("Isolation", func(t *testing.T) {
		cases := []struct {
			name string
			f    func(*testing.T, driver.Driver, driver.Template)
			// boundary says the case needs one (see Run).
			boundary bool
		}{
			{"ForkBomb", testForkBomb, true},
			{"MemoryBomb", testMemoryBomb, true},
			{"OutputFlood", testOutputFlood, false},
			{"DiskFill", testDiskFill, true},
			// Its check lists the sandbox's /proc: the host's, without
			// a boundary.
			{"TimeoutTree", testTimeoutTree, true},
			{"BackgroundDies", testBackgroundDies, true},
			{"HostFiles", testHostFiles, true},
			{"CrossSandbox", testCrossSandbox, true},
			{"Users", testUsers, true},
			// Without a boundary there is nothing to freeze.
			{"PauseResume", testPauseResume, true},
			{"StopStart", testStopStart, false},
			{"TarIn", testTarIn, false},
			{"LayerCapture", testLayerCapture, false},
			{"PausedLayer", testPausedLayer, false},
			{"Checkpoint", testCheckpoint, false},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				if tc.boundary {
					requireBoundary(t, d)
				}
				tc.f(t, d, tmpl)
			})
		}
	})
	// The quota's enforcement is read from the kernel's counters, which
	// other work on the host cannot make it look wrong; it runs after the
	// parallel cases only to keep their load off its sandbox.
	t.Run("CPUQuota", func(t *testing.T) {
		requireBoundary(t, d)
		testCPUQuota(t, d, tmpl)
	})
	t.Run("Recover", func(t *testing.T) {
		if o.reopen == nil {
			t.Skip("driver gave no WithReopen")
		}
		testRecover(t, d, tmpl, o.reopen)
	})
	t.Run("Teardown", func(t *testing.T) { testTeardown(t, d, tmpl, o) })
	t.Run("CheckpointCycles", func(t *testing.T) { testCheckpointCycles(t, d, tmpl, o, o.checkpointCycles) })
}

// requireBoundary skips t for a driver without any isolation boundary.
func requireBoundary(t *testing.T, d driver.Driver) {
	t.Helper()
	if !bounded(d) {
		t.Skip("the driver puts no boundary around a sandbox (isolation none): the case would run on the host")
	}
}

// optional returns d as the optional interface T that its capability
// (Capabilities field name, declared) stands for: it skips t when the
// driver declares no such capability and fails it when the driver declares
// one it does not implement.
func optional[T any](t *testing.T, d driver.Driver, declared bool, name string) T {
	t.Helper()
	v, ok := d.(T)
	switch {
	case !declared:
		t.Skipf("the driver declares no %s (Capabilities.%s)", strings.ToLower(name), name)
	case !ok:
		t.Fatalf("the driver declares Capabilities.%s but implements no %T", name, (*T)(nil))
	}
	return v
}

// bounded reports whether d isolates its sandboxes at all.
func bounded(d driver.Driver) bool { return d.Capabilities().Isolation != driver.IsolationNone }

func testProbe(t *testing.T, d driver.Driver) {
	h := d.Probe(ctxT(t))
	if h.State != driver.HealthHealthy {
		t.Fatalf("Probe = %+v, want healthy", h)
	}
	if h.Description == "" {
		t.Error("Probe gave no description")
	}
}

// testContract checks the error classes of the lifecycle calls.
func testContract(t *testing.T, d driver.Driver, tmpl driver.Template) {
	ctx := ctxT(t)
	unknown := newID("sbx_none")
	if err := d.Destroy(ctx, unknown); err != nil {
		t.Errorf("Destroy of an unknown id = %v, want nil", err)
	}
	if _, err := d.Inspect(ctx, unknown); !errdefs.IsNotFound(err) {
		t.Errorf("Inspect of an unknown id = %v, want not found", err)
	}
	if err := d.Recover(ctx, &driver.Handle{ID: unknown, Driver: d.Name()}); !errdefs.IsNotFound(err) {
		t.Errorf("Recover of an unknown id = %v, want not found", err)
	}
	if _, err := d.Create(ctx, driver.Spec{ID: "../escape", Template: tmpl}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Create with id ../escape = %v, want invalid argument", err)
	}
	spec := driver.Spec{ID: newID("sbx_c"), Template: tmpl}
	h, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { d.Destroy(context.Background(), spec.ID) })
	if h.ID != spec.ID || h.Driver != d.Name() {
		t.Errorf("handle = %+v", h)
	}
	if _, err := d.Create(ctx, spec); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("second Create = %v, want already exists", err)
	}
	st, err := d.Inspect(ctx, spec.ID)
	if err != nil || st.State != driver.StateCreated {
		t.Errorf("Inspect before Start = %+v, %v; want created", st, err)
	}
	if err := d.Destroy(ctx, spec.ID); err != nil {
		t.Fatalf("Destroy of a created sandbox: %v", err)
	}
	if err := d.Destroy(ctx, spec.ID); err != nil {
		t.Fatalf("second Destroy: %v", err)
	}
	if _, err := d.Inspect(ctx, spec.ID); !errdefs.IsNotFound(err) {
		t.Errorf("Inspect after Destroy = %v, want not found", err)
	}
}

// agentTasks bounds the tasks (threads count) of an idle agent: far below
// every fork bomb's limit, so what remains above it is the bomb's.
const agentTasks = 24

// testForkBomb: a fork bomb hits the PID limit, never the host's, and the
// sandbox still answers once it is killed.
func testForkBomb(t *testing.T, d driver.Driver, tmpl driver.Template) {
	const limit = 64
	s := create(t, d, tmpl, driver.Resources{PIDs: limit})
	stater, _ := d.(driver.Stater)
	// Under gVisor the host sees the runtime's threads and stubs, not the
	// sandbox's processes: the host task count says nothing of the limit
	// there (the Sentry enforces it, see internal/driver/gvisor), so only
	// the outcome is checked: the bomb is stopped, the sandbox lives.
	if !hostVisible(d) {
		stater = nil
	}
	done := make(chan result, 1)
	go func() {
		// The classic bomb, then a loop that keeps every task it gets so
		// the limit stays pressed until the timeout kills the tree (bash
		// retries a failed fork where dash would give up and exit).
		r, err := s.run(ctxT(t), agentproto.ExecRequest{
			Argv:      []string{"bash", "-c", `f() { f | f & }; f; while :; do sleep 1000 & done`},
			TimeoutMS: 4000,
		})
		if err != nil {
			r.Error = err.Error()
		}
		done <- r
	}()
	var peak uint64
	var r result
wait:
	for {
		select {
		case r = <-done:
			break wait
		case <-time.After(50 * time.Millisecond):
			if stater != nil {
				if st, err := stater.Stats(ctxT(t), s.id); err == nil && st.PIDs > peak {
					peak = st.PIDs
				}
			}
		}
	}
	switch {
	case !hostVisible(d) && strings.Contains(r.Error, errNoExit.Error()):
		// gVisor's ptrace platform backs every sandbox process with host
		// stub tasks under the sandbox's host pids limit: a bomb that
		// exhausts it takes down the sandbox's own Sentry (contained:
		// the host and neighbours keep their tasks). It must then be
		// startable again.
		t.Logf("fork bomb ended the sandbox's user-space kernel: %s", r.Error)
		if st, err := d.Inspect(ctxT(t), s.id); err != nil || st.State == driver.StateRunning {
			t.Fatalf("Inspect after the sandbox's end = %+v, %v", st, err)
		}
		if err := d.Start(ctxT(t), s.id); err != nil {
			t.Fatalf("Start after the fork bomb: %v", err)
		}
		s.connect(t, d)
	case r.Status != agentproto.StatusTimeout:
		t.Errorf("fork bomb: %v, want status timeout", r)
	}
	if stater != nil {
		t.Logf("fork bomb peaked at %d tasks (limit %d)", peak, limit)
		if peak > limit {
			t.Errorf("sandbox ran %d tasks, limit %d", peak, limit)
		}
		if peak < limit/2 {
			t.Errorf("fork bomb peaked at %d tasks: it never pressed the limit of %d", peak, limit)
		}
	}
	s.alive(t)
	if !hostVisible(d) {
		// The bomb's processes are gone from the sandbox's own view.
		var out string
		if !eventually(10*time.Second, func() bool {
			out = s.mustSh(t, "root", `ls -d /proc/[0-9]* | wc -l`)
			n, err := strconv.Atoi(strings.TrimSpace(out))
			return err == nil && n < 10
		}) {
			t.Errorf("%s processes left in the sandbox after the fork bomb ended", strings.TrimSpace(out))
		}
	}
	if stater != nil {
		// The bomb's processes are gone, not just throttled.
		var n uint64
		if !eventually(10*time.Second, func() bool {
			st, err := stater.Stats(ctxT(t), s.id)
			n = st.PIDs
			// What stays is the agent: its own threads (it keeps about
			// a dozen idle, see cmd/airlock-agent) and nothing of the bomb.
			return err == nil && st.PIDs < agentTasks
		}) {
			t.Errorf("%d tasks left after the fork bomb ended", n)
		}
	}
}

// testMemoryBomb: allocating past the memory limit gets the process OOM
// killed, reported as status oom and counted by Inspect and Stats.
func testMemoryBomb(t *testing.T, d driver.Driver, tmpl driver.Template) {
	s := create(t, d, tmpl, driver.Resources{MemoryMB: 128})
	r, err := s.run(ctxT(t), agentproto.ExecRequest{
		Argv:      []string{"python3", "-c", "x = []\nwhile True:\n    x.append(b'x' * (8 << 20))"},
		TimeoutMS: 60_000,
	})
	// A user-space kernel (gVisor) holds every process's memory in its
	// own host processes, so the host's OOM killer, which alone enforces
	// the cgroup limit, ends the whole sandbox rather than the bomb: the
	// exec's stream ends with it. The kill is still counted, the limit
	// still held, and the sandbox can be started again.
	userspace := d.Capabilities().Isolation == driver.IsolationUserspaceKernel
	switch {
	case userspace && errors.Is(err, errNoExit):
	case err != nil:
		t.Fatal(err)
	case r.Status != agentproto.StatusOOM:
		t.Errorf("memory bomb: %v, want status oom", r)
	}
	st, err := d.Inspect(ctxT(t), s.id)
	if err != nil {
		t.Fatal(err)
	}
	if st.OOMKills < 1 {
		t.Errorf("Inspect OOMKills = %d after an OOM kill", st.OOMKills)
	}

	if stater, ok := d.(driver.Stater); ok {
		ss, err := stater.Stats(ctxT(t), s.id)
		if err != nil {
			t.Fatal(err)
		}
		if ss.OOMKills < 1 {
			t.Errorf("Stats OOMKills = %d after an OOM kill", ss.OOMKills)
		}
		if ss.MemoryPeakBytes > 0 && ss.MemoryPeakBytes > 129<<20 {
			t.Errorf("memory peak %d above the 128 MiB limit", ss.MemoryPeakBytes)
		}
	}
	if userspace && st.State != driver.StateRunning {
		if err := d.Start(ctxT(t), s.id); err != nil {
			t.Fatalf("Start after the sandbox's OOM kill: %v", err)
		}
		s.connect(t, d)
	}
	s.alive(t)
}

// testCPUQuota: a sandbox limited to half a CPU, running two busy loops
// (which could use two), is held to its quota. It asserts what the limit
// guarantees, read from the host cgroup that enforces it: the quota is set,
// the kernel throttled the group, and the group never used more than the
// quota over the whole measurement. Never a share of the host's CPU: on a
// host that other work keeps busy the sandbox may get less than its quota
// (a run of the whole suite once measured 0.19 of a CPU), and that is not a
// fault of the limit.
func testCPUQuota(t *testing.T, d driver.Driver, tmpl driver.Template) {
	s := create(t, d, tmpl, driver.Resources{CPU: 0.5})
	// Under gVisor the pid Inspect reports is the Sentry's, in the same
	// cgroup as everything the sandbox runs.
	g, quota := quotaGroup(t, s.initPid(t))
	if quota < 0.49 || quota > 0.51 {
		t.Fatalf("CPU quota %.2f of a CPU on %s, want 0.5", quota, g.dir)
	}
	before, start := g.stat(t), time.Now()
	// In the background, so that the group is sampled while it runs; the
	// loops end by themselves, and with the sandbox.
	s.mustSh(t, "", `for i in 1 2; do nohup timeout 120 sh -c 'while :; do :; done' >/dev/null 2>&1 & done`)
	// Run until the kernel has throttled the group in a few periods: on a
	// quiet host that is the first few hundred ms; on a busy one the loops
	// reach the quota in a period less often, but they do.
	var after cpuStat
	if !eventually(90*time.Second, func() bool {
		after = g.stat(t)
		return after.throttled >= before.throttled+5 && time.Since(start) > time.Second
	}) {
		t.Errorf("the group was throttled in %d of %d periods: the quota is not enforced", after.throttled-before.throttled, after.periods-before.periods)
	}
	wall := time.Since(start)
	used := after.usage - before.usage
	t.Logf("%v of CPU over %v (%.2f of a CPU), throttled in %d of %d periods", used.Round(time.Millisecond), wall.Round(time.Millisecond),
		used.Seconds()/wall.Seconds(), after.throttled-before.throttled, after.periods-before.periods)
	// What the quota guarantees: at most quota × wall time, give or take
	// the period the first sample fell into and the kernel's overrun of
	// each period (a tick per CPU before the throttle lands: 0.54 of a CPU
	// measured here for 0.5), a quarter of the quota at most. Unthrottled,
	// the two loops would use 2.
	const period = 100 * time.Millisecond
	if limit := time.Duration(1.25*quota*float64(wall)) + period; used > limit {
		t.Errorf("the group used %v of CPU in %v, more than its quota allows (%v)", used, wall, limit)
	}
}

// testOutputFlood: output past the cap is dropped, the exec is marked
// truncated and still ends normally.
func testOutputFlood(t *testing.T, d driver.Driver, tmpl driver.Template) {
	s := create(t, d, tmpl, driver.Resources{})
	const total, limit = 20_000_000, 1 << 20
	start := time.Now()
	r := s.exec(t, agentproto.ExecRequest{Argv: []string{"head", "-c", strconv.Itoa(total), "/dev/zero"}, MaxOutputBytes: limit, TimeoutMS: 60_000})
	// Past the cap a follower gets paced samples of the tail: the cap
	// plus at most FollowRate for the time it ran, never the flood.
	if bound := int64(limit) + int64(time.Since(start).Seconds()*agentproto.FollowRate) + agentproto.DataChunk; r.Streamed > bound {
		t.Errorf("the agent streamed %d bytes of a %d-byte flood, more than the cap and its pace allow (%d)", r.Streamed, total, bound)
	}
	if r.Status != agentproto.StatusExited || r.ExitCode != 0 {
		t.Fatalf("flood: %v", r)
	}
	if !r.Truncated {
		t.Error("flood not marked truncated")
	}
	if len(r.Stdout) > limit || len(r.Stdout) == 0 {
		t.Errorf("got %d bytes of output, cap %d", len(r.Stdout), limit)
	}
	if r.StdoutBytes != total {
		t.Errorf("StdoutBytes = %d, want %d", r.StdoutBytes, total)
	}
	s.alive(t)
}

// testDiskFill: filling the writable layer gives ENOSPC, not a host problem;
// the sandbox keeps working, a file write through the agent fails with the
// quota class, and deleting frees the space.
func testDiskFill(t *testing.T, d driver.Driver, tmpl driver.Template) {
	if !d.Capabilities().DiskQuota {
		t.Skip("driver enforces no disk quota")
	}
	s := create(t, d, tmpl, driver.Resources{DiskMB: 64})
	r := s.sh(t, "", "dd if=/dev/zero of=/home/user/fill bs=1M count=1000")
	if r.Status != agentproto.StatusExited || r.ExitCode == 0 {
		t.Fatalf("dd past the quota: %v", r)
	}
	if !strings.Contains(r.Stderr, "No space left on device") {
		t.Errorf("dd stderr %q, want ENOSPC", r.Stderr)
	}
	s.alive(t)
	ctx := ctxT(t)
	_, err := s.c.WriteFile(ctx, "/home/user/more", "", 0o644, bytes.NewReader(make([]byte, 8<<20)), 0)
	if !errors.Is(err, errdefs.ErrQuotaExceeded) {
		t.Errorf("WriteFile on a full disk = %v, want quota exceeded", err)
	}
	if err := s.c.Remove(ctx, "/home/user/fill", "", false); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if _, err := s.c.WriteFile(ctx, "/home/user/more", "", 0o644, bytes.NewReader(make([]byte, 8<<20)), 0); err != nil {
		t.Errorf("WriteFile after freeing space: %v", err)
	}
}

// testTimeoutTree: a timed-out exec whose processes ignore SIGTERM still
// ends, with every process of its tree.
func testTimeoutTree(t *testing.T, d driver.Driver, tmpl driver.Template) {
	s := create(t, d, tmpl, driver.Resources{})
	start := time.Now()
	r := s.exec(t, agentproto.ExecRequest{
		Shell:     `trap '' TERM; sh -c "trap '' TERM; sleep 1001" & sh -c "trap '' TERM; sleep 1002 & wait" & sleep 1003`,
		TimeoutMS: 1000,
	})
	if r.Status != agentproto.StatusTimeout {
		t.Errorf("exec: %v, want status timeout", r)
	}
	if el := time.Since(start); el > 30*time.Second {
		t.Errorf("timed-out exec took %v to end", el)
	}
	out := s.mustSh(t, "root", `for p in /proc/[0-9]*; do cat $p/cmdline 2>/dev/null | tr '\0' ' '; echo; done`)
	for _, n := range []string{"sleep 1001", "sleep 1002", "sleep 1003"} {
		if strings.Contains(out, n) {
			t.Errorf("%q survived the timeout:\n%s", n, out)
		}
	}
}

// testBackgroundDies: processes left running by an exec (nohup, a setsid
// double-forked daemon) die with the sandbox.
func testBackgroundDies(t *testing.T, d driver.Driver, tmpl driver.Template) {
	if !hostVisible(d) {
		t.Skip("sandbox processes are not host processes")
	}
	s := create(t, d, tmpl, driver.Resources{})
	s.mustSh(t, "", `nohup sleep 1001 >/dev/null 2>&1 &
setsid sh -c 'setsid sleep 1002 >/dev/null 2>&1 < /dev/null & ' >/dev/null 2>&1 < /dev/null
true`)
	init := s.initPid(t)
	var procs []hostProc
	if !eventually(10*time.Second, func() bool {
		procs = pidnsProcs(t, init)
		n := 0
		for _, p := range procs {
			if p.Comm == "sleep" {
				n++
			}
		}
		return n == 2
	}) {
		t.Fatalf("want 2 background sleeps on the host, sandbox has %+v", procs)
	}
	s.destroy(t)
	if left := stillAlive(procs); !eventually(5*time.Second, func() bool { left = stillAlive(procs); return len(left) == 0 }) {
		t.Fatalf("processes alive after Destroy: %+v", left)
	}
}

// testHostFiles: nothing outside the sandbox root is reachable, by path, via
// /proc, via symlinks made inside, via the agent's file operations or via a
// tar-slip archive.
func testHostFiles(t *testing.T, d driver.Driver, tmpl driver.Template) {
	secret := token()
	hostDir, err := os.MkdirTemp("", "airlock-hostfile-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(hostDir) })
	// World-readable on purpose: only the sandbox boundary may keep it out.
	os.Chmod(hostDir, 0o777)
	marker := filepath.Join(hostDir, "marker")
	if err := os.WriteFile(marker, []byte(secret), 0o644); err != nil {
		t.Fatal(err)
	}
	s := create(t, d, tmpl, driver.Resources{})
	var seen strings.Builder
	for _, user := range []string{"user", "root"} {
		for _, cmd := range []string{
			"cat " + marker,
			"cat /proc/1/root" + marker,
			"cat /proc/*/root" + marker,
			"cat /proc/self/cwd/../../../../../.." + marker,
			"ln -sf " + marker + " /tmp/l-" + user + "; cat /tmp/l-" + user,
			"ln -sfn " + hostDir + " /tmp/d-" + user + "; cat /tmp/d-" + user + "/marker",
			"cat /.airlock/run/../../../../.." + marker,
		} {
			r := s.sh(t, user, cmd)
			seen.WriteString(r.Stdout + r.Stderr)
		}
	}
	// /etc/shadow inside is the template's, never the host's.
	if hostShadow, err := os.ReadFile("/etc/shadow"); err == nil {
		r := s.sh(t, "root", "cat /etc/shadow")
		if sha256.Sum256([]byte(r.Stdout)) == sha256.Sum256(hostShadow) {
			t.Error("the sandbox reads the host's /etc/shadow")
		}
	}
	ctx := ctxT(t)
	s.mustSh(t, "", "ln -sfn "+hostDir+" /home/user/hostdir; ln -sf "+marker+" /home/user/hostmarker")
	for _, p := range []string{
		marker, "/tmp/../../../../.." + marker, "/home/user/hostdir/marker", "/home/user/hostmarker",
		"/proc/1/root" + marker,
	} {
		for _, user := range []string{"", "root"} {
			rc, _, err := s.c.ReadFile(ctx, p, user)
			if err != nil {
				continue
			}
			b, _ := io.ReadAll(rc)
			rc.Close()
			seen.Write(b)
		}
	}
	// The agent writes through paths that point outside: nothing may land
	// on the host.
	for _, p := range []string{"/home/user/hostdir/written", filepath.Join(hostDir, "written2")} {
		s.c.WriteFile(ctx, p, "root", 0o644, strings.NewReader(secret), 0)
	}
	// A tar-slip archive: parent escapes, an absolute name, and a symlink
	// the archive itself makes and then writes through.
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "../../../../../../../../" + hostDir + "/slip1", Mode: 0o644, Size: int64(len(secret)), Typeflag: tar.TypeReg},
		{Name: hostDir + "/slip2", Mode: 0o644, Size: int64(len(secret)), Typeflag: tar.TypeReg},
		{Name: "lnk", Linkname: hostDir, Typeflag: tar.TypeSymlink},
		{Name: "lnk/slip3", Mode: 0o644, Size: int64(len(secret)), Typeflag: tar.TypeReg},
		{Name: "hard", Linkname: marker, Typeflag: tar.TypeLink},
	} {
		tw.WriteHeader(h)
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(secret))
		}
	}
	tw.Close()
	for _, user := range []string{"", "root"} {
		s.c.TarIn(ctx, "/tmp/untar-"+user, user, bytes.NewReader(buf.Bytes()))
	}
	r := s.sh(t, "root", "cat /tmp/untar-*/hard /tmp/untar-*/lnk/* 2>&1")
	seen.WriteString(r.Stdout)

	if strings.Contains(seen.String(), secret) {
		t.Error("a host file's content was read from inside the sandbox")
	}
	ents, _ := os.ReadDir(hostDir)
	if len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("the sandbox wrote into a host directory: %v", names)
	}
	if b, _ := os.ReadFile(marker); string(b) != secret {
		t.Error("the host marker file was changed")
	}
}

// testCrossSandbox: two sandboxes see neither each other's processes nor
// files.
func testCrossSandbox(t *testing.T, d driver.Driver, tmpl driver.Template) {
	a := create(t, d, tmpl, driver.Resources{})
	b := create(t, d, tmpl, driver.Resources{})
	secret := token()
	a.mustSh(t, "", "echo "+secret+" > /tmp/a-file; nohup sleep 1777 >/dev/null 2>&1 &")
	// The listing shell's own command line must not name what it looks
	// for, so the names are built at run time.
	r := b.sh(t, "root", `for p in /proc/[0-9]*; do cat $p/cmdline 2>/dev/null | tr '\0' ' '; echo; done; cat /proc/*/root/tmp/a-fi""le /tmp/a-fi""le 2>/dev/null; ls /tmp`)
	if strings.Contains(r.Stdout, "sleep 1777") {
		t.Error("sandbox B sees sandbox A's process")
	}
	if strings.Contains(r.Stdout, secret) || strings.Contains(r.Stdout, "a-file") {
		t.Errorf("sandbox B sees sandbox A's file: %q", r.Stdout)
	}
	if out := a.mustSh(t, "", "cat /tmp/a-file"); strings.TrimSpace(out) != secret {
		t.Errorf("sandbox A lost its own file: %q", out)
	}
	if _, _, err := b.c.ReadFile(ctxT(t), "/tmp/a-file", "root"); !errdefs.IsNotFound(err) {
		t.Errorf("ReadFile of A's file in B = %v, want not found", err)
	}
	if hostVisible(d) {
		pa, pb := a.initPid(t), b.initPid(t)
		na, _ := os.Readlink("/proc/" + strconv.Itoa(pa) + "/ns/pid")
		nb, _ := os.Readlink("/proc/" + strconv.Itoa(pb) + "/ns/pid")
		if na == nb {
			t.Errorf("both sandboxes share the pid namespace %s", na)
		}
	}
}

// testUsers: the default user is `user` (uid 1000, home /home/user); root
// inside is not root on the host.
func testUsers(t *testing.T, d driver.Driver, tmpl driver.Template) {
	s := create(t, d, tmpl, driver.Resources{})
	out := s.mustSh(t, "", `id -u; id -g; id -un; echo "$HOME"; pwd`)
	if want := "1000\n1000\nuser\n/home/user\n/home/user\n"; out != want {
		t.Errorf("default user: got %q, want %q", out, want)
	}
	if out := s.mustSh(t, "root", "id -u"); strings.TrimSpace(out) != "0" {
		t.Errorf("root: id -u = %q", out)
	}
	if out := s.mustSh(t, "", "cat /proc/sys/kernel/hostname"); strings.TrimSpace(out) != s.spec.Hostname {
		t.Errorf("hostname %q, want %q", out, s.spec.Hostname)
	}
	if !hostVisible(d) {
		return
	}
	init := s.initPid(t)
	ip, ok := readHostProc(init)
	if !ok {
		t.Fatal("init is gone")
	}
	if ip.UID <= 0 {
		t.Fatalf("init runs as host uid %d: root inside is root outside", ip.UID)
	}
	umap, err := os.ReadFile("/proc/" + strconv.Itoa(init) + "/uid_map")
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Fields(string(umap)); len(f) < 3 || f[0] != "0" || f[1] != strconv.Itoa(ip.UID) {
		t.Errorf("uid_map %q does not map 0 to the init's host uid %d", umap, ip.UID)
	}
	// A process of `user` is host uid base+1000, and a root one base.
	s.mustSh(t, "", "nohup sleep 1501 >/dev/null 2>&1 &")
	s.mustSh(t, "root", "nohup sleep 1502 >/dev/null 2>&1 &")
	var procs []hostProc
	eventually(10*time.Second, func() bool {
		procs = pidnsProcs(t, init)
		n := 0
		for _, p := range procs {
			if p.Comm == "sleep" {
				n++
			}
		}
		return n == 2
	})
	var uids []int
	for _, p := range procs {
		if p.Comm == "sleep" {
			uids = append(uids, p.UID)
		}
	}
	if len(uids) != 2 || !((uids[0] == ip.UID+1000 && uids[1] == ip.UID) || (uids[1] == ip.UID+1000 && uids[0] == ip.UID)) {
		t.Errorf("sleep host uids %v, want %d and %d", uids, ip.UID, ip.UID+1000)
	}
}

// testPauseResume: a paused sandbox does not run (a clock loop shows a gap
// as long as the pause) and runs again after Resume.
func testPauseResume(t *testing.T, d driver.Driver, tmpl driver.Template) {
	p := optional[driver.Pauser](t, d, d.Capabilities().Pause, "Pause")
	s := create(t, d, tmpl, driver.Resources{})
	ctx := ctxT(t)
	id := newID("ex_")
	st, err := s.c.Exec(ctx, agentproto.ExecRequest{ID: id, Shell: `while :; do date +%s%N; sleep 0.05; done`, TimeoutMS: 60_000})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var mu sync.Mutex
	var stamps []int64
	var partial string
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		for {
			ev, err := st.Next()
			if err != nil {
				return
			}
			if ev.Type != agentproto.EventOutput {
				continue
			}
			mu.Lock()
			partial += string(ev.Data)
			for {
				line, rest, ok := strings.Cut(partial, "\n")
				if !ok {
					break
				}
				partial = rest
				if n, err := strconv.ParseInt(line, 10, 64); err == nil {
					stamps = append(stamps, n)
				}
			}
			mu.Unlock()
		}
	}()
	time.Sleep(700 * time.Millisecond)
	const pause = 1500 * time.Millisecond
	if err := p.Pause(ctx, s.id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if ss, err := d.Inspect(ctx, s.id); err != nil || ss.State != driver.StatePaused {
		t.Errorf("Inspect while paused = %+v, %v", ss, err)
	}
	time.Sleep(pause)
	if err := p.Resume(ctx, s.id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if ss, err := d.Inspect(ctx, s.id); err != nil || ss.State != driver.StateRunning {
		t.Errorf("Inspect after resume = %+v, %v", ss, err)
	}
	time.Sleep(700 * time.Millisecond)
	if err := s.c.Signal(ctx, id, "SIGKILL"); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	<-readDone
	mu.Lock()
	defer mu.Unlock()
	// How many lines a busy host lets the loop print is not the point
	// (a floor of 10 once was); the gap across the pause is.
	if len(stamps) < 2 {
		t.Fatalf("only %d clock lines", len(stamps))
	}
	var maxGap int64
	for i := 1; i < len(stamps); i++ {
		maxGap = max(maxGap, stamps[i]-stamps[i-1])
	}
	if time.Duration(maxGap) < pause*8/10 {
		t.Errorf("longest gap between clock lines %v: the loop ran while paused %v", time.Duration(maxGap), pause)
	}
	s.alive(t)

	// A paused sandbox can be destroyed, processes and all.
	s.mustSh(t, "", "nohup sleep 1000 >/dev/null 2>&1 &")
	var procs []hostProc
	if hostVisible(d) {
		procs = pidnsProcs(t, s.initPid(t))
	}
	if err := p.Pause(ctx, s.id); err != nil {
		t.Fatalf("second Pause: %v", err)
	}
	s.destroy(t)
	if !eventually(5*time.Second, func() bool { return len(stillAlive(procs)) == 0 }) {
		t.Errorf("processes alive after Destroy of a paused sandbox: %+v", stillAlive(procs))
	}
}

// testStopStart: Stop ends every process (one that ignores SIGTERM too) and
// keeps the storage; Start runs the sandbox again.
func testStopStart(t *testing.T, d driver.Driver, tmpl driver.Template) {
	s := create(t, d, tmpl, driver.Resources{})
	secret := token()
	s.writeFile(t, "/home/user/kept", secret)
	if bounded(d) {
		s.mustSh(t, "", "nohup sh -c \"trap '' TERM; sleep 1000\" >/dev/null 2>&1 &")
	}
	ctx := ctxT(t)
	var procs []hostProc
	if hostVisible(d) {
		procs = pidnsProcs(t, s.initPid(t))
	}
	s.c.Close()
	if err := d.Stop(ctx, s.id, 2*time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	st, err := d.Inspect(ctx, s.id)
	if err != nil || st.State != driver.StateStopped {
		t.Errorf("Inspect after Stop = %+v, %v; want stopped", st, err)
	}
	if left := stillAlive(procs); len(left) > 0 {
		t.Errorf("processes alive after Stop: %+v", left)
	}
	s.start(t)
	if got := s.readFile(t, "/home/user/kept"); got != secret {
		t.Errorf("file after Stop/Start = %q, want %q", got, secret)
	}
}

// testRecover: a new driver instance re-adopts a running sandbox (exec
// works through it), and reports one whose init died as not found, which
// Destroy then cleans.
func testRecover(t *testing.T, d driver.Driver, tmpl driver.Template, reopen func(*testing.T) driver.Driver) {
	live := create(t, d, tmpl, driver.Resources{})
	dead := create(t, d, tmpl, driver.Resources{})
	live.writeFile(t, "/tmp/f", "before")
	var deadProcs []hostProc
	if hostVisible(d) {
		pid := dead.initPid(t)
		deadProcs = pidnsProcs(t, pid)
		// The sandbox's init is a process this test started (through
		// the driver): kill it by pid, as a crash would.
		if err := killPid(pid); err != nil {
			t.Fatal(err)
		}
		if !eventually(10*time.Second, func() bool { return len(stillAlive(deadProcs)) == 0 }) {
			t.Fatalf("sandbox processes survive their init: %+v", stillAlive(deadProcs))
		}
	}
	d2 := reopen(t)
	ctx := ctxT(t)
	if err := d2.Recover(ctx, live.h); err != nil {
		t.Fatalf("Recover of a running sandbox: %v", err)
	}
	live.connect(t, d2)
	if got := live.readFile(t, "/tmp/f"); got != "before" {
		t.Errorf("recovered sandbox lost its file: %q", got)
	}
	live.alive(t)
	if st, err := d2.Inspect(ctx, live.id); err != nil || st.State != driver.StateRunning {
		t.Errorf("Inspect of the recovered sandbox = %+v, %v", st, err)
	}
	if !hostVisible(d) {
		return
	}
	if err := d2.Recover(ctx, dead.h); !errdefs.IsNotFound(err) {
		t.Errorf("Recover of a sandbox whose init died = %v, want not found", err)
	}
	if err := d2.Destroy(ctx, dead.id); err != nil {
		t.Fatalf("Destroy of the dead sandbox: %v", err)
	}
	dead.d = d2
	if _, err := d2.Inspect(ctx, dead.id); !errdefs.IsNotFound(err) {
		t.Errorf("Inspect after Destroy = %v, want not found", err)
	}
}

// testTarIn: an archive unpacks in the sandbox as it was made: a
// directory, files with their modes and times, a symlink and a hard link,
// owned by the user who unpacked it (the agent's TarIn, which file uploads
// and template builds' COPY steps use, on the driver's kernel).
func testTarIn(t *testing.T, d driver.Driver, tmpl driver.Template) {
	s := create(t, d, tmpl, driver.Resources{})
	ctx := ctxT(t)
	mtime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range []struct {
		h    tar.Header
		body string
	}{
		{tar.Header{Name: "dir/", Mode: 0o750, Typeflag: tar.TypeDir, ModTime: mtime}, ""},
		{tar.Header{Name: "dir/run.sh", Mode: 0o755, Typeflag: tar.TypeReg, ModTime: mtime}, "#!/bin/sh\necho ran\n"},
		{tar.Header{Name: "dir/link", Linkname: "run.sh", Typeflag: tar.TypeSymlink, ModTime: mtime}, ""},
		{tar.Header{Name: "dir/hard", Linkname: "dir/run.sh", Typeflag: tar.TypeLink, ModTime: mtime}, ""},
	} {
		e.h.Size = int64(len(e.body))
		if err := tw.WriteHeader(&e.h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.body))
	}
	tw.Close()
	if err := s.c.TarIn(ctx, "/home/user/untar", "", &buf); err != nil {
		t.Fatalf("TarIn: %v", err)
	}
	uid, err := strconv.ParseUint(strings.TrimSpace(s.mustSh(t, "", "id -u")), 10, 32)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		path, typ string
		mode      uint32
	}{
		{"/home/user/untar/dir", agentproto.FileTypeDir, 0o750},
		{"/home/user/untar/dir/run.sh", agentproto.FileTypeFile, 0o755},
		{"/home/user/untar/dir/hard", agentproto.FileTypeFile, 0o755},
		{"/home/user/untar/dir/link", agentproto.FileTypeSymlink, 0},
	} {
		fi, err := s.c.Stat(ctx, f.path, "")
		if err != nil {
			t.Errorf("Stat %s: %v", f.path, err)
			continue
		}
		if fi.Type != f.typ || (f.mode != 0 && fi.Mode&0o7777 != f.mode) {
			t.Errorf("%s: %s mode %o, want %s %o", f.path, fi.Type, fi.Mode, f.typ, f.mode)
		}
		if f.typ != agentproto.FileTypeSymlink && !fi.ModTime.Equal(mtime) {
			t.Errorf("%s: modified %v, want the archive's %v", f.path, fi.ModTime, mtime)
		}
		if uint64(fi.Uid) != uid {
			t.Errorf("%s: owner %d, want the default user's %d", f.path, fi.Uid, uid)
		}
	}
	if got := s.readFile(t, "/home/user/untar/dir/hard"); got != "#!/bin/sh\necho ran\n" {
		t.Errorf("hard link holds %q", got)
	}
}

// testLayerCapture: the writable layer of a stopped sandbox holds what it
// wrote, owned by the host uids its users map to, and a deleted template
// file as an overlay whiteout; the layer is refused while the sandbox runs
// (before its stop and after its next start).
func testLayerCapture(t *testing.T, d driver.Driver, tmpl driver.Template) {
	lc := optional[driver.LayerCapturer](t, d, d.Capabilities().LayerCapture, "LayerCapture")
	s := create(t, d, tmpl, driver.Resources{})
	ctx := ctxT(t)
	secret := token()
	s.mustSh(t, "root", "mkdir -p /opt/capture && echo "+secret+" > /opt/capture/by-root && rm /etc/debian_version")
	s.mustSh(t, "", "echo "+secret+" > /home/user/by-user")
	if _, err := lc.WritableLayer(ctx, s.id); !errors.Is(err, errdefs.ErrInvalidState) {
		t.Errorf("WritableLayer of a running sandbox = %v, want invalid state", err)
	}
	s.c.Close()
	if err := d.Stop(ctx, s.id, 0); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	wl, err := lc.WritableLayer(ctx, s.id)
	if err != nil {
		t.Fatalf("WritableLayer of a stopped sandbox: %v", err)
	}
	if wl.IDCount < 65536 || uint64(wl.UIDBase)+uint64(wl.IDCount) > 1<<32 {
		t.Errorf("id mapping %d+%d", wl.UIDBase, wl.IDCount)
	}
	for _, f := range []struct {
		path string
		uid  uint32 // inside
	}{{"opt/capture/by-root", 0}, {"home/user/by-user", 1000}} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(wl.Dir, f.path), &st); err != nil {
			t.Errorf("%s not in the layer: %v", f.path, err)
			continue
		}
		if st.Uid != wl.UIDBase+f.uid || st.Gid != wl.UIDBase+f.uid {
			t.Errorf("%s: host owner %d:%d, want %d (uid %d inside)", f.path, st.Uid, st.Gid, wl.UIDBase+f.uid, f.uid)
		}
		if b, err := os.ReadFile(filepath.Join(wl.Dir, f.path)); err != nil || strings.TrimSpace(string(b)) != secret {
			t.Errorf("%s holds %q (%v)", f.path, b, err)
		}
	}
	var wh unix.Stat_t
	if err := unix.Lstat(filepath.Join(wl.Dir, "etc/debian_version"), &wh); err != nil || wh.Mode&unix.S_IFMT != unix.S_IFCHR || wh.Rdev != 0 {
		t.Errorf("deleted template file: mode %o rdev %d (%v), want a whiteout (0/0 character device)", wh.Mode, wh.Rdev, err)
	}
	if _, err := os.Lstat(filepath.Join(wl.Dir, ".airlock")); err == nil && !slices.Contains(wl.RuntimeNames, ".airlock") {
		t.Errorf("the agent's mount point is in the layer but not among its runtime names %v", wl.RuntimeNames)
	}
	s.start(t)
	if _, err := lc.WritableLayer(ctx, s.id); !errors.Is(err, errdefs.ErrInvalidState) {
		t.Errorf("WritableLayer after the next start = %v, want invalid state", err)
	}
	if out := s.mustSh(t, "", "cat /home/user/by-user"); strings.TrimSpace(out) != secret {
		t.Errorf("file after the capture and a start = %q", out)
	}
}

// testTeardown creates sandboxes (a third with background processes, one
// that fails half way) and destroys them all, then checks that no mount, loop
// device, cgroup, file or process is left.
func testTeardown(t *testing.T, d driver.Driver, tmpl driver.Template, o options) {
	snap := hostcheck.Take(t, o.leakRoots...)
	n := o.teardownCount
	ctx := ctxT(t)
	type made struct {
		id    string
		procs []hostProc
	}
	var (
		mu   sync.Mutex
		all  []made
		wg   sync.WaitGroup
		sem  = make(chan struct{}, 6)
		errs = make(chan error, n+1)
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			id := newID("sbx_td")
			// A small disk each: the count is the point, and the host's
			// disk admission must not refuse the fiftieth on a fuller disk.
			if _, err := d.Create(ctx, driver.Spec{ID: id, Template: tmpl, Resources: driver.Resources{DiskMB: 64}}); err != nil {
				errs <- err
				return
			}
			m := made{id: id}
			defer func() { mu.Lock(); all = append(all, m); mu.Unlock() }()
			if err := d.Start(ctx, id); err != nil {
				errs <- err
				return
			}
			// Background processes of a driver without a boundary would
			// be the host's, beyond its reach.
			if i%3 != 0 || !bounded(d) {
				return
			}
			procs, err := startBackground(ctx, d, id)
			if err != nil {
				errs <- err
			}
			m.procs = procs
		}(i)
	}
	wg.Wait()
	// A sandbox whose Create fails half way (missing template layer) leaves
	// nothing either.
	bad := tmpl
	bad.Layers = append([]string{"/nonexistent/airlock-layer"}, tmpl.Layers...)
	if _, err := d.Create(ctx, driver.Spec{ID: newID("sbx_bad"), Template: bad}); err == nil {
		errs <- errors.New("create with a missing layer succeeded")
	}
	for _, m := range all {
		wg.Add(1)
		go func(m made) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := d.Destroy(ctx, m.id); err != nil {
				errs <- err
			}
			if err := d.Destroy(ctx, m.id); err != nil {
				errs <- errors.New("second Destroy: " + err.Error())
			}
		}(m)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var background int
	for _, m := range all {
		background += len(m.procs)
		if left := stillAlive(m.procs); len(left) > 0 {
			t.Errorf("sandbox %s: processes alive after Destroy: %+v", m.id, left)
		}
	}
	if hostVisible(d) && background == 0 {
		t.Error("no background process was started: the check above proved nothing")
	}
	snap.AssertNoLeaks(t)
}

// startBackground leaves background processes in sandbox id and returns
// them as seen from the host.
func startBackground(ctx context.Context, d driver.Driver, id string) ([]hostProc, error) {
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := d.DialAgent(dctx, id)
	if err != nil {
		return nil, err
	}
	c, err := newClient(conn)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	res, err := runWait(ctx, c, agentproto.ExecRequest{
		ID:    newID("ex_"),
		Shell: `nohup sleep 1000 >/dev/null 2>&1 & setsid sh -c 'sleep 1001 & ' >/dev/null 2>&1 </dev/null; true`,
	})
	if err != nil {
		return nil, err
	}
	if res.Status != agentproto.StatusExited || res.ExitCode != 0 {
		return nil, errors.New("background exec: " + res.Status + " " + res.Error)
	}
	if !hostVisible(d) {
		return nil, nil
	}
	st, err := d.Inspect(ctx, id)
	if err != nil {
		return nil, err
	}
	var procs []hostProc
	eventually(10*time.Second, func() bool {
		procs = pidnsProcsErr(st.Pid)
		return len(procs) >= 3
	})
	return procs, nil
}
