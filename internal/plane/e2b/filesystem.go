package e2b

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	pb "github.com/airlockhq/airlock/internal/plane/e2b/envd/filesystempb"
	"github.com/airlockhq/airlock/internal/plane/e2b/envd/filesystempb/filesystempbconnect"
	"github.com/airlockhq/airlock/internal/service/files"
)

// maxWatchers bounds the polled watchers (CreateWatcher) a daemon keeps, so
// that clients that never remove theirs cannot grow its memory (each holds
// an inotify watch in its sandbox, which the agent bounds too).
const maxWatchers = 1024

// filesystemService implements envd's filesystem.Filesystem on the file service.
type filesystemService struct {
	filesystempbconnect.UnimplementedFilesystemHandler
	h *Handler

	mu       sync.Mutex
	watchers map[string]*watcher
}

var _ filesystempbconnect.FilesystemHandler = (*filesystemService)(nil)

// entryOf turns airlock's file info into envd's.
func entryOf(fi api.FileInfo) *pb.EntryInfo {
	e := &pb.EntryInfo{Name: fi.Name, Path: fi.Path, Size: fi.Size, Owner: userName(fi.Owner), Group: userName(fi.Group),
		ModifiedTime: timestamppb.New(fi.ModifiedAt), Metadata: fi.Metadata}
	perm, _ := strconv.ParseUint(fi.Mode, 8, 32)
	mode := fs.FileMode(perm)
	switch fi.Type {
	case "file":
		e.Type = pb.FileType_FILE_TYPE_FILE
	case "dir":
		e.Type, mode = pb.FileType_FILE_TYPE_DIRECTORY, mode|fs.ModeDir
	case "symlink":
		e.Type, mode = pb.FileType_FILE_TYPE_SYMLINK, mode|fs.ModeSymlink
		if t := linkTarget(fi.Path, fi.LinkTarget); t != "" {
			e.SymlinkTarget = &t
		}
	}
	// mode is the permission bits alone, as envd's (a directory is 0o755,
	// not Go's ModeDir|0o755); permissions spells the type too.
	e.Mode, e.Permissions = uint32(perm), mode.String()
	return e
}

// linkTarget is the path a symlink at p points to, as envd reports it:
// absolute, a relative target taken from the link's directory (the link's
// text is the sandbox's, and only named here, never followed).
func linkTarget(p, target string) string {
	if target == "" {
		return ""
	}
	if !path.IsAbs(target) {
		target = path.Join(path.Dir(p), target)
	}
	return path.Clean(target)
}

// userName names the sandbox's well-known uids as envd does.
func userName(uid uint32) string {
	switch uid {
	case 0:
		return "root"
	case 1000:
		return "user"
	}
	return strconv.FormatUint(uint64(uid), 10)
}

// pathArg resolves an RPC's path for its user.
func pathArg(req connect.AnyRequest, p string) (string, string, error) {
	user := userOf(req.Header())
	r, err := resolvePath(p, user)
	return r, user, err
}

func (s *filesystemService) Stat(ctx context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	t := targetFrom(ctx)
	p, user, err := pathArg(req, req.Msg.GetPath())
	if err != nil {
		return nil, s.h.connectError(ctx, err)
	}
	fi, err := s.h.files.StatFile(ctx, t.p, t.id, p, user)
	if err != nil {
		return nil, s.h.connectError(ctx, err)
	}
	return connect.NewResponse(&pb.StatResponse{Entry: entryOf(fi)}), nil
}

func (s *filesystemService) MakeDir(ctx context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	t := targetFrom(ctx)
	p, user, err := pathArg(req, req.Msg.GetPath())
	if err != nil {
		return nil, s.h.connectError(ctx, err)
	}
	// envd answers AlreadyExists for an existing path (the SDK's makeDir
	// then returns false); airlock's mkdir -p would succeed silently.
	if _, err := s.h.files.StatFile(ctx, t.p, t.id, p, user); err == nil {
		return nil, s.h.connectError(ctx, errf(errdefs.ErrAlreadyExists, "%s already exists", p))
	}
	fi, err := s.h.files.Mkdir(ctx, t.p, t.id, p, user, true)
	s.h.auditFile(ctx, t, api.FileAuditDetail{Op: "mkdir", Path: p, User: user}, err)
	if err != nil {
		return nil, s.h.connectError(ctx, err)
	}
	return connect.NewResponse(&pb.MakeDirResponse{Entry: entryOf(fi)}), nil
}

