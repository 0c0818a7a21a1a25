package oci

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/cgroups"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/drivertest"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/storage"
)

// TestAgentSocket: the agent's socket is the daemon's, in a directory the
// sandbox cannot reach; nothing inside can write to the host; and DialAgent
// neither follows a symlink put in the socket's place nor talks to anything
// but the sandbox's agent.
func TestAgentSocket(t *testing.T) {
	requireHost(t)
	tmpl := drivertest.BaseTemplate(t)
	d := newCore(t, newHost(t))
	id := "sbx_sock" + strconv.Itoa(os.Getpid())
	c := drivertest.Started(t, d, driver.Spec{ID: id, Template: tmpl})
	runDir := filepath.Join(d.Dir(id), runDirName)
	sock := filepath.Join(runDir, agentSockName)

	var st unix.Stat_t
	if err := unix.Lstat(runDir, &st); err != nil || st.Uid != 0 || st.Mode&0o777 != 0o700 {
		t.Errorf("run dir: uid %d mode %o (%v), want root's, 0700", st.Uid, st.Mode&0o777, err)
	}
	if err := unix.Lstat(sock, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK || st.Uid != 0 {
		t.Errorf("agent socket: mode %o uid %d (%v), want a socket of root", st.Mode, st.Uid, err)
	}

	// From inside, as root: no mount of the sandbox dir but the rootfs
	// and the agent binary, nothing under /.airlock but the agent, and
	// the agent's stdout and stderr (agent.log, on the host) not writable.
	mi := drivertest.Output(t, c, "cat /proc/self/mountinfo")
	for _, line := range strings.Split(mi, "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[3], d.Dir(id)+"/") && f[3] != filepath.Join(d.Dir(id), "rootfs") {
			t.Errorf("a host path of the sandbox dir is mounted inside: %s", line)
		}
	}
	if got := drivertest.Output(t, c, "ls -A /.airlock"); got != "airlock-agent\n" {
		t.Errorf("/.airlock holds %q", got)
	}
	before, _ := os.Stat(filepath.Join(d.Dir(id), "agent.log"))
	if got := drivertest.Output(t, c, "for f in 1 2; do echo attack >> /proc/1/fd/$f && echo wrote; done 2>/dev/null; echo done"); got != "done\n" {
		t.Errorf("root inside writes to the agent's log: %q", got)
	}
	if after, err := os.Stat(filepath.Join(d.Dir(id), "agent.log")); err != nil || (before != nil && after.Size() > before.Size()) {
		t.Errorf("agent.log grew from inside: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// A decoy listening on the host: what a swapped socket would lead to.
	decoyDir := t.TempDir()
	decoy, err := net.Listen("unix", filepath.Join(decoyDir, "decoy.sock"))
	if err != nil {
		t.Fatal(err)
	}
	var accepted sync.WaitGroup
	var conns int
	accepted.Add(1)
	go func() {
		defer accepted.Done()
		for {
			c, err := decoy.Accept()
			if err != nil {
				return
			}
			conns++
			c.Close()
		}
	}()
	// The agent's socket is kept under another name (its inode stays bound
	// to the agent's listener) while something else takes its place.
	if err := os.Rename(sock, sock+".orig"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		plant func() error
	}{
		{"symlink", func() error { return os.Symlink(filepath.Join(decoyDir, "decoy.sock"), sock) }},
		// A real socket of root's: only its peer credentials give it away.
		{"foreign_listener", func() error { return os.Link(filepath.Join(decoyDir, "decoy.sock"), sock) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.plant(); err != nil {
				t.Fatal(err)
			}
			defer os.Remove(sock)
			conn, err := d.DialAgent(ctx, id)
			if err == nil {
				conn.Close()
				t.Fatal("DialAgent connected through a planted socket")
			}
			if !errors.Is(err, errdefs.ErrUnavailable) {
				t.Errorf("DialAgent = %v, want unavailable", err)
			}
		})
	}
	decoy.Close()
	accepted.Wait()
	// Following the symlink would have reached the decoy; the hard link is
	// reached on purpose, to read its credentials, and refused.
	if conns > 1 {
		t.Errorf("the decoy accepted %d connections", conns)
	}
	if err := os.Rename(sock+".orig", sock); err != nil {
		t.Fatal(err)
	}
	conn, err := d.DialAgent(ctx, id)
	if err != nil {
		t.Fatalf("DialAgent to the agent's own socket: %v", err)
	}
	conn.Close()
}

// TestAgentLogBounded: the agent's stdout and stderr (its log on the host)
// is a file on the sandbox's own writable layer, so writing to it without
// end, through the very path of the agent's stderr (/proc/<init>/fd/2, as
// host root: what an agent made to log for ever would do), stops at the
// sandbox's disk quota, with the ext4 image and with a tmpfs layer; the
// data dir's file system outside the layer does not grow, the log is
// nowhere inside the sandbox, and the sandbox still answers. (Before, the
// log was a file in the sandbox dir that took whatever was written.)
func TestAgentLogBounded(t *testing.T) {
	requireHost(t)
	tmpl := drivertest.BaseTemplate(t)
	d := newCore(t, newHost(t))
	const quotaMB = 16
	for _, tc := range []struct {
		name  string
		tmpfs bool
	}{{"ext4", false}, {"tmpfs", true}} {
		t.Run(tc.name, func(t *testing.T) {
			id := "sbx_log" + tc.name + strconv.Itoa(os.Getpid())
			c := drivertest.Started(t, d, driver.Spec{ID: id, Template: tmpl,
				Resources: driver.Resources{DiskMB: quotaMB, DiskTmpfs: tc.tmpfs}})
			st, err := d.LoadState(id)
			if err != nil {
				t.Fatal(err)
			}
			priv, err := storage.PrivateDir(d.Dir(id))
			if err != nil {
				t.Fatal(err)
			}
			logPath := filepath.Join(priv, agentLogName)
			if got, err := filepath.EvalSymlinks(filepath.Join(d.Dir(id), agentLogName)); err != nil || got != logPath {
				t.Errorf("%s/agent.log leads to %q (%v), want %s", d.Dir(id), got, err, logPath)
			}
			var sfsBefore unix.Statfs_t
			if err := unix.Statfs(d.Dir(id), &sfsBefore); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/2", st.Pid), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var fi, li unix.Stat_t
			if err := unix.Fstat(int(f.Fd()), &fi); err != nil || unix.Stat(logPath, &li) != nil || fi.Ino != li.Ino || fi.Dev != li.Dev {
				t.Errorf("the agent's stderr is not %s (%v)", logPath, err)
			}
			buf := make([]byte, 1<<20)
			var wrote int64
			var werr error
			for wrote < 4*quotaMB<<20 {
				n, err := f.Write(buf)
				wrote += int64(n)
				if err != nil {
					werr = err
					break
				}
			}
			if !errors.Is(werr, unix.ENOSPC) {
				t.Errorf("wrote %d MiB to the agent's log of a sandbox with %d MiB of disk (%v), want ENOSPC within the quota", wrote>>20, quotaMB, werr)
			}
			if err := unix.Stat(logPath, &li); err != nil || li.Size > quotaMB<<20 {
				t.Errorf("agent log is %d bytes (%v), past the %d MiB quota", li.Size, err, quotaMB)
			}
			var sfsAfter unix.Statfs_t
			if err := unix.Statfs(d.Dir(id), &sfsAfter); err != nil {
				t.Fatal(err)
			}
			// Other tests may write meanwhile: only growth beyond the
			// quota (what the image may take) counts.
			if grew := (int64(sfsBefore.Bavail) - int64(sfsAfter.Bavail)) * sfsAfter.Bsize; grew > 2*quotaMB<<20 {
				t.Errorf("the data dir's file system lost %d MiB while a %d MiB sandbox's log was written", grew>>20, quotaMB)
			}
			if out := drivertest.Output(t, c, "find / -xdev -name agent.log 2>/dev/null; echo done"); out != "done\n" {
				t.Errorf("the agent's log is visible inside: %q", out)
			}
			if err := c.Ping(context.Background()); err != nil {
				t.Errorf("sandbox with a full log: %v", err)
			}
		})
	}
}

// TestSandboxRlimits: processes start with the soft open file limit
// select(2) can handle and may raise it to the hard limit, not beyond.
func TestSandboxRlimits(t *testing.T) {
	requireHost(t)
	tmpl := drivertest.BaseTemplate(t)
	d := newCore(t, newHost(t))
	c := drivertest.Started(t, d, driver.Spec{ID: "sbx_rlim" + strconv.Itoa(os.Getpid()), Template: tmpl})
	want := nofileLimit()
	got := strings.Fields(drivertest.Output(t, c, "ulimit -Sn; ulimit -Hn; ulimit -Sn "+strconv.FormatUint(want.Hard, 10)+" && echo raised; ulimit -Hn "+strconv.FormatUint(want.Hard+1, 10)+" 2>/dev/null || echo capped"))
	if len(got) != 4 || got[0] != strconv.FormatUint(want.Soft, 10) || got[1] != strconv.FormatUint(want.Hard, 10) || got[2] != "raised" || got[3] != "capped" {
		t.Errorf("open file limits inside: %q, want soft %d, hard %d, raisable to hard only", got, want.Soft, want.Hard)
	}
}

// TestHostLimits: New caps the tasks of all sandboxes through their parent
// cgroup and raises fs.file-max.
func TestHostLimits(t *testing.T) {
	requireHost(t)
	h, err := cgroups.Load()
	if err != nil {
		t.Fatal(err)
	}
	if !h.Has("pids") {
		t.Skip("no pids controller")
	}
	def, err := hostPIDBudget()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		pids int64
		want int64
	}{
		{"default", 0, def},
		{"configured", 1234, 1234},
		{"unlimited", -1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A parent of its own: the host's /airlock serves other tests.
			parent := "airlock-test-limits-" + strconv.Itoa(os.Getpid())
			g := h.Group(parent)
			t.Cleanup(func() { g.Remove(context.Background()) })
			cfg := testConfig(newHost(t))
			cfg.AgentPath, cfg.CgroupParent, cfg.HostPIDs = "/bin/true", parent, tc.pids
			newTestCore(t, cfg)
			if n, err := g.PIDsMax(); err != nil || n != tc.want {
				t.Errorf("pids.max of %s = %d, %v; want %d", parent, n, err, tc.want)
			}
		})
	}
	if def*2 > min(mustSysctl(t, "/proc/sys/kernel/pid_max"), mustSysctl(t, "/proc/sys/kernel/threads-max")) {
		t.Errorf("default budget %d leaves the host less than half its pid space", def)
	}
	// The file table: at least the configured value afterwards, never lowered.
	if v := mustSysctl(t, fileMaxPath); v < fileMaxDefault {
		t.Errorf("fs.file-max = %d after New, want %d", v, int64(fileMaxDefault))
	}
}

