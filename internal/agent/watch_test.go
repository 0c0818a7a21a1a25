package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/testutil"
)

// watchEvents reads w's events in the background.
type watchEvents struct {
	t  *testing.T
	ch chan agentproto.WatchEvent
	// end is closed when Next failed; err is its error.
	end chan struct{}
	err error
}

func startWatch(t *testing.T, c *agentclient.Client, p, user string, recursive bool) (*agentclient.Watch, *watchEvents) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := c.Watch(ctx, p, user, recursive)
	if err != nil {
		t.Fatalf("Watch(%s): %v", p, err)
	}
	we := &watchEvents{t: t, ch: make(chan agentproto.WatchEvent, 100000), end: make(chan struct{})}
	go func() {
		defer close(we.end)
		for {
			evs, err := w.Next()
			if err != nil {
				we.err = err
				return
			}
			for _, ev := range evs {
				we.ch <- ev
			}
		}
	}()
	t.Cleanup(func() {
		w.Close()
		<-we.end
	})
	return w, we
}

// until collects events until one matches stop (included), or fails after
// a while.
func (we *watchEvents) until(stop func(agentproto.WatchEvent) bool) []agentproto.WatchEvent {
	we.t.Helper()
	var got []agentproto.WatchEvent
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-we.ch:
			got = append(got, ev)
			if stop(ev) {
				return got
			}
		case <-we.end:
			// Drain what was read before the end.
			for {
				select {
				case ev := <-we.ch:
					got = append(got, ev)
					if stop(ev) {
						return got
					}
					continue
				default:
				}
				break
			}
			we.t.Fatalf("watch ended (%v) before the awaited event; got %s", we.err, show(got))
		case <-timeout:
			we.t.Fatalf("no awaited event; got %s", show(got))
		}
	}
}

func is(typ, p string) func(agentproto.WatchEvent) bool {
	return func(ev agentproto.WatchEvent) bool { return ev.Type == typ && ev.Path == p }
}

// show renders events as "type path[<-from]" lines, for comparisons.
func show(evs []agentproto.WatchEvent) string {
	var b strings.Builder
	for i, ev := range evs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(ev.Type + " " + ev.Path)
		if ev.From != "" {
			b.WriteString("<-" + ev.From)
		}
		if ev.Dir {
			b.WriteString("/")
		}
	}
	return b.String()
}

// only keeps the events other than writes and chmods, whose number depends
// on timing (they are coalesced while queued).
func only(evs []agentproto.WatchEvent, types ...string) []agentproto.WatchEvent {
	var out []agentproto.WatchEvent
	for _, ev := range evs {
		for _, t := range types {
			if ev.Type == t {
				out = append(out, ev)
			}
		}
	}
	return out
}

