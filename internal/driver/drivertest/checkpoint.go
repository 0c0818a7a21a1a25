package drivertest

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/hostcheck"
	"github.com/airlockhq/airlock/internal/template"
)

// The checkpoint cases (driver.Checkpointer, capability memory_snapshot).
// What survives a checkpoint is shown by a process started before it: a
// python loop that holds a token it drew at random in its memory only and
// counts, and writes both with its pid to a file every 50 ms. A restore
// that ran the process anew would draw another token and count from 1; a
// restore that lost the file system would lose the file written before.

// memProc is the memory-holding loop, as the default user.
const memProc = `nohup python3 -c '
import os, secrets, time
tok = secrets.token_hex(8)
i = 0
while True:
    i += 1
    with open("/home/user/.mem.tmp", "w") as f:
        f.write("%d %s %d\n" % (i, tok, os.getpid()))
    os.replace("/home/user/.mem.tmp", "/home/user/mem")
    time.sleep(0.05)
' >/dev/null 2>&1 &`

// memState is one line of the loop's file.
type memState struct {
	count int
	token string
	pid   string
}

// readMem reads the loop's last line, ok false if there is none yet.
func (s *sandbox) readMem(t *testing.T) (memState, bool) {
	t.Helper()
	r := s.sh(t, "", "cat /home/user/mem 2>/dev/null")
	f := strings.Fields(r.Stdout)
	if len(f) != 3 {
		return memState{}, false
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return memState{}, false
	}
	return memState{count: n, token: f[1], pid: f[2]}, true
}

// startMem starts the loop and returns its first state.
func (s *sandbox) startMem(t *testing.T) memState {
	t.Helper()
	s.mustSh(t, "", memProc)
	var m memState
	if !eventually(20*time.Second, func() bool {
		var ok bool
		m, ok = s.readMem(t)
		return ok && m.count >= 2
	}) {
		t.Fatal("the memory loop never wrote its file")
	}
	return m
}

// wantMemContinues checks that the loop runs on from before: the same
// token and pid, a count past before's.
func (s *sandbox) wantMemContinues(t *testing.T, before memState, what string) memState {
	t.Helper()
	var m memState
	if !eventually(20*time.Second, func() bool {
		var ok bool
		m, ok = s.readMem(t)
		return ok && m.count > before.count+1
	}) {
		t.Fatalf("%s: the memory loop does not run on: last %+v, before %+v", what, m, before)
	}
	if m.token != before.token || m.pid != before.pid {
		t.Fatalf("%s: the memory loop is %+v, before %+v: a new process, not the one checkpointed", what, m, before)
	}
	return m
}

