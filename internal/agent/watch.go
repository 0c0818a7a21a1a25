package agent

import (
	"context"
	"errors"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
)

const (
	// maxWatches bounds the watches an agent serves at once: each holds an
	// inotify instance, and the kernel allows a user only a few (128 by
	// default) across the whole sandbox.
	maxWatches = 64
	// moveWait is how long an IN_MOVED_FROM that ended a read waits for
	// its IN_MOVED_TO. The kernel queues the two back to back, so the pair
	// is split only by the end of a read; a move out of the tree has no
	// partner and is reported as a remove when another event comes or this
	// passes.
	moveWait = 20 * time.Millisecond
	// maxPendingMoves bounds the unpaired IN_MOVED_FROM events held back.
	maxPendingMoves = 256
	// maxModified bounds the set of files written but not yet closed (see
	// watcher.modified); past it the set is cleared, which costs at most
	// one extra write event per file.
	maxModified = 4096
	// watchBatchMax is the most events one frame carries: a path may be
	// 4 KiB long, and a frame must stay well under MaxFramePayload.
	watchBatchMax = 256
	// uploadPrefix names the agent's own temporary files of an upload in
	// progress (writeFile); a watch never shows them.
	uploadPrefix = ".airlock-upload-"
	// overwritePrefix names the temporary file of an upload over an
	// existing regular file: when it is renamed into place the watch
	// shows a write of the file (as envd's in-place write does), not its
	// creation. Its "o" is no hex digit, so no other upload's name has it.
	overwritePrefix = uploadPrefix + "o"
)

// watchMask is what a watched directory reports. IN_EXCL_UNLINK: a file
// unlinked while still open stops reporting.
const watchMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_ATTRIB |
	unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF |
	unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

// watchSlots counts a server's running watches.
type watchSlots struct {
	mu sync.Mutex
	n  int
}

func (w *watchSlots) acquire() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n >= maxWatches {
		return false
	}
	w.n++
	return true
}

func (w *watchSlots) release() {
	w.mu.Lock()
	w.n--
	w.mu.Unlock()
}

// handleWatch serves OpWatch: an inotify watch on directory req.Path (and
// its tree when req.Recursive), as req.User, streamed until the client
// closes the stream.
func (s *Server) handleWatch(ctx context.Context, st stream, fr *agentproto.FrameReader, fw *agentproto.FrameWriter, req *agentproto.Request) (agentproto.Response, error) {
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
	if !s.watches.acquire() {
		return agentproto.Response{}, &agentproto.Error{Code: agentproto.CodeTooLarge, Message: "too many watches in this sandbox"}
	}
	defer s.watches.release()
	w, err := s.newWatcher(acct, p, req.Recursive)
	if err != nil {
		return agentproto.Response{}, err
	}
	defer w.close()
	if err := fw.WriteJSON(&agentproto.Response{}); err != nil {
		return agentproto.Response{}, errHandled
	}
	gone, stop := watchPeer(st, fr)
	defer stop()
	w.started = true
	go w.run()
	for {
		evs, end, werr := w.q.take()
		for len(evs) > 0 {
			n := min(len(evs), watchBatchMax)
			if err := fw.WriteJSON(&agentproto.WatchBatch{Events: evs[:n]}); err != nil {
				return agentproto.Response{}, errHandled
			}
			evs = evs[n:]
		}
		if werr != nil {
			return agentproto.Response{}, werr
		}
		if end {
			_ = fw.WriteEnd()
			return agentproto.Response{}, errHandled
		}
		select {
		case <-w.q.notify:
		case <-gone:
			return agentproto.Response{}, errHandled
		case <-ctx.Done():
			return agentproto.Response{}, errHandled
		}
	}
}