func TestWatch(t *testing.T) {
	const marker = "zz-marker"
	cases := []struct {
		name      string
		recursive bool
		// setup prepares the watched dir (host path) before the watch.
		setup func(t *testing.T, dir string)
		// act changes the tree; then the test creates the marker file.
		act func(t *testing.T, dir, outside string)
		// types are the event types compared (others are ignored).
		types []string
		// want is the events of those types before the marker (the
		// watched dir is "/w").
		want string
		// check, when set, judges them instead of want.
		check func(t *testing.T, got []agentproto.WatchEvent)
	}{
		{
			name: "CreateWriteRemove",
			act: func(t *testing.T, dir, _ string) {
				writeFile(t, filepath.Join(dir, "a.txt"), "one")
				os.Remove(filepath.Join(dir, "a.txt"))
			},
			types: []string{"create", "write", "remove"},
			want:  "create /w/a.txt, write /w/a.txt, remove /w/a.txt",
		},
		{
			name: "CreateAndRemoveAtOnce",
			act: func(t *testing.T, dir, _ string) {
				f, err := os.Create(filepath.Join(dir, "brief"))
				if err != nil {
					t.Fatal(err)
				}
				f.Close()
				os.Remove(filepath.Join(dir, "brief"))
			},
			types: []string{"create", "remove", "rename"},
			want:  "create /w/brief, remove /w/brief",
		},
		{
			name:  "RenameIsOneEvent",
			setup: func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "old"), "x") },
			act: func(t *testing.T, dir, _ string) {
				if err := os.Rename(filepath.Join(dir, "old"), filepath.Join(dir, "new")); err != nil {
					t.Fatal(err)
				}
			},
			types: []string{"create", "remove", "rename"},
			want:  "rename /w/new<-/w/old",
		},
		{
			name:  "MoveOutIsRemove",
			setup: func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "leaving"), "x") },
			act: func(t *testing.T, dir, outside string) {
				if err := os.Rename(filepath.Join(dir, "leaving"), filepath.Join(outside, "left")); err != nil {
					t.Fatal(err)
				}
			},
			types: []string{"create", "remove", "rename"},
			want:  "remove /w/leaving",
		},
		{
			name: "MoveInIsCreate",
			act: func(t *testing.T, dir, outside string) {
				writeFile(t, filepath.Join(outside, "coming"), "x")
				if err := os.Rename(filepath.Join(outside, "coming"), filepath.Join(dir, "came")); err != nil {
					t.Fatal(err)
				}
			},
			types: []string{"create", "remove", "rename"},
			want:  "create /w/came",
		},
		{
			name: "TouchIsCreateOnly",
			act: func(t *testing.T, dir, _ string) {
				f, err := os.Create(filepath.Join(dir, "touched"))
				if err != nil {
					t.Fatal(err)
				}
				f.Close()
			},
			types: []string{"create", "write", "remove"},
			want:  "create /w/touched",
		},
		{
			name:  "AppendsCoalesce",
			setup: func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "f"), "x") },
			act: func(t *testing.T, dir, _ string) {
				f, err := os.OpenFile(filepath.Join(dir, "f"), os.O_WRONLY|os.O_APPEND, 0)
				if err != nil {
					t.Fatal(err)
				}
				for range 100 {
					f.WriteString("more")
				}
				f.Close()
			},
			// How many writes depends on how far the reader is behind:
			// between one and one per write(2), nothing else.
			types: []string{"create", "remove", "write", "rename"},
			check: func(t *testing.T, got []agentproto.WatchEvent) {
				if len(got) < 1 || len(got) > 100 {
					t.Fatalf("%d events, want 1 to 100 writes: %s", len(got), show(got))
				}
				for _, ev := range got {
					if ev.Type != "write" || ev.Path != "/w/f" {
						t.Fatalf("events %s, want writes of /w/f only", show(got))
					}
				}
			},
		},
		{
			name:  "Chmod",
			setup: func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "m"), "x") },
			act: func(t *testing.T, dir, _ string) {
				if err := os.Chmod(filepath.Join(dir, "m"), 0o600); err != nil {
					t.Fatal(err)
				}
			},
			types: []string{"chmod", "write", "create"},
			want:  "chmod /w/m",
		},
		{
			name:      "RecursiveNewTree",
			recursive: true,
			act: func(t *testing.T, dir, _ string) {
				// Made at once: the deeper levels exist before their
				// parents' watches do, and are found by a scan.
				if err := os.MkdirAll(filepath.Join(dir, "a/b/c"), 0o755); err != nil {
					t.Fatal(err)
				}
				writeFile(t, filepath.Join(dir, "a/b/c/deep.txt"), "x")
				time.Sleep(50 * time.Millisecond)
				writeFile(t, filepath.Join(dir, "a/b/later.txt"), "x")
			},
			types: []string{"create"},
			want:  "create /w/a/, create /w/a/b/, create /w/a/b/c/, create /w/a/b/c/deep.txt, create /w/a/b/later.txt",
		},
		{
			name:      "RecursiveDirRename",
			recursive: true,
			setup: func(t *testing.T, dir string) {
				if err := os.MkdirAll(filepath.Join(dir, "d/sub"), 0o755); err != nil {
					t.Fatal(err)
				}
			},
			act: func(t *testing.T, dir, _ string) {
				if err := os.Rename(filepath.Join(dir, "d"), filepath.Join(dir, "e")); err != nil {
					t.Fatal(err)
				}
				writeFile(t, filepath.Join(dir, "e/sub/f"), "x")
			},
			types: []string{"create", "rename", "remove"},
			want:  "rename /w/e<-/w/d/, create /w/e/sub/f",
		},
		{
			// A name that is not valid UTF-8 cannot be carried (JSON would
			// make it U+FFFD, merging it with others): its changes are an
			// overflow, never an event under a rewritten name.
			name: "NotUTF8IsOverflow",
			act: func(t *testing.T, dir, _ string) {
				writeFile(t, filepath.Join(dir, "x\xff"), "one")
				os.Remove(filepath.Join(dir, "x\xff"))
			},
			types: []string{"create", "write", "remove", "rename", "overflow"},
			check: wantOverflowOnly(""),
		},
		{
			name:  "RenameToNotUTF8IsRemove",
			setup: func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "plain"), "x") },
			act: func(t *testing.T, dir, _ string) {
				if err := os.Rename(filepath.Join(dir, "plain"), filepath.Join(dir, "odd\xfe")); err != nil {
					t.Fatal(err)
				}
			},
			types: []string{"create", "write", "remove", "rename", "overflow"},
			check: wantOverflowOnly("remove /w/plain"),
		},
		{
			name:      "RecursiveNotUTF8Dir",
			recursive: true,
			act: func(t *testing.T, dir, _ string) {
				if err := os.MkdirAll(filepath.Join(dir, "ok/d\xff"), 0o755); err != nil {
					t.Fatal(err)
				}
				writeFile(t, filepath.Join(dir, "ok/d\xff/f"), "x")
			},
			types: []string{"create", "write", "remove", "rename", "overflow"},
			check: wantOverflowOnly("create /w/ok/"),
		},
		{
			name: "NotRecursive",
			act: func(t *testing.T, dir, _ string) {
				if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
					t.Fatal(err)
				}
				writeFile(t, filepath.Join(dir, "sub/hidden"), "x")
			},
			types: []string{"create"},
			want:  "create /w/sub/",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newFileEnv(t)
			dir := filepath.Join(e.dir, "w")
			outside := filepath.Join(e.dir, "srv")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if tc.setup != nil {
				tc.setup(t, dir)
			}
			_, we := startWatch(t, e.c, "/w", "root", tc.recursive)
			tc.act(t, dir, outside)
			writeFile(t, filepath.Join(dir, marker), "")
			got := we.until(is("create", "/w/"+marker))
			got = only(got[:len(got)-1], tc.types...)
			if tc.check != nil {
				tc.check(t, got)
				return
			}
			if show(got) != tc.want {
				t.Fatalf("events\n got %s\nwant %s", show(got), tc.want)
			}
		})
	}
}

