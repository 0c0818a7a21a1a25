package httpapi_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/runc"
	"github.com/airlockhq/airlock/internal/hostcheck"
	"github.com/airlockhq/airlock/internal/hostslot"
	"github.com/airlockhq/airlock/internal/network"
	"github.com/airlockhq/airlock/internal/plane/httpapi"
	"github.com/airlockhq/airlock/internal/plane/preview"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/service/netpolicy"
	"github.com/airlockhq/airlock/internal/service/sandbox"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testutil"
)

// The end-to-end tests run the real stack as root: runc driver, storage,
// the base template and the agent binary, behind the real HTTP server.

// buildAgent is the static airlock-agent the e2e sandboxes run.
func buildAgent(t testing.TB) string { return testutil.BuildAgent(t) }

// e2e is the real stack on a temp data dir.
type e2e struct {
	t       testing.TB
	dataDir string
	tmpl    *template.Store
	st      *store.Store
	auth    *auth.Authenticator
	drv     *runc.Driver
	m       *sandbox.Service
	svc     *service.Set
	srv     *httpapi.Server
	ts      *httptest.Server
	h       *harness // request helpers bound to ts
	rec     *audit.Recorder
	// world, when set, gives sandboxes networking whose host side lives
	// in the world's host namespace (nm, made by start).
	world *world
	nm    *network.Manager
	// unmetered runs without the audit trail, the Prometheus observer
	// and sampling (the overhead benchmark's baseline); sampleEvery
	// overrides the sample interval.
	unmetered   bool
	sampleEvery time.Duration
	metrics     *httpapi.Metrics
	// slot names the host-wide resources of the test's driver.
	slot hostslot.Names
	// previews, when set, serves the manager's previews on a listener of
	// 127.0.0.1 that every start makes before the manager (as the
	// daemon does), at previewAddr.
	previews    bool
	previewAddr string
	previewStop func()
}

// e2ePreviews serves previews (see e2e.previews).
func e2ePreviews(e *e2e) { e.previews = true }

// e2eUnmetered: see e2e.unmetered.
func e2eUnmetered(e *e2e) { e.unmetered, e.sampleEvery = true, time.Hour }

// e2eSampleEvery samples every sandbox each d.
func e2eSampleEvery(d time.Duration) func(*e2e) { return func(e *e2e) { e.sampleEvery = d } }

