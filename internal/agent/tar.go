package agent

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"unicode/utf8"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// frameDataWriter turns writes into data frames.
type frameDataWriter struct{ fw *agentproto.FrameWriter }

func (w frameDataWriter) Write(p []byte) (int, error) {
	if err := w.fw.WriteData(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// tarOut sends p (a directory, or a single file) as a tar stream. The whole
// walk runs as the user: the archive holds exactly what the user may read.
func (s *Server) tarOut(st stream, fr *agentproto.FrameReader, fw *agentproto.FrameWriter, acct *account, p string) (agentproto.Response, error) {
	_, stop := watchPeer(st, fr)
	defer stop()
	sent := false
	err := s.asUser(acct, func() error {
		fd, err := s.openForRead(p)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), p)
		defer f.Close()
		fi, err := statFd(fd, "", p)
		if err != nil {
			return err
		}
		if err := fw.WriteJSON(&agentproto.Response{File: &fi}); err != nil {
			return errHandled
		}
		sent = true
		bw := bufio.NewWriterSize(frameDataWriter{fw}, agentproto.DataChunk)
		tw := tar.NewWriter(bw)
		if fi.Type == agentproto.FileTypeDir {
			if err := tarDir(tw, fd, ""); err != nil {
				return err
			}
		} else {
			if err := tarEntry(tw, fd, "", fi.Name); err != nil {
				return err
			}
		}
		if err := tw.Close(); err != nil {
			return err
		}
		return bw.Flush()
	})
	if err != nil {
		if errors.Is(err, errHandled) || !sent {
			return agentproto.Response{}, err
		}
		// Data frames went out already; the failing response ends them.
		return agentproto.Response{}, err
	}
	_ = fw.WriteEnd()
	return agentproto.Response{}, errHandled
}

// tarDir writes the entries of directory dirfd, named below prefix.
func tarDir(tw *tar.Writer, dirfd int, prefix string) error {
	// Readdirnames on a dup: closing the os.File must not close dirfd.
	dup, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(dup), prefix)
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		if err := tarEntry(tw, dirfd, name, prefix+name); err != nil {
			return err
		}
	}
	return nil
}

