package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Usage reports the disk use of the writable layer of the rootfs in dir.
// usedBytes is the space the layer's files take now. writtenBytes is what was
// written to the layer's filesystem since it was made (ext4's lifetime write
// counter, which includes a few KiB of mkfs metadata); tmpfs keeps no such
// counter, so there it is usedBytes, a lower bound.
func Usage(dir string) (usedBytes, writtenBytes uint64, err error) {
	st := filepath.Join(dir, storageName)
	rw := filepath.Join(st, rwName)
	var parent, mnt unix.Stat_t
	if err := unix.Stat(st, &parent); err != nil {
		return 0, 0, errdefs.Wrap(errdefs.ErrNotFound, "no storage in %s", dir)
	}
	if err := unix.Stat(rw, &mnt); err != nil || mnt.Dev == parent.Dev {
		// Not a mount point: statfs would describe the host's disk.
		return 0, 0, errdefs.Wrap(errdefs.ErrNotFound, "no writable layer mounted in %s", dir)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(rw, &sfs); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", rw, err)
	}
	used := (sfs.Blocks - sfs.Bfree) * uint64(sfs.Bsize)
	if sfs.Type != unix.EXT4_SUPER_MAGIC {
		return used, used, nil
	}
	written, err := ext4Written(mnt.Dev)
	if err != nil {
		return used, 0, err
	}
	return used, written, nil
}

// ext4Written reads the lifetime write counter of the ext4 on device dev.
func ext4Written(dev uint64) (uint64, error) {
	link, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(dev), unix.Minor(dev)))
	if err != nil {
		return 0, fmt.Errorf("finding block device: %w", err)
	}
	b, err := os.ReadFile(filepath.Join("/sys/fs/ext4", filepath.Base(link), "lifetime_write_kbytes"))
	if err != nil {
		return 0, fmt.Errorf("reading ext4 write counter: %w", err)
	}
	kb, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parsing ext4 write counter: %w", err)
	}
	return kb << 10, nil
}

// Unallocated reports how much of the disk quota of the writable layer in dir
// the host has not yet backed with blocks: the image is sparse, so its size
// is a promise and only what the sandbox wrote takes host disk space. The
// rest may still be claimed at any time, which is what an admission check
// must set aside. It is 0 for a tmpfs layer (memory, not disk) or none.
func Unallocated(dir string) (int64, error) {
	var st unix.Stat_t
	err := unix.Stat(filepath.Join(dir, storageName, imageName), &st)
	if errors.Is(err, unix.ENOENT) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("stat disk image: %w", err)
	}
	// st_blocks counts 512-byte units whatever the block size.
	return max(st.Size-st.Blocks*512, 0), nil
}
