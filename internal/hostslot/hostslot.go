// Package hostslot gives every airlock daemon on a host a numbered slot, from which each host-wide name it uses derives, so that daemons with different data dirs never touch each other's sandboxes.
//
// Host-wide are: the nftables table, the veth name prefix, the sandbox
// subnet, the NFLOG group, the cgroup parent and the host uid ranges of each
// runtime. A daemon claims a slot for its data dir with Acquire: a claim file
// per slot under Dir (/run/airlock, a tmpfs emptied at reboot together with
// every sandbox) names the data dir and is held with flock while the daemon
// runs. A data dir gets its slot back on restart (its surviving sandboxes'
// veths, chains and cgroups are named by it); a second daemon on the same data
// dir is refused with the other daemon's pid. Slot 0 keeps the names airlock
// had before slots existed and is only given to a data dir that asks for it
// (the default data dir, one that was used before slots existed, or a pinned
// host_slot); any other data dir takes the lowest free slot from 1.
package hostslot

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/cgroups"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// DefaultDir holds the claims. /run is a tmpfs: claims vanish at reboot,
// with every sandbox they named.
const DefaultDir = "/run/airlock"

// Count is the number of slots: 0 to Count-1.
const Count = 16

// UIDRanges is the number of host uid ranges each runtime of a slot has,
// so the most sandboxes one daemon runs per runtime.
const UIDRanges = 1024

// IDCount is the size of one sandbox's uid range (the drivers' default).
const IDCount = 65536

// rememberFile, in a data dir, names the slot it had last, so that it
// asks for the same one after a reboot and keeps its names stable (an
// operator's firewall rules may name its veth prefix).
const rememberFile = "host-slot"

// Names are the host-wide names of a slot.
type Names struct {
	Slot int `json:"slot"`
	// Table is the nftables table (family inet).
	Table string `json:"nft_table"`
	// IfPrefix starts every host-side veth name. No prefix is a prefix
	// of another slot's: base chains match their veths by prefix.
	IfPrefix string `json:"veth_prefix"`
	// Subnet is where the slot's sandboxes get their addresses.
	Subnet netip.Prefix `json:"subnet"`
	// LogGroup is the NFLOG group of the slot's filter.
	LogGroup uint16 `json:"nflog_group"`
	// CgroupParent is the cgroup every sandbox of the slot lives under.
	// Other slots' parents are below slot 0's, so that the task budget of
	// the "airlock" cgroup bounds every daemon's sandboxes together.
	CgroupParent string `json:"cgroup_parent"`
	// RuncUIDStart and GVisorUIDStart are the first host uid of each
	// runtime's UIDRanges ranges of IDCount ids.
	RuncUIDStart   uint32 `json:"runc_uid_start"`
	GVisorUIDStart uint32 `json:"gvisor_uid_start"`
}

// uidSpan is the uids one runtime of one slot covers.
const uidSpan = UIDRanges * IDCount

// NamesOf returns slot n's names (0 <= n < Count). Slot 0 has airlock's
// original names; slot n > 0 has table airlock_<n>, veths al<n>v…, the
// n-th /20 of 10.230.0.0/16, NFLOG group 4231+n, cgroup airlock/slot<n> and
// uid ranges right above the previous slot's, below 2^31 for runc and from
// 2^31 for gVisor.
func NamesOf(n int) Names {
	if n == 0 {
		return Names{Slot: 0, Table: "airlock", IfPrefix: "alv", Subnet: netip.MustParsePrefix("10.231.0.0/16"),
			LogGroup: 4231, CgroupParent: "airlock", RuncUIDStart: 1 << 20, GVisorUIDStart: 1 << 31}
	}
	s := strconv.Itoa(n)
	return Names{
		Slot: n, Table: "airlock_" + s, IfPrefix: "al" + s + "v",
		Subnet:   netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 230, byte((n - 1) * 16), 0}), 20),
		LogGroup: uint16(4231 + n), CgroupParent: "airlock/slot" + s,
		RuncUIDStart: 1<<20 + uint32(n)*uidSpan, GVisorUIDStart: 1<<31 + uint32(n)*uidSpan,
	}
}

