package mountinfo

import (
	"os"
	"strings"
	"testing"
)

const sample = `22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
100 22 7:3 / /data/sbx/storage/rw rw,nosuid,nodev shared:50 - ext4 /dev/loop3 rw
101 22 254:0 /tpl /data/sbx/storage/lower/0 ro,idmapped shared:1 - ext4 /dev/vda rw
105 22 0:63 / /data/with\040space rw - tmpfs tmp\134fs rw
106 22 0:64 / /data/sbx/rootfs/tmp rw opt1 opt2 - tmpfs tmpfs rw
610 609 0:32 /airlock/sbx_a /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory
611 609 0:33 / /odd - - tmpfs none
`

func TestParse(t *testing.T) {
	all, err := Parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		idx  int
		want Mount
	}{
		{"root", 0, Mount{ID: 22, ParentID: 1, Root: "/", Target: "/", Options: "rw,relatime", FSType: "ext4", Source: "/dev/vda", SuperOptions: "rw"}},
		{"loop", 1, Mount{ID: 100, ParentID: 22, Root: "/", Target: "/data/sbx/storage/rw", Options: "rw,nosuid,nodev", FSType: "ext4", Source: "/dev/loop3", SuperOptions: "rw"}},
		{"bind_root", 2, Mount{ID: 101, ParentID: 22, Root: "/tpl", Target: "/data/sbx/storage/lower/0", Options: "ro,idmapped", FSType: "ext4", Source: "/dev/vda", SuperOptions: "rw"}},
		{"escaped", 3, Mount{ID: 105, ParentID: 22, Root: "/", Target: "/data/with space", Options: "rw", FSType: "tmpfs", Source: `tmp\fs`, SuperOptions: "rw"}},
		{"optional_fields", 4, Mount{ID: 106, ParentID: 22, Root: "/", Target: "/data/sbx/rootfs/tmp", Options: "rw", FSType: "tmpfs", Source: "tmpfs", SuperOptions: "rw"}},
		{"cgroup", 5, Mount{ID: 610, ParentID: 609, Root: "/airlock/sbx_a", Target: "/sys/fs/cgroup/memory", Options: "ro,nosuid", FSType: "cgroup", Source: "cgroup", SuperOptions: "rw,memory"}},
		// Fields are split at the first "-" from field 7 on: a file
		// system type "-" is the type, not a separator.
		{"dash_type", 6, Mount{ID: 611, ParentID: 609, Root: "/", Target: "/odd", Options: "-", FSType: "tmpfs", Source: "none"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := all[tc.idx]; got != tc.want {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
	for _, bad := range []string{"garbage line\n", "x 1 0:1 / / rw - ext4 /dev/vda rw\n", "1 1 0:1 / / rw shared:1\n"} {
		if _, err := Parse(strings.NewReader(bad)); err == nil {
			t.Errorf("malformed mountinfo %q accepted", bad)
		}
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`plain`:          "plain",
		`a\040b`:         "a b",
		`tab\011nl\012`:  "tab\tnl\n",
		`back\134slash`:  `back\slash`,
		`not\9escape`:    `not\9escape`,
		`short\04`:       `short\04`,
		`\040leading`:    " leading",
		`trailing\040`:   "trailing ",
		`mixed\040\134x`: `mixed \x`,
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestUnder(t *testing.T) {
	for _, tc := range []struct {
		path, root string
		want       bool
	}{
		{"/data/sbx", "/data/sbx", true},
		{"/data/sbx/rootfs", "/data/sbx", true},
		{"/data/sbx/rootfs", "/data/sbx/", true},
		{"/data/sbx2", "/data/sbx", false},
		{"/data", "/data/sbx", false},
		{"/anything", "/", true},
	} {
		if got := Under(tc.path, tc.root); got != tc.want {
			t.Errorf("Under(%q, %q) = %v", tc.path, tc.root, got)
		}
	}
	all, _ := Parse(strings.NewReader(sample))
	if m, ok := MountedUnder(all, "/data/sbx/storage"); !ok || m.ID != 100 {
		t.Errorf("MountedUnder(/data/sbx/storage) = %+v, %v", m, ok)
	}
	if _, ok := MountedUnder(all, "/data/sbx/storage/lower/1"); ok {
		t.Error("MountedUnder found a mount below a path without one")
	}
}

func TestReadSelf(t *testing.T) {
	all, err := Read()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/proc/self/mountinfo"); err == nil && len(all) == 0 {
		t.Fatal("no mounts in /proc/self/mountinfo")
	}
	if _, ok := MountedUnder(all, "/"); !ok {
		t.Error("nothing mounted at or under /")
	}
}
