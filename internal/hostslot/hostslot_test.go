package hostslot

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// TestNamesNeverCollide: no two slots share a table, an NFLOG group, a
// cgroup parent, an address or a host uid, and no veth prefix matches
// another slot's veths (base chains match by prefix).
func TestNamesNeverCollide(t *testing.T) {
	if got, want := NamesOf(0), (Names{Slot: 0, Table: "airlock", IfPrefix: "alv", Subnet: netip.MustParsePrefix("10.231.0.0/16"),
		LogGroup: 4231, CgroupParent: "airlock", RuncUIDStart: 1 << 20, GVisorUIDStart: 1 << 31}); got != want {
		t.Fatalf("slot 0 changed airlock's names: %+v", got)
	}
	type span struct{ lo, hi uint64 }
	var uids []span
	for n := 0; n < Count; n++ {
		a := NamesOf(n)
		if a.Slot != n {
			t.Fatalf("slot %d: %+v", n, a)
		}
		// The longest veth name (prefix + the highest index) fits IFNAMSIZ.
		if l := len(a.IfPrefix + strconv.Itoa(1<<(30-a.Subnet.Bits())-1)); l > 15 {
			t.Errorf("slot %d: veth names of %d characters", n, l)
		}
		if 1<<(30-a.Subnet.Bits()) < UIDRanges {
			t.Errorf("slot %d: subnet %s has fewer addresses than sandboxes", n, a.Subnet)
		}
		inside := false
		for _, s := range Subnets() {
			inside = inside || (s.Bits() <= a.Subnet.Bits() && s.Contains(a.Subnet.Addr()))
		}
		if !inside {
			t.Errorf("slot %d: subnet %s outside Subnets()", n, a.Subnet)
		}
		for _, start := range []uint32{a.RuncUIDStart, a.GVisorUIDStart} {
			s := span{uint64(start), uint64(start) + uidSpan}
			if s.lo < 1<<20 || s.hi > 1<<32-1 {
				t.Errorf("slot %d: uid range %d-%d outside [2^20, 2^32)", n, s.lo, s.hi)
			}
			uids = append(uids, s)
		}
		for m := 0; m < n; m++ {
			b := NamesOf(m)
			if a.Table == b.Table || a.LogGroup == b.LogGroup || a.CgroupParent == b.CgroupParent {
				t.Errorf("slots %d and %d share a name: %+v %+v", n, m, a, b)
			}
			if strings.HasPrefix(a.IfPrefix, b.IfPrefix) || strings.HasPrefix(b.IfPrefix, a.IfPrefix) {
				t.Errorf("veth prefixes %q and %q match each other's veths", a.IfPrefix, b.IfPrefix)
			}
			if a.Subnet.Overlaps(b.Subnet) {
				t.Errorf("subnets %s and %s overlap", a.Subnet, b.Subnet)
			}
		}
	}
	for i := range uids {
		for j := range i {
			if uids[i].lo < uids[j].hi && uids[j].lo < uids[i].hi {
				t.Errorf("uid ranges %v and %v overlap", uids[i], uids[j])
			}
		}
	}
}

// fakeCgroups points the cgroup lookup at a directory tree of the test.
func fakeCgroups(t *testing.T) string {
	root := t.TempDir()
	old := cgroupDirs
	cgroupDirs = func(p string) ([]string, error) { return []string{filepath.Join(root, p)}, nil }
	t.Cleanup(func() { cgroupDirs = old })
	return root
}

func dataDir(t *testing.T) string {
	d, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func acquire(t *testing.T, claims, data string, opts Options) *Claim {
	t.Helper()
	opts.Dir = claims
	c, err := Acquire(data, opts)
	if err != nil {
		t.Fatalf("Acquire(%s): %v", data, err)
	}
	t.Cleanup(c.Release)
	return c
}

func TestAcquire(t *testing.T) {
	fakeCgroups(t)
	claims := t.TempDir()
	a, b := dataDir(t), dataDir(t)

	ca := acquire(t, claims, a, Options{})
	cb := acquire(t, claims, b, Options{})
	if ca.Slot != 1 || cb.Slot != 2 {
		t.Fatalf("fresh data dirs got slots %d and %d, want 1 and 2 (0 only when asked for)", ca.Slot, cb.Slot)
	}
	if ca.Names != NamesOf(1) || ca.DataDir != a {
		t.Fatalf("claim %+v", ca)
	}

	// A second daemon on a's data dir is refused, naming the first.
	_, err := Acquire(a, Options{Dir: claims})
	var inUse *InUseError
	if !errors.As(err, &inUse) || !inUse.Same || inUse.PID != os.Getpid() || inUse.Slot != 1 || !errors.Is(err, errdefs.ErrConflict) ||
		!strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) || !strings.Contains(err.Error(), a) {
		t.Fatalf("second claim on one data dir: %v", err)
	}

	// a stops: its slot is kept for it, a new data dir goes elsewhere, and
	// a gets its slot back.
	ca.Release()
	c := dataDir(t)
	if cc := acquire(t, claims, c, Options{}); cc.Slot != 3 {
		t.Fatalf("new data dir took slot %d while slot 1 is kept for %s", cc.Slot, a)
	}
	if ca = acquire(t, claims, a, Options{}); ca.Slot != 1 {
		t.Fatalf("restart got slot %d, want its slot 1", ca.Slot)
	}
	ca.Release()

	// A claim whose data dir is gone and that nobody holds is free again.
	os.RemoveAll(a)
	if cd := acquire(t, claims, dataDir(t), Options{}); cd.Slot != 1 {
		t.Fatalf("got slot %d, want the stale slot 1", cd.Slot)
	}
}

