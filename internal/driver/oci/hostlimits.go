package oci

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/cgroups"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/storage"
)

// Host-wide limits: what all sandboxes of a driver together may take of
// the host (tasks, the file table, the data dir's disk).

// ensureCgroupParent creates the parent cgroup of all sandboxes in every
// hierarchy. It stays for the daemon's lifetime (like Docker's /docker):
// removing it when the last sandbox goes would race with runc creating the
// next one below it.
func (c *Core) ensureCgroupParent() error {
	h, err := cgroups.Load()
	if err != nil {
		return err
	}
	c.cg = h
	parent := h.Group(c.cfg.CgroupParent)
	for _, dir := range parent.Dirs() {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("creating cgroup parent: %w", err)
		}
	}
	budget := c.cfg.HostPIDs
	if budget == 0 {
		if budget, err = hostPIDBudget(); err != nil {
			return err
		}
	}
	if !h.Has("pids") {
		c.log.Warn("no pids cgroup controller: the sandboxes' total tasks are not bounded")
		return nil
	}
	if err := parent.SetPIDsMax(budget); err != nil {
		return fmt.Errorf("limiting the sandboxes' tasks: %w", err)
	}
	c.log.Debug("sandboxes' task budget set", "cgroup", parent.Path(), "pids_max", budget)
	return nil
}

// hostPIDBudget is the default HostPIDs: half of the host's pid space
// (the lower of kernel.pid_max and kernel.threads-max), the other half
// left to the host, the daemon and everything else.
func hostPIDBudget() (int64, error) {
	var space int64
	for _, p := range []string{"/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"} {
		v, err := readSysctl(p)
		if err != nil {
			return 0, err
		}
		if space == 0 || v < space {
			space = v
		}
	}
	return max(space/2, 1), nil
}

// fileMaxDefault is the default Config.FileMax: LONG_MAX, the kernel's
// upper bound for fs.file-max.
const fileMaxDefault = 1<<63 - 1

const fileMaxPath = "/proc/sys/fs/file-max"

// raiseFileMax raises fs.file-max to cfg.FileMax if it is lower. Failure
// (a host that mounts /proc/sys read-only for the daemon) is only logged:
// sandboxes still run, with the host's file table as their shared limit.
func (c *Core) raiseFileMax() {
	want := c.cfg.FileMax
	if want < 0 {
		return
	}
	if want == 0 {
		want = fileMaxDefault
	}
	cur, err := readSysctl(fileMaxPath)
	if err != nil {
		c.log.Warn("reading fs.file-max", "err", err)
		return
	}
	if cur >= want {
		return
	}
	if err := os.WriteFile(fileMaxPath, []byte(strconv.FormatInt(want, 10)), 0); err != nil {
		c.log.Warn("cannot raise fs.file-max: one sandbox can fill the host's file table", "file_max", cur, "err", err)
		return
	}
	c.log.Info("raised fs.file-max: open files are bounded by each sandbox's memory cgroup", "was", cur, "now", want)
}

// readSysctl reads a single-number file of /proc/sys.
func readSysctl(p string) (int64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parsing %s: %w", p, err)
	}
	return v, nil
}

// diskReserveMin is the least default reserve of DiskReserveMB: what the
// host needs to keep working (the store, logs, template builds).
const diskReserveMin = 1 << 30

// admitDisk reserves diskMB for sandbox id against the data dir's free
// space, or fails with an error wrapping errdefs.ErrCapacityExhausted if
// the host cannot promise it: free space, minus what live sandboxes may
// still write into their sparse images, minus creates in flight, minus the
// reserve. The returned release ends the reservation once the sandbox's
// image exists (it is then counted from the image itself) or the create
// failed.
func (c *Core) admitDisk(id string, res driver.Resources) (release func(), err error) {
	if res.DiskTmpfs || c.cfg.DiskReserveMB < 0 {
		return func() {}, nil // tmpfs layers use memory, not disk
	}
	want := res.DiskMB << 20
	c.diskMu.Lock()
	defer c.diskMu.Unlock()
	var sfs unix.Statfs_t
	if err := c.statfs(c.sbxRoot, &sfs); err != nil {
		return nil, fmt.Errorf("statfs of the data dir: %w", err)
	}
	free := int64(sfs.Bavail) * sfs.Bsize
	reserve := c.cfg.DiskReserveMB << 20
	if reserve == 0 {
		reserve = max(diskReserveMin, int64(sfs.Blocks)*sfs.Bsize/20)
	}
	var promised int64
	ents, err := os.ReadDir(c.sbxRoot)
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	for _, e := range ents {
		if _, ok := c.diskPending[e.Name()]; ok || !e.IsDir() {
			continue
		}
		n, err := storage.Unallocated(filepath.Join(c.sbxRoot, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("disk promised to sandbox %s: %w", e.Name(), err)
		}
		promised += n
	}
	for _, n := range c.diskPending {
		promised += n
	}
	if avail := free - promised - reserve; want > avail {
		return nil, errdefs.Wrap(errdefs.ErrCapacityExhausted,
			"disk: %d MiB asked, the host can promise %d MiB (free %d MiB, promised to sandboxes %d MiB, reserve %d MiB)",
			want>>20, max(avail, 0)>>20, free>>20, promised>>20, reserve>>20)
	}
	c.diskPending[id] = want
	return func() {
		c.diskMu.Lock()
		delete(c.diskPending, id)
		c.diskMu.Unlock()
	}, nil
}
