package httpapi_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// TestE2ERuncWatch watches directories of a real runc sandbox through the
// daemon's watch route (the Go SDK's WatchDir): the agent's inotify, as the
// sandbox's users.
func TestE2ERuncWatch(t *testing.T) {
	e := newE2E(t)
	h := e.h
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sb := h.create("acme", api.CreateSandboxRequest{})
	acme, err := client.New(h.url, h.key("acme"))
	if err != nil {
		t.Fatal(err)
	}

	t.Run("Tree", func(t *testing.T) {
		if res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`mkdir w`)}); res.Status != api.ExecExited || intp(res.ExitCode) != "0" {
			t.Fatalf("mkdir: %+v", res)
		}
		w, err := acme.WatchDir(ctx, sb.ID, "/home/user/w", client.WatchOptions{Recursive: true})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		var got []string
		until := func(last string) {
			t.Helper()
			for !strings.HasSuffix(strings.Join(got, ","), last) {
				ev, err := w.Next()
				if err != nil {
					t.Fatalf("Next: %v (got %v)", err, got)
				}
				if ev.Type == client.WatchWrite {
					continue
				}
				s := ev.Type + " " + ev.Path
				if ev.From != "" {
					s += "<-" + ev.From
				}
				got = append(got, s)
			}
		}
		run := func(script string) {
			t.Helper()
			if res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(script)}); intp(res.ExitCode) != "0" {
				t.Fatalf("script: %+v stderr %q", res, strp(res.Stderr))
			}
		}
		// The new directory is watched once its create is reported; a
		// file that lives an instant in it is seen from then on.
		run(`mkdir -p w/sub`)
		until("create /home/user/w/sub")
		run(`cd w && : > sub/brief && rm sub/brief && echo x > a && mv a b && chmod 600 b && : > zz-marker`)
		until("create /home/user/w/zz-marker")
		want := strings.Join([]string{
			"create /home/user/w/sub", "create /home/user/w/sub/brief", "remove /home/user/w/sub/brief",
			"create /home/user/w/a", "rename /home/user/w/b<-/home/user/w/a", "chmod /home/user/w/b",
			"create /home/user/w/zz-marker",
		}, ",")
		if strings.Join(got, ",") != want {
			t.Fatalf("events\n got %s\nwant %s", strings.Join(got, ","), want)
		}
	})

	t.Run("AsUser", func(t *testing.T) {
		// /root is root's, 0700: user may not watch it, root may.
		if w, err := acme.WatchDir(ctx, sb.ID, "/root", client.WatchOptions{User: "user"}); !errors.Is(err, client.ErrPermissionDenied) {
			if err == nil {
				w.Close()
			}
			t.Fatalf("user watched /root: %v", err)
		}
		w, err := acme.WatchDir(ctx, sb.ID, "/root", client.WatchOptions{User: "root"})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`touch /root/mine`), User: "root"}); intp(res.ExitCode) != "0" {
			t.Fatalf("touch: %+v", res)
		}
		ev, err := w.Next()
		if err != nil || ev.Type != client.WatchCreate || ev.Path != "/root/mine" {
			t.Fatalf("root's watch: %+v, %v", ev, err)
		}
		// Another tenant does not find the sandbox.
		other, err := client.New(h.url, h.key("other"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.WatchDir(ctx, sb.ID, "/root", client.WatchOptions{User: "root"}); !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("other tenant: %v", err)
		}
	})

	t.Run("HTTP", func(t *testing.T) {
		c, err := client.New(h.url, h.key("acme"))
		if err != nil {
			t.Fatal(err)
		}
		w, err := c.WatchDir(ctx, sb.ID, "/tmp", client.WatchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteFile(ctx, sb.ID, "/tmp/up.txt", strings.NewReader("x")); err != nil {
			t.Fatal(err)
		}
		if ev := nextChange(t, w); ev.Type != client.WatchCreate || ev.Path != "/tmp/up.txt" {
			t.Fatalf("event %+v, want the upload's create", ev)
		}
		// The agent holds one inotify instance: this watch's (the ones
		// above end with their subtests, soon); once closed, none.
		// Counted from the host: the sandbox's own root may not read the
		// agent's fds.
		pid := agentPID(t, sb.ID)
		waitInotifyFDs(t, pid, 1)
		w.Close()
		waitInotifyFDs(t, pid, 0)
	})
}

// agentPID finds the host pid of sandbox id's agent: the airlock-agent
// process whose cgroup names the sandbox.
func agentPID(t *testing.T, id string) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + ent.Name() + "/cmdline")
		cg, _ := os.ReadFile("/proc/" + ent.Name() + "/cgroup")
		if strings.Contains(string(cmd), "airlock-agent") && strings.Contains(string(cg), id) {
			return pid
		}
	}
	t.Fatalf("no agent process of %s", id)
	return 0
}

// waitInotifyFDs waits until process pid has want inotify instances.
func waitInotifyFDs(t *testing.T, pid, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for n := inotifyFDsOf(t, pid); n != want; n = inotifyFDsOf(t, pid) {
		if time.Now().After(deadline) {
			t.Fatalf("%d inotify instances in the agent, want %d", n, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// inotifyFDsOf counts the inotify instances of process pid.
func inotifyFDsOf(t *testing.T, pid int) int {
	t.Helper()
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ent := range ents {
		if l, err := os.Readlink(dir + "/" + ent.Name()); err == nil && l == "anon_inode:inotify" {
			n++
		}
	}
	return n
}
