package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// maxListEntries bounds one List answer (it is one JSON frame in memory on
// both sides).
const maxListEntries = 20000

// handleFile serves the file operations. Every permission-relevant step runs
// in asUser; moving bytes over an fd opened that way needs no identity.
func (s *Server) handleFile(ctx context.Context, st stream, fr *agentproto.FrameReader, fw *agentproto.FrameWriter, req *agentproto.Request) (agentproto.Response, error) {
	if s.fs == nil {
		return agentproto.Response{}, &agentproto.Error{Code: agentproto.CodeUnsupported, Message: "file operations unavailable"}
	}
	acct, err := s.lookupUser(req.User)
	if err != nil {
		return agentproto.Response{}, err
	}
	p, err := cleanPath(req.Path, acct.Home)
	if err != nil {
		return agentproto.Response{}, err
	}
	switch req.Op {
	case agentproto.OpStat:
		var fi agentproto.FileInfo
		err := s.asUser(acct, func() error {
			fd, err := s.fs.open(p, unix.O_PATH|unix.O_NOFOLLOW, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			fi, err = statFd(fd, "", p)
			if err == nil {
				err = checkNames(fi)
			}
			return err
		})
		return agentproto.Response{File: &fi}, err
	case agentproto.OpList:
		var files []agentproto.FileInfo
		err := s.asUser(acct, func() error {
			var err error
			files, err = s.list(p, max(req.Depth, 1))
			return err
		})
		return agentproto.Response{Files: files}, err
	case agentproto.OpMkdir:
		mode := req.Mode
		if mode == 0 {
			mode = 0o755
		}
		err := s.asUser(acct, func() error {
			if req.Parents {
				fd, err := s.fs.mkdirAll(p, mode)
				if err == nil {
					unix.Close(fd)
				}
				return err
			}
			pfd, base, err := s.fs.openParent(p)
			if err != nil {
				return err
			}
			defer unix.Close(pfd)
			return unix.Mkdirat(pfd, base, mode)
		})
		return agentproto.Response{}, err
	case agentproto.OpMove:
		to, err := cleanPath(req.To, acct.Home)
		if err != nil {
			return agentproto.Response{}, err
		}
		err = s.asUser(acct, func() error {
			fpfd, fbase, err := s.fs.openParent(p)
			if err != nil {
				return err
			}
			defer unix.Close(fpfd)
			tpfd, tbase, err := s.fs.openParent(to)
			if err != nil {
				return err
			}
			defer unix.Close(tpfd)
			return unix.Renameat(fpfd, fbase, tpfd, tbase)
		})
		return agentproto.Response{}, err
	case agentproto.OpRemove:
		err := s.asUser(acct, func() error {
			pfd, base, err := s.fs.openParent(p)
			if err != nil {
				return err
			}
			defer unix.Close(pfd)
			return removeAt(pfd, base, req.Recursive)
		})
		return agentproto.Response{}, err
	case agentproto.OpReadFile:
		var fd int
		var fi agentproto.FileInfo
		tar := false
		err := s.asUser(acct, func() error {
			var err error
			// A FIFO is opened as it is, waiting for its writer: the code
			// interpreter streams a cell's output that way.
			fd, err = s.fs.open(p, unix.O_RDONLY, 0)
			if err != nil {
				return err
			}
			fi, err = statFd(fd, "", p)
			if err == nil && fi.Type == agentproto.FileTypeDir {
				// As OpStat then OpTarOut would: a directory, but not
				// one reached through a final symlink.
				if tar = req.Tar && s.isDir(p); !tar {
					err = unix.EISDIR
				}
			}
			if err != nil || tar {
				unix.Close(fd)
			}
			return err
		})
		if err != nil {
			return agentproto.Response{}, err
		}
		if tar {
			return s.tarOut(st, fr, fw, acct, p)
		}
		f := os.NewFile(uintptr(fd), p)
		defer f.Close()
		if err := fw.WriteJSON(&agentproto.Response{File: &fi}); err != nil {
			return agentproto.Response{}, errHandled
		}
		// A regular file of known size goes by sendfile on a direct
		// connection; an empty-looking one (a /proc file) is read to EOF.
		if dc, ok := st.(*directConn); ok && fi.Type == agentproto.FileTypeFile && fi.Size > 0 {
			return sendFileDirect(dc, fw, f, fi.Size)
		}
		return s.sendData(st, fr, fw, f)
	case agentproto.OpWriteFile:
		_, splice := st.(*directConn)
		return s.writeFile(fr, fw, acct, p, req, splice)
	case agentproto.OpTarOut:
		return s.tarOut(st, fr, fw, acct, p)
	case agentproto.OpTarIn:
		return s.tarIn(fr, fw, acct, p)
	}
	return agentproto.Response{}, invalid("unknown file op")
}

// isDir reports whether p itself (not a final symlink's target) is a
// directory; it runs as the request's user.
func (s *Server) isDir(p string) bool {
	fd, err := s.fs.open(p, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	fi, err := statFd(fd, "", p)
	return err == nil && fi.Type == agentproto.FileTypeDir
}

// sendData streams r as data frames and an end frame. A read error after the
// first frame is sent as a failing Response instead of the end frame.
func (s *Server) sendData(st stream, fr *agentproto.FrameReader, fw *agentproto.FrameWriter, r io.Reader) (agentproto.Response, error) {
	_, stop := watchPeer(st, fr)
	defer stop()
	if _, err := fw.ReadFrom(r); err != nil {
		var se *agentproto.SourceError
		if errors.As(err, &se) {
			return agentproto.Response{}, se.Err
		}
		return agentproto.Response{}, errHandled
	}
	_ = fw.WriteEnd()
	return agentproto.Response{}, errHandled
}

// dataReader presents the client's data frames as a reader; the end frame is
// io.EOF. With limit > 0, data past limit bytes fails with CodeTooLarge.
type dataReader struct {
	fr    *agentproto.FrameReader
	buf   []byte
	eof   bool
	limit int64
	n     int64
	// splice makes WriteTo move each frame's payload from the socket to the
	// destination in the kernel; fr must then be unbuffered.
	splice bool
}

func (d *dataReader) tooLarge() error {
	return &agentproto.Error{Code: agentproto.CodeTooLarge, Message: "file is larger than the limit"}
}

func (d *dataReader) next() error {
	t, payload, err := d.fr.Next()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	switch t {
	case agentproto.FrameData:
		d.n += int64(len(payload))
		if d.limit > 0 && d.n > d.limit {
			return d.tooLarge()
		}
		d.buf = payload
	case agentproto.FrameEnd:
		d.eof = true
	default:
		return invalid("unexpected frame in data")
	}
	return nil
}

func (d *dataReader) Read(p []byte) (int, error) {
	for len(d.buf) == 0 {
		if d.eof {
			return 0, io.EOF
		}
		if err := d.next(); err != nil {
			return 0, err
		}
	}
	n := copy(p, d.buf)
	d.buf = d.buf[n:]
	return n, nil
}

// WriteTo writes each frame's payload straight to w (no copy in between).
func (d *dataReader) WriteTo(w io.Writer) (int64, error) {
	if d.splice && len(d.buf) == 0 && !d.eof {
		return d.spliceTo(w)
	}
	var total int64
	for {
		if len(d.buf) > 0 {
			n, err := w.Write(d.buf)
			total += int64(n)
			d.buf = d.buf[n:]
			if err != nil {
				return total, err
			}
		}
		if d.eof {
			return total, nil
		}
		if err := d.next(); err != nil {
			return total, err
		}
	}
}

// spliceTo is WriteTo for direct connections: each payload goes from the
// socket to w by io.Copy, which for an *os.File is splice(2), so the bytes
// never enter the agent's memory.
func (d *dataReader) spliceTo(w io.Writer) (int64, error) {
	var total int64
	for {
		t, n, err := d.fr.NextHeader()
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return total, err
		}
		switch t {
		case agentproto.FrameData:
			d.n += int64(n)
			if d.limit > 0 && d.n > d.limit {
				return total, d.tooLarge()
			}
			k, err := io.Copy(w, d.fr.Payload(n))
			total += k
			if err != nil {
				return total, err
			}
			if k < int64(n) {
				return total, io.ErrUnexpectedEOF
			}
		case agentproto.FrameEnd:
			d.eof = true
			return total, nil
		default:
			return total, invalid("unexpected frame in data")
		}
	}
}

// writeFile stores the client's data at p through a temporary file renamed
// over p at the end, so readers never see a half-written file and a failed
// upload (too large, disk full, client gone) leaves p as it was.
func (s *Server) writeFile(fr *agentproto.FrameReader, fw *agentproto.FrameWriter, acct *account, p string, req *agentproto.Request, splice bool) (agentproto.Response, error) {
	var pfd, fd int = -1, -1
	var base, tmp string
	direct := false
	if err := validMetadata(req.Metadata); err != nil {
		return agentproto.Response{}, err
	}
	err := s.asUser(acct, func() error {
		dfd, err := s.fs.mkdirAll(path.Dir(p), 0o755)
		if err != nil {
			return err
		}
		pfd, base = dfd, path.Base(p)
		if p == "/" {
			return unix.EISDIR
		}
		mode := req.Mode & 0o7777
		var st unix.Stat_t
		exists := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
		if exists && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			return unix.EISDIR
		}
		if mode == 0 {
			mode = 0o644
			if exists && st.Mode&unix.S_IFMT == unix.S_IFREG {
				mode = st.Mode & 0o7777
			}
		}
		tmp = uploadPrefix + randHex()
		if exists && st.Mode&unix.S_IFMT == unix.S_IFREG {
			tmp = overwritePrefix + randHex() // a watch shows a write (watch.go)
		}
		fd, err = unix.Openat(pfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
		if err == unix.EACCES && exists && st.Mode&unix.S_IFMT == unix.S_IFREG {
			// The user may write the file but not its directory: write in
			// place (O_NOFOLLOW: never through a symlink).
			direct = true
			fd, err = unix.Openat(pfd, base, unix.O_WRONLY|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			return err
		}
		if err != nil {
			return err
		}
		// The umask must not narrow the requested mode.
		return unix.Fchmod(fd, mode)
	})
	if pfd >= 0 {
		defer unix.Close(pfd)
	}
	cleanup := func() {
		if !direct && tmp != "" && fd >= 0 {
			_ = s.asUser(acct, func() error { return unix.Unlinkat(pfd, tmp, 0) })
		}
	}
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		cleanup()
		return agentproto.Response{}, err
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	if err := fw.WriteJSON(&agentproto.Response{}); err != nil {
		cleanup()
		return agentproto.Response{}, errHandled
	}
	n, err := (&dataReader{fr: fr, limit: req.MaxBytes, splice: splice}).WriteTo(f)
	if err != nil {
		cleanup()
		return agentproto.Response{}, err
	}
	// The metadata replace the file's (a new temporary file has none; one
	// written in place loses its earlier ones), before the rename, so the
	// file appears with them.
	if len(req.Metadata) > 0 || direct {
		if err := s.asUser(acct, func() error { return setMetadata(fd, req.Metadata) }); err != nil {
			cleanup()
			return agentproto.Response{}, err
		}
	}
	if !direct {
		if err := s.asUser(acct, func() error { return unix.Renameat(pfd, tmp, pfd, base) }); err != nil {
			cleanup()
			return agentproto.Response{}, err
		}
	}
	return agentproto.Response{Written: n}, nil
}

func randHex() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// statFd describes the file at fd (name "" and AT_EMPTY_PATH) or name in
// directory fd, without following a final symlink.
func statFd(fd int, name, p string) (agentproto.FileInfo, error) {
	var st unix.Stat_t
	flags := unix.AT_SYMLINK_NOFOLLOW
	if name == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	if err := unix.Fstatat(fd, name, &st, flags); err != nil {
		return agentproto.FileInfo{}, err
	}
	base := path.Base(p)
	if p == "/" {
		base = "/"
	}
	fi := agentproto.FileInfo{
		Name:    base,
		Path:    p,
		Size:    st.Size,
		Mode:    st.Mode & 0o7777,
		Uid:     st.Uid,
		Gid:     st.Gid,
		ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec).UTC(),
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		fi.Type = agentproto.FileTypeFile
	case unix.S_IFDIR:
		fi.Type = agentproto.FileTypeDir
	case unix.S_IFLNK:
		fi.Type = agentproto.FileTypeSymlink
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(fd, name, buf)
		if err == nil {
			fi.LinkTarget = string(buf[:n])
		}
	default:
		fi.Type = agentproto.FileTypeOther
	}
	if fi.Type == agentproto.FileTypeFile || fi.Type == agentproto.FileTypeDir {
		fi.Metadata = readMetadata(fd, name)
	}
	return fi, nil
}

// list returns the entries below directory p down to depth levels.
func (s *Server) list(p string, depth int) ([]agentproto.FileInfo, error) {
	fd, err := s.fs.open(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	var out []agentproto.FileInfo
	err = listDir(fd, p, depth, &out)
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, err
}

// listDir appends dir's entries to out and descends into subdirectories
// (opened with O_NOFOLLOW: a symlink is listed, never entered). It closes fd.
func listDir(fd int, p string, depth int, out *[]agentproto.FileInfo) error {
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		if len(*out) >= maxListEntries {
			return &agentproto.Error{Code: agentproto.CodeTooLarge, Message: "too many entries; list a smaller depth"}
		}
		if !utf8.ValidString(name) {
			return errNotUTF8("name", path.Join(p, name))
		}
		fi, err := statFd(fd, name, path.Join(p, name))
		if err != nil {
			if err == unix.ENOENT {
				continue // removed meanwhile
			}
			return err
		}
		if err := checkNames(fi); err != nil {
			return err
		}
		*out = append(*out, fi)
		if fi.Type == agentproto.FileTypeDir && depth > 1 {
			cfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				if err == unix.EACCES {
					continue // listed, but its contents are not the user's to see
				}
				return err
			}
			if err := listDir(cfd, fi.Path, depth-1, out); err != nil {
				return err
			}
		}
	}
	return nil
}

