package runc

import (
	"context"
	"testing"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/drivertest"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// TestOOMKills checks the cheap OOM counter the manager reads around every
// exec: zero on a fresh sandbox, counting a kill, equal to what Stats says,
// and gone with the sandbox.
func TestOOMKills(t *testing.T) {
	requireHost(t)
	tmpl := drivertest.BaseTemplate(t)
	d := newDriver(t, newHost(t))
	ctx := context.Background()
	const id = "sbx_oomkills"
	if _, err := d.OOMKills(ctx, id); !errdefs.IsNotFound(err) {
		t.Fatalf("before create: %v, want not found", err)
	}
	c := drivertest.Started(t, d, driver.Spec{ID: id, Template: tmpl, Resources: driver.Resources{MemoryMB: 64}})
	if n, err := d.OOMKills(ctx, id); err != nil || n != 0 {
		t.Fatalf("fresh sandbox: %d, %v", n, err)
	}
	drivertest.Output(t, c, "python3 -c 'b = bytearray(512 << 20)'; echo done")
	n, err := d.OOMKills(ctx, id)
	if err != nil || n < 1 {
		t.Fatalf("after a memory bomb: %d, %v; want at least one kill", n, err)
	}
	st, err := d.Stats(ctx, id)
	if err != nil || st.OOMKills != n {
		t.Fatalf("Stats says %d (%v), OOMKills %d", st.OOMKills, err, n)
	}
	if err := d.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := d.OOMKills(ctx, id); !errdefs.IsNotFound(err) {
		t.Fatalf("after destroy: %v, want not found", err)
	}
}