// wantOverflowOnly checks the events of a change to a name that is not
// valid UTF-8: the events of valid names (want, as show renders them, in
// order) and at least one overflow, and no path that is not the bytes on
// disk (an invalid name would come out holding U+FFFD).
func wantOverflowOnly(want string) func(t *testing.T, got []agentproto.WatchEvent) {
	return func(t *testing.T, got []agentproto.WatchEvent) {
		t.Helper()
		var named []agentproto.WatchEvent
		overflow := false
		for _, ev := range got {
			if strings.ContainsRune(ev.Path+ev.From, utf8.RuneError) {
				t.Fatalf("event under a rewritten name: %s", show(got))
			}
			if ev.Type == agentproto.WatchOverflow {
				overflow = true
				continue
			}
			named = append(named, ev)
		}
		if !overflow {
			t.Fatalf("no overflow for a change the events cannot name: %s", show(got))
		}
		if show(named) != want {
			t.Fatalf("events\n got %s\nwant %s", show(named), want)
		}
	}
}

// TestWatchUpload checks that the agent's own upload (a temp file renamed
// into place) shows as envd's in-place write does, never under the temp
// name: a new file's creation, then its write when it has content; an
// upload over an existing file as one write of it (E2B's clients wait for
// those writes).
func TestWatchUpload(t *testing.T) {
	e := newFileEnv(t)
	_, we := startWatch(t, e.c, "/home/user", "", false)
	for _, name := range []string{"up.txt", "empty"} {
		content := "data"
		if name == "empty" {
			content = ""
		}
		if _, err := e.c.WriteFile(ctxT(t), "/home/user/"+name, "", 0, strings.NewReader(content), 0); err != nil {
			t.Fatal(err)
		}
	}
	// The overwrite comes once the first writes were reported: writes to a
	// file the client has not been told of yet are coalesced into one
	// event (by design), which a loaded host would otherwise show here.
	got := we.until(is("create", "/home/user/empty"))
	if _, err := e.c.WriteFile(ctxT(t), "/home/user/up.txt", "", 0, strings.NewReader("new data"), 0); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(e.dir, "home/user/zz-marker"), "")
	after := we.until(is("create", "/home/user/zz-marker"))
	// Before the overwrite: up.txt created then written, empty created
	// (with no write: it has no data); after it: up.txt written, then the
	// marker. A write of up.txt still pending at the overwrite may come in
	// the second part, merged with it.
	first := show(only(got, "create", "write", "remove", "rename"))
	if first != "create /home/user/up.txt, write /home/user/up.txt, create /home/user/empty" && first != "create /home/user/up.txt, create /home/user/empty" {
		t.Fatalf("events before the overwrite: %s", show(got))
	}
	if second := show(only(after, "create", "write", "remove", "rename")); second != "write /home/user/up.txt, create /home/user/zz-marker" {
		t.Fatalf("events after the overwrite: %s (before it: %s)", show(after), show(got))
	}
}

