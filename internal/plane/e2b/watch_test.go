package e2b_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	fspb "github.com/airlockhq/airlock/internal/plane/e2b/envd/filesystempb"
	pb "github.com/airlockhq/airlock/internal/plane/e2b/envd/processpb"
)

// watchScript changes a watched directory in ways a poll would miss or
// misreport: a file that lives for no time at all, and a rename. The marker
// ends it; %s is a directory relative to the user's home (where commands
// start; the fake driver's commands run on the host).
const watchScript = `cd %s && : > brief && rm brief && echo x > old && mv old new && : > zz-marker`

// checkInotifyEvents checks the events of watchScript: the short-lived
// file is seen, and the rename is one RENAME of the old name followed by
// the CREATE of the new one (what envd reports), with no REMOVE.
func checkInotifyEvents(t *testing.T, evs []*fspb.FilesystemEvent) {
	t.Helper()
	var got []string
	for _, ev := range evs {
		if ev.GetType() != fspb.EventType_EVENT_TYPE_WRITE && ev.GetType() != fspb.EventType_EVENT_TYPE_CHMOD {
			got = append(got, strings.TrimPrefix(ev.GetType().String(), "EVENT_TYPE_")+" "+ev.GetName())
		}
	}
	want := "CREATE brief,REMOVE brief,CREATE old,RENAME old,CREATE new,CREATE zz-marker"
	if strings.Join(got, ",") != want {
		t.Fatalf("events\n got %s\nwant %s", strings.Join(got, ","), want)
	}
}

func isMarker(ev *fspb.FilesystemEvent) bool {
	return ev.GetName() == "zz-marker" && ev.GetType() == fspb.EventType_EVENT_TYPE_CREATE
}

// TestWatchDirInotify checks WatchDir's events against what only inotify
// can see.
func TestWatchDirInotify(t *testing.T) {
	h := newHarness(t)
	c := h.create("acme")
	fc := h.filesystem(c, codecs[0].opts)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := fc.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "/home/user/wi"})); err != nil {
		t.Fatal(err)
	}
	stream, err := fc.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: "/home/user/wi"}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatalf("first watch event is not start: %v %v", stream.Msg(), stream.Err())
	}
	// The watch is in place once start arrived.
	run(t, h, c, fmt.Sprintf(watchScript, "wi"))
	var evs []*fspb.FilesystemEvent
	for stream.Receive() {
		if ev := stream.Msg().GetFilesystem(); ev != nil {
			evs = append(evs, ev)
			if isMarker(ev) {
				break
			}
		}
	}
	if stream.Err() != nil {
		t.Fatal(stream.Err())
	}
	checkInotifyEvents(t, evs)
}

// TestPolledWatcherInotify checks the same through CreateWatcher and
// GetWatcherEvents, and that the events of one poll are not repeated.
func TestPolledWatcherInotify(t *testing.T) {
	h := newHarness(t)
	c := h.create("acme")
	fc := h.filesystem(c, codecs[1].opts)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := fc.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "/home/user/pi"})); err != nil {
		t.Fatal(err)
	}
	cw, err := fc.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: "/home/user/pi", Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	wid := cw.Msg.GetWatcherId()
	defer fc.RemoveWatcher(context.Background(), connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: wid}))
	run(t, h, c, fmt.Sprintf(watchScript, "pi"))
	var evs []*fspb.FilesystemEvent
	for len(evs) == 0 || !isMarker(evs[len(evs)-1]) {
		if ctx.Err() != nil {
			t.Fatalf("no marker; events %v", evs)
		}
		r, err := fc.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: wid}))
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, r.Msg.GetEvents()...)
		time.Sleep(10 * time.Millisecond)
	}
	checkInotifyEvents(t, evs)
	// A new subdirectory is watched too (recursive).
	run(t, h, c, "mkdir -p pi/sub/deeper && echo y > pi/sub/deeper/f")
	var names []string
	for !strings.Contains(strings.Join(names, ","), "sub/deeper/f") {
		if ctx.Err() != nil {
			t.Fatalf("no event in the new subdirectory; events %v", names)
		}
		r, err := fc.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: wid}))
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range r.Msg.GetEvents() {
			names = append(names, ev.GetName())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, n := range names {
		if n == "zz-marker" || n == "new" {
			t.Fatalf("a poll repeated earlier events: %v", names)
		}
	}
}

// run runs a shell script in sandbox c and fails the test unless it exits 0.
func run(t *testing.T, h *harness, c created, script string) {
	t.Helper()
	s, err := h.process(c, codecs[0].opts).Start(context.Background(), connect.NewRequest(&pb.StartRequest{Process: shell(script)}))
	if err != nil {
		t.Fatal(err)
	}
	r, err := collect(t, s)
	if err != nil || r.end == nil || r.end.GetExitCode() != 0 {
		t.Fatalf("script %q: %v, end %v, stderr %q", script, err, r.end, r.stderr)
	}
}

// TestPolledWatcherOverflow checks that a watcher whose client falls too
// far behind fails (envd's answer to a kernel queue overflow) instead of
// growing without bound.
func TestPolledWatcherOverflow(t *testing.T) {
	h := newHarness(t)
	c := h.create("acme")
	fc := h.filesystem(c, codecs[0].opts)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := fc.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "/home/user/many"})); err != nil {
		t.Fatal(err)
	}
	cw, err := fc.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: "/home/user/many"}))
	if err != nil {
		t.Fatal(err)
	}
	wid := cw.Msg.GetWatcherId()
	defer fc.RemoveWatcher(context.Background(), connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: wid}))
	// One create event per file, none polled meanwhile. Shell builtins
	// only: a process per file (rm) made the loop take most of the
	// deadline on a busy host.
	run(t, h, c, `cd many && i=0; while [ $i -lt 5000 ]; do : > f$i; i=$((i+1)); done`)
	for {
		_, err := fc.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: wid}))
		if err != nil {
			if connect.CodeOf(err) != connect.CodeResourceExhausted {
				t.Fatalf("overflowed watcher: %v, want resource_exhausted", err)
			}
			return
		}
		if ctx.Err() != nil {
			t.Fatal("5000 unpolled events did not fail the watcher")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