func mustSysctl(t *testing.T, p string) int64 {
	t.Helper()
	v, err := readSysctl(p)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// fakeDisk is a data dir file system of size bytes with free bytes left.
func fakeDisk(size, free int64) func(string, *unix.Statfs_t) error {
	return func(_ string, st *unix.Statfs_t) error {
		st.Bsize, st.Blocks, st.Bavail, st.Bfree = 4096, uint64(size/4096), uint64(free/4096), uint64(free/4096)
		return nil
	}
}

// TestAdmitDisk: creates reserve their quota; one that would over-commit
// the data dir's free space is refused, however many race.
func TestAdmitDisk(t *testing.T) {
	const gib = int64(1) << 30
	tests := []struct {
		name    string
		size    int64 // of the file system
		free    int64
		reserve int64 // Config.DiskReserveMB
		asks    []int64
		admit   int // how many of asks fit
	}{
		// Reserve max(1 GiB, 5% of 10 GiB) = 1 GiB: 3 GiB left.
		{"fits", 10 * gib, 4 * gib, 0, []int64{3072}, 1},
		{"one_too_big", 10 * gib, 4 * gib, 0, []int64{3073}, 0},
		// 5% of 100 GiB = 5 GiB reserved: 5 GiB left, two of three fit.
		{"percent_reserve", 100 * gib, 10 * gib, 0, []int64{2048, 2048, 2048}, 2},
		{"explicit_reserve", 100 * gib, 10 * gib, 512, []int64{4096, 4096, 4096}, 2},
		{"check_off", 10 * gib, 1 * gib, -1, []int64{20480, 20480}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := &Core{cfg: Config{DiskReserveMB: tc.reserve}, sbxRoot: t.TempDir(), statfs: fakeDisk(tc.size, tc.free), diskPending: map[string]int64{}}
			var wg sync.WaitGroup
			var mu sync.Mutex
			admitted := 0
			var releases []func()
			for i, mb := range tc.asks {
				wg.Add(1)
				go func() {
					defer wg.Done()
					release, err := d.admitDisk("sbx_"+strconv.Itoa(i), driver.Resources{DiskMB: mb})
					mu.Lock()
					defer mu.Unlock()
					if err == nil {
						admitted++
						releases = append(releases, release)
					} else if !errors.Is(err, errdefs.ErrCapacityExhausted) {
						t.Errorf("admitDisk(%d MiB) = %v, want capacity exhausted", mb, err)
					}
				}()
			}
			wg.Wait()
			if admitted != tc.admit {
				t.Errorf("%d of %v admitted, want %d", admitted, tc.asks, tc.admit)
			}
			for _, r := range releases {
				r()
			}
			if len(d.diskPending) != 0 {
				t.Errorf("reservations left: %v", d.diskPending)
			}
			// Tmpfs layers take memory: never refused for disk.
			if _, err := d.admitDisk("sbx_tmpfs", driver.Resources{DiskMB: 1 << 20, DiskTmpfs: true}); err != nil {
				t.Errorf("tmpfs layer refused: %v", err)
			}
		})
	}
}

