package gvisor

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/drivertest"
)

// TestSocketDirSealedOnReply: the directory of the agent's socket stays
// the sandbox root's while the agent sets its socket up, however early
// the daemon connects (runsc's Gofer accepts on the host as soon as the
// agent has bound it; a dir sealed then made the agent's chmod fail and
// the agent exit), and is host root's, 0755, once the agent has answered.
func TestSocketDirSealedOnReply(t *testing.T) {
	requireHost(t)
	tmpl := drivertest.BaseTemplate(t)
	d := newDriver(t, newHost(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const id = "sbx_gsealed"
	if _, err := d.Create(ctx, driver.Spec{ID: id, Template: tmpl}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Destroy(context.Background(), id) })
	if err := d.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	st, err := d.LoadState(id)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(d.Dir(id), "uds")
	owner := func() (uint32, uint32) {
		var s unix.Stat_t
		if err := unix.Lstat(dir, &s); err != nil {
			t.Fatal(err)
		}
		return s.Uid, s.Mode & 0o777
	}
	conn, err := d.DialAgent(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if uid, mode := owner(); uid != st.UIDBase || mode != 0o700 {
		t.Errorf("socket dir before the agent answered: owner %d mode %o, want the sandbox root's %d, 0700", uid, mode, st.UIDBase)
	}
	c, err := agentclient.New(conn)
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	defer c.Close()
	if uid, mode := owner(); uid != 0 || mode != 0o755 {
		t.Errorf("socket dir after the handshake: owner %d mode %o, want host root's, 0755", uid, mode)
	}
	if err := c.Ping(ctx); err != nil {
		t.Errorf("agent after the seal: %v", err)
	}
}
