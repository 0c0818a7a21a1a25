package gvisor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/drivertest"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/network"
	"github.com/airlockhq/airlock/internal/template"
)

// sourceAddr prints the sandbox's source address towards host.
func sourceAddr(host string) []string {
	return []string{"python3", "-c", `import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    s.connect((sys.argv[1], 80))
    print(s.getsockname()[0], end="")
except Exception as e:
    print("FAIL", type(e).__name__, end="")`, host}
}

// holdTCP keeps a TCP connection to host:80 open until /home/user/stop
// exists, then resets it (SO_LINGER 0: no TIME_WAIT, which runsc could
// not checkpoint either) and exits.
const holdTCP = `nohup python3 -c '
import os, socket, struct, sys, time
s = socket.create_connection((sys.argv[1], 80), timeout=5)
s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
open("/home/user/held", "w").close()
while not os.path.exists("/home/user/stop"):
    time.sleep(0.05)
s.close()
os.remove("/home/user/held")
' %s >/dev/null 2>&1 &`

// TestCheckpointNetwork: a gVisor sandbox on netstack in the namespace
// airlock prepared is checkpointed and restored, and reaches the allowed
// name from its address after; a copy restored into a new sandbox with a
// namespace (and address) of its own takes that namespace's interface
// (runsc restore reads the interfaces anew) and its resolver; while a TCP
// connection is open the checkpoint is refused and the sandbox runs on.
func TestCheckpointNetwork(t *testing.T) {
	requireHost(t)
	tmpl := drivertest.BaseTemplate(t)
	w := newNetWorld(t)
	nm := newNetManager(t, w)
	d := newDriver(t, newHost(t))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const id = "sbx_gckptnet"
	att := attach(t, nm, id, network.Policy{Mode: network.ModeAllowlist, Allow: []string{"allowed.test"}})
	c := startAttached(t, d, tmpl, id, att)
	// No connection before the first checkpoint: one the sandbox closed
	// itself lingers in TIME_WAIT, which runsc cannot save either.
	if out := execOut(t, c, sourceAddr(nWebA)); out != att.Address().String() {
		t.Fatalf("source address %q, want %s", out, att.Address())
	}

	// An open connection: refused, and the sandbox runs on.
	execOut(t, c, []string{"sh", "-c", strings.ReplaceAll(holdTCP, "%s", nWebA)})
	waitFile(t, c, "/home/user/held", true)
	c.Close()
	if err := d.Checkpoint(ctx, id, drivertest.DataDir(t, "img"), driver.CheckpointOptions{}); !errors.Is(err, errdefs.ErrInvalidState) {
		b, _ := os.ReadFile(filepath.Join(d.Dir(id), "agent.log"))
		t.Fatalf("Checkpoint with a TCP connection open = %v, want invalid state\n%s", err, b)
	}
	c = drivertest.Dial(t, d, id)
	if out := execOut(t, c, []string{"sh", "-c", "test -e /home/user/held && touch /home/user/stop && echo held"}); out != "held\n" {
		t.Fatalf("after the refused checkpoint the connection is gone: %q", out)
	}
	waitFile(t, c, "/home/user/held", false)

	// Restored in place: the same address, the allowed name served.
	c.Close()
	img := drivertest.DataDir(t, "img")
	if err := d.Checkpoint(ctx, id, img, driver.CheckpointOptions{}); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if err := d.Restore(ctx, id, img); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	c = drivertest.Dial(t, d, id)
	if out := execOut(t, c, sourceAddr(nWebA)); out != att.Address().String() {
		t.Errorf("restored: source address %q, want %s", out, att.Address())
	}

	// A copy in a namespace of its own: checkpointed again before any
	// connection of the restored sandbox.
	c.Close()
	img2 := drivertest.DataDir(t, "img2")
	if err := d.Checkpoint(ctx, id, img2, driver.CheckpointOptions{}); err != nil {
		t.Fatalf("Checkpoint for the copy: %v", err)
	}
	wl, err := d.WritableLayer(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	store := template.NewStore(drivertest.DataDir(t, "store"))
	ref, _, err := store.CaptureSnapshotLayer(ctx, "snap_gckptnet", wl, "")
	if err != nil {
		t.Fatal(err)
	}
	layer, err := store.LayerPath(ref)
	if err != nil {
		t.Fatal(err)
	}
	const id2 = "sbx_gckptcopy"
	att2 := attach(t, nm, id2, network.Policy{Mode: network.ModeAllowlist, Allow: []string{"allowed.test"}})
	if att2.Address() == att.Address() {
		t.Fatal("the copy's namespace has the original's address: the test proves nothing")
	}
	ct := tmpl
	ct.Layers = append(append([]string{}, tmpl.Layers...), layer)
	if _, err := d.Create(ctx, driver.Spec{ID: id2, Template: ct, NetNSPath: att2.NetNSPath(), ResolvConfPath: att2.ResolvConfPath()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Destroy(context.Background(), id2); err != nil {
			t.Errorf("Destroy of the copy: %v", err)
		}
	})
	if err := d.Restore(ctx, id2, img2); err != nil {
		t.Fatalf("Restore into a new sandbox and namespace: %v", err)
	}
	c2 := drivertest.Dial(t, d, id2)
	if out := execOut(t, c2, sourceAddr(nWebA)); out != att2.Address().String() {
		t.Errorf("copy: source address %q, want its own %s", out, att2.Address())
	}
	if out := execOut(t, c2, []string{"cat", "/etc/resolv.conf"}); !strings.Contains(out, "nameserver "+att2.Gateway().String()) {
		t.Errorf("copy: resolv.conf does not name its own resolver %s: %q", att2.Gateway(), out)
	}
	before := w.srv["a80"].Hits()
	if out := execOut(t, c2, fetch("http://allowed.test/")); !strings.HasPrefix(out, "OK web-a") {
		t.Errorf("copy: allowed name: %q", out)
	}
	if out := execOut(t, c2, fetch("http://denied.test/")); !strings.HasPrefix(out, "FAIL") {
		t.Errorf("copy: unlisted name: %q", out)
	}
	if got := w.srv["a80"].Hits(); got != before+1 {
		t.Errorf("web-a hits %d → %d, want one more", before, got)
	}
	// The original runs on from the same image, in its own namespace.
	if err := d.Restore(ctx, id, img2); err != nil {
		t.Fatalf("Restore of the original: %v", err)
	}
	c = drivertest.Dial(t, d, id)
	if out := execOut(t, c, fetch("http://allowed.test/")); !strings.HasPrefix(out, "OK web-a") {
		t.Errorf("original after its copy: allowed name: %q", out)
	}
}

// waitFile waits until path exists in the sandbox (or, want false, is gone).
func waitFile(t *testing.T, c *agentclient.Client, path string, want bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		out := execOut(t, c, []string{"sh", "-c", "test -e " + path + " && echo yes || echo no"})
		if (out == "yes\n") == want {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s exists: want %v", path, want)
}