// imageDir returns a new empty directory for a checkpoint image.
func imageDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp(DataDir(t, "ckpt"), "img-")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// testCheckpoint: a checkpoint stops the sandbox and a restore runs it on
// from there, processes, memory and files included (a pause to disk);
// LeaveRunning keeps it running; a new sandbox over the checkpointed one's
// template and captured writable layer, restored from the image, is a
// copy that runs on from the same point, apart from the original (a
// snapshot, a fork); bad directories are refused with the contract's
// error classes.
func testCheckpoint(t *testing.T, d driver.Driver, tmpl driver.Template) {
	cp := optional[driver.Checkpointer](t, d, d.Capabilities().MemorySnapshot, "MemorySnapshot")
	ctx := ctxT(t)
	s := create(t, d, tmpl, driver.Resources{})
	secret := token()
	s.writeFile(t, "/home/user/kept", secret)
	before := s.startMem(t)

	if err := cp.Restore(ctx, s.id, imageDir(t)); !errdefs.IsNotFound(err) && !errors.Is(err, errdefs.ErrInvalidState) {
		t.Errorf("Restore from an empty directory = %v, want not found or invalid state", err)
	}
	if err := cp.Checkpoint(ctx, s.id, "relative/dir", driver.CheckpointOptions{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Checkpoint into a relative path = %v, want invalid argument", err)
	}

	// Pause to disk: stopped, then resumed from the image.
	s.c.Close()
	s.c = nil
	dir := imageDir(t)
	if err := cp.Checkpoint(ctx, s.id, dir, driver.CheckpointOptions{}); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if st, err := d.Inspect(ctx, s.id); err != nil || st.State != driver.StateStopped {
		t.Errorf("Inspect after Checkpoint = %+v, %v; want stopped", st, err)
	}
	if err := cp.Checkpoint(ctx, s.id, imageDir(t), driver.CheckpointOptions{}); !errors.Is(err, errdefs.ErrInvalidState) {
		t.Errorf("Checkpoint of a stopped sandbox = %v, want invalid state", err)
	}
	if err := cp.Restore(ctx, s.id, dir); err != nil {
		t.Fatalf("Restore of the checkpointed sandbox: %v", err)
	}
	s.connect(t, d)
	if st, err := d.Inspect(ctx, s.id); err != nil || st.State != driver.StateRunning {
		t.Errorf("Inspect after Restore = %+v, %v; want running", st, err)
	}
	if got := s.readFile(t, "/home/user/kept"); got != secret {
		t.Errorf("file after checkpoint and restore = %q, want %q", got, secret)
	}
	m := s.wantMemContinues(t, before, "restored")
	s.alive(t)

	// A memory snapshot: the sandbox runs on.
	s.c.Close()
	s.c = nil
	if err := cp.Checkpoint(ctx, s.id, imageDir(t), driver.CheckpointOptions{LeaveRunning: true}); err != nil {
		t.Fatalf("Checkpoint leaving it running: %v", err)
	}
	if st, err := d.Inspect(ctx, s.id); err != nil || st.State != driver.StateRunning {
		t.Errorf("Inspect after Checkpoint leaving it running = %+v, %v; want running", st, err)
	}
	s.connect(t, d)
	m = s.wantMemContinues(t, m, "left running")

	// A copy: a new sandbox whose layers are the template's and the
	// checkpointed sandbox's writable layer captured over them (as a
	// snapshot's are), restored from the image.
	lc, ok := d.(driver.LayerCapturer)
	if !ok || !d.Capabilities().LayerCapture {
		t.Log("the driver declares no layer capture: the copy is not tried")
		return
	}
	s.c.Close()
	s.c = nil
	dir = imageDir(t)
	if err := cp.Checkpoint(ctx, s.id, dir, driver.CheckpointOptions{}); err != nil {
		t.Fatalf("Checkpoint for a copy: %v", err)
	}
	wl, err := lc.WritableLayer(ctx, s.id)
	if err != nil {
		t.Fatalf("WritableLayer of the checkpointed sandbox: %v", err)
	}
	store := template.NewStore(DataDir(t, "snapstore"))
	snapID := "snap_" + strings.TrimPrefix(newID("t"), "t")
	ref, _, err := store.CaptureSnapshotLayer(ctx, snapID, wl, "")
	if err != nil {
		t.Fatalf("capturing the checkpointed sandbox's layer: %v", err)
	}
	layer, err := store.LayerPath(ref)
	if err != nil {
		t.Fatal(err)
	}
	copyTmpl := tmpl
	copyTmpl.Layers = append(append([]string{}, tmpl.Layers...), layer)
	cs := &sandbox{t: t, d: d, id: newID("sbx_tcopy"), spec: driver.Spec{Template: copyTmpl, Hostname: "conformance"}}
	cs.spec.ID = cs.id
	h, err := d.Create(ctx, cs.spec)
	if err != nil {
		t.Fatalf("Create of the copy: %v", err)
	}
	cs.h = h
	t.Cleanup(func() { cs.destroy(t) })
	if err := cp.Restore(ctx, cs.id, dir); err != nil {
		t.Fatalf("Restore into a new sandbox: %v", err)
	}
	cs.connect(t, d)
	if got := cs.readFile(t, "/home/user/kept"); got != secret {
		t.Errorf("the copy's file = %q, want %q", got, secret)
	}
	cm := cs.wantMemContinues(t, m, "the copy")
	// The original runs on from the same image, apart from its copy.
	if err := cp.Restore(ctx, s.id, dir); err != nil {
		t.Fatalf("Restore of the original after its copy: %v", err)
	}
	s.connect(t, d)
	s.wantMemContinues(t, m, "the original after its copy")
	mark := token()
	cs.writeFile(t, "/home/user/copy-only", mark)
	if r := s.sh(t, "", "cat /home/user/copy-only"); r.ExitCode == 0 {
		t.Errorf("the original sees its copy's file: %q", r.Stdout)
	}
	cs.wantMemContinues(t, cm, "the copy later")
}

// testCheckpointCycles checkpoints and restores one sandbox n times, then
// destroys it while checkpointed (stopped) and a second one restored from
// its image, and checks that nothing is left: the mounts, cgroups,
// namespaces, files and processes of every run go.
func testCheckpointCycles(t *testing.T, d driver.Driver, tmpl driver.Template, o options, n int) {
	cp := optional[driver.Checkpointer](t, d, d.Capabilities().MemorySnapshot, "MemorySnapshot")
	snap := hostcheck.Take(t, o.leakRoots...)
	ctx := ctxT(t)
	func() {
		s := create(t, d, tmpl, driver.Resources{DiskMB: 64})
		before := s.startMem(t)
		root := DataDir(t, "ckcycles")
		for i := 0; i < n; i++ {
			s.c.Close()
			s.c = nil
			dir := filepath.Join(root, strconv.Itoa(i))
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := cp.Checkpoint(ctx, s.id, dir, driver.CheckpointOptions{LeaveRunning: i%2 == 1}); err != nil {
				t.Fatalf("cycle %d: Checkpoint: %v", i, err)
			}
			if i%2 == 0 {
				if err := cp.Restore(ctx, s.id, dir); err != nil {
					t.Fatalf("cycle %d: Restore: %v", i, err)
				}
			}
			s.connect(t, d)
			if i == n-1 {
				s.wantMemContinues(t, before, "after the cycles")
			}
			os.RemoveAll(dir)
		}
		// Destroyed while checkpointed: stopped, its image elsewhere.
		s.c.Close()
		s.c = nil
		if err := cp.Checkpoint(ctx, s.id, filepath.Join(root, "last"), driver.CheckpointOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
			// A missing directory is the caller's mistake; nothing changed.
			t.Errorf("Checkpoint into a missing directory = %v, want not found", err)
		}
		dir := filepath.Join(root, "last")
		os.Mkdir(dir, 0o700)
		if err := cp.Checkpoint(ctx, s.id, dir, driver.CheckpointOptions{}); err != nil {
			t.Fatalf("last Checkpoint: %v", err)
		}
		s.destroy(t)
	}()
	snap.AssertNoLeaks(t)
}

// testPausedLayer: the writable layer of a paused sandbox holds what its
// processes wrote, a file closed and one still open (written, flushed to
// the kernel, never closed); the sandbox resumes after the read and runs
// on, and a running sandbox's layer is refused.
func testPausedLayer(t *testing.T, d driver.Driver, tmpl driver.Template) {
	lc := optional[driver.LayerCapturer](t, d, d.Capabilities().LayerCapture, "LayerCapture")
	p := optional[driver.Pauser](t, d, d.Capabilities().Pause, "Pause")
	requireBoundary(t, d)
	s := create(t, d, tmpl, driver.Resources{})
	ctx := ctxT(t)
	closed, open := token(), token()
	s.mustSh(t, "", "echo "+closed+" > /home/user/closed")
	s.mustSh(t, "", `nohup python3 -c '
import sys, time
f = open("/home/user/open", "w")
f.write(sys.argv[1])
f.flush()
open("/home/user/open.ready", "w").close()
time.sleep(1000)
' `+open+` >/dev/null 2>&1 &`)
	if !eventually(20*time.Second, func() bool { return s.sh(t, "", "test -e /home/user/open.ready").ExitCode == 0 }) {
		t.Fatal("the writer never wrote")
	}
	if _, err := lc.WritableLayer(ctx, s.id); !errors.Is(err, errdefs.ErrInvalidState) {
		t.Errorf("WritableLayer of a running sandbox = %v, want invalid state", err)
	}
	if err := p.Pause(ctx, s.id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	wl, err := lc.WritableLayer(ctx, s.id)
	if err != nil {
		t.Fatalf("WritableLayer of a paused sandbox: %v", err)
	}
	for name, want := range map[string]string{"closed": closed, "open": open} {
		b, err := os.ReadFile(filepath.Join(wl.Dir, "home/user", name))
		if err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("paused sandbox's layer: %s holds %q (%v), want %q", name, b, err, want)
		}
	}
	if err := p.Resume(ctx, s.id); err != nil {
		t.Fatalf("Resume after the layer was read: %v", err)
	}
	s.alive(t)
	if got := strings.TrimSpace(s.mustSh(t, "", "cat /home/user/open")); got != open {
		t.Errorf("after resume the open file holds %q", got)
	}
}
