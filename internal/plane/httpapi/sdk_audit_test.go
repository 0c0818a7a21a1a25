package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// TestSDKAuditAndNetwork drives the SDK's audit and network calls against
// the real server.
func TestSDKAuditAndNetwork(t *testing.T) {
	h, fn := newNetHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(h.url, h.key("acme"))
	if err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(h.url, h.admin)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("network", func(t *testing.T) {
		got, err := c.UpdateNetwork(ctx, sb.ID, api.Network{Mode: "allowlist", Allow: []string{"pypi.org"}, Registries: []string{"debian"}})
		if err != nil || got.Network.Mode != "allowlist" || got.Network.Registries[0] != "debian" {
			t.Fatalf("UpdateNetwork: %+v %v", got, err)
		}
		if p, _ := fn.policy(sb.ID); p.Mode != "allowlist" {
			t.Fatalf("policy %+v", p)
		}
		if _, err := c.UpdateNetwork(ctx, sb.ID, api.Network{Mode: "bogus"}); !errors.Is(err, client.ErrInvalidArgument) {
			t.Fatalf("bad mode: %v", err)
		}
		if _, err := c.SetTenantNetwork(ctx, "acme", api.Network{Mode: "open"}); !errors.Is(err, client.ErrPermissionDenied) {
			t.Fatalf("tenant key sets a default: %v", err)
		}
		tn, err := admin.SetTenantNetwork(ctx, "acme", api.Network{Mode: "open"})
		if err != nil || tn.Network == nil || tn.Network.Mode != "open" {
			t.Fatalf("SetTenantNetwork: %+v %v", tn, err)
		}
		if tn, err := c.TenantNetwork(ctx, "acme"); err != nil || tn.Network.Mode != "open" {
			t.Fatalf("TenantNetwork: %+v %v", tn, err)
		}
		if err := admin.ClearTenantNetwork(ctx, "acme"); err != nil {
			t.Fatal(err)
		}
		if tn, err := c.TenantNetwork(ctx, "acme"); err != nil || tn.Network != nil {
			t.Fatalf("after clearing: %+v %v", tn, err)
		}
	})

	t.Run("audit", func(t *testing.T) {
		for range 5 {
			if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"true"}}); err != nil {
				t.Fatal(err)
			}
		}
		var n int
		eventually(t, "five exec events", func() bool {
			n = 0
			for e, err := range c.AuditEvents(ctx, client.AuditOptions{SandboxID: sb.ID, Types: []string{api.AuditExec}, Limit: 2}) {
				if err != nil {
					t.Fatal(err)
				}
				if e.Type != api.AuditExec {
					t.Fatalf("event %+v", e)
				}
				n++
			}
			return n == 5
		})
		var buf bytes.Buffer
		got, err := c.ExportAudit(ctx, client.AuditOptions{SandboxID: sb.ID}, &buf)
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		if err != nil || got != len(lines) || got < 7 { // create, network_update, 5 execs
			t.Fatalf("export: %d events, %d lines, %v", got, len(lines), err)
		}
		var first api.AuditEvent
		if err := json.Unmarshal([]byte(lines[0]), &first); err != nil || first.Type != api.AuditCreate {
			t.Fatalf("first exported event %s: %v", lines[0], err)
		}
		if _, err := c.Audit(ctx, client.AuditOptions{Types: []string{"bogus"}}); !errors.Is(err, client.ErrInvalidArgument) {
			t.Fatalf("bad type: %v", err)
		}
	})

	t.Run("follow", func(t *testing.T) {
		fctx, fcancel := context.WithCancel(ctx)
		defer fcancel()
		seen := make(chan api.AuditEvent, 16)
		done := make(chan error, 1)
		go func() {
			for e, err := range c.FollowAudit(fctx, client.AuditOptions{Since: time.Now(), Types: []string{api.AuditPause, api.AuditResume}}, 50*time.Millisecond) {
				if err != nil {
					done <- err
					return
				}
				seen <- e
			}
			done <- nil
		}()
		if _, err := c.Pause(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Resume(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{api.AuditPause, api.AuditResume} {
			select {
			case e := <-seen:
				if e.Type != want || e.SandboxID != sb.ID {
					t.Fatalf("followed %+v, want %s", e, want)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("follow did not see %s", want)
			}
		}
		fcancel()
		if err := <-done; err != nil {
			t.Fatalf("follow ended with %v", err)
		}
	})
}