func (s *filesystemService) Move(ctx context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	t := targetFrom(ctx)
	from, user, err := pathArg(req, req.Msg.GetSource())
	if err != nil {
		return nil, s.h.connectError(ctx, err)
	}
	to, _, err := pathArg(req, req.Msg.GetDestination())
	if err != nil {
		return nil, s.h.connectError(ctx, err)
	}
	fi, err := s.h.files.Move(ctx, t.p, t.id, from, to, user)
	s.h.auditFile(ctx, t, api.FileAuditDetail{Op: "move", Path: from, To: to, User: user}, err)
	if err != nil {
		return nil, s.h.connectError(ctx, err)
	}
	return connect.NewResponse(&pb.MoveResponse{Entry: entryOf(fi)}), nil
}

func (s *filesystemService) ListDir(ctx context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	t := targetFrom(ctx)
	p, user, err := pathArg(req, req.Msg.GetPath())
	if err != nil {
		return nil, s.h.connectError(ctx, err)
	}
	depth := int(min(req.Msg.GetDepth(), 32))
	if depth == 0 {
		depth = 1
	}
	fl, err := s.h.files.ListFiles(ctx, t.p, t.id, p, user, depth)
	if err != nil {
		return nil, s.h.connectError(ctx, err)
	}
	out := &pb.ListDirResponse{Entries: make([]*pb.EntryInfo, 0, len(fl.Entries))}
	for _, fi := range fl.Entries {
		out.Entries = append(out.Entries, entryOf(fi))
	}
	return connect.NewResponse(out), nil
}

func (s *filesystemService) Remove(ctx context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	t := targetFrom(ctx)
	p, user, err := pathArg(req, req.Msg.GetPath())
	if err != nil {
		return nil, s.h.connectError(ctx, err)
	}
	// A missing path is removed already: envd answers it with success
	// (E2B's suite, "remove non-existing file"); a missing sandbox stays
	// an error.
	err = s.h.files.RemoveFile(ctx, t.p, t.id, p, user, true)
	if errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrSandboxNotFound) {
		return connect.NewResponse(&pb.RemoveResponse{}), nil
	}
	s.h.auditFile(ctx, t, api.FileAuditDetail{Op: "remove", Path: p, User: user, Recursive: true}, err)
	if err != nil {
		return nil, s.h.connectError(ctx, err)
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}

// maxWatcherEvents bounds the events a polled watcher (CreateWatcher) keeps
// between two GetWatcherEvents, so that a client that stops polling cannot
// grow the daemon's memory. Past it the watcher fails, as envd's does when
// its kernel queue overflows.
const maxWatcherEvents = 4096

// errEventsLost ends a watch that missed events: it could not keep up, or
// a name changed that is not valid UTF-8, which no event can carry (a
// listing then names it). The client must list the directory again.
func errEventsLost() error {
	return errf(errdefs.ErrTooLarge, "file system events were lost (too many of them, or a name that is not valid UTF-8); list the directory again")
}