// watchQueue holds a watch's events between the inotify reader and the
// stream writer. Writes and chmods to a path still in the queue are merged
// into the queued event: a client that reads slower than a file changes
// gets one event per read, not one per write(2).
type watchQueue struct {
	mu       sync.Mutex
	evs      []agentproto.WatchEvent
	merge    map[string]int // type+"\x00"+path → index in evs, for writes and chmods
	overflow bool
	end      bool
	err      error
	notify   chan struct{} // capacity 1: "something changed"
}

func newWatchQueue() *watchQueue {
	return &watchQueue{merge: map[string]int{}, notify: make(chan struct{}, 1)}
}

func (q *watchQueue) signal() {
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// push queues ev, merging it into a queued event of the same kind.
func (q *watchQueue) push(ev agentproto.WatchEvent) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.end {
		return
	}
	mergeable := ev.Type == agentproto.WatchWrite || ev.Type == agentproto.WatchChmod
	key := ev.Type + "\x00" + ev.Path
	if mergeable {
		if i, ok := q.merge[key]; ok {
			q.evs[i].Time = ev.Time
			return
		}
	} else {
		// A later write must not merge into one queued before this event
		// (a write, remove, create of the same name stays in that order).
		for _, p := range []string{ev.Path, ev.From} {
			if p != "" {
				delete(q.merge, agentproto.WatchWrite+"\x00"+p)
				delete(q.merge, agentproto.WatchChmod+"\x00"+p)
			}
		}
	}
	if len(q.evs) >= agentproto.MaxWatchQueue {
		q.overflow = true
		return
	}
	if ev.Type == agentproto.WatchOverflow {
		q.overflow = true
		q.signal()
		return
	}
	if mergeable {
		q.merge[key] = len(q.evs)
	}
	q.evs = append(q.evs, ev)
	q.signal()
}

// lost queues an overflow event in its place among the others (one for a
// run of them), unlike push's, which marks where dropping began.
func (q *watchQueue) lost(now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.end || (len(q.evs) > 0 && q.evs[len(q.evs)-1].Type == agentproto.WatchOverflow) {
		return
	}
	if len(q.evs) >= agentproto.MaxWatchQueue {
		q.overflow = true
		return
	}
	// Nothing queued before it may absorb what comes after.
	clear(q.merge)
	q.evs = append(q.evs, agentproto.WatchEvent{Type: agentproto.WatchOverflow, Time: now})
	q.signal()
}

// finish ends the queue: the writer sends what is queued, then err (a
// failing Response) or, when err is nil, the end frame.
func (q *watchQueue) finish(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.end {
		return
	}
	q.end, q.err = true, err
	q.signal()
}

// take returns the queued events (an overflow last, where the dropping
// began) and whether the watch has ended.
func (q *watchQueue) take() ([]agentproto.WatchEvent, bool, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	evs := q.evs
	if q.overflow {
		evs = append(evs, agentproto.WatchEvent{Type: agentproto.WatchOverflow, Time: time.Now().UTC()})
		q.overflow = false
	}
	q.evs = nil
	clear(q.merge)
	return evs, q.end, q.err
}

// pendingMove is an IN_MOVED_FROM waiting for its IN_MOVED_TO.
type pendingMove struct {
	path  string
	dir   bool
	temp  bool
	over  bool // an upload's temporary file over an existing file (overwritePrefix)
	since time.Time
}

// watcher is one inotify instance and the directories it watches. Only the
// run goroutine touches its maps once run has started.
type watcher struct {
	s         *Server
	acct      *account
	root      string
	recursive bool
	f         *os.File // the inotify fd, non-blocking, in Go's poller
	fd        int
	q         *watchQueue
	done      chan struct{}

	dirs     map[int32]string // watch descriptor → directory path
	rootWd   int32
	moves    map[uint32]pendingMove // by cookie
	modified map[string]struct{}    // files with IN_MODIFY since their last IN_CLOSE_WRITE
	// scanned holds the paths a scan of a new directory reported as
	// created, with when: their own IN_CREATE, queued when the entry was
	// made (after the directory's watch was added, maybe), is then not
	// reported again.
	scanned    map[string]time.Time
	lastForget time.Time
	capped     bool // MaxWatchDirs was hit after the start
	// started is set (by the handler, before run starts) when there is a
	// reader for close to wait for.
	started bool
}

