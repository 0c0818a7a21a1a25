package e2b

import (
	"strings"
	"testing"

	"github.com/airlockhq/airlock/api"
	pb "github.com/airlockhq/airlock/internal/plane/e2b/envd/filesystempb"
	"github.com/airlockhq/airlock/internal/service/files"
)

// TestEntryOf checks envd's entry fields: mode is the permission bits
// alone (a directory 0o755, not Go's ModeDir bit with them), permissions
// spells the type, and a symlink's target is an absolute path.
func TestEntryOf(t *testing.T) {
	cases := []struct {
		in         api.FileInfo
		typ        pb.FileType
		mode       uint32
		perms      string
		linkTarget string
	}{
		{api.FileInfo{Path: "/home/user/d", Type: "dir", Mode: "0755"}, pb.FileType_FILE_TYPE_DIRECTORY, 0o755, "drwxr-xr-x", ""},
		{api.FileInfo{Path: "/home/user/f", Type: "file", Mode: "0644"}, pb.FileType_FILE_TYPE_FILE, 0o644, "-rw-r--r--", ""},
		{api.FileInfo{Path: "/home/user/l", Type: "symlink", Mode: "0777", LinkTarget: "test_file.txt"}, pb.FileType_FILE_TYPE_SYMLINK, 0o777, "Lrwxrwxrwx", "/home/user/test_file.txt"},
		{api.FileInfo{Path: "/home/user/l", Type: "symlink", Mode: "0777", LinkTarget: "../x/./y"}, pb.FileType_FILE_TYPE_SYMLINK, 0o777, "Lrwxrwxrwx", "/home/x/y"},
		{api.FileInfo{Path: "/home/user/l", Type: "symlink", Mode: "0777", LinkTarget: "/etc/passwd"}, pb.FileType_FILE_TYPE_SYMLINK, 0o777, "Lrwxrwxrwx", "/etc/passwd"},
	}
	for _, c := range cases {
		e := entryOf(c.in)
		if e.GetType() != c.typ || e.GetMode() != c.mode || e.GetPermissions() != c.perms || e.GetSymlinkTarget() != c.linkTarget {
			t.Errorf("entryOf(%+v) = type %v mode %o perms %q target %q; want %v %o %q %q", c.in,
				e.GetType(), e.GetMode(), e.GetPermissions(), e.GetSymlinkTarget(), c.typ, c.mode, c.perms, c.linkTarget)
		}
	}
}

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