// errNotUTF8 refuses a name found in the sandbox that is not valid UTF-8.
// The protocol's strings are JSON, which is UTF-8: encoding/json would turn
// every invalid byte into U+FFFD, so "a\xff" and "a\xfe" would both come
// out as "a\uFFFD", and a client writing back to that name would reach
// another file. Refusing, with the name escaped, is the only answer that
// neither renames nor merges. Tar streams carry names byte for byte and are
// not refused (see tarOut).
func errNotUTF8(what, p string) error {
	q := strconv.Quote(p)
	if len(q) > 300 {
		q = q[:300] + "…"
	}
	return &agentproto.Error{Code: agentproto.CodeInvalidArgument,
		Message: fmt.Sprintf("%s %s is not valid UTF-8, which the file API cannot carry: rename it in the sandbox (an exec of mv) or download its directory as a tar", what, q)}
}

// checkNames refuses a FileInfo whose path or symlink target is not valid
// UTF-8 (see errNotUTF8).
func checkNames(fi agentproto.FileInfo) error {
	if !utf8.ValidString(fi.Path) {
		return errNotUTF8("name", fi.Path)
	}
	if !utf8.ValidString(fi.LinkTarget) {
		return errNotUTF8("the target of symlink", fi.Path)
	}
	return nil
}

