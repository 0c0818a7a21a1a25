package httpapi_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// nextChange returns w's next event other than writes and chmods (whose
// number depends on timing).
func nextChange(t *testing.T, w *client.DirWatch) client.WatchEvent {
	t.Helper()
	for {
		ev, err := w.Next()
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		if ev.Type != client.WatchWrite && ev.Type != client.WatchChmod {
			return ev
		}
	}
}

// TestWatchRoute drives GET /v1/sandboxes/{id}/fs/watch with the Go SDK.
func TestWatchRoute(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(h.url, h.key("acme"))
	if err != nil {
		t.Fatal(err)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Mkdir(ctx, sb.ID, "/home/user/w"); err != nil {
		t.Fatal(err)
	}

	t.Run("Refused", func(t *testing.T) {
		other, err := client.New(h.url, h.key("other"))
		if err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			name   string
			c      *client.Client
			path   string
			status int
		}{
			{"OtherTenant", other, "/home/user/w", http.StatusNotFound},
			{"Missing", c, "/home/user/none", http.StatusNotFound},
			{"DotDot", c, "/home/../etc", http.StatusBadRequest},
			{"NoPath", c, "", http.StatusBadRequest},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				w, err := tc.c.WatchDir(ctx, sb.ID, tc.path, client.WatchOptions{})
				if err == nil {
					w.Close()
				}
				var ae *client.APIError
				if !errors.As(err, &ae) || ae.StatusCode != tc.status {
					t.Fatalf("WatchDir(%q): %v, want status %d", tc.path, err, tc.status)
				}
			})
		}
	})

	t.Run("Events", func(t *testing.T) {
		w, err := c.WatchDir(ctx, sb.ID, "/home/user/w", client.WatchOptions{Recursive: true})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if _, err := c.WriteFile(ctx, sb.ID, "/home/user/w/d/a.txt", strings.NewReader("a")); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Move(ctx, sb.ID, "/home/user/w/d/a.txt", "/home/user/w/b.txt"); err != nil {
			t.Fatal(err)
		}
		if err := c.Remove(ctx, sb.ID, "/home/user/w/b.txt", false); err != nil {
			t.Fatal(err)
		}
		var got []string
		for range 4 {
			ev := nextChange(t, w)
			if ev.Time.IsZero() {
				t.Fatalf("event without a time: %+v", ev)
			}
			s := ev.Type + " " + ev.Path
			if ev.From != "" {
				s += "<-" + ev.From
			}
			got = append(got, s)
		}
		want := "create /home/user/w/d,create /home/user/w/d/a.txt,rename /home/user/w/b.txt<-/home/user/w/d/a.txt,remove /home/user/w/b.txt"
		if strings.Join(got, ",") != want {
			t.Fatalf("events\n got %s\nwant %s", strings.Join(got, ","), want)
		}
	})

	t.Run("EndsWithTheDirectory", func(t *testing.T) {
		if _, err := c.Mkdir(ctx, sb.ID, "/home/user/brief"); err != nil {
			t.Fatal(err)
		}
		w, err := c.WatchDir(ctx, sb.ID, "/home/user/brief", client.WatchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if err := c.Remove(ctx, sb.ID, "/home/user/brief", true); err != nil {
			t.Fatal(err)
		}
		if ev := nextChange(t, w); ev.Type != client.WatchRemove || ev.Path != "/home/user/brief" {
			t.Fatalf("event %+v, want the directory's removal", ev)
		}
		if _, err := w.Next(); !errors.Is(err, io.EOF) {
			t.Fatalf("after the removal: %v, want io.EOF", err)
		}
	})
}