// Subnets are every slot's sandbox subnets: no sandbox may reach another
// daemon's sandboxes or gateways either.
func Subnets() []netip.Prefix {
	return []netip.Prefix{netip.MustParsePrefix("10.231.0.0/16"), netip.MustParsePrefix("10.230.0.0/16")}
}

// Options tune Acquire.
type Options struct {
	// Dir holds the claim files; default DefaultDir.
	Dir string
	// Pin, when set, is the only slot to take; not getting it is an error.
	Pin *int
	// PreferZero asks for slot 0 when the data dir remembers no slot: the
	// default data dir, or one a daemon used before slots existed (its
	// surviving sandboxes have slot 0's names).
	PreferZero bool
	// Owns reports whether a cgroup below a slot's parent is one of this
	// data dir's sandboxes (by its name, the sandbox id). Live processes in
	// any other cgroup there mean another daemon's sandboxes still run:
	// that slot is not free, whatever its claim says.
	Owns func(id string) bool
}

// Claim is a slot held by this process for a data dir. Release it when the
// daemon stops; the claim file stays, so that the data dir gets the slot
// back when it starts again.
type Claim struct {
	Names
	// DataDir is the data dir as the claim names it (absolute, symlinks
	// resolved).
	DataDir string
	// Path is the claim file.
	Path string
	f    *os.File
}

// record is a claim file's content.
type record struct {
	DataDir string    `json:"data_dir"`
	PID     int       `json:"pid"`
	Since   time.Time `json:"since"`
	Names   Names     `json:"names"`
}

// InUseError is a refusal: the data dir, or a pinned slot, is held by a
// running daemon.
type InUseError struct {
	Slot    int
	DataDir string // the holder's data dir
	PID     int    // the holder's pid, 0 when it did not say
	Same    bool   // the holder serves the data dir that asked
}

func (e *InUseError) Error() string {
	who := "another airlock serve"
	if e.PID > 0 {
		who = fmt.Sprintf("another airlock serve (pid %d)", e.PID)
	}
	if e.Same {
		return fmt.Sprintf("%s is using data dir %s (host slot %d)", who, e.DataDir, e.Slot)
	}
	return fmt.Sprintf("host slot %d is held by %s for data dir %s", e.Slot, who, e.DataDir)
}

func (e *InUseError) Unwrap() error { return errdefs.ErrConflict }

// cgroupDirs returns the directories of a cgroup in every hierarchy (a
// test hook).
var cgroupDirs = func(path string) ([]string, error) {
	h, err := cgroups.Load()
	if err != nil {
		return nil, err
	}
	return h.Group(path).Dirs(), nil
}

