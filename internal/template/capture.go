package template

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// IDShift maps the host ids of a sandbox's writable layer back to the
// container ids a template layer stores: host id Base+n is container id n.
type IDShift struct {
	Base  uint32
	Count uint32
}

// back returns the container id of host id, and whether it was in range.
// Ids outside the range (overlay whiteouts are made by the mounter, host
// root) become 0.
func (s IDShift) back(id uint32) (uint32, bool) {
	if id >= s.Base && id-s.Base < s.Count {
		return id - s.Base, true
	}
	return 0, false
}

// Overlay xattrs, in the trusted namespace because the daemon (host root)
// mounts the overlays.
const (
	opaqueXattr  = "trusted.overlay.opaque"
	overlayXattr = "trusted.overlay."
	capXattr     = "security.capability"
	aclAccess    = "system.posix_acl_access"
	aclDefault   = "system.posix_acl_default"
)

// CaptureStats counts what CaptureUpper copied.
type CaptureStats struct {
	Files, Dirs, Symlinks, Whiteouts, Hardlinks int
	Bytes                                       int64
	// Skipped counts entries a template layer cannot hold (sockets, device
	// nodes other than whiteouts).
	Skipped int
}

// CaptureUpper copies the writable (upper) directory of a stopped sandbox's
// overlay, src, into dst (an empty layer directory) as a template layer:
// owners shifted back by shift, overlay whiteouts (0/0 character devices)
// and opaque directories kept, hard links kept as hard links, sparse files
// kept sparse, modes, times and the xattrs a layer can carry (user.*, file
// capabilities, ACLs with their ids shifted). Top-level names in exclude
// (mount points the runtime makes, like proc or .airlock) are left out.
//
// src belongs to a sandbox and is hostile: nothing in it is followed (no
// symlink, no special file is opened), and the sandbox must not run while
// it is copied.
func CaptureUpper(ctx context.Context, src, dst string, shift IDShift, exclude []string) (CaptureStats, error) {
	c := &capturer{ctx: ctx, shift: shift, links: map[[2]uint64]string{}, exclude: map[string]bool{}}
	for _, e := range exclude {
		c.exclude[e] = true
	}
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return c.stats, fmt.Errorf("reading writable layer: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return c.stats, fmt.Errorf("writable layer %s is not a directory", src)
	}
	if err := c.dir(src, dst, &st, true); err != nil {
		return c.stats, err
	}
	return c.stats, nil
}

type capturer struct {
	ctx     context.Context
	shift   IDShift
	links   map[[2]uint64]string // (dev, ino) of a multiply linked file → its copy
	exclude map[string]bool
	stats   CaptureStats
}

// dir copies directory src (already lstat'ed) to dst; dst exists when root.
func (c *capturer) dir(src, dst string, st *unix.Stat_t, root bool) error {
	if err := c.ctx.Err(); err != nil {
		return err
	}
	if !root {
		if err := os.Mkdir(dst, 0o700); err != nil {
			return fmt.Errorf("creating %s: %w", dst, err)
		}
		c.stats.Dirs++
	}
	f, err := os.OpenFile(src, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("reading directory: %w", err)
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("reading directory: %w", err)
	}
	sort.Strings(names)
	for _, name := range names {
		if root && c.exclude[name] {
			continue
		}
		if err := c.entry(filepath.Join(src, name), filepath.Join(dst, name)); err != nil {
			return err
		}
	}
	// Attributes last: a read-only directory must still take its children,
	// and writing them changed its times.
	return c.attrs(src, dst, st, true)
}

func (c *capturer) entry(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return fmt.Errorf("reading %s: %w", src, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return c.dir(src, dst, &st, false)
	case unix.S_IFREG:
		return c.file(src, dst, &st)
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return fmt.Errorf("reading link: %w", err)
		}
		if err := os.Symlink(target, dst); err != nil {
			return fmt.Errorf("creating link: %w", err)
		}
		c.stats.Symlinks++
		return c.attrs(src, dst, &st, false)
	case unix.S_IFCHR:
		if st.Rdev != 0 {
			c.stats.Skipped++
			return nil
		}
		// An overlay whiteout: it hides the name in the layers below.
		if err := unix.Mknod(dst, unix.S_IFCHR, 0); err != nil {
			return fmt.Errorf("creating whiteout: %w", err)
		}
		c.stats.Whiteouts++
		return c.attrs(src, dst, &st, false)
	case unix.S_IFIFO:
		if err := unix.Mkfifo(dst, 0o600); err != nil {
			return fmt.Errorf("creating fifo: %w", err)
		}
		return c.attrs(src, dst, &st, false)
	default: // sockets, block devices
		c.stats.Skipped++
		return nil
	}
}

// file copies a regular file, or links it to an earlier copy of the same
// inode.
func (c *capturer) file(src, dst string, st *unix.Stat_t) error {
	key := [2]uint64{st.Dev, st.Ino}
	if st.Nlink > 1 {
		if first, ok := c.links[key]; ok {
			if err := os.Link(first, dst); err != nil {
				return fmt.Errorf("creating hard link: %w", err)
			}
			c.stats.Hardlinks++
			return nil
		}
	}
	in, err := os.OpenFile(src, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("reading file: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("creating file: %w", err)
	}
	n, err := copySparse(out, in, st.Size)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copying %s: %w", filepath.Base(src), err)
	}
	c.stats.Files++
	c.stats.Bytes += n
	if st.Nlink > 1 {
		c.links[key] = dst
	}
	return c.attrs(src, dst, st, false)
}

