package files_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/servicetest"
)

func TestWatchDir(t *testing.T) {
	e := servicetest.Start(t, servicetest.Options{})
	m := e.Sandboxes
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := auth.Principal{Tenant: "acme"}
	res, err := m.Create(ctx, p, api.CreateSandboxRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	id := res.Sandbox.ID
	defer m.Delete(context.WithoutCancel(ctx), p, id)

	t.Run("Refused", func(t *testing.T) {
		cases := []struct {
			name string
			p    auth.Principal
			path string
			user string
			want error
		}{
			{"OtherTenant", auth.Principal{Tenant: "other"}, "/home/user", "", errdefs.ErrNotFound},
			{"DotDot", p, "/home/user/../..", "", errdefs.ErrInvalidArgument},
			{"Relative", p, "home/user", "", errdefs.ErrInvalidArgument},
			{"BadUser", p, "/home/user", "no body", errdefs.ErrInvalidArgument},
			{"Missing", p, "/home/user/none", "", errdefs.ErrNotFound},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				w, err := e.Files.WatchDir(ctx, tc.p, id, tc.path, tc.user, false)
				if err == nil {
					w.Close()
				}
				if !errors.Is(err, tc.want) {
					t.Fatalf("WatchDir: %v, want %v", err, tc.want)
				}
			})
		}
	})

	t.Run("Events", func(t *testing.T) {
		w, err := e.Files.WatchDir(ctx, p, id, "/home/user", "", true)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		var got []string
		until := func(last string) {
			t.Helper()
			for !strings.Contains(strings.Join(got, ","), last) {
				evs, err := w.Next()
				if err != nil {
					t.Fatalf("Next: %v (got %v)", err, got)
				}
				for _, ev := range evs {
					if ev.Type != agentproto.WatchWrite && ev.Type != agentproto.WatchChmod {
						got = append(got, ev.Type+" "+ev.Path)
					}
				}
			}
		}
		// A new directory's create is reported once it is watched: what
		// is done in it afterwards is seen event by event (what happened
		// in between, only a scan of it could show).
		if _, err := e.Files.Mkdir(ctx, p, id, "/home/user/sub", "", false); err != nil {
			t.Fatal(err)
		}
		until("create /home/user/sub")
		if _, err := e.Files.WriteFile(ctx, p, id, "/home/user/sub/f.txt", "", 0, strings.NewReader("x"), 0); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Files.Move(ctx, p, id, "/home/user/sub/f.txt", "/home/user/sub/g.txt", ""); err != nil {
			t.Fatal(err)
		}
		until("rename /home/user/sub/g.txt")
		want := "create /home/user/sub,create /home/user/sub/f.txt,rename /home/user/sub/g.txt"
		if strings.Join(got, ",") != want {
			t.Fatalf("events %v, want %s", got, want)
		}
	})

	t.Run("EndsWithSandbox", func(t *testing.T) {
		w, err := e.Files.WatchDir(ctx, p, id, "/home/user", "", false)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if err := m.Delete(ctx, p, id); err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := w.Next(); err != nil {
				if !errors.Is(err, errdefs.ErrUnavailable) {
					t.Fatalf("watch of a deleted sandbox ended with %v, want unavailable", err)
				}
				return
			}
		}
	})
}