// Acquire claims a slot for dataDir and holds it until Release.
func Acquire(dataDir string, opts Options) (*Claim, error) {
	if opts.Dir == "" {
		opts.Dir = DefaultDir
	}
	if opts.Pin != nil && (*opts.Pin < 0 || *opts.Pin >= Count) {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "host slot %d is not between 0 and %d", *opts.Pin, Count-1)
	}
	dir, err := canonical(dataDir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("host slots: %w", err)
	}
	// One daemon at a time chooses: two starting together must not take
	// the same free slot.
	lock, err := os.OpenFile(filepath.Join(opts.Dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("host slots: %w", err)
	}
	defer lock.Close()
	if err := flock(lock, unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("host slots: locking %s: %w", lock.Name(), err)
	}

	var order []int
	if opts.Pin != nil {
		order = []int{*opts.Pin}
	} else {
		if n, ok := remembered(dir); ok {
			order = append(order, n)
		}
		if opts.PreferZero {
			order = append(order, 0)
		}
		for n := 1; n < Count; n++ {
			order = append(order, n)
		}
	}
	var why []string
	// First pass: slots free outright (unclaimed, ours, or claimed for a
	// data dir that is gone). Second: slots claimed for another data dir
	// that exists but has no daemon and no running sandbox (it gets
	// another slot when it starts again).
	for _, reclaim := range []bool{false, true} {
		seen := map[int]bool{}
		for _, n := range order {
			if seen[n] || (reclaim && n == 0 && opts.Pin == nil) {
				continue
			}
			seen[n] = true
			c, reason, err := try(opts, dir, n, reclaim || opts.Pin != nil)
			if err != nil {
				return nil, err
			}
			if c != nil {
				if err := remember(dir, n); err != nil {
					c.Release()
					return nil, err
				}
				return c, nil
			}
			if reclaim || opts.Pin != nil {
				why = append(why, fmt.Sprintf("%d: %s", n, reason))
			}
		}
		if opts.Pin != nil {
			return nil, errdefs.Wrap(errdefs.ErrConflict, "host slot %d is not free: %s", *opts.Pin, strings.TrimPrefix(why[0], strconv.Itoa(*opts.Pin)+": "))
		}
	}
	return nil, errdefs.Wrap(errdefs.ErrCapacityExhausted, "no free host slot for data dir %s (%s)", dir, strings.Join(why, "; "))
}

// try takes slot n for dir if it is free; a nil Claim with a reason if it
// is not; an error when the data dir itself is in use.
func try(opts Options, dir string, n int, reclaim bool) (*Claim, string, error) {
	path := filepath.Join(opts.Dir, "slot-"+strconv.Itoa(n))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, "", fmt.Errorf("host slot %d: %w", n, err)
	}
	keep := false
	defer func() {
		if !keep {
			f.Close()
		}
	}()
	rec, _ := readRecord(f)
	if err := flock(f, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return nil, "", fmt.Errorf("host slot %d: %w", n, err)
		}
		rec, _ = readRecord(f) // written before the holder let the choice go
		if rec.DataDir == dir {
			return nil, "", &InUseError{Slot: n, DataDir: dir, PID: rec.PID, Same: true}
		}
		return nil, (&InUseError{Slot: n, DataDir: rec.DataDir, PID: rec.PID}).Error(), nil
	}
	if rec, err = readRecord(f); err != nil {
		return nil, "", fmt.Errorf("host slot %d: %w", n, err)
	}
	mine := rec.DataDir == dir
	if !mine && rec.DataDir != "" && !reclaim {
		if _, err := os.Stat(rec.DataDir); err == nil {
			return nil, "kept for data dir " + rec.DataDir, nil
		}
	}
	// A slot claimed for us has only our sandboxes (whoever took it over
	// would have rewritten the claim); any other may have sandboxes of a
	// daemon that kept no claim (one from before slots existed, or whose
	// data dir was removed under it).
	if !mine {
		if cg, busy := othersRunning(NamesOf(n).CgroupParent, n == 0, opts.Owns); busy {
			return nil, "sandboxes of another data dir still run (" + cg + ")", nil
		}
	}
	// Ours now: say whose, for the next daemon that looks.
	b, _ := json.Marshal(record{DataDir: dir, PID: os.Getpid(), Since: time.Now().UTC(), Names: NamesOf(n)})
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt(append(b, '\n'), 0)
		if err != nil {
			return nil, "", fmt.Errorf("host slot %d: %w", n, err)
		}
	} else {
		return nil, "", fmt.Errorf("host slot %d: %w", n, err)
	}
	keep = true
	return &Claim{Names: NamesOf(n), DataDir: dir, Path: path, f: f}, "", nil
}

// Release lets the slot go; the claim file still names the data dir.
func (c *Claim) Release() {
	if c != nil && c.f != nil {
		c.f.Close()
		c.f = nil
	}
}