// TestDiskAdmission: the quota a live sandbox has not written yet stays
// promised to it; a create that the rest cannot hold fails with
// ErrCapacityExhausted and leaves nothing behind.
func TestDiskAdmission(t *testing.T) {
	requireHost(t)
	tmpl := drivertest.BaseTemplate(t)
	h := newHost(t)
	d := newCore(t, h)
	snap := hostcheckTake(t, h.DataDir)
	// 4 GiB free on a 10 GiB file system: 3 GiB can be promised.
	d.statfs = fakeDisk(10<<30, 4<<30)
	ctx := context.Background()
	create := func(name string, mb int64) error {
		_, err := d.Create(ctx, driver.Spec{ID: "sbx_disk" + name + strconv.Itoa(os.Getpid()), Template: tmpl, Resources: driver.Resources{DiskMB: mb}})
		return err
	}
	destroy := func(name string) {
		t.Helper()
		if err := d.Destroy(ctx, "sbx_disk"+name+strconv.Itoa(os.Getpid())); err != nil {
			t.Error(err)
		}
	}
	if err := create("a", 2048); err != nil {
		t.Fatal(err)
	}
	defer destroy("a")
	// a's image is sparse: the host's free space barely moved, yet b would
	// not fit if a filled its quota.
	if err := create("b", 1536); !errors.Is(err, errdefs.ErrCapacityExhausted) {
		t.Fatalf("create over the promised space = %v, want capacity exhausted", err)
	}
	if _, err := os.Stat(d.Dir("sbx_diskb" + strconv.Itoa(os.Getpid()))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused sandbox left its dir: %v", err)
	}
	if err := create("c", 512); err != nil {
		t.Fatalf("create that fits: %v", err)
	}
	destroy("c")
	destroy("a")
	if err := create("b", 1536); err != nil {
		t.Fatalf("create after the space was freed: %v", err)
	}
	destroy("b")
	snap.AssertNoLeaks(t)
}

