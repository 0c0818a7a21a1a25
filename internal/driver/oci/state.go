package oci

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// StateVersion is the version of State, and of the handles whose State it
// is; a handle of a later version is refused rather than misread.
const StateVersion = 1

// State is what the core remembers of a sandbox across daemon restarts. It
// lives in <sandbox dir>/state.json and, as a copy, in the handle the
// caller persists.
type State struct {
	ID      string `json:"id"`
	Slot    int    `json:"slot"`
	UIDBase uint32 `json:"uid_base"`
	IDCount uint32 `json:"id_count"`
	Dir     string `json:"dir"`
	Cgroup  string `json:"cgroup"`
	// Started is set once the runtime ran the sandbox; a sandbox never
	// started has no record in the runtime.
	Started bool `json:"started,omitempty"`
	// Pid is the host pid of the init last started.
	Pid int `json:"pid,omitempty"`
	// RunArgs are the runtime flags of its last run (Runtime.RunArgs),
	// saved before the run.
	RunArgs []string `json:"run_args,omitempty"`
	// NetNS is the network namespace the sandbox joins (Spec.NetNSPath);
	// "" for a fresh one.
	NetNS string `json:"netns,omitempty"`
	// CPU is the CPU limit the core sets itself once the agent listens
	// (Config.DeferCPULimit); nil when the bundle carries it.
	CPU *CPULimit `json:"cpu,omitempty"`
}

// CPULimit is a CFS quota: Quota µs of CPU time per Period µs.
type CPULimit struct {
	Quota  int64  `json:"quota"`
	Period uint64 `json:"period"`
}

// handle returns the driver.Handle the caller persists for this sandbox,
// named after the driver that made it.
func (s *State) handle(driverName string) (*driver.Handle, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encoding handle: %w", err)
	}
	return &driver.Handle{ID: s.ID, Driver: driverName, Version: StateVersion, State: b}, nil
}

// checkHandle refuses a handle that is not one of driver driverName's.
func checkHandle(h *driver.Handle, driverName string) error {
	if h == nil {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "nil handle")
	}
	if h.Driver != "" && h.Driver != driverName {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "handle of driver %q", h.Driver)
	}
	if h.Version > StateVersion {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "handle version %d is newer than this driver's %d", h.Version, StateVersion)
	}
	return checkID(h.ID)
}

func stateFile(dir string) string { return filepath.Join(dir, "state.json") }

func (s *State) save() error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(stateFile(s.Dir), b, 0o600); err != nil {
		return fmt.Errorf("saving sandbox state: %w", err)
	}
	return nil
}

// loadState reads the state of the sandbox in dir; an error wrapping
// errdefs.ErrNotFound if there is none.
func loadState(dir string) (*State, error) {
	b, err := os.ReadFile(stateFile(dir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errdefs.Wrap(errdefs.ErrNotFound, "sandbox state")
	}
	if err != nil {
		return nil, fmt.Errorf("reading sandbox state: %w", err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("parsing sandbox state: %w", err)
	}
	return &s, nil
}

// slots hands out uid ranges. A slot is taken by creating the file
// <dir>/<n> exclusively with the sandbox id in it, so allocation is atomic
// across goroutines and processes and survives restarts; the bitmap only
// saves syscalls.
type slots struct {
	dir string
	max int

	mu   sync.Mutex
	used []bool
}

func newSlots(dir string, max int) (*slots, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating slot dir: %w", err)
	}
	s := &slots{dir: dir, max: max, used: make([]bool, max)}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading slots: %w", err)
	}
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil && n >= 0 && n < max {
			s.used[n] = true
		}
	}
	return s, nil
}

// alloc takes a free slot for id; errdefs.ErrCapacityExhausted if none.
// The lowest free slot is preferred: storage caches a user namespace per
// uid range, so reusing ranges is cheaper than spreading out.
func (s *slots) alloc(id string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for n := 0; n < s.max; n++ {
		if s.used[n] {
			continue
		}
		f, err := os.OpenFile(filepath.Join(s.dir, strconv.Itoa(n)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			s.used[n] = true // another process took it
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("taking uid slot: %w", err)
		}
		_, werr := f.WriteString(id)
		cerr := f.Close()
		if err := errors.Join(werr, cerr); err != nil {
			os.Remove(f.Name())
			return 0, fmt.Errorf("taking uid slot: %w", err)
		}
		s.used[n] = true
		return n, nil
	}
	return 0, errdefs.Wrap(errdefs.ErrCapacityExhausted, "all %d sandbox slots in use", s.max)
}

// free releases slot n if id holds it.
func (s *slots) free(n int, id string) error {
	if n < 0 || n >= s.max {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p := filepath.Join(s.dir, strconv.Itoa(n))
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		s.used[n] = false
		return nil
	}
	if err != nil {
		return fmt.Errorf("releasing uid slot: %w", err)
	}
	if string(b) != id {
		return nil // reused by another sandbox since
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("releasing uid slot: %w", err)
	}
	s.used[n] = false
	return nil
}

// find returns the slot id holds, -1 if none: for a sandbox whose state
// file was never written (Create failed half way, or a crash).
func (s *slots) find(id string) int {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return -1
	}
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(s.dir, e.Name())); err == nil && strings.TrimSpace(string(b)) == id {
			return n
		}
	}
	return -1
}