func newE2E(t testing.TB, opts ...func(*e2e)) *e2e {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "runc")
	tmpl := template.NewStore(filepath.Join(testutil.DataDir(), "templates"))
	if _, err := tmpl.Get("base", 0); err != nil {
		// Build it once per machine (about half a minute).
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		var progress strings.Builder
		if _, err := tmpl.EnsureBase(ctx, &progress); err != nil {
			t.Fatalf("base template: %v\n%s", err, progress.String())
		}
	}
	dataDir, err := os.MkdirTemp("", "airlock-server-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dataDir, 0o711) // sandbox uids must search it
	// A host slot of its own: its cgroups and uid ranges are never those
	// of a daemon serving on this host, nor of another test's.
	slot, err := hostslot.Acquire(dataDir, hostslot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(slot.Release) // after the cleanup below, which runs first
	e := &e2e{t: t, dataDir: dataDir, tmpl: tmpl, slot: slot.Names}
	for _, o := range opts {
		o(e)
	}
	st, err := store.Open(context.Background(), filepath.Join(dataDir, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	e.st, e.auth = st, auth.New(st)
	if !e.unmetered {
		if e.rec, err = audit.New(audit.Config{Sink: st, Logger: testLog}); err != nil {
			t.Fatal(err)
		}
		e.metrics = httpapi.NewMetrics(nil)
	}
	e.start()
	// After the driver and the network made their own directories: from
	// here on, nothing new may stay behind (mounts, loop devices, cgroups,
	// processes, files of sandboxes and their networks).
	snap := hostcheck.Take(t, filepath.Join(dataDir, "sandboxes"), filepath.Join(dataDir, "network"))
	t.Cleanup(func() {
		ctx := context.Background()
		// Delete what the test left, then nothing may remain on the host.
		recs, _ := e.st.SandboxesInStates(ctx, api.StateStarting, api.StateRunning, api.StatePaused, api.StateStopping)
		for _, r := range recs {
			e.m.Delete(ctx, auth.Principal{Admin: true}, r.ID)
		}
		e.stop()
		snap.AssertNoLeaks(t)
		e.rec.Close()
		st.Close()
		os.RemoveAll(dataDir)
	})
	return e
}

func (e *e2e) start() {
	e.t.Helper()
	drv, err := runc.New(runc.Config{DataDir: e.dataDir, AgentPath: buildAgent(e.t), Logger: testLog,
		CgroupParent: e.slot.CgroupParent, UIDRangeStart: e.slot.RuncUIDStart, MaxSandboxes: hostslot.UIDRanges})
	if err != nil {
		e.t.Fatal(err)
	}
	if h := drv.Probe(context.Background()); h.State != driver.HealthHealthy {
		drv.Close()
		testutil.HostLacks(e.t, "runc driver not usable here: %s", h.Description)
	}
	s := config.Default()
	s.DataDir = e.dataDir
	var pln net.Listener
	if e.previews {
		if pln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			drv.Close()
			e.t.Fatal(err)
		}
		// The manager hands out URLs of the listener as bound.
		s.PreviewListen = pln.Addr().String()
	}
	var regs map[string][]string
	var ncfg network.Config
	if e.world != nil {
		ncfg = e.world.netConfig(filepath.Join(e.dataDir, "network"))
		regs = network.DefaultRegistries(ncfg.Registries)
	}
	// The network's events go to the attribution, made first (as the
	// daemon does), which the manager is given too.
	attr := netpolicy.NewAttribution(netpolicy.AttributionConfig{Audit: e.rec, Registries: regs, Logger: testLog})
	if e.world != nil {
		ncfg.Audit = attr.NetworkEvent
		nm, err := network.New(ncfg)
		if err != nil {
			drv.Close()
			e.t.Fatal(err)
		}
		e.nm = nm
	}
	var obs service.Observer
	if e.metrics != nil {
		obs = e.metrics
	}
	svc, err := service.New(service.Config{Settings: s, Store: e.st, Drivers: []driver.Driver{drv}, Templates: e.tmpl,
		Logger: testLog, TickInterval: 50 * time.Millisecond, SweepInterval: time.Second,
		Audit: e.rec, Attribution: attr, Network: sandbox.NetworkOf(e.nm), Registries: regs,
		Observer: obs, SampleInterval: e.sampleEvery})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := svc.Start(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	m := svc.Sandboxes
	e.svc = svc
	e.drv, e.m = drv, m
	if pln != nil {
		ph := preview.New(preview.Config{Backend: svc.Previews.PreviewBackend(), Logger: testLog})
		psrv := &http.Server{Handler: ph, ReadHeaderTimeout: 5 * time.Second}
		done := make(chan struct{})
		go func() { defer close(done); _ = psrv.Serve(pln) }()
		e.previewAddr, e.previewStop = pln.Addr().String(), func() { psrv.Close(); <-done; ph.Close() }
	}
	e.srv = httpapi.New(httpapi.Config{Auth: e.auth,
		Sandboxes: svc.Sandboxes, Execs: svc.Execs, Files: svc.Files, Networks: svc.Networks,
		Previews: svc.Previews, Accounting: svc.Accounting, Templates: svc.Templates, Logger: testLog, Version: "e2e", MaxUploadBytes: 64 << 20, Audit: e.rec,
		Metrics: e.metrics})
	e.ts = httptest.NewServer(e.srv.Handler())
	if e.h == nil {
		e.h = &harness{t: e.t, keys: map[string]string{}, auth: e.auth}
	}
	e.h.url, e.h.srv, e.h.svc = e.ts.URL, e.srv, svc
}

func (e *e2e) stop() {
	if e.ts == nil {
		return
	}
	e.srv.CloseStreams()
	e.ts.Close()
	if e.previewStop != nil {
		e.previewStop()
		e.previewStop = nil
	}
	e.svc.Close()
	e.drv.Close()
	if e.nm != nil {
		// Sandboxes keep their kernel state for the next network.Manager.
		if err := e.nm.Close(); err != nil {
			e.t.Errorf("closing the network: %v", err)
		}
		e.nm = nil
	}
	e.ts = nil
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
	st, err := e.drv.Inspect(context.Background(), dies.ID)
	if err != nil || st.Pid <= 0 {
		t.Fatalf("inspect: %+v %v", st, err)
	}
	e.stop() // the daemon goes away; sandboxes keep running
	if err := syscall.Kill(st.Pid, syscall.SIGKILL); err != nil {
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
