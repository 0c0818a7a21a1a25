package httpapi_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/mountinfo"
	"github.com/airlockhq/airlock/internal/testutil"
)

// Snapshots, create from a snapshot, fork and reset against the real
// daemon (runc, the base template): the data written before a snapshot is
// in every sandbox made from it (after a daemon restart too), nothing of
// the source's secrets is, and tenants never see each other's.

// run runs a shell command as root in sb and returns its stdout, failing
// the test unless it exits 0.
func run(t testing.TB, sb *client.Sandbox, cmd string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := sb.Run(ctx, cmd, client.WithUser("root"))
	if err != nil {
		t.Fatalf("%s: run %q: %v", sb.ID(), cmd, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("%s: run %q: exit %d: %s%s", sb.ID(), cmd, res.ExitCode, res.Stdout, res.Stderr)
	}
	return strings.TrimSpace(res.Stdout)
}

// apiCode returns the API error code of err ("" if it is not an APIError).
func apiCode(err error) string {
	var ae *client.APIError
	if errors.As(err, &ae) {
		return ae.Code
	}
	return ""
}

// wantCode fails unless err is an API error with code.
func wantCode(t testing.TB, what string, err error, code string) {
	t.Helper()
	if err == nil || apiCode(err) != code {
		t.Fatalf("%s: got %v (code %q), want code %s", what, err, apiCode(err), code)
	}
}

const secretValue = "s3cr3t-snapshot-value-7f3a"

// marker writes the state a snapshot must carry: files in the user's
// home and in a root-owned directory, and a template file removed (a
// whiteout in the captured layer).
const marker = `echo before > /home/user/data.txt && mkdir -p /opt/deep/er && echo deep > /opt/deep/er/f && rm /etc/issue && ` +
	`dd if=/dev/urandom of=/home/user/blob bs=1k count=64 2>/dev/null && sha256sum /home/user/blob | cut -d' ' -f1`

// checkMarker fails unless sb has the marker's state, blob hash sum.
func checkMarker(t testing.TB, sb *client.Sandbox, sum string) {
	t.Helper()
	if got := run(t, sb, "cat /home/user/data.txt /opt/deep/er/f; test ! -e /etc/issue && echo issue-gone; sha256sum /home/user/blob | cut -d' ' -f1; find /home/user/data.txt -printf %u"); got != "before\ndeep\nissue-gone\n"+sum+"\nroot" {
		t.Fatalf("%s: the snapshot's files are not there: %q", sb.ID(), got)
	}
}

func TestE2ESnapshotCreateFromResetForkAcrossRestart(t *testing.T) {
	e := newE2E(t)
	ctx := context.Background()
	cl := e.env.Client(e.env.Key(t, "snap-a"))
	other := e.env.Client(e.env.Key(t, "snap-b"))

	src, err := cl.NewSandbox(ctx, client.WithRequest(api.CreateSandboxRequest{
		Secrets: map[string]string{"TOKEN": secretValue}, SecretsAsFiles: true, Metadata: map[string]string{"role": "src"},
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	// (Output is masked of the sandbox's secrets: compare inside.)
	if got := run(t, src, "test \"$(cat /run/secrets/TOKEN)\" = "+secretValue+" && echo secret-there"); got != "secret-there" {
		t.Fatalf("secret file: %q", got)
	}
	sum := run(t, src, marker)

	// Memory on runc is refused, never a filesystem-only snapshot.
	_, err = src.Snapshot(ctx, "", true)
	wantCode(t, "memory snapshot on runc", err, api.CodeCapabilityUnsupported)

	snap, err := src.Snapshot(ctx, "first", false)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(snap.ID, "snap_") || snap.State != api.SnapshotReady || snap.SandboxID != src.ID() || snap.Tenant != "snap-a" ||
		snap.Template != "base" || snap.Memory || snap.Layers < 2 || snap.SizeBytes < 64<<10 || snap.Name != "first" {
		t.Fatalf("snapshot = %+v", snap)
	}
	// The source runs on (it was frozen for the capture only).
	run(t, src, "echo after > /home/user/after.txt")

	// Names are unique per tenant.
	_, err = src.Snapshot(ctx, "first", false)
	wantCode(t, "duplicate name", err, api.CodeConflict)

	got, err := cl.GetSnapshot(ctx, snap.ID)
	if err != nil || got.ID != snap.ID || got.SizeBytes != snap.SizeBytes {
		t.Fatalf("get = %+v, %v", got, err)
	}
	list, err := cl.ListSnapshots(ctx, client.SnapshotListOptions{SandboxID: src.ID()})
	if err != nil || len(list.Snapshots) != 1 || list.Snapshots[0].ID != snap.ID {
		t.Fatalf("list = %+v, %v", list, err)
	}

	// Another tenant: 404, exactly as a snapshot that does not exist.
	missing := "snap_" + strings.Repeat("a", 24)
	for _, id := range []string{snap.ID, missing} {
		_, err = other.GetSnapshot(ctx, id)
		wantCode(t, "other tenant get "+id, err, api.CodeNotFound)
		wantCode(t, "other tenant delete "+id, other.DeleteSnapshot(ctx, id), api.CodeNotFound)
		_, err = other.CreateSandbox(ctx, api.CreateSandboxRequest{Snapshot: id})
		wantCode(t, "other tenant create from "+id, err, api.CodeNotFound)
	}
	_, err = other.CreateSnapshot(ctx, src.ID(), api.CreateSnapshotRequest{})
	wantCode(t, "other tenant snapshots the sandbox", err, api.CodeSandboxNotFound)
	if l, err := other.ListSnapshots(ctx, client.SnapshotListOptions{}); err != nil || len(l.Snapshots) != 0 {
		t.Fatalf("other tenant's list = %+v, %v", l, err)
	}
	osb, err := other.NewSandbox(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer osb.Close()
	_, err = other.Reset(ctx, osb.ID(), api.ResetRequest{Snapshot: snap.ID})
	wantCode(t, "other tenant resets to it", err, api.CodeNotFound)

	// A sandbox from the snapshot: the files, none of the secrets, a new
	// identity, the request's metadata.
	cp, err := cl.NewSandbox(ctx, client.WithSnapshot(snap.ID), client.WithMetadata("role", "copy"))
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	checkMarker(t, cp, sum)
	if info := cp.Info(); info.ID == src.ID() || info.Snapshot != snap.ID || info.Template != "base" || info.Metadata["role"] != "copy" {
		t.Fatalf("copy = %+v", info)
	}
	if got := run(t, cp, "test ! -e /home/user/after.txt && echo no-after; ls -A /run/secrets 2>/dev/null | wc -l; env | grep -c "+secretValue+" || true; "+
		"grep -rl "+secretValue+" /home /opt /etc /tmp /root 2>/dev/null | wc -l; hostname"); got != "no-after\n0\n0\n0\n"+strings.ReplaceAll(cp.ID(), "_", "-") {
		t.Fatalf("copy carries what it must not: %q", got)
	}

	// Reset of the copy: to its template, then to the snapshot.
	run(t, cp, "echo later > /home/user/later.txt")
	long, err := cl.ExecAsync(ctx, cp.ID(), api.ExecRequest{Cmd: []string{"sleep", "600"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.Reset(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if info := cp.Info(); info.State != api.StateRunning || info.Snapshot != "" || info.Metadata["role"] != "copy" {
		t.Fatalf("after reset = %+v", info)
	}
	if got := run(t, cp, "ls /home/user; test -e /etc/issue && echo issue-back"); got != "issue-back" {
		t.Fatalf("after reset to the template: %q", got)
	}
	var ex *api.ExecResult
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ex, err = cl.GetExec(ctx, cp.ID(), long)
		if err != nil || ex.Status != api.ExecRunning || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || ex.Status != api.ExecKilled || ex.ErrorCode != api.ExecCodeSandboxReset {
		t.Fatalf("exec running at the reset = %+v, %v", ex, err)
	}
	if err := cp.Reset(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	checkMarker(t, cp, sum)
	if cp.Info().Snapshot != snap.ID {
		t.Fatalf("after reset to the snapshot: %+v", cp.Info())
	}
	// A paused sandbox resets too, and runs after.
	if err := cp.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cp.Reset(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if cp.Info().State != api.StateRunning {
		t.Fatalf("after reset of a paused sandbox: %+v", cp.Info())
	}
	checkMarker(t, cp, sum)

	// Fork of the source: its state now (after.txt included), each copy
	// its own.
	forks, err := src.Fork(ctx, 2, map[string]string{"FORKSECRET": "f-1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range forks {
		defer f.Close()
	}
	if len(forks) != 2 || forks[0].ID() == forks[1].ID() || forks[0].ID() == src.ID() {
		t.Fatalf("forks = %v", forks)
	}
	for i, f := range forks {
		checkMarker(t, f, sum)
		if got := run(t, f, "cat /home/user/after.txt; ls -A /run/secrets | tr '\\n' ' '"); got != "after\nFORKSECRET" {
			t.Fatalf("fork %d: %q", i, got)
		}
		if f.Info().Metadata["role"] != "src" {
			t.Fatalf("fork %d metadata = %v", i, f.Info().Metadata)
		}
	}
	run(t, forks[0], "echo mine > /home/user/fork0.txt")
	for _, sb := range []*client.Sandbox{forks[1], src} {
		if got := run(t, sb, "test ! -e /home/user/fork0.txt && echo clean"); got != "clean" {
			t.Fatalf("%s sees fork 0's file", sb.ID())
		}
	}
	// The fork's own snapshot is gone before it answered.
	if l, err := cl.ListSnapshots(ctx, client.SnapshotListOptions{}); err != nil || len(l.Snapshots) != 1 {
		t.Fatalf("snapshots after the fork = %+v, %v", l, err)
	}
	// Bounded, and checked against the quota before anything is made.
	_, err = src.Fork(ctx, 11, nil, nil)
	wantCode(t, "fork of 11", err, api.CodeInvalidArgument)
	live, err := cl.ListSandboxes(ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	room := len(live.Sandboxes) + 1
	if _, err := e.env.Admin().SetTenantQuotas(ctx, "snap-a", api.QuotaOverride{Sandboxes: &room}); err != nil {
		t.Fatal(err)
	}
	_, err = src.Fork(ctx, 2, nil, nil)
	wantCode(t, "fork over the quota", err, api.CodeQuotaExceeded)
	if l, err := cl.ListSandboxes(ctx, client.ListOptions{}); err != nil || len(l.Sandboxes) != len(live.Sandboxes) {
		t.Fatalf("a refused fork left sandboxes: %d, was %d (%v)", len(l.Sandboxes), len(live.Sandboxes), err)
	}
	if l, err := cl.ListSnapshots(ctx, client.SnapshotListOptions{}); err != nil || len(l.Snapshots) != 1 {
		t.Fatalf("a refused fork left a snapshot: %+v, %v", l, err)
	}
	if err := e.env.Admin().ClearTenantQuotas(ctx, "snap-a"); err != nil {
		t.Fatal(err)
	}

	// A daemon restart between the snapshot and a create from it.
	e.env.Restart()
	cl = e.env.Client(e.env.Key(t, "snap-a"))
	after, err := cl.NewSandbox(ctx, client.WithSnapshot(snap.ID))
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()
	checkMarker(t, after, sum)

	// Deleted: unusable at once; its users run on.
	if err := cl.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if err := cl.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatalf("deleting again: %v", err)
	}
	_, err = cl.GetSnapshot(ctx, snap.ID)
	wantCode(t, "get deleted", err, api.CodeNotFound)
	_, err = cl.CreateSandbox(ctx, api.CreateSandboxRequest{Snapshot: snap.ID})
	wantCode(t, "create from deleted", err, api.CodeNotFound)
	checkMarker(t, after, sum)
}

// TestE2EForkOwnNetworksResetKeepsNetwork: with sandbox networking, each
// fork copy has its own namespace under the parent's policy (allowed
// names reachable, others not), and a reset keeps the sandbox's namespace
// and policy.
func TestE2EForkOwnNetworksResetKeepsNetwork(t *testing.T) {
	w := newWorld(t)
	e := newE2E(t, e2eWorld(w))
	ctx := context.Background()
	cl := e.env.Client(e.env.Key(t, "acme"))
	src, err := cl.NewSandbox(ctx, client.WithNetwork("allowlist", "allowed.test"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	netns := func(sb *client.Sandbox) string { return run(t, sb, "readlink /proc/self/ns/net") }
	reach := func(sb *client.Sandbox) {
		t.Helper()
		res, err := sb.RunArgs(ctx, fetch("http://allowed.test/"))
		if err != nil || !strings.HasPrefix(res.Stdout, "OK web-a") {
			t.Fatalf("%s: allowed.test: %+v, %v", sb.ID(), res, err)
		}
		res, err = sb.RunArgs(ctx, fetch("http://denied.test/"))
		if err != nil || !strings.HasPrefix(res.Stdout, "FAIL") {
			t.Fatalf("%s: denied.test: %+v, %v", sb.ID(), res, err)
		}
	}
	reach(src)
	srcNS := netns(src)
	run(t, src, "echo parent > /home/user/p.txt")

	forks, err := src.Fork(ctx, 3, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{srcNS: src.ID()}
	for _, f := range forks {
		defer f.Close()
		if got := run(t, f, "cat /home/user/p.txt"); got != "parent" {
			t.Fatalf("fork %s: %q", f.ID(), got)
		}
		ns := netns(f)
		if other, dup := seen[ns]; dup {
			t.Fatalf("fork %s shares its network namespace with %s", f.ID(), other)
		}
		seen[ns] = f.ID()
		if n := f.Info().Network; n.Mode != "allowlist" || len(n.Allow) != 1 || n.Allow[0] != "allowed.test" {
			t.Fatalf("fork %s network = %+v", f.ID(), n)
		}
		reach(f)
	}

	expires := src.Info().ExpiresAt
	if err := src.Reset(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if got := netns(src); got != srcNS {
		t.Fatalf("reset changed the network namespace: %s, was %s", got, srcNS)
	}
	if info := src.Info(); info.ExpiresAt == nil || expires == nil || !info.ExpiresAt.Equal(*expires) {
		t.Fatalf("reset moved expires_at: %v, was %v", info.ExpiresAt, expires)
	}
	if got := run(t, src, "test ! -e /home/user/p.txt && echo gone"); got != "gone" {
		t.Fatalf("after reset: %q", got)
	}
	reach(src)
}

// TestE2ESnapshotGVisor: filesystem snapshots on gVisor too (sync, pause,
// copy, resume): a sandbox from the snapshot and a reset to it have the
// files.
func TestE2ESnapshotGVisor(t *testing.T) {
	testutil.RequiresBinary(t, "runsc")
	e := newE2E(t)
	ctx := context.Background()
	cl := e.env.Client(e.env.Key(t, "gv"))
	src, err := cl.NewSandbox(ctx, client.WithRuntime("gvisor"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	sum := run(t, src, marker)
	snap, err := src.Snapshot(ctx, "", false)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Runtime != "gvisor" {
		t.Fatalf("snapshot = %+v", snap)
	}
	run(t, src, "echo after > /home/user/after.txt")
	cp, err := cl.NewSandbox(ctx, client.WithSnapshot(snap.ID))
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	if cp.Info().Runtime != "gvisor" {
		t.Fatalf("copy runtime = %s, want the snapshot's", cp.Info().Runtime)
	}
	checkMarker(t, cp, sum)
	if err := src.Reset(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	checkMarker(t, src, sum)
	if got := run(t, src, "test ! -e /home/user/after.txt && echo gone"); got != "gone" {
		t.Fatalf("after reset: %q", got)
	}
}

// tickLoop starts a process that counts in its own memory and writes the
// count to /home/user/tick every 50 ms: after a memory restore it goes on
// from where it was; a process started again would count from 1.
const tickLoop = `nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /home/user/tick; sleep 0.05; done' >/dev/null 2>&1 &
sleep 0.5; cat /home/user/tick`

// tick reads sb's count until it passes least, and fails if the count
// ever goes back (the counting process was started again, from 1, instead
// of going on from its memory) or does not move.
func tick(t *testing.T, sb *client.Sandbox, least int) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	last := -1
	for {
		n, err := strconv.Atoi(run(t, sb, "cat /home/user/tick"))
		if err == nil && n < last {
			t.Fatalf("%s: tick went back from %d to %d: the counting process started again", sb.ID(), last, n)
		}
		if err == nil && n > least && last >= 0 && n > last {
			return n
		}
		if err == nil {
			last = n
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: tick %d (%v), want past %d: the counting process did not go on\n%s", sb.ID(), n, err, least, sandboxDiagnosis(sb))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sandboxDiagnosis says what runs in sb and what its lifecycle events
// were, for a test that found a process not going on.
func sandboxDiagnosis(sb *client.Sandbox) string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var b strings.Builder
	res, err := sb.Run(ctx, `for p in /proc/[0-9]*; do echo "$(basename $p) $(cut -d' ' -f3 $p/stat) $(tr '\0' ' ' < $p/cmdline)"; done; echo "tick: $(cat /home/user/tick)"`, client.WithUser("root"))
	if err != nil {
		fmt.Fprintf(&b, "processes: %v\n", err)
	} else {
		fmt.Fprintf(&b, "processes (pid state cmdline):\n%s%s", res.Stdout, res.Stderr)
	}
	for e, err := range sb.Client().AuditEvents(ctx, client.AuditOptions{SandboxID: sb.ID()}) {
		if err != nil {
			fmt.Fprintf(&b, "events: %v\n", err)
			break
		}
		if e.Type != api.AuditExec && e.Type != api.AuditEgress {
			fmt.Fprintf(&b, "event %s %s %s\n", e.Time.Format(time.RFC3339Nano), e.Type, e.Detail)
		}
	}
	return b.String()
}

// TestE2EGVisorMemoryAcrossRestart: through the API, on gVisor, a process's
// memory is kept by a memory snapshot (a sandbox made from it goes on
// counting where the source was), by a fork (memory included where the
// runtime checkpoints) and by a pause to disk with a daemon restart before
// the resume; the files written before are there each time.
func TestE2EGVisorMemoryAcrossRestart(t *testing.T) {
	testutil.RequiresBinary(t, "runsc")
	e := newE2E(t)
	ctx := context.Background()
	cl := e.env.Client(e.env.Key(t, "gvmem"))
	src, err := cl.NewSandbox(ctx, client.WithRuntime("gvisor"), client.WithTTL(10*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	sum := run(t, src, marker)
	first, err := strconv.Atoi(run(t, src, tickLoop))
	if err != nil {
		t.Fatal(err)
	}
	at := tick(t, src, first)

	snap, err := src.Snapshot(ctx, "", true)
	if err != nil {
		t.Fatal(err)
	}
	if !snap.Memory || snap.MemoryBytes == 0 || snap.Runtime != "gvisor" {
		t.Fatalf("memory snapshot = %+v", snap)
	}
	cp, err := cl.NewSandbox(ctx, client.WithSnapshot(snap.ID), client.WithTTL(10*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	checkMarker(t, cp, sum)
	tick(t, cp, at) // restored, counting on from at least where the source was

	forks, err := src.Fork(ctx, 1, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer forks[0].Close()
	checkMarker(t, forks[0], sum)
	tick(t, forks[0], at)

	// Pause to disk, a daemon restart, then the resume: the process goes
	// on, the files are there.
	before := tick(t, src, at)
	if err := src.PauseWith(ctx, client.PauseOptions{Disk: true}); err != nil {
		t.Fatal(err)
	}
	e.stop()
	e.start()
	cl = e.env.Client(e.env.Key(t, "gvmem"))
	again, err := cl.ConnectSandbox(ctx, src.ID())
	if err != nil {
		t.Fatal(err)
	}
	if st := again.Info().State; st != api.StatePaused {
		t.Fatalf("after the restart: state %s, want paused", st)
	}
	if err := again.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	checkMarker(t, again, sum)
	tick(t, again, before)
}

// TestE2EResetInPlace: a reset of a running runc sandbox keeps its agent
// and swaps its root (driver.RootResetter): every other process is gone,
// every file it wrote (in /home, /tmp, /etc) is gone, the runtime's mounts
// (/proc, /dev, /sys, resolv.conf, the agent) are all there again, the
// user and the disk work, and the host holds as many mounts for it as
// before; so after a reset to a snapshot (mountPoint's tests cover a
// layer whose paths are symlinks).
func TestE2EResetInPlace(t *testing.T) {
	e := newE2E(t, e2eWorld(newWorld(t))) // sandbox networking: resolv.conf is a mount
	ctx := context.Background()
	cl := e.env.Client(e.env.Key(t, "acme"))
	sb, err := cl.NewSandbox(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	mounts := `awk '{print $5}' /proc/self/mountinfo | sort | tr '\n' ' '`
	procs := `for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline; echo; done | grep -v '^$' | sort | tr '\n' ';'`
	hostMounts := func() int {
		ms, err := mountinfo.Read()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, m := range ms {
			if strings.Contains(m.Target, sb.ID()) {
				n++
			}
		}
		return n
	}
	before, hostBefore := run(t, sb, mounts), hostMounts()
	run(t, sb, "echo a > /home/user/a; echo b > /tmp/b; echo c > /etc/c; (setsid sleep 600 >/dev/null 2>&1 &)")
	if got := run(t, sb, procs); !strings.Contains(got, "sleep 600") {
		t.Fatalf("processes before the reset: %q", got)
	}

	if err := sb.Reset(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if got := run(t, sb, "ls /home/user; test -e /tmp/b || test -e /etc/c || echo clean"); got != "clean" {
		t.Fatalf("files after the reset: %q", got)
	}
	if got := run(t, sb, procs); strings.Contains(got, "sleep") || !strings.Contains(got, "airlock-agent") {
		t.Fatalf("processes after the reset: %q", got)
	}
	if got := run(t, sb, mounts); got != before {
		t.Fatalf("mounts in the sandbox after the reset:\n%s\nbefore:\n%s", got, before)
	}
	if got := hostMounts(); got != hostBefore {
		t.Fatalf("host mounts of the sandbox after the reset: %d, before %d", got, hostBefore)
	}
	res, err := sb.Run(ctx, "id -un; ls -ld / /.airlock | awk '{print $3}'; echo x > ~/w && cat ~/w; dd if=/dev/zero of=/tmp/z bs=1M count=8 2>/dev/null && echo wrote")
	if err != nil || res.Stdout != "user\nroot\nroot\nx\nwrote\n" {
		t.Fatalf("as user after the reset: %+v %v", res, err)
	}
	// The agent's file API works on the new root, both ways (its root is
	// not an fd it opened before the reset).
	if _, err := cl.WriteFile(ctx, sb.ID(), "/home/user/up.txt", strings.NewReader("through the api")); err != nil {
		t.Fatal(err)
	}
	if got := run(t, sb, "cat /home/user/up.txt"); got != "through the api" {
		t.Fatalf("an upload after the reset, read by a command: %q", got)
	}
	rc, err := cl.ReadFile(ctx, sb.ID(), "/home/user/w")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "x\n" {
		t.Fatalf("a command's file after the reset, downloaded: %q", b)
	}

	// To a snapshot and back: the mounts are where they were each time.
	run(t, sb, "echo snap > /home/user/s")
	snap, err := sb.Snapshot(ctx, "", false)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.DeleteSnapshot(ctx, snap.ID)
	run(t, sb, "rm /home/user/s")
	if err := sb.Reset(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if got := run(t, sb, "cat /home/user/s; grep -c ' /etc/resolv.conf ' /proc/self/mountinfo"); got != "snap\n1" {
		t.Fatalf("after the reset to a snapshot: %q", got)
	}
	if got := run(t, sb, mounts); got != before {
		t.Fatalf("mounts after the reset to a snapshot:\n%s\nbefore:\n%s", got, before)
	}
	ms, err := mountinfo.Read()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if strings.Contains(m.Target, sb.ID()) && !strings.HasPrefix(m.Target, e.dataDir+"/") && !strings.Contains(m.Target, "/netns/") {
			t.Fatalf("a mount of the sandbox outside its dirs: %s", m.Target)
		}
	}
}