// attrs gives dst the xattrs, owner, mode and times of src.
func (c *capturer) attrs(src, dst string, st *unix.Stat_t, isDir bool) error {
	typ := st.Mode & unix.S_IFMT
	uid, _ := c.shift.back(st.Uid)
	gid, _ := c.shift.back(st.Gid)
	if err := unix.Lchown(dst, int(uid), int(gid)); err != nil {
		return fmt.Errorf("chown %s: %w", dst, err)
	}
	if typ != unix.S_IFLNK {
		// After chown, which clears setuid and setgid.
		if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
			return fmt.Errorf("chmod %s: %w", dst, err)
		}
		// After chown, which drops file capabilities.
		if err := c.xattrs(src, dst, isDir); err != nil {
			return err
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("setting times of %s: %w", dst, err)
	}
	return nil
}

// xattrs copies the xattrs a layer keeps.
func (c *capturer) xattrs(src, dst string, isDir bool) error {
	names, err := listXattrs(src)
	if err != nil {
		return err
	}
	for _, name := range names {
		val, err := getXattr(src, name)
		if err != nil {
			if errors.Is(err, unix.ENODATA) {
				continue
			}
			return err
		}
		switch {
		case name == opaqueXattr:
			if !isDir || string(val) != "y" {
				continue
			}
		case strings.HasPrefix(name, overlayXattr):
			// origin, impure, nlink…: bookkeeping about this overlay's
			// lower layers, meaningless in another stack.
			continue
		case name == capXattr:
			if val = c.shiftCaps(val); val == nil {
				continue
			}
		case name == aclAccess || name == aclDefault:
			if val = c.shiftACL(val); val == nil {
				continue
			}
		case strings.HasPrefix(name, "user."):
		default: // security.selinux and the like belong to the host
			continue
		}
		if err := unix.Lsetxattr(dst, name, val, 0); err != nil {
			if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EOPNOTSUPP) {
				continue
			}
			return fmt.Errorf("setting %s on %s: %w", name, dst, err)
		}
	}
	return nil
}

// shiftCaps turns file capabilities written in the sandbox (version 3,
// rooted at the sandbox's root) into version 2, which a template layer
// holds: seen through a sandbox's idmapped mount they apply to its root.
// Capabilities rooted elsewhere are dropped.
func (c *capturer) shiftCaps(v []byte) []byte {
	const (
		rev2, rev3 = 0x02000000, 0x03000000
		revMask    = 0xFF000000
		size2      = 20
		size3      = 24
	)
	if len(v) < size2 {
		return nil
	}
	magic := binary.LittleEndian.Uint32(v)
	switch magic & revMask {
	case rev2:
		return v[:size2]
	case rev3:
		if len(v) < size3 {
			return nil
		}
		if id, ok := c.shift.back(binary.LittleEndian.Uint32(v[20:])); !ok || id != 0 {
			return nil
		}
		out := append([]byte(nil), v[:size2]...)
		binary.LittleEndian.PutUint32(out, rev2|(magic&^revMask))
		return out
	}
	return nil
}

// shiftACL shifts the user and group ids of a POSIX ACL xattr.
func (c *capturer) shiftACL(v []byte) []byte {
	const (
		header    = 4
		entrySize = 8
		aclUser   = 0x02
		aclGroup  = 0x08
	)
	if len(v) < header || (len(v)-header)%entrySize != 0 {
		return nil
	}
	out := append([]byte(nil), v...)
	for off := header; off < len(out); off += entrySize {
		tag := binary.LittleEndian.Uint16(out[off:])
		if tag != aclUser && tag != aclGroup {
			continue
		}
		id, ok := c.shift.back(binary.LittleEndian.Uint32(out[off+4:]))
		if !ok {
			return nil
		}
		binary.LittleEndian.PutUint32(out[off+4:], id)
	}
	return out
}

func listXattrs(path string) ([]string, error) {
	buf := make([]byte, 1024)
	for {
		n, err := unix.Llistxattr(path, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("listing xattrs of %s: %w", path, err)
		}
		var out []string
		for _, name := range strings.Split(string(buf[:n]), "\x00") {
			if name != "" {
				out = append(out, name)
			}
		}
		return out, nil
	}
}

func getXattr(path, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(path, name, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// copySparse copies size bytes of in to out, leaving holes where in has
// them: a sandbox can make a terabyte file that takes no disk, and the
// template layer must not take a terabyte either.
func copySparse(out, in *os.File, size int64) (int64, error) {
	var copied, off int64
	ifd := int(in.Fd())
	for off < size {
		data, err := unix.Seek(ifd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole remains
		}
		if err != nil {
			// No SEEK_DATA support: copy the rest densely.
			n, err := copyRange(out, in, off, size-off)
			return copied + n, err
		}
		hole, err := unix.Seek(ifd, data, unix.SEEK_HOLE)
		if err != nil {
			hole = size
		}
		hole = min(hole, size)
		n, err := copyRange(out, in, data, hole-data)
		copied += n
		if err != nil {
			return copied, err
		}
		off = hole
	}
	if err := out.Truncate(size); err != nil {
		return copied, err
	}
	return copied, nil
}

// copyRange copies n bytes at off of in to the same offset of out, in the
// kernel where it can.
func copyRange(out, in *os.File, off, n int64) (int64, error) {
	roff, woff := off, off
	var done int64
	for done < n {
		m, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(min(n-done, 1<<30)), 0)
		if err != nil || m == 0 {
			if err == nil || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
				k, err := io.Copy(io.NewOffsetWriter(out, woff), io.NewSectionReader(in, roff, n-done))
				return done + k, err
			}
			return done, err
		}
		done += int64(m)
	}
	return done, nil
}