// newWatcher starts an inotify instance watching root (and, when
// recursive, every directory below it that the user may read). Watches are
// added as the user: the kernel checks that the user may read each
// directory, and one it may not read is skipped.
func (s *Server) newWatcher(acct *account, root string, recursive bool) (*watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		if err == unix.EMFILE || err == unix.ENFILE || err == unix.ENOMEM {
			return nil, &agentproto.Error{Code: agentproto.CodeTooLarge, Message: "too many watches in this sandbox"}
		}
		return nil, err
	}
	w := &watcher{
		s: s, acct: acct, root: root, recursive: recursive,
		fd: fd, f: os.NewFile(uintptr(fd), "inotify"), q: newWatchQueue(), done: make(chan struct{}),
		dirs: map[int32]string{}, moves: map[uint32]pendingMove{}, modified: map[string]struct{}{},
		scanned: map[string]time.Time{},
	}
	err = s.asUser(acct, func() error {
		wd, err := w.addDir(root, true)
		if err != nil {
			return err
		}
		w.rootWd = wd
		if recursive {
			return w.addTree(root, false, true)
		}
		return nil
	})
	if err != nil {
		w.f.Close()
		return nil, err
	}
	return w, nil
}

// errTooManyDirs is the start of a watch over more than MaxWatchDirs directories.
var errTooManyDirs = &agentproto.Error{Code: agentproto.CodeTooLarge, Message: "too many directories to watch; watch a smaller tree"}

// addDir adds an inotify watch on directory p, resolved below the file root
// (follow: a final symlink is followed, inside the root). It runs as the
// user.
func (w *watcher) addDir(p string, follow bool) (int32, error) {
	if len(w.dirs) >= agentproto.MaxWatchDirs {
		return -1, errTooManyDirs
	}
	flags := unix.O_PATH | unix.O_DIRECTORY
	if !follow {
		flags |= unix.O_NOFOLLOW
	}
	dfd, err := w.s.fs.open(p, flags, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(dfd)
	// inotify takes a path, not an fd: the fd's /proc link names exactly
	// the directory openat2 resolved, with no second lookup to race.
	target := "/proc/self/fd/" + strconv.Itoa(dfd)
	if !procFDs() {
		if w.s.fs.path != "/" {
			return -1, &agentproto.Error{Code: agentproto.CodeUnsupported, Message: "watch needs /proc"}
		}
		target = p
	}
	wd, err := unix.InotifyAddWatch(w.fd, target, watchMask)
	if err != nil {
		return -1, err
	}
	w.dirs[int32(wd)] = p
	return int32(wd), nil
}

var (
	procFDsOnce sync.Once
	procFDsOK   bool
)

// procFDs reports whether /proc/self/fd is there to name fds by path.
func procFDs() bool {
	procFDsOnce.Do(func() {
		_, err := os.Stat("/proc/self/fd")
		procFDsOK = err == nil
	})
	return procFDsOK
}

// addTree watches the directories below dir (already watched); with emit,
// it reports what it finds as created: they appeared before their
// directory's watch was in place. At the start (strict) too many
// directories fail the watch; later they cost an overflow event. It runs as
// the user.
func (w *watcher) addTree(dir string, emit, strict bool) error {
	fd, err := w.s.fs.open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		if strict && dir == w.root {
			return err
		}
		return nil // gone or unreadable meanwhile: its watch says so, if any
	}
	f := os.NewFile(uintptr(fd), dir)
	ents, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return nil
	}
	now := time.Now().UTC()
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), uploadPrefix) {
			continue
		}
		child := path.Join(dir, e.Name())
		isDir := e.IsDir()
		if !utf8.ValidString(e.Name()) {
			// Its events could not be named (see errNotUTF8): a directory
			// is not watched, and the client learns that it misses events.
			if strict && isDir {
				return errNotUTF8("directory", child)
			}
			if emit || isDir {
				w.unnamable()
			}
			continue
		}
		if emit {
			if _, dup := w.scanned[child]; dup {
				continue // reported, and its tree watched, already
			}
			if len(w.scanned) >= maxModified {
				clear(w.scanned) // costs duplicate creates at worst
			}
			w.scanned[child] = now
			w.q.push(agentproto.WatchEvent{Type: agentproto.WatchCreate, Path: child, Dir: isDir, Time: now})
		}
		if !isDir {
			continue
		}
		if _, err := w.addDir(child, false); err != nil {
			if err == errTooManyDirs {
				if strict {
					return err
				}
				w.overCap()
				return nil
			}
			continue // not readable by the user, or gone: skip it
		}
		if err := w.addTree(child, emit, strict); err != nil {
			return err
		}
	}
	return nil
}

