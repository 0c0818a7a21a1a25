package httpapi_test

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
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
	"github.com/airlockhq/airlock/internal/plane/httpapi"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/service/sandbox"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testutil"
)

// benchStack is the API's whole in-process stack on the runc driver (the
// services, the HTTP plane, a temp data dir): what the benchmarks measure
// with and without metering, which a daemon cannot be run without. Tests
// drive the daemon itself instead (newE2E, over internal/testutil/daemontest).
type benchStack struct {
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
	// unmetered runs without the audit trail, the Prometheus observer
	// and sampling (the overhead benchmark's baseline); sampleEvery
	// overrides the sample interval.
	unmetered   bool
	sampleEvery time.Duration
	metrics     *httpapi.Metrics
	// slot names the host-wide resources of the test's driver.
	slot hostslot.Names
}

// stackUnmetered: see benchStack.unmetered.
func stackUnmetered(e *benchStack) { e.unmetered, e.sampleEvery = true, time.Hour }

// stackSampleEvery samples every sandbox each d.
func stackSampleEvery(d time.Duration) func(*benchStack) {
	return func(e *benchStack) { e.sampleEvery = d }
}

func newBenchStack(t testing.TB, opts ...func(*benchStack)) *benchStack {
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
	dataDir, err := os.MkdirTemp("", "airlock-bench-")
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
	e := &benchStack{t: t, dataDir: dataDir, tmpl: tmpl, slot: slot.Names}
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
	// After the driver made its own directories: from here on, nothing
	// new may stay behind (mounts, loop devices, cgroups, processes, files
	// of sandboxes).
	snap := hostcheck.Take(t, filepath.Join(dataDir, "sandboxes"))
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

func (e *benchStack) start() {
	e.t.Helper()
	drv, err := runc.New(runc.Config{DataDir: e.dataDir, AgentPath: testutil.BuildAgent(e.t), Logger: testLog,
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
	var obs service.Observer
	if e.metrics != nil {
		obs = e.metrics
	}
	svc, err := service.New(service.Config{Settings: s, Store: e.st, Drivers: []driver.Driver{drv}, Templates: e.tmpl,
		Logger: testLog, TickInterval: 50 * time.Millisecond, SweepInterval: time.Second,
		Audit: e.rec, Observer: obs, SampleInterval: e.sampleEvery})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := svc.Start(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.svc, e.drv, e.m = svc, drv, svc.Sandboxes
	e.srv = httpapi.New(httpapi.Config{Auth: e.auth,
		Sandboxes: svc.Sandboxes, Execs: svc.Execs, Files: svc.Files, Networks: svc.Networks,
		Previews: svc.Previews, Accounting: svc.Accounting, Templates: svc.Templates,
		Logger: testLog, Version: "bench", MaxUploadBytes: 64 << 20, Audit: e.rec, Metrics: e.metrics})
	e.ts = httptest.NewServer(e.srv.Handler())
	if e.h == nil {
		e.h = &harness{t: e.t, keys: map[string]string{}, auth: e.auth}
	}
	e.h.url, e.h.srv, e.h.svc = e.ts.URL, e.srv, svc
}

func (e *benchStack) stop() {
	if e.ts == nil {
		return
	}
	e.srv.CloseStreams()
	e.ts.Close()
	e.svc.Close()
	e.drv.Close()
	e.ts = nil
}