// envdEvents turns the agent's events into envd's, named relative to the
// watched directory dir. A rename becomes what envd (fsnotify) reports: a
// RENAME of the old name, then a CREATE of the new one. lost is set when
// the agent reported lost events.
func envdEvents(dir string, evs []files.WatchEvent) (out []*pb.FilesystemEvent, lost bool) {
	name := func(p string) string {
		if p == dir {
			return "."
		}
		if dir == "/" {
			return strings.TrimPrefix(p, "/")
		}
		return strings.TrimPrefix(p, dir+"/")
	}
	add := func(p string, t pb.EventType) {
		out = append(out, &pb.FilesystemEvent{Name: name(p), Type: t})
	}
	for _, ev := range evs {
		switch ev.Type {
		case files.WatchCreate:
			add(ev.Path, pb.EventType_EVENT_TYPE_CREATE)
		case files.WatchWrite:
			add(ev.Path, pb.EventType_EVENT_TYPE_WRITE)
		case files.WatchRemove:
			add(ev.Path, pb.EventType_EVENT_TYPE_REMOVE)
		case files.WatchChmod:
			add(ev.Path, pb.EventType_EVENT_TYPE_CHMOD)
		case files.WatchRename:
			add(ev.From, pb.EventType_EVENT_TYPE_RENAME)
			add(ev.Path, pb.EventType_EVENT_TYPE_CREATE)
		case files.WatchOverflow:
			lost = true
		}
	}
	return out, lost
}

// watchBatch is one Next of a sandbox's watch.
type watchBatch struct {
	evs []files.WatchEvent
	err error
}

// follow reads w in a goroutine until it fails or ctx ends; the channel is
// closed after the failing batch.
func follow(ctx context.Context, w *files.Watch) <-chan watchBatch {
	ch := make(chan watchBatch)
	go func() {
		defer close(ch)
		for {
			evs, err := w.Next()
			select {
			case ch <- watchBatch{evs, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}

// WatchDir streams what changes in a directory, from an inotify watch in
// the sandbox's agent.
func (s *filesystemService) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], stream *connect.ServerStream[pb.WatchDirResponse]) error {
	h, t := s.h, targetFrom(ctx)
	dir, user, err := pathArg(req, req.Msg.GetPath())
	if err != nil {
		return h.connectError(ctx, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := h.files.WatchDir(ctx, t.p, t.id, dir, user, req.Msg.GetRecursive())
	if err != nil {
		return h.connectError(ctx, err)
	}
	defer w.Close()
	if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	batches := follow(ctx, w)
	keepalive := time.NewTicker(h.cfg.Keepalive)
	defer keepalive.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-keepalive.C:
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case b := <-batches:
			if b.err != nil {
				if errors.Is(b.err, io.EOF) || ctx.Err() != nil {
					return nil // the directory is gone, or the client
				}
				return h.connectError(ctx, b.err)
			}
			evs, lost := envdEvents(dir, b.evs)
			if req.Msg.GetIncludeEntry() {
				s.addEntries(ctx, t, dir, user, evs)
			}
			for _, ev := range evs {
				if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
					return err
				}
			}
			if lost {
				return h.connectError(ctx, errEventsLost())
			}
			keepalive.Reset(h.cfg.Keepalive)
		}
	}
}

// maxEntriesPerBatch bounds the stats one batch of watch events costs
// with include_entry: past it, events go without their entry.
const maxEntriesPerBatch = 64

// addEntries gives each event of a file that is there (created, written,
// its mode changed) the file's entry, as envd 0.6.3 does for a watch with
// include_entry: one stat each, as the watch's user. A file gone by then
// has none.
func (s *filesystemService) addEntries(ctx context.Context, t target, dir, user string, evs []*pb.FilesystemEvent) {
	n := 0
	for _, ev := range evs {
		switch ev.GetType() {
		case pb.EventType_EVENT_TYPE_CREATE, pb.EventType_EVENT_TYPE_WRITE, pb.EventType_EVENT_TYPE_CHMOD:
		default:
			continue
		}
		if n++; n > maxEntriesPerBatch {
			return
		}
		if fi, err := s.h.files.StatFile(ctx, t.p, t.id, path.Join(dir, ev.GetName()), user); err == nil {
			ev.Entry = entryOf(fi)
		}
	}
}

// watcher is a polled watch (CreateWatcher / GetWatcherEvents): an agent
// watch whose events wait here for the client's next poll.
type watcher struct {
	sandbox string
	stop    func() // ends the watch and waits for its goroutine

	mu     sync.Mutex
	events []*pb.FilesystemEvent
	err    error // once set, the watch has ended
	ended  bool
}

// collect gathers w's events until the watch ends.
func (wt *watcher) collect(ctx context.Context, dir string, w *files.Watch) {
	for b := range follow(ctx, w) {
		wt.mu.Lock()
		if b.err != nil {
			wt.ended = true
			if !errors.Is(b.err, io.EOF) && ctx.Err() == nil {
				wt.err = b.err
			}
			wt.mu.Unlock()
			return
		}
		evs, lost := envdEvents(dir, b.evs)
		wt.events = append(wt.events, evs...)
		if lost || len(wt.events) > maxWatcherEvents {
			wt.events, wt.err, wt.ended = nil, errEventsLost(), true
			wt.mu.Unlock()
			return
		}
		wt.mu.Unlock()
	}
}

func (s *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	h, t := s.h, targetFrom(ctx)
	dir, user, err := pathArg(req, req.Msg.GetPath())
	if err != nil {
		return nil, h.connectError(ctx, err)
	}
	if err := s.makeRoom(ctx); err != nil {
		return nil, h.connectError(ctx, err)
	}
	// The watch outlives this request: it ends at RemoveWatcher, or when
	// the sandbox does.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w, err := h.files.WatchDir(wctx, t.p, t.id, dir, user, req.Msg.GetRecursive())
	if err != nil {
		cancel()
		return nil, h.connectError(ctx, err)
	}
	done := make(chan struct{})
	wt := &watcher{sandbox: t.id, stop: func() {
		w.Close()
		cancel()
		<-done
	}}
	go func() {
		defer close(done)
		wt.collect(wctx, dir, w)
	}()
	id := auth.RandomID("w_", 10)
	s.mu.Lock()
	if s.watchers == nil {
		s.watchers = map[string]*watcher{}
	}
	s.watchers[id] = wt
	s.mu.Unlock()
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: id}), nil
}