// unnamable reports that a change happened to a name that is not valid
// UTF-8, which no event can carry (see errNotUTF8): the client gets an
// overflow, as for any event it misses, and re-reads the tree, where the
// listing names the culprit.
func (w *watcher) unnamable() {
	w.q.lost(time.Now().UTC())
}

// overCap notes once that directories went unwatched.
func (w *watcher) overCap() {
	if !w.capped {
		w.capped = true
		w.q.push(agentproto.WatchEvent{Type: agentproto.WatchOverflow})
	}
}

// close ends the watch: the inotify fd is closed (which removes every
// watch and unblocks the reader) and the reader is waited for.
func (w *watcher) close() {
	w.f.Close()
	if w.started {
		<-w.done
	}
}

// run reads inotify events until the fd is closed or the watch ends.
func (w *watcher) run() {
	defer close(w.done)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
		case errors.Is(err, os.ErrClosed) || errors.Is(err, io.EOF):
			w.q.finish(nil)
			return
		case err != nil:
			w.q.finish(err)
			return
		case !w.parse(buf[:n]):
			w.q.finish(nil)
			return
		}
		// Moves still unpaired after moveWait went out of the tree; the
		// deadline wakes the reader for the ones still waiting.
		w.flushMoves(time.Now().UTC())
		w.forgetScanned(time.Now().UTC())
		if len(w.moves) > 0 {
			_ = w.f.SetReadDeadline(time.Now().Add(moveWait))
		} else {
			_ = w.f.SetReadDeadline(time.Time{})
		}
	}
}

// parse handles one read's events; false means the watch has ended.
func (w *watcher) parse(b []byte) bool {
	now := time.Now().UTC()
	for len(b) >= unix.SizeofInotifyEvent {
		raw := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
		end := unix.SizeofInotifyEvent + int(raw.Len)
		if end > len(b) {
			break
		}
		name := string(b[unix.SizeofInotifyEvent:end])
		if i := strings.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		wd, mask, cookie := raw.Wd, raw.Mask, raw.Cookie
		b = b[end:]
		if !w.event(wd, mask, cookie, name, now) {
			return false
		}
	}
	return true
}