// BenchmarkAdmitDisk is the disk admission of one create with 100 live
// sandboxes (one stat each): it runs under a lock on every create.
func BenchmarkAdmitDisk(b *testing.B) {
	root := b.TempDir()
	for i := range 100 {
		dir := filepath.Join(root, "sbx_"+strconv.Itoa(i), "storage")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "disk.img"), nil, 0o600); err != nil {
			b.Fatal(err)
		}
		if err := os.Truncate(filepath.Join(dir, "disk.img"), 64<<20); err != nil {
			b.Fatal(err)
		}
	}
	d := &Core{sbxRoot: root, statfs: unix.Statfs, diskPending: map[string]int64{}}
	for b.Loop() {
		release, err := d.admitDisk("sbx_new", driver.Resources{DiskMB: 1})
		if err != nil {
			b.Fatal(err)
		}
		release()
	}
}

// TestDestroyHalfCreated: Destroy cleans a sandbox that Create left half
// way (a crash after storage was mounted, before any state was written),
// knowing only its id, and frees its uid slot.
func TestDestroyHalfCreated(t *testing.T) {
	requireHost(t)
	tmpl := drivertest.BaseTemplate(t)
	h := newHost(t)
	d := newCore(t, h)
	snap := hostcheckTake(t, h.DataDir)
	ctx := context.Background()
	id := "sbx_half" + strconv.Itoa(os.Getpid())
	slot, err := d.slots.alloc(id)
	if err != nil {
		t.Fatal(err)
	}
	dir := d.Dir(id)
	if err := os.Mkdir(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	base := d.cfg.UIDRangeStart + uint32(slot)*d.cfg.IDCount
	if _, err := storage.Setup(ctx, storage.Options{Dir: dir, Layers: tmpl.Layers, UIDBase: base, IDCount: d.cfg.IDCount, SizeMB: 64}); err != nil {
		t.Fatal(err)
	}
	// A new driver instance, as after the crash.
	d2 := newCore(t, h)
	if err := d2.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("sandbox dir left: %v", err)
	}
	if n := d2.slots.find(id); n != -1 {
		t.Errorf("slot %d still held", n)
	}
	snap.AssertNoLeaks(t)
}

