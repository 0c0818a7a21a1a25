package httpapi_test

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/daemon"
	"github.com/airlockhq/airlock/internal/network"
	"github.com/airlockhq/airlock/internal/testutil/daemontest"
)

// The end-to-end tests run the real stack as root: runc driver, storage,
// the base template and the agent binary, behind the real HTTP server.

// The end-to-end tests drive the real daemon (internal/testutil/daemontest:
// daemon.Run as `airlock serve` runs it, root, the runc driver, the base
// template and the agent binary) through its HTTP API; e2e is a thin
// wrapper over the harness with this package's request helpers.

// e2e is one daemon for a test.
type e2e struct {
	t   testing.TB
	env *daemontest.Env
	h   *harness // request helpers bound to the daemon
	// dataDir is the daemon's data dir.
	dataDir string
	// previewAddr is where the daemon's preview listener listens (with
	// e2ePreviews), the same across restarts.
	previewAddr string
}

// e2eOptions adjust the daemon of newE2E.
type e2eOptions struct {
	// world, when set, gives sandboxes networking whose host side lives in
	// the world's host namespace; without it the daemon runs without
	// sandbox networking.
	world *world
	// previews serves previews on a port of 127.0.0.1.
	previews bool
	// templates are shipped templates the test needs besides base.
	templates []string
}

// e2ePreviews serves previews (see e2e.previewAddr).
func e2ePreviews(o *e2eOptions) { o.previews = true }

// e2eWorld gives sandboxes the network of w.
func e2eWorld(w *world) func(*e2eOptions) { return func(o *e2eOptions) { o.world = w } }

// e2eTemplates builds the shipped templates names into the cache first.
func e2eTemplates(names ...string) func(*e2eOptions) {
	return func(o *e2eOptions) { o.templates = append(o.templates, names...) }
}

func newE2E(t testing.TB, opts ...func(*e2eOptions)) *e2e {
	t.Helper()
	var o e2eOptions
	for _, f := range opts {
		f(&o)
	}
	e := &e2e{t: t}
	do := daemon.Options{NoNetwork: o.world == nil}
	if w := o.world; w != nil {
		do.Network = func(c *network.Config) {
			wc := w.netConfig(c.StateDir)
			c.HostNetNS, c.Upstream, c.Registries = wc.HostNetNS, wc.Upstream, wc.Registries
			c.APIPorts = append(c.APIPorts, wc.APIPorts...)
		}
	}
	if o.previews {
		e.previewAddr = freeAddr(t)
	}
	e.env = daemontest.Start(t, daemontest.Options{
		Prefix: "airlock-server-e2e-", Templates: o.templates, Daemon: do,
		Configure: func(c *config.Config) {
			c.PreviewListen = e.previewAddr
		},
	})
	e.dataDir = e.env.DataDir()
	e.h = &harness{t: t, keys: map[string]string{}, admin: e.env.AdminKey(),
		keyFn: func(tenant string) string { return e.env.Key(t, tenant) }}
	e.h.url = e.env.URL()
	return e
}

// stop shuts the daemon down; sandboxes keep running.
func (e *e2e) stop() {
	e.t.Helper()
	if err := e.env.Stop(); err != nil {
		e.t.Fatalf("daemon stop: %v", err)
	}
}

// start starts a daemon again on the same data dir (it re-adopts every
// running sandbox).
func (e *e2e) start() {
	e.t.Helper()
	e.env.Start()
	e.h.url = e.env.URL()
}