// Holder reads the claim of slot n under dir (DefaultDir if empty):
// the data dir it names and the pid that wrote it.
func Holder(dir string, n int) (dataDir string, pid int, err error) {
	if dir == "" {
		dir = DefaultDir
	}
	f, err := os.Open(filepath.Join(dir, "slot-"+strconv.Itoa(n)))
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	rec, err := readRecord(f)
	return rec.DataDir, rec.PID, err
}

func readRecord(f *os.File) (record, error) {
	var rec record
	st, err := f.Stat()
	if err != nil || st.Size() == 0 {
		return rec, err
	}
	if st.Size() > 64<<10 {
		return rec, fmt.Errorf("claim file %s is too large", f.Name())
	}
	b := make([]byte, st.Size())
	if _, err := f.ReadAt(b, 0); err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		// A torn write: nobody can be named, the slot is free to decide on.
		return record{}, nil
	}
	return rec, nil
}

// othersRunning reports a cgroup below parent, not one of owns', in which
// processes live. Slot 0's parent holds the other slots' parents: those
// are theirs (isTop).
func othersRunning(parent string, isTop bool, owns func(string) bool) (string, bool) {
	dirs, err := cgroupDirs(parent)
	if err != nil {
		return "", false
	}
	for _, d := range dirs {
		ents, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if !e.IsDir() || (isTop && strings.HasPrefix(e.Name(), "slot")) || (owns != nil && owns(e.Name())) {
				continue
			}
			if hasProcs(filepath.Join(d, e.Name())) {
				return filepath.Join(d, e.Name()), true
			}
		}
	}
	return "", false
}

// hasProcs reports whether a cgroup or one below it has a process.
func hasProcs(dir string) bool {
	found := false
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || found {
			return filepath.SkipDir
		}
		if !d.IsDir() {
			return nil
		}
		if b, err := os.ReadFile(filepath.Join(p, "cgroup.procs")); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			found = true
			return filepath.SkipAll
		}
		return nil
	})
	return found
}

func remembered(dataDir string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(dataDir, rememberFile))
	if err != nil {
		return 0, false
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return n, err == nil && n >= 0 && n < Count
}

func remember(dataDir string, n int) error {
	if m, ok := remembered(dataDir); ok && m == n {
		return nil
	}
	tmp := filepath.Join(dataDir, rememberFile+".tmp")
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(n)+"\n"), 0o600); err != nil {
		return fmt.Errorf("remembering the host slot: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dataDir, rememberFile)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("remembering the host slot: %w", err)
	}
	return nil
}

// Remembered returns the slot dataDir had last, if it remembers one.
func Remembered(dataDir string) (int, bool) { return remembered(dataDir) }

func canonical(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	} else {
		return "", fmt.Errorf("data dir: %w", err)
	}
	return abs, nil
}

func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// Slot is one slot's claim as List finds it.
type Slot struct {
	Names
	// DataDir and PID are what the claim names: the data dir the slot is
	// kept for and the daemon that last took it.
	DataDir string `json:"data_dir"`
	PID     int    `json:"pid"`
	// Held reports whether a daemon holds the claim now.
	Held bool `json:"held"`
}

// List returns every slot that has a claim under dir (DefaultDir if
// empty), held or not, in slot order. It takes no lock and changes
// nothing: a slot can change hands right after.
func List(dir string) ([]Slot, error) {
	if dir == "" {
		dir = DefaultDir
	}
	var out []Slot
	for n := range Count {
		f, err := os.Open(filepath.Join(dir, "slot-"+strconv.Itoa(n)))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return out, err
		}
		rec, _ := readRecord(f)
		// A shared lock is refused while a daemon holds the claim.
		held := flock(f, unix.LOCK_SH|unix.LOCK_NB) != nil
		f.Close()
		out = append(out, Slot{Names: NamesOf(n), DataDir: rec.DataDir, PID: rec.PID, Held: held})
	}
	return out, nil
}
