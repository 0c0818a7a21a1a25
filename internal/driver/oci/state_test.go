package oci

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestSlots(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "slots")
	s, err := newSlots(dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	got := map[int]string{}
	for _, id := range []string{"a", "b", "c"} {
		n, err := s.alloc(id)
		if err != nil {
			t.Fatal(err)
		}
		got[n] = id
	}
	if len(got) != 3 {
		t.Fatalf("slots %v not distinct", got)
	}
	if _, err := s.alloc("d"); !errors.Is(err, errdefs.ErrCapacityExhausted) {
		t.Fatalf("alloc past max = %v, want capacity exhausted", err)
	}
	// A new instance (daemon restart) sees the same slots taken.
	s2, err := newSlots(dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.alloc("d"); !errors.Is(err, errdefs.ErrCapacityExhausted) {
		t.Fatalf("alloc after restart = %v, want capacity exhausted", err)
	}
	if n := s2.find("b"); got[n] != "b" {
		t.Fatalf("find(b) = %d", n)
	}
	if n := s2.find("zz"); n != -1 {
		t.Fatalf("find(zz) = %d", n)
	}
	// Freeing with the wrong id keeps the slot.
	nb := s2.find("b")
	if err := s2.free(nb, "other"); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.alloc("d"); !errors.Is(err, errdefs.ErrCapacityExhausted) {
		t.Fatal("a slot was freed by the wrong id")
	}
	if err := s2.free(nb, "b"); err != nil {
		t.Fatal(err)
	}
	n, err := s2.alloc("d")
	if err != nil || n != nb {
		t.Fatalf("alloc after free = %d, %v; want %d", n, err, nb)
	}
	if err := s2.free(nb, "b"); err != nil { // stale free of a reused slot
		t.Fatal(err)
	}
	if s2.find("d") != nb {
		t.Fatal("stale free released the new owner's slot")
	}
}

func TestSlotsConcurrent(t *testing.T) {
	dir := t.TempDir()
	// Two instances on one dir, as two processes would be.
	a, _ := newSlots(dir, 40)
	b, _ := newSlots(dir, 40)
	var mu sync.Mutex
	seen := map[int]bool{}
	var wg sync.WaitGroup
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			s := a
			if i%2 == 1 {
				s = b
			}
			n, err := s.alloc("x")
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if seen[n] {
				t.Errorf("slot %d handed out twice", n)
			}
			seen[n] = true
		}(i)
	}
	wg.Wait()
}

func TestStateRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if _, err := loadState(dir); !errdefs.IsNotFound(err) {
		t.Fatalf("loadState of an empty dir = %v", err)
	}
	st := &State{ID: "sbx_1", Slot: 2, UIDBase: 3 << 16, IDCount: 65536, Dir: dir, Cgroup: "/airlock/sbx_1", Started: true, Pid: 42,
		RunArgs: []string{"--network=none"}}
	if err := st.save(); err != nil {
		t.Fatal(err)
	}
	got, err := loadState(dir)
	if err != nil || !reflect.DeepEqual(got, st) {
		t.Fatalf("loadState = %+v, %v", got, err)
	}
	h, err := st.handle("runc")
	if err != nil || h.ID != "sbx_1" || h.Driver != "runc" || h.Version != StateVersion || len(h.State) == 0 {
		t.Fatalf("handle = %+v, %v", h, err)
	}
	if err := checkHandle(h, "runc"); err != nil {
		t.Errorf("checkHandle of the driver's own handle: %v", err)
	}
	for _, bad := range []*driver.Handle{nil, {ID: "sbx_1", Driver: "gvisor"}, {ID: "sbx_1", Driver: "runc", Version: StateVersion + 1}, {ID: "../x", Driver: "runc"}} {
		if err := checkHandle(bad, "runc"); !errdefs.IsInvalidArgument(err) {
			t.Errorf("checkHandle(%+v) = %v, want invalid argument", bad, err)
		}
	}
	if _, err := os.Stat(stateFile(dir) + ".tmp"); !os.IsNotExist(err) {
		t.Error("temp file left behind")
	}
}

func TestCheckID(t *testing.T) {
	tests := []struct {
		id string
		ok bool
	}{
		{"sbx_abc123", true},
		{"a", true},
		{"", false},
		{"../x", false},
		{"a/b", false},
		{".hidden", false},
		{"a b", false},
		{"a,b", false},
	}
	for _, tc := range tests {
		if err := checkID(tc.id); (err == nil) != tc.ok {
			t.Errorf("checkID(%q) = %v", tc.id, err)
		}
	}
}

func TestRuncError(t *testing.T) {
	tests := []struct {
		msg  string
		want error
	}{
		{`container "x" does not exist`, errdefs.ErrNotFound},
		{"container with id exists: x already exists", errdefs.ErrAlreadyExists},
		{"cannot pause a container that is not running", errdefs.ErrInvalidState},
		{"something broke", errdefs.ErrRuntimeUnavailable},
	}
	for _, tc := range tests {
		err := runcError("x", []byte("first\n"+tc.msg+"\n"), errors.New("exit status 1"))
		if !errors.Is(err, tc.want) {
			t.Errorf("runcError(%q) = %v, want %v", tc.msg, err, tc.want)
		}
	}
}

func TestLastLogError(t *testing.T) {
	p := filepath.Join(t.TempDir(), "runc.log")
	os.WriteFile(p, []byte(`{"level":"info","msg":"hello"}
{"level":"error","msg":"unable to start container process: boom"}
{"level":"debug","msg":"later"}
`), 0o600)
	if got := string(lastLogError(p)); got != "unable to start container process: boom" {
		t.Fatalf("lastLogError = %q", got)
	}
}

func TestNewValidation(t *testing.T) {
	rt := &testDriver{}
	if _, err := New(Config{Name: "runc", Binary: "runc", DataDir: "relative"}, rt); !errdefs.IsInvalidArgument(err) {
		t.Errorf("relative data dir: %v", err)
	}
	if _, err := New(Config{Name: "runc", Binary: "runc", DataDir: "/x", UIDRangeStart: 1 << 31, MaxSandboxes: 1 << 16}, rt); !errdefs.IsInvalidArgument(err) {
		t.Errorf("uid overflow: %v", err)
	}
	if _, err := New(Config{DataDir: "/x"}, rt); !errdefs.IsInvalidArgument(err) {
		t.Errorf("no name nor binary: %v", err)
	}
	if _, err := New(Config{Name: "runc", Binary: "runc", DataDir: "/x"}, nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("no runtime: %v", err)
	}
}

func TestSearchable(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "a")
	os.Mkdir(sub, 0o711)
	os.Chmod(dir, 0o700)
	if err := searchable(sub); !errdefs.IsInvalidArgument(err) {
		t.Errorf("searchable under a 0700 dir = %v", err)
	}
}