// event handles one inotify event; false means the watch has ended.
func (w *watcher) event(wd int32, mask, cookie uint32, name string, now time.Time) bool {
	if mask&unix.IN_Q_OVERFLOW != 0 {
		w.q.push(agentproto.WatchEvent{Type: agentproto.WatchOverflow})
		return true
	}
	if len(w.moves) > 0 && mask&unix.IN_MOVED_TO == 0 {
		// The kernel queues a rename's two halves back to back: a move
		// still unpaired when another event comes left the tree. Reporting
		// it now keeps the events in order.
		w.flushMoves(time.Time{})
	}
	dir, ok := w.dirs[wd]
	if mask&unix.IN_IGNORED != 0 {
		delete(w.dirs, wd)
		return wd != w.rootWd
	}
	if !ok {
		return true // a watch removed meanwhile
	}
	if name == "" {
		// The directory itself. Its parent reports it (as an entry) unless
		// it is the root; a root removed or moved away ends the watch.
		if wd == w.rootWd && mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_UNMOUNT) != 0 {
			w.flushMoves(time.Time{})
			w.q.push(agentproto.WatchEvent{Type: agentproto.WatchRemove, Path: w.root, Dir: true, Time: now})
			return false
		}
		return true
	}
	p := path.Join(dir, name)
	isDir := mask&unix.IN_ISDIR != 0
	temp := strings.HasPrefix(name, uploadPrefix)
	if !utf8.ValidString(name) {
		if mask&unix.IN_MOVED_TO != 0 {
			// Renamed to a name no event can carry: for the client the
			// old name is gone.
			if from, paired := w.moves[cookie]; paired {
				delete(w.moves, cookie)
				delete(w.modified, from.path)
				if !from.temp {
					w.removed(from.path, from.dir, now)
				}
			}
		}
		w.unnamable()
		return true
	}
	switch {
	case mask&unix.IN_MOVED_FROM != 0:
		if len(w.moves) >= maxPendingMoves {
			w.flushMoves(time.Time{})
		}
		w.moves[cookie] = pendingMove{path: p, dir: isDir, temp: temp, over: strings.HasPrefix(name, overwritePrefix), since: now}
	case mask&unix.IN_MOVED_TO != 0:
		from, paired := w.moves[cookie]
		delete(w.moves, cookie)
		if _, ok := w.modified[from.path]; ok && paired {
			// The writer's close comes under the new name.
			delete(w.modified, from.path)
			w.modified[p] = struct{}{}
		}
		switch {
		case temp && paired && !from.temp:
			w.removed(from.path, from.dir, now)
		case temp:
		case paired && !from.temp:
			w.q.push(agentproto.WatchEvent{Type: agentproto.WatchRename, Path: p, From: from.path, Dir: isDir, Time: now})
			if isDir {
				w.retarget(from.path, p)
			}
		case paired && from.over && !isDir:
			// An upload over an existing file finished: its content
			// changed in one step.
			w.q.push(agentproto.WatchEvent{Type: agentproto.WatchWrite, Path: p, Time: now})
		case paired && from.temp && !isDir:
			// An upload that finished: a new file here, and its content
			// (envd's in-place write shows both: E2B's clients wait for
			// the write of a file they upload into a new directory).
			w.created(p, isDir, now)
			if w.nonEmpty(p) {
				w.q.push(agentproto.WatchEvent{Type: agentproto.WatchWrite, Path: p, Time: now})
			}
		default:
			// Moved in from outside: new here.
			w.created(p, isDir, now)
		}
	case mask&unix.IN_MODIFY != 0:
		w.markModified(p)
		if !temp {
			w.q.push(agentproto.WatchEvent{Type: agentproto.WatchWrite, Path: p, Time: now})
		}
	case mask&unix.IN_CLOSE_WRITE != 0:
		// Every IN_MODIFY already has its write event; a close after none
		// (writes through mmap) still changed the file, maybe.
		if _, ok := w.modified[p]; ok {
			delete(w.modified, p)
		} else if !temp {
			w.q.push(agentproto.WatchEvent{Type: agentproto.WatchWrite, Path: p, Time: now})
		}
	case mask&unix.IN_CREATE != 0 && !isDir:
		// The creator's close says nothing new: the create was reported.
		w.markModified(p)
		if _, dup := w.scanned[p]; dup {
			delete(w.scanned, p)
		} else if !temp {
			w.created(p, isDir, now)
		}
	case temp:
		if mask&unix.IN_DELETE != 0 {
			delete(w.modified, p)
		}
	case mask&unix.IN_CREATE != 0:
		if _, dup := w.scanned[p]; dup {
			delete(w.scanned, p)
			return true
		}
		w.created(p, isDir, now)
	case mask&unix.IN_DELETE != 0:
		w.removed(p, isDir, now)
	case mask&unix.IN_ATTRIB != 0:
		w.q.push(agentproto.WatchEvent{Type: agentproto.WatchChmod, Path: p, Dir: isDir, Time: now})
	}
	return true
}