func TestAcquireSlotZeroAndPin(t *testing.T) {
	fakeCgroups(t)
	claims := t.TempDir()
	def := dataDir(t)
	if c := acquire(t, claims, def, Options{PreferZero: true}); c.Slot != 0 {
		t.Fatalf("a data dir asking for slot 0 got %d", c.Slot)
	}
	// Held: a pinned claim of slot 0 names the holder.
	zero := 0
	_, err := Acquire(dataDir(t), Options{Dir: claims, Pin: &zero})
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), def) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("pinned to a held slot: %v", err)
	}
	// Another asking for slot 0 while it is held goes elsewhere.
	if c := acquire(t, claims, dataDir(t), Options{PreferZero: true}); c.Slot != 1 {
		t.Fatalf("got %d, want 1", c.Slot)
	}
	seven := 7
	if c := acquire(t, claims, dataDir(t), Options{Pin: &seven}); c.Slot != 7 {
		t.Fatalf("pinned to 7, got %d", c.Slot)
	}
	bad := Count
	if _, err := Acquire(dataDir(t), Options{Dir: claims, Pin: &bad}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("pin out of range: %v", err)
	}
}

// TestAcquireRemembersAcrossReboot: the claims vanish at reboot; a data
// dir asks for the slot it had, so that its names stay the same.
func TestAcquireRemembersAcrossReboot(t *testing.T) {
	fakeCgroups(t)
	claims := t.TempDir()
	a, b := dataDir(t), dataDir(t)
	acquire(t, claims, a, Options{}).Release()
	cb := acquire(t, claims, b, Options{})
	cb.Release()
	if cb.Slot != 2 {
		t.Fatalf("b got %d", cb.Slot)
	}
	os.RemoveAll(claims) // reboot
	if c := acquire(t, claims, b, Options{}); c.Slot != 2 {
		t.Fatalf("after a reboot b got %d, want its slot 2", c.Slot)
	}
	if n, ok := Remembered(b); !ok || n != 2 {
		t.Fatalf("remembered %d %v", n, ok)
	}
}

// TestAcquireRunningSandboxesKeepASlot: processes in a cgroup below a
// slot's parent that is not one of the data dir's own sandboxes (another
// daemon's, one that kept no claim) make the slot busy; the data dir's own
// do not.
func TestAcquireRunningSandboxesKeepASlot(t *testing.T) {
	cg := fakeCgroups(t)
	claims := t.TempDir()
	running := func(parent, id string) {
		d := filepath.Join(cg, parent, id)
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte("4242\n"), 0o644)
	}
	running("airlock/slot1", "sbx_other")
	os.MkdirAll(filepath.Join(cg, "airlock/slot2/sbx_dead"), 0o755) // no process: a leftover
	if c := acquire(t, claims, dataDir(t), Options{}); c.Slot != 2 {
		t.Fatalf("got slot %d, want 2 (slot 1 has another's running sandbox)", c.Slot)
	}
	own := func(id string) bool { return id == "sbx_other" }
	if c := acquire(t, claims, dataDir(t), Options{Owns: own}); c.Slot != 1 {
		t.Fatalf("got slot %d, want 1 (its own sandbox runs there)", c.Slot)
	}
	// Slot 0 without a claim, running sandboxes of a daemon from before
	// slots existed: not taken by a data dir that is not theirs. The other
	// slots' parents below it do not count.
	running("airlock", "sbx_legacy")
	running("airlock/slot3", "sbx_x")
	if c := acquire(t, claims, dataDir(t), Options{PreferZero: true}); c.Slot == 0 {
		t.Fatal("slot 0 taken while another data dir's sandboxes run in it")
	}
	legacy := func(id string) bool { return id == "sbx_legacy" }
	if c := acquire(t, claims, dataDir(t), Options{PreferZero: true, Owns: legacy}); c.Slot != 0 {
		t.Fatalf("the legacy data dir got slot %d, want 0", c.Slot)
	}
}

// TestAcquireReclaimsIdleSlots: with every slot kept for some data dir,
// one whose data dir has no daemon and no running sandbox is taken.
func TestAcquireReclaimsIdleSlots(t *testing.T) {
	fakeCgroups(t)
	claims := t.TempDir()
	held := map[int]*Claim{}
	for n := 1; n < Count; n++ {
		c := acquire(t, claims, dataDir(t), Options{})
		held[c.Slot] = c
	}
	if _, err := Acquire(dataDir(t), Options{Dir: claims}); !errors.Is(err, errdefs.ErrCapacityExhausted) || !strings.Contains(err.Error(), "held by") {
		t.Fatalf("every slot held: %v", err)
	}
	held[5].Release()
	if c := acquire(t, claims, dataDir(t), Options{}); c.Slot != 5 {
		t.Fatalf("got %d, want the idle slot 5", c.Slot)
	}
}

// TestList: every claim is listed with the data dir it names and whether a
// daemon holds it now.
func TestList(t *testing.T) {
	fakeCgroups(t)
	claims := t.TempDir()
	a, b := dataDir(t), dataDir(t)
	ca := acquire(t, claims, a, Options{})
	cb := acquire(t, claims, b, Options{})
	cb.Release()
	got, err := List(claims)
	if err != nil {
		t.Fatal(err)
	}
	want := []Slot{
		{Names: NamesOf(ca.Slot), DataDir: a, PID: os.Getpid(), Held: true},
		{Names: NamesOf(cb.Slot), DataDir: b, PID: os.Getpid(), Held: false},
	}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("List = %+v, want %+v", got, want)
	}
	if l, err := List(t.TempDir()); err != nil || len(l) != 0 {
		t.Fatalf("no claims: %+v %v", l, err)
	}
}
