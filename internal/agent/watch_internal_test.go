package agent

import (
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// TestWatchQueue checks the merging and the bound of a watch's queue.
func TestWatchQueue(t *testing.T) {
	ev := func(typ, p string) agentproto.WatchEvent { return agentproto.WatchEvent{Type: typ, Path: p} }
	cases := []struct {
		name string
		push []agentproto.WatchEvent
		want string
	}{
		{"WritesMerge", []agentproto.WatchEvent{ev("write", "/a"), ev("write", "/a"), ev("write", "/b"), ev("write", "/a")},
			"write /a, write /b"},
		{"ChmodsMerge", []agentproto.WatchEvent{ev("chmod", "/a"), ev("write", "/a"), ev("chmod", "/a")},
			"chmod /a, write /a"},
		{"OrderKept", []agentproto.WatchEvent{ev("create", "/a"), ev("write", "/a"), ev("remove", "/a"), ev("create", "/a"), ev("write", "/a")},
			"create /a, write /a, remove /a, create /a, write /a"},
		{"RenameSplits", []agentproto.WatchEvent{ev("write", "/a"), {Type: "rename", Path: "/b", From: "/a"}, ev("write", "/a")},
			"write /a, rename /b, write /a"},
		{"CreatesNeverMerge", []agentproto.WatchEvent{ev("create", "/a"), ev("create", "/a")},
			"create /a, create /a"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q := newWatchQueue()
			for _, e := range tc.push {
				q.push(e)
			}
			evs, end, err := q.take()
			var got []string
			for _, e := range evs {
				got = append(got, e.Type+" "+e.Path)
			}
			if strings.Join(got, ", ") != tc.want || end || err != nil {
				t.Fatalf("took %q (end %v, err %v), want %q", got, end, err, tc.want)
			}
		})
	}
	t.Run("Overflow", func(t *testing.T) {
		q := newWatchQueue()
		for i := 0; i < agentproto.MaxWatchQueue+10; i++ {
			q.push(ev("create", "/f"))
		}
		q.push(ev("write", "/late")) // dropped too: nothing new past the cap
		evs, _, _ := q.take()
		if len(evs) != agentproto.MaxWatchQueue+1 || evs[len(evs)-1].Type != agentproto.WatchOverflow {
			t.Fatalf("took %d events ending in %q, want %d ending in an overflow", len(evs), evs[len(evs)-1].Type, agentproto.MaxWatchQueue+1)
		}
		q.push(ev("create", "/g"))
		if evs, _, _ := q.take(); len(evs) != 1 || evs[0].Path != "/g" {
			t.Fatalf("after the overflow: %v", evs)
		}
	})
	t.Run("MergeAfterTake", func(t *testing.T) {
		// A write already taken (sent) is not merged into: the client
		// learns of the later writes.
		q := newWatchQueue()
		q.push(ev("write", "/a"))
		q.take()
		q.push(ev("write", "/a"))
		if evs, _, _ := q.take(); len(evs) != 1 {
			t.Fatalf("second take: %v", evs)
		}
	})
}