// removeAt removes name in directory dirfd; a directory needs recursive
// unless it is empty. Nothing is followed: a symlink is removed, not its
// target.
func removeAt(dirfd int, name string, recursive bool) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return unix.Unlinkat(dirfd, name, 0)
	}
	if !recursive {
		err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
		if err == unix.ENOTEMPTY || err == unix.EEXIST {
			return &agentproto.Error{Code: agentproto.CodeInvalidArgument, Message: "directory not empty"}
		}
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	names, err := f.Readdirnames(-1)
	if err != nil {
		f.Close()
		return err
	}
	for _, n := range names {
		if err := removeAt(fd, n, true); err != nil && err != unix.ENOENT {
			f.Close()
			return err
		}
	}
	f.Close()
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

// openForRead opens p to tar it: a regular file or a directory. A FIFO
// would block the open (or the read) until some process of the sandbox
// writes to it, and a device never ends: both are refused, never waited
// on.
func (s *Server) openForRead(p string) (int, error) {
	fd, err := s.fs.open(p, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, err
	}
	if err := readable(fd, p); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// readable checks that fd (opened O_NONBLOCK) is a regular file or a
// directory and makes it blocking again.
func readable(fd int, name string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFREG && t != unix.S_IFDIR {
		return invalid(fmt.Sprintf("%s is not a regular file or a directory", name))
	}
	return unix.SetNonblock(fd, false)
}
