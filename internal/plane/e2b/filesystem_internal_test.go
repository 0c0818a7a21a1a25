package e2b

import (
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/service/files"
)

// TestEnvdEvents checks the mapping of the agent's watch events to envd's.
func TestEnvdEvents(t *testing.T) {
	ev := func(typ, p, from string) files.WatchEvent {
		return files.WatchEvent{Type: typ, Path: p, From: from}
	}
	cases := []struct {
		name string
		dir  string
		in   []files.WatchEvent
		want string
		lost bool
	}{
		{"Types", "/w", []files.WatchEvent{ev("create", "/w/a", ""), ev("write", "/w/a", ""), ev("chmod", "/w/a", ""), ev("remove", "/w/a", "")},
			"CREATE a,WRITE a,CHMOD a,REMOVE a", false},
		{"RenameAsEnvd", "/w", []files.WatchEvent{ev("rename", "/w/sub/new", "/w/old")},
			"RENAME old,CREATE sub/new", false},
		{"RootDir", "/", []files.WatchEvent{ev("create", "/etc/x", "")}, "CREATE etc/x", false},
		{"TheDirItself", "/w", []files.WatchEvent{ev("remove", "/w", "")}, "REMOVE .", false},
		{"Overflow", "/w", []files.WatchEvent{ev("create", "/w/a", ""), {Type: "overflow"}}, "CREATE a", true},
		{"UnknownIgnored", "/w", []files.WatchEvent{ev("future", "/w/a", "")}, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, lost := envdEvents(tc.dir, tc.in)
			var got []string
			for _, e := range out {
				got = append(got, strings.TrimPrefix(e.GetType().String(), "EVENT_TYPE_")+" "+e.GetName())
			}
			if strings.Join(got, ",") != tc.want || lost != tc.lost {
				t.Fatalf("envdEvents = %v (lost %v), want %s (lost %v)", got, lost, tc.want, tc.lost)
			}
		})
	}
}