// initPid returns the host pid of sandbox id's init (its agent), as runc
// reports it.
func (e *e2e) initPid(id string) int {
	e.t.Helper()
	out, err := osexec.Command("runc", "--root", filepath.Join(e.dataDir, "runc"), "state", id).Output()
	if err != nil {
		e.t.Fatalf("runc state %s: %v", id, err)
	}
	var st struct {
		Pid    int    `json:"pid"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 0 {
		e.t.Fatalf("runc state %s: %s (%v)", id, out, err)
	}
	return st.Pid
}

// networks lists the sandboxes the daemon's network keeps state of.
func (e *e2e) networks() []string {
	ents, _ := os.ReadDir(filepath.Join(e.dataDir, "network", "sandboxes"))
	var out []string
	for _, d := range ents {
		out = append(out, d.Name())
	}
	return out
}

// freeAddr returns a 127.0.0.1 address no one listens on now.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
func TestE2ERuncCreateExecFilesDelete(t *testing.T) {
	e := newE2E(t)
	h := e.h
	sb := h.create("acme", api.CreateSandboxRequest{Resources: &api.Resources{MemoryMB: 128}, Secrets: map[string]string{"API_TOKEN": "e2e-secret-token-42"}})
	if sb.State != api.StateRunning || sb.ReadyMS <= 0 {
		t.Fatalf("created %+v", sb)
	}
	res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`id -u; id -un; pwd; cat /proc/sys/kernel/hostname; python3 -c 'print(6*7)'; echo $API_TOKEN`)})
	want := "1000\nuser\n/home/user\n" + strings.ReplaceAll(sb.ID, "_", "-") + "\n42\n" + strings.Repeat("*", 19) + "\n"
	if res.Status != api.ExecExited || strp(res.Stdout) != want {
		t.Fatalf("exec: %+v\nstdout %q\nwant   %q\nstderr %q", res, strp(res.Stdout), want, strp(res.Stderr))
	}
	// Files in and out, seen by commands.
	h.expect(h.req("PUT", "/v1/sandboxes/"+sb.ID+"/files?path=/home/user/in.txt", h.key("acme"), "from the host\n"), http.StatusCreated, "")
	if res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`cat in.txt; echo made > out.txt`)}); strp(res.Stdout) != "from the host\n" {
		t.Fatalf("uploaded file: %q", strp(res.Stdout))
	}
	r := h.req("GET", "/v1/sandboxes/"+sb.ID+"/files?path=/home/user/out.txt", h.key("acme"), nil)
	if string(r.body) != "made\n" {
		t.Fatalf("download %q", r.body)
	}
	// Timeout: the whole tree dies, status timeout.
	timeout := 1.0
	res = h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`trap "" TERM; (trap "" TERM; sleep 60) & sleep 60`), TimeoutS: &timeout})
	if res.Status != api.ExecTimeout {
		t.Fatalf("timeout: %+v", res)
	}
	// OOM: a memory bomb in a 128 MiB sandbox is reported as oom.
	res = h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"python3", "-c", "a = bytearray(1 << 30); print(len(a))"}})
	if res.Status != api.ExecOOM {
		t.Fatalf("memory bomb: status %q (%+v stderr %q)", res.Status, res, strp(res.Stderr))
	}
	// The sandbox still answers.
	if res := h.exec("acme", sb.ID, api.ExecRequest{Cmd: []string{"true"}}); res.Status != api.ExecExited {
		t.Fatalf("after oom: %+v", res)
	}
	var mt api.Metrics
	h.req("GET", "/v1/sandboxes/"+sb.ID+"/metrics", h.key("acme"), nil).json(t, &mt)
	if mt.CPUSeconds <= 0 || mt.MemoryPeakBytes == 0 || mt.UptimeS <= 0 {
		t.Fatalf("metrics %+v", mt)
	}
	h.expect(h.req("DELETE", "/v1/sandboxes/"+sb.ID, h.key("acme"), nil), http.StatusNoContent, "")
	if _, err := os.Stat(filepath.Join(e.dataDir, "sandboxes", sb.ID)); !os.IsNotExist(err) {
		t.Fatalf("sandbox dir left after delete: %v", err)
	}
}

func TestE2ERuncDiskFull(t *testing.T) {
	e := newE2E(t)
	h := e.h
	sb := h.create("acme", api.CreateSandboxRequest{Resources: &api.Resources{DiskMB: 32}})
	// An upload larger than the disk: quota_exceeded, nothing left behind.
	big := strings.Repeat("x", 40<<20)
	h.expect(h.req("PUT", "/v1/sandboxes/"+sb.ID+"/files?path=/home/user/big", h.key("acme"), big), http.StatusTooManyRequests, api.CodeQuotaExceeded)
	// A command filling the disk sees ENOSPC; the sandbox stays usable.
	res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`dd if=/dev/zero of=/home/user/fill bs=1M count=64 2>&1; rm -f /home/user/fill; echo ok > /home/user/after`)})
	if !strings.Contains(strp(res.Stdout), "No space left") {
		t.Fatalf("disk fill: %q", strp(res.Stdout))
	}
	h.expect(h.req("PUT", "/v1/sandboxes/"+sb.ID+"/files?path=/home/user/small", h.key("acme"), "fits"), http.StatusCreated, "")
	if res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`cat /home/user/after /home/user/small; ls /home/user`)}); !strings.HasPrefix(strp(res.Stdout), "ok\nfits") || strings.Contains(strp(res.Stdout), "big") {
		t.Fatalf("after disk full: %q", strp(res.Stdout))
	}
}

func TestE2ERuncRestartSafety(t *testing.T) {
	e := newE2E(t)
	h := e.h
	keep := h.create("acme", api.CreateSandboxRequest{})
	dies := h.create("acme", api.CreateSandboxRequest{})
	h.exec("acme", keep.ID, api.ExecRequest{Shell: sh(`echo state > /home/user/marker`)})
	pid := e.initPid(dies.ID)
	e.stop() // the daemon goes away; sandboxes keep running
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e.start()
	if got := h.state("acme", keep.ID); got.State != api.StateRunning {
		t.Fatalf("kept sandbox after restart: %+v", got)
	}
	if res := h.exec("acme", keep.ID, api.ExecRequest{Cmd: []string{"cat", "/home/user/marker"}}); strp(res.Stdout) != "state\n" {
		t.Fatalf("exec after restart: %+v", res)
	}
	got := h.state("acme", dies.ID)
	if got.State != "error" || got.Error == nil || got.Error.Code != "sandbox_crashed" {
		t.Fatalf("killed sandbox after restart: %+v", got)
	}
	if _, err := os.Stat(filepath.Join(e.dataDir, "sandboxes", dies.ID)); !os.IsNotExist(err) {
		t.Fatalf("crashed sandbox not cleaned: %v", err)
	}
}