// markModified notes that p's next IN_CLOSE_WRITE needs no event.
func (w *watcher) markModified(p string) {
	if len(w.modified) >= maxModified {
		clear(w.modified)
	}
	w.modified[p] = struct{}{}
}

// created reports p as new and, for a directory of a recursive watch,
// watches it and reports what it already holds. A new directory's watch is
// added before its create is reported, so that a client that saw the
// create sees everything done in the directory after it; what happened
// there before (between the kernel's event and the watch) only the scan of
// its entries can show.
func (w *watcher) created(p string, isDir bool, now time.Time) {
	if !isDir || !w.recursive {
		w.q.push(agentproto.WatchEvent{Type: agentproto.WatchCreate, Path: p, Dir: isDir, Time: now})
		return
	}
	_ = w.s.asUser(w.acct, func() error {
		_, err := w.addDir(p, false)
		w.q.push(agentproto.WatchEvent{Type: agentproto.WatchCreate, Path: p, Dir: isDir, Time: now})
		if err != nil {
			if err == errTooManyDirs {
				w.overCap()
			}
			return nil
		}
		return w.addTree(p, true, false)
	})
}

// nonEmpty reports whether p is a file with content (a symlink is not
// followed; a file gone already has none).
func (w *watcher) nonEmpty(p string) bool {
	fd, err := w.s.fs.open(p, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	return unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Size > 0
}

// removed reports p as gone and, for a directory, forgets the watches below
// it (a directory moved out of the tree still sends events).
func (w *watcher) removed(p string, isDir bool, now time.Time) {
	delete(w.modified, p)
	delete(w.scanned, p)
	w.q.push(agentproto.WatchEvent{Type: agentproto.WatchRemove, Path: p, Dir: isDir, Time: now})
	if !isDir {
		return
	}
	for wd, d := range w.dirs {
		if wd != w.rootWd && (d == p || strings.HasPrefix(d, p+"/")) {
			_, _ = unix.InotifyRmWatch(w.fd, uint32(wd))
			delete(w.dirs, wd)
		}
	}
}

// retarget renames the watched directories below from to below to.
func (w *watcher) retarget(from, to string) {
	for wd, d := range w.dirs {
		if d == from {
			w.dirs[wd] = to
		} else if rest, ok := strings.CutPrefix(d, from+"/"); ok {
			w.dirs[wd] = to + "/" + rest
		}
	}
}

// scanMemory is how long a scanned path waits for its duplicate IN_CREATE:
// that event is in the kernel's queue before the scan ends, so the reader
// meets it within its next reads.
const scanMemory = 2 * time.Second

// forgetScanned drops the scanned paths whose IN_CREATE never came (they
// were made before their directory's watch).
func (w *watcher) forgetScanned(now time.Time) {
	if len(w.scanned) == 0 || now.Sub(w.lastForget) < scanMemory/4 {
		return
	}
	w.lastForget = now
	for p, at := range w.scanned {
		if now.Sub(at) > scanMemory {
			delete(w.scanned, p)
		}
	}
}

// flushMoves reports the moves out of the tree whose partner did not come
// by now (zero: all of them) as removals.
func (w *watcher) flushMoves(now time.Time) {
	for c, m := range w.moves {
		if !now.IsZero() && now.Sub(m.since) < moveWait {
			continue
		}
		delete(w.moves, c)
		if !m.temp {
			w.removed(m.path, m.dir, time.Now().UTC())
		}
	}
}