// tarEntry writes name in dirfd (or dirfd itself when name is "") as
// archive entry arcName, and a directory's contents after it.
func tarEntry(tw *tar.Writer, dirfd int, name, arcName string) error {
	fi, err := statFd(dirfd, name, arcName)
	if err != nil {
		if err == unix.ENOENT {
			return nil // removed meanwhile
		}
		return err
	}
	hdr := &tar.Header{
		Name:    arcName,
		Mode:    int64(fi.Mode),
		Uid:     int(fi.Uid),
		Gid:     int(fi.Gid),
		ModTime: fi.ModTime,
		Format:  tar.FormatPAX,
	}
	switch fi.Type {
	case agentproto.FileTypeDir:
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
		binaryNames(hdr)
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		fd, err := openNoFollow(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return tarDir(tw, fd, hdr.Name)
	case agentproto.FileTypeSymlink:
		hdr.Typeflag = tar.TypeSymlink
		hdr.Linkname = fi.LinkTarget
		binaryNames(hdr)
		return tw.WriteHeader(hdr)
	case agentproto.FileTypeFile:
		// O_NONBLOCK: a FIFO swapped in since the walk saw a file is
		// refused, not waited on.
		fd, err := openNoFollow(dirfd, name, unix.O_RDONLY|unix.O_NONBLOCK)
		if err != nil {
			return err
		}
		if err := readable(fd, arcName); err != nil {
			unix.Close(fd)
			return err
		}
		f := os.NewFile(uintptr(fd), arcName)
		defer f.Close()
		hdr.Typeflag = tar.TypeReg
		hdr.Size = fi.Size
		binaryNames(hdr)
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		n, err := io.CopyN(tw, f, fi.Size)
		if err == io.EOF {
			// The file shrank while we read it: pad, so the archive
			// stays well-formed.
			_, err = io.CopyN(tw, zeroReader{}, fi.Size-n)
		}
		return err
	default:
		return nil // devices, fifos, sockets: not archived
	}
}

// binaryNames marks an entry whose name or link target is not valid UTF-8
// with the PAX record hdrcharset=BINARY: a tar carries names byte for byte
// (unlike the JSON of a listing, see errNotUTF8), and the record tells
// readers that these bytes are not the UTF-8 PAX otherwise promises, so
// that GNU tar, bsdtar and Python's tarfile restore them as they are.
func binaryNames(hdr *tar.Header) {
	if !utf8.ValidString(hdr.Name) || !utf8.ValidString(hdr.Linkname) {
		hdr.PAXRecords = map[string]string{"hdrcharset": "BINARY"}
	}
}

// openNoFollow opens name in dirfd without following a symlink; name ""
// duplicates dirfd itself (a directory, or the single file of a TarOut).
func openNoFollow(dirfd int, name string, flags int) (int, error) {
	if name == "" {
		return unix.FcntlInt(uintptr(dirfd), unix.F_DUPFD_CLOEXEC, 0)
	}
	return unix.Openat(dirfd, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// tarIn unpacks the client's tar stream into directory dir as the user.
func (s *Server) tarIn(fr *agentproto.FrameReader, fw *agentproto.FrameWriter, acct *account, dir string) (agentproto.Response, error) {
	err := s.asUser(acct, func() error {
		dfd, err := s.fs.mkdirAll(dir, 0o755)
		if err != nil {
			return err
		}
		defer unix.Close(dfd)
		if err := fw.WriteJSON(&agentproto.Response{}); err != nil {
			return errHandled
		}
		dr := &dataReader{fr: fr}
		if err := unpack(dfd, tar.NewReader(dr)); err != nil {
			return err
		}
		// Whatever follows the archive's end blocks, up to the end frame.
		_, err = io.Copy(io.Discard, dr)
		return err
	})
	return agentproto.Response{}, err
}

// tarPath validates an archive entry name and returns it clean and relative,
// or "" for the directory itself. Absolute names and ".." are refused, not
// rewritten: an archive that tries them is hostile or broken.
func tarPath(name string) (string, error) {
	if strings.HasPrefix(name, "/") {
		return "", invalid(fmt.Sprintf("tar entry %q: absolute path", name))
	}
	if strings.IndexByte(name, 0) >= 0 {
		return "", invalid("tar entry name contains a NUL byte")
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", invalid(fmt.Sprintf("tar entry %q: path leaves the directory", name))
		}
	}
	clean := path.Clean(name)
	if clean == "." {
		return "", nil
	}
	return clean, nil
}

// walkParent opens the parent directory of rel below dirfd, one component at
// a time with O_NOFOLLOW, creating missing directories. Any symlink on the
// way (one the archive made, or one that was there) is refused: following it
// could lead out of the directory.
func walkParent(dirfd int, rel string) (int, string, error) {
	dir, base := path.Split(rel)
	cur, err := unix.Openat(dirfd, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", err
	}
	for _, part := range strings.Split(strings.TrimSuffix(dir, "/"), "/") {
		if part == "" {
			continue
		}
		next, err := unix.Openat(cur, part, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == unix.ENOENT {
			if err := unix.Mkdirat(cur, part, 0o755); err != nil && err != unix.EEXIST {
				unix.Close(cur)
				return -1, "", err
			}
			next, err = unix.Openat(cur, part, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		}
		unix.Close(cur)
		if err == unix.ENOTDIR || err == unix.ELOOP {
			return -1, "", invalid(fmt.Sprintf("tar entry %q: path goes through a symlink or file", rel))
		}
		if err != nil {
			return -1, "", err
		}
		cur = next
	}
	return cur, base, nil
}

// dirMode is a directory's mode and times to apply after unpacking: a
// read-only directory must stay writable until its entries are in, and
// every entry made in it changes its mtime.
type dirMode struct {
	rel   string
	mode  uint32
	times []unix.Timespec
}

// unpack extracts tr below dirfd.
func unpack(dirfd int, tr *tar.Reader) error {
	var dirs []dirMode
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return invalid("malformed tar stream")
		}
		rel, err := tarPath(hdr.Name)
		if err != nil {
			return err
		}
		if rel == "" {
			continue
		}
		// Permission bits only: setuid/setgid from an archive are refused.
		mode := uint32(hdr.Mode) & 0o777
		if err := unpackEntry(dirfd, rel, hdr, tr, mode, &dirs); err != nil {
			return err
		}
	}
	// Deepest first, so a read-only parent does not block its children.
	sort.Slice(dirs, func(i, j int) bool { return dirs[i].rel > dirs[j].rel })
	for _, d := range dirs {
		pfd, base, err := walkParent(dirfd, d.rel)
		if err != nil {
			return err
		}
		fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(pfd)
		if err != nil {
			continue // replaced by a later entry
		}
		err = unix.Fchmod(fd, d.mode)
		if err == nil {
			err = futimens(fd, d.times)
		}
		unix.Close(fd)
		if err != nil {
			return err
		}
	}
	return nil
}

// futimens sets the access and modification times of the file open at fd:
// utimensat(fd, NULL, times, 0). The AT_EMPTY_PATH form of utimensat is
// newer (Linux 5.8) and gVisor's Sentry refuses it (EINVAL).
func futimens(fd int, times []unix.Timespec) error {
	_, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&times[0])), 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

func unpackEntry(dirfd int, rel string, hdr *tar.Header, tr *tar.Reader, mode uint32, dirs *[]dirMode) error {
	pfd, base, err := walkParent(dirfd, rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	exists := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
	isDir := exists && st.Mode&unix.S_IFMT == unix.S_IFDIR
	replace := func() error {
		if exists && !isDir {
			return unix.Unlinkat(pfd, base, 0)
		}
		if isDir {
			return invalid(fmt.Sprintf("tar entry %q: a directory is in the way", rel))
		}
		return nil
	}
	mtime := unix.NsecToTimespec(hdr.ModTime.UnixNano())
	times := []unix.Timespec{mtime, mtime}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if exists && !isDir {
			if err := unix.Unlinkat(pfd, base, 0); err != nil {
				return err
			}
		}
		if !isDir {
			if err := unix.Mkdirat(pfd, base, 0o700); err != nil && err != unix.EEXIST {
				return err
			}
		}
		*dirs = append(*dirs, dirMode{rel: rel, mode: mode, times: times})
		return nil
	case tar.TypeReg: // tar.Reader turns the legacy TypeRegA into TypeReg
		if isDir {
			return invalid(fmt.Sprintf("tar entry %q: a directory is in the way", rel))
		}
		// A FIFO, socket or device at this name (made by the archive or
		// by the sandbox's code) is replaced: opening a FIFO for writing
		// would wait forever for a reader.
		if ft := st.Mode & unix.S_IFMT; exists && ft != unix.S_IFREG && ft != unix.S_IFLNK {
			if err := unix.Unlinkat(pfd, base, 0); err != nil {
				return err
			}
		}
		// O_NOFOLLOW: an existing symlink at this name (say, one this
		// archive just made) is never written through. O_NONBLOCK: one
		// that appears meanwhile fails (ENXIO) instead of blocking.
		fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, mode)
		if err == unix.ELOOP {
			return invalid(fmt.Sprintf("tar entry %q: would write through a symlink", rel))
		}
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), rel)
		defer f.Close()
		var fst unix.Stat_t
		if err := unix.Fstat(fd, &fst); err != nil {
			return err
		}
		if fst.Mode&unix.S_IFMT != unix.S_IFREG {
			return invalid(fmt.Sprintf("tar entry %q: not a regular file in the sandbox", rel))
		}
		if err := unix.Fchmod(fd, mode); err != nil {
			return err
		}
		if _, err := io.Copy(f, tr); err != nil {
			var errno unix.Errno
			if errors.As(err, &errno) {
				return errno
			}
			return invalid("malformed tar stream")
		}
		return futimens(fd, times)
	case tar.TypeSymlink:
		if err := replace(); err != nil {
			return err
		}
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return err
		}
		_ = unix.UtimesNanoAt(pfd, base, times, unix.AT_SYMLINK_NOFOLLOW)
		return nil
	case tar.TypeLink:
		target, err := tarPath(hdr.Linkname)
		if err != nil {
			return err
		}
		if target == "" {
			return invalid(fmt.Sprintf("tar entry %q: bad link target", rel))
		}
		spfd, sbase, err := walkParent(dirfd, target)
		if err != nil {
			return err
		}
		defer unix.Close(spfd)
		if err := replace(); err != nil {
			return err
		}
		// Flags 0: a symlink as the source is linked itself, not followed.
		return unix.Linkat(spfd, sbase, pfd, base, 0)
	case tar.TypeFifo:
		if err := replace(); err != nil {
			return err
		}
		return unix.Mkfifoat(pfd, base, mode)
	case tar.TypeChar, tar.TypeBlock:
		return invalid(fmt.Sprintf("tar entry %q: device files are not allowed", rel))
	default:
		// Global headers and vendor extensions carry nothing to create.
		return nil
	}
}
