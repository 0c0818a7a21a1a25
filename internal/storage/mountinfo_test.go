package storage

import (
	"strings"
	"testing"
)

const sampleMountinfo = `22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
100 22 7:3 / /data/sbx/storage/rw rw,nosuid,nodev shared:50 - ext4 /dev/loop3 rw
101 22 254:0 /tpl /data/sbx/storage/lower/0 ro,idmapped shared:1 - ext4 /dev/vda rw
102 22 0:60 / /data/sbx/rootfs rw shared:51 - overlay overlay rw,lowerdir=/data/sbx/storage/lower/0
103 102 0:61 / /data/sbx/rootfs rw shared:52 - tmpfs tmpfs rw
104 22 0:62 / /data/sbx2/rootfs rw - overlay overlay rw
105 22 0:63 / /data/with\040space rw - tmpfs tmp\134fs rw
106 22 0:64 / /data/sbx/rootfs/tmp rw opt1 opt2 - tmpfs tmpfs rw
`

func TestParseMountinfo(t *testing.T) {
	all, err := parseMountinfo(strings.NewReader(sampleMountinfo))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name                   string
		idx                    int
		id                     int
		target, fstype, source string
	}{
		{"root", 0, 22, "/", "ext4", "/dev/vda"},
		{"loop", 1, 100, "/data/sbx/storage/rw", "ext4", "/dev/loop3"},
		{"escaped", 6, 105, "/data/with space", "tmpfs", `tmp\fs`},
		{"optional-fields", 7, 106, "/data/sbx/rootfs/tmp", "tmpfs", "tmpfs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := all[tc.idx]
			if m.ID != tc.id || m.Target != tc.target || m.FSType != tc.fstype || m.Source != tc.source {
				t.Errorf("got %+v", m)
			}
		})
	}
	if _, err := parseMountinfo(strings.NewReader("garbage line\n")); err == nil {
		t.Error("malformed mountinfo accepted")
	}
}

func TestMountsUnder(t *testing.T) {
	all, err := parseMountinfo(strings.NewReader(sampleMountinfo))
	if err != nil {
		t.Fatal(err)
	}
	var ids []int
	for _, m := range mountsUnder(all, []string{"/data/sbx"}) {
		ids = append(ids, m.ID)
	}
	// Deepest first, newest first at equal depth: on /data/sbx/rootfs the
	// stacked tmpfs (103) before the overlay (102); /data/sbx2 is a sibling.
	want := []int{101, 106, 100, 103, 102}
	if len(ids) != len(want) {
		t.Fatalf("got %v, want %v", ids, want)
	}
	for i := range want {
		if ids[i] != want[i] {
			t.Fatalf("got %v, want %v", ids, want)
		}
	}
}