// TestLegacyAgentLogCap: the agent.log of a sandbox an earlier daemon made
// (a regular file in its dir, on the data dir's file system) is truncated
// past legacyLogMax; the symlink to today's log is left alone.
func TestLegacyAgentLogCap(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, agentLogName)
	if err := os.WriteFile(p, make([]byte, legacyLogMax+1), 0o600); err != nil {
		t.Fatal(err)
	}
	d := &Core{log: slog.New(slog.DiscardHandler)}
	d.capLegacyLog(dir)
	if fi, err := os.Stat(p); err != nil || fi.Size() != 0 {
		t.Fatalf("log after cap: %v, %v", fi.Size(), err)
	}
	os.WriteFile(p, []byte("small"), 0o600)
	d.capLegacyLog(dir)
	if b, _ := os.ReadFile(p); string(b) != "small" {
		t.Fatalf("small log changed: %q", b)
	}
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, make([]byte, legacyLogMax+1), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(p)
	if err := os.Symlink("target", p); err != nil {
		t.Fatal(err)
	}
	d.capLegacyLog(dir)
	if fi, err := os.Stat(target); err != nil || fi.Size() != legacyLogMax+1 {
		t.Fatalf("the symlink's target was truncated: %v, %v", fi.Size(), err)
	}
}
