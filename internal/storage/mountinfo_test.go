package storage

import (
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/mountinfo"
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

func TestMountsUnder(t *testing.T) {
	all, err := mountinfo.Parse(strings.NewReader(sampleMountinfo))
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