// TestWatchEnds checks that removing the watched directory ends the watch
// with a remove event and io.EOF.
func TestWatchEnds(t *testing.T) {
	e := newFileEnv(t)
	dir := filepath.Join(e.dir, "gone")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	_, we := startWatch(t, e.c, "/gone", "root", false)
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	got := we.until(is("remove", "/gone"))
	if len(got) != 1 {
		t.Fatalf("events %s, want only the root's removal", show(got))
	}
	select {
	case <-we.end:
		if !errors.Is(we.err, io.EOF) {
			t.Fatalf("watch ended with %v, want io.EOF", we.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not end")
	}
}

func TestWatchErrors(t *testing.T) {
	e := newFileEnv(t)
	writeFile(t, filepath.Join(e.dir, "srv/file"), "x")
	if err := os.MkdirAll(filepath.Join(e.dir, "tree/sub/d\xff"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		path string
		want error
	}{
		{"Missing", "/nothing", errdefs.ErrNotFound},
		{"NotADirectory", "/srv/file", errdefs.ErrInvalidArgument},
		{"Empty", "", errdefs.ErrInvalidArgument},
		// A directory a recursive watch would have to name in its events.
		{"NotUTF8Dir", "/tree", errdefs.ErrInvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, err := e.c.Watch(ctxT(t), tc.path, "root", true)
			if err == nil {
				w.Close()
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Watch(%q): %v, want %v", tc.path, err, tc.want)
			}
		})
	}
}

// inotifyFDs counts this process's inotify instances (the agent runs in
// the test's process).
func inotifyFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ent := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + ent.Name()); err == nil && l == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

// TestWatchReleases checks that ending a watch, by Close or by cancelling
// its context, leaves no inotify instance behind.
func TestWatchReleases(t *testing.T) {
	for _, how := range []string{"Close", "Cancel", "Session"} {
		t.Run(how, func(t *testing.T) {
			e := newFileEnv(t)
			before := inotifyFDs(t)
			c := e.c
			if how == "Session" {
				c = e.connect()
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			w, err := c.Watch(ctx, "/home/user", "", true)
			if err != nil {
				t.Fatal(err)
			}
			if n := inotifyFDs(t); n != before+1 {
				t.Fatalf("%d inotify fds during the watch, want %d", n, before+1)
			}
			switch how {
			case "Close":
				w.Close()
			case "Cancel":
				cancel()
			case "Session":
				c.Close()
			}
			if _, err := w.Next(); err == nil {
				t.Fatal("Next after the end succeeded")
			}
			deadline := time.Now().Add(10 * time.Second)
			for inotifyFDs(t) != before {
				if time.Now().After(deadline) {
					t.Fatalf("%d inotify fds left, want %d", inotifyFDs(t), before)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// TestWatchTooManyDirs checks the cap on directories per watch.
func TestWatchTooManyDirs(t *testing.T) {
	if testing.Short() {
		t.Skip("makes 8193 directories")
	}
	e := newFileEnv(t)
	base := filepath.Join(e.dir, "srv/many")
	for i := 0; i < agentproto.MaxWatchDirs; i++ {
		if err := os.MkdirAll(filepath.Join(base, fmt.Sprintf("%d/%d", i/100, i%100)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	_, err := e.c.Watch(ctxT(t), "/srv/many", "root", true)
	if !errors.Is(err, errdefs.ErrTooLarge) {
		t.Fatalf("recursive watch of %d+ dirs: %v, want too large", agentproto.MaxWatchDirs, err)
	}
	// The same tree without recursion is one directory.
	w, err := e.c.Watch(ctxT(t), "/srv/many", "root", false)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
}

// TestWatchAsUser checks that a watch runs with the user's permissions: a
// directory the user may not read cannot be watched, and in a recursive
// watch it is skipped while the rest is watched.
func TestWatchAsUser(t *testing.T) {
	testutil.RequiresRoot(t)
	e := newFileEnv(t)
	tree := filepath.Join(e.dir, "home/user/tree")
	for _, d := range []string{"open", "closed"} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"", "open"} {
		if err := os.Chown(filepath.Join(tree, d), 1000, 1000); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(tree, "closed"), 0o700); err != nil { // root's
		t.Fatal(err)
	}
	if _, err := e.c.Watch(ctxT(t), "/home/user/tree/closed", "user", false); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("user watched root's 0700 dir: %v", err)
	}
	_, we := startWatch(t, e.c, "/home/user/tree", "user", true)
	writeFile(t, filepath.Join(tree, "closed/secret"), "x")
	writeFile(t, filepath.Join(tree, "open/seen"), "x")
	got := we.until(is("create", "/home/user/tree/open/seen"))
	for _, ev := range got {
		if strings.Contains(ev.Path, "secret") {
			t.Fatalf("user saw an event in a dir it cannot read: %s", show(got))
		}
	}
	// Root sees it.
	_, rwe := startWatch(t, e.c, "/home/user/tree", "root", true)
	writeFile(t, filepath.Join(tree, "closed/secret2"), "x")
	rwe.until(is("create", "/home/user/tree/closed/secret2"))
}

// TestWatchConfined checks that a watch path cannot leave the file root.
func TestWatchConfined(t *testing.T) {
	e := newFileEnv(t)
	// An absolute symlink resolves inside the root: /home/user/l → /srv.
	if err := os.Symlink("/srv", filepath.Join(e.dir, "home/user/l")); err != nil {
		t.Fatal(err)
	}
	_, we := startWatch(t, e.c, "/home/user/l", "root", false)
	writeFile(t, filepath.Join(e.dir, "srv/inside"), "x")
	we.until(is("create", "/home/user/l/inside"))
	// ".." stops at the root.
	_, we2 := startWatch(t, e.c, "/../../srv", "root", false)
	writeFile(t, filepath.Join(e.dir, "srv/again"), "x")
	we2.until(is("create", "/srv/again"))
}
