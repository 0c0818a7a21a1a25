package gvisor

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/cgroups"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/drivertest"
	"github.com/airlockhq/airlock/internal/driver/oci"
)

// TestCPULimitOnceAgentListens: the bundle runsc starts carries no CPU
// quota (the Sentry boots the agent unthrottled), the sandbox's cgroup has
// its quota by the time DialAgent hands out a connection, after a restart
// too, and a recovering driver sets it on a sandbox whose agent was never
// dialled.
func TestCPULimitOnceAgentListens(t *testing.T) {
	requireHost(t)
	tmpl := drivertest.BaseTemplate(t)
	h := newHost(t)
	d := newDriver(t, h)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const id = "sbx_gcpulimit"
	hd, err := d.Create(ctx, driver.Spec{ID: id, Template: tmpl, Resources: driver.Resources{CPU: 0.5}})
	if err != nil {
		t.Fatal(err)
	}
	var cur driver.Driver = d // the driver that holds the sandbox now
	t.Cleanup(func() { cur.Destroy(context.Background(), id) })
	b, err := os.ReadFile(filepath.Join(d.Dir(id), "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var bundle struct {
		Linux struct {
			CgroupsPath string `json:"cgroupsPath"`
			Resources   struct {
				CPU *json.RawMessage `json:"cpu"`
			} `json:"resources"`
		} `json:"linux"`
	}
	if err := json.Unmarshal(b, &bundle); err != nil {
		t.Fatal(err)
	}
	if bundle.Linux.Resources.CPU != nil {
		t.Fatalf("bundle has a CPU limit %s: runsc would boot the agent throttled", *bundle.Linux.Resources.CPU)
	}
	hier, err := cgroups.Load()
	if err != nil {
		t.Fatal(err)
	}
	g := hier.Group(bundle.Linux.CgroupsPath)
	want := func(what string) {
		t.Helper()
		q, p, err := g.CPU()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if q != 50000 || p != 100000 {
			t.Fatalf("%s: cgroup CPU limit %d/%d µs, want 50000/100000", what, q, p)
		}
	}
	dial := func() {
		t.Helper()
		conn, err := d.DialAgent(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		conn.Close()
	}
	if err := d.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	dial()
	want("after the first dial")

	// A new init gets a new cgroup from runsc: the limit is set again.
	if err := d.Stop(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	dial()
	want("after a restart")

	// A daemon that stopped before dialling: the next driver's Recover
	// sets the limit.
	if err := g.SetCPU(-1, 100000); err != nil {
		t.Fatal(err)
	}
	d.Close()
	d2, err := New(Config{DataDir: h.DataDir, AgentPath: d.cfg.AgentPath, CgroupParent: h.CgroupParent, UIDRangeStart: h.GVisorUIDStart})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d2.Close() })
	cur = d2
	var st oci.State
	if err := json.Unmarshal(hd.State, &st); err != nil || st.CPU == nil {
		t.Fatalf("handle state %s: no deferred CPU limit (%v)", hd.State, err)
	}
	if err := d2.Recover(ctx, hd); err != nil {
		t.Fatal(err)
	}
	want("after Recover")
}