// makeRoom checks that one more polled watcher fits, dropping the ones
// whose watch has ended (their sandbox is gone) when there are too many:
// clients of a deleted sandbox never remove theirs.
func (s *filesystemService) makeRoom(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.watchers) < maxWatchers {
		return nil
	}
	for id, wt := range s.watchers {
		wt.mu.Lock()
		ended := wt.ended
		wt.mu.Unlock()
		if ended {
			delete(s.watchers, id)
			go wt.stop()
		}
	}
	if len(s.watchers) >= maxWatchers {
		return errf(errdefs.ErrRateLimited, "too many watchers; remove some")
	}
	return nil
}

// watcher returns the watcher id of the request's sandbox.
func (s *filesystemService) watcher(ctx context.Context, id string) (*watcher, error) {
	t := targetFrom(ctx)
	s.mu.Lock()
	w := s.watchers[id]
	s.mu.Unlock()
	if w == nil || w.sandbox != t.id {
		return nil, errf(errdefs.ErrNotFound, "watcher %q not found", id)
	}
	return w, nil
}

// GetWatcherEvents returns the events since the last call. A watcher that
// failed returns its events first, then its error on every later call.
func (s *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	w, err := s.watcher(ctx, req.Msg.GetWatcherId())
	if err != nil {
		return nil, s.h.connectError(ctx, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	evs := w.events
	w.events = nil
	if len(evs) == 0 && w.err != nil {
		return nil, s.h.connectError(ctx, w.err)
	}
	return connect.NewResponse(&pb.GetWatcherEventsResponse{Events: evs}), nil
}

func (s *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	w, err := s.watcher(ctx, req.Msg.GetWatcherId())
	if err != nil {
		return nil, s.h.connectError(ctx, err)
	}
	s.mu.Lock()
	delete(s.watchers, req.Msg.GetWatcherId())
	s.mu.Unlock()
	w.stop()
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}

// auditFile records a file change made through the sandbox plane.
func (h *Handler) auditFile(ctx context.Context, t target, d api.FileAuditDetail, err error) {
	d.OK = err == nil
	if err != nil {
		d.Code = strconv.Itoa(classify(err).E2BStatus)
	}
	h.files.AuditFileOp(ctx, t.p, t.id, d)
}
