package e2b

import (
	"context"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	pb "github.com/airlockhq/airlock/internal/e2b/envd/filesystempb"
	"github.com/airlockhq/airlock/internal/e2b/envd/filesystempb/filesystempbconnect"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// maxWatchers bounds the polled watchers (CreateWatcher) a daemon keeps, so
// that clients that never remove theirs cannot grow its memory.
const maxWatchers = 1024

// filesystemService implements envd's filesystem.Filesystem on the manager.
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
		ModifiedTime: timestamppb.New(fi.ModifiedAt)}
	perm, _ := strconv.ParseUint(fi.Mode, 8, 32)
	mode := fs.FileMode(perm)
	switch fi.Type {
	case "file":
		e.Type = pb.FileType_FILE_TYPE_FILE
	case "dir":
		e.Type, mode = pb.FileType_FILE_TYPE_DIRECTORY, mode|fs.ModeDir
	case "symlink":
		e.Type, mode = pb.FileType_FILE_TYPE_SYMLINK, mode|fs.ModeSymlink
		if fi.LinkTarget != "" {
			e.SymlinkTarget = &fi.LinkTarget
		}
	}
	e.Mode, e.Permissions = uint32(mode), mode.String()
	return e
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
	fi, err := s.h.m.StatFile(ctx, t.p, t.id, p, user)
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
	if _, err := s.h.m.StatFile(ctx, t.p, t.id, p, user); err == nil {
		return nil, s.h.connectError(ctx, errf(errdefs.ErrAlreadyExists, "%s already exists", p))
	}
	fi, err := s.h.m.Mkdir(ctx, t.p, t.id, p, user, true)
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
	fi, err := s.h.m.Move(ctx, t.p, t.id, from, to, user)
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
	fl, err := s.h.m.ListFiles(ctx, t.p, t.id, p, user, depth)
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
	// envd removes a missing path with NotFound; airlock's remove is
	// idempotent, so look first.
	if _, err := s.h.m.StatFile(ctx, t.p, t.id, p, user); err != nil {
		return nil, s.h.connectError(ctx, err)
	}
	err = s.h.m.RemoveFile(ctx, t.p, t.id, p, user, true)
	s.h.auditFile(ctx, t, api.FileAuditDetail{Op: "remove", Path: p, User: user, Recursive: true}, err)
	if err != nil {
		return nil, s.h.connectError(ctx, err)
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}

// snapshot is what a watch compares between polls: per relative path, the
// file's type, size, mode and modification time.
type snapshot map[string]string

// snap lists dir (recursively or one level) into a snapshot.
func (h *Handler) snap(ctx context.Context, t target, dir, user string, recursive bool) (snapshot, error) {
	depth := 1
	if recursive {
		depth = 32
	}
	fl, err := h.m.ListFiles(ctx, t.p, t.id, dir, user, depth)
	if err != nil {
		return nil, err
	}
	out := make(snapshot, len(fl.Entries))
	for _, fi := range fl.Entries {
		rel := strings.TrimPrefix(strings.TrimPrefix(fi.Path, dir), "/")
		if rel == "" || strings.HasPrefix(path.Base(rel), ".airlock-upload-") {
			// The agent's own temp files of an upload in progress.
			continue
		}
		out[rel] = fi.Type + "|" + strconv.FormatInt(fi.Size, 10) + "|" + fi.Mode + "|" + fi.ModifiedAt.Format(time.RFC3339Nano)
	}
	return out, nil
}

// diff returns the events that turn old into cur, in name order.
func diff(old, cur snapshot) []*pb.FilesystemEvent {
	var evs []*pb.FilesystemEvent
	for name, v := range cur {
		o, ok := old[name]
		switch {
		case !ok:
			evs = append(evs, &pb.FilesystemEvent{Name: name, Type: pb.EventType_EVENT_TYPE_CREATE})
		case o != v:
			typ := pb.EventType_EVENT_TYPE_WRITE
			if modeOf(o) != modeOf(v) && sizeTimeOf(o) == sizeTimeOf(v) {
				typ = pb.EventType_EVENT_TYPE_CHMOD
			}
			evs = append(evs, &pb.FilesystemEvent{Name: name, Type: typ})
		}
	}
	for name := range old {
		if _, ok := cur[name]; !ok {
			evs = append(evs, &pb.FilesystemEvent{Name: name, Type: pb.EventType_EVENT_TYPE_REMOVE})
		}
	}
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].Name != evs[j].Name {
			return evs[i].Name < evs[j].Name
		}
		return evs[i].Type < evs[j].Type
	})
	return evs
}

func modeOf(v string) string { return strings.Split(v, "|")[2] }
func sizeTimeOf(v string) string {
	f := strings.Split(v, "|")
	return f[1] + "|" + f[3]
}

// WatchDir polls the directory and streams what changed. airlock's agent
// has no inotify: polling sees every create, write and remove that lasts
// longer than the interval, and reports a rename as remove + create.
func (s *filesystemService) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], stream *connect.ServerStream[pb.WatchDirResponse]) error {
	h, t := s.h, targetFrom(ctx)
	dir, user, err := pathArg(req, req.Msg.GetPath())
	if err != nil {
		return h.connectError(ctx, err)
	}
	if fi, err := h.m.StatFile(ctx, t.p, t.id, dir, user); err != nil {
		return h.connectError(ctx, err)
	} else if fi.Type != "dir" {
		return h.connectError(ctx, errf(errdefs.ErrInvalidArgument, "%s is not a directory", dir))
	}
	cur, err := h.snap(ctx, t, dir, user, req.Msg.GetRecursive())
	if err != nil {
		return h.connectError(ctx, err)
	}
	if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	tick := time.NewTicker(h.cfg.WatchInterval)
	defer tick.Stop()
	quiet := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		next, err := h.snap(ctx, t, dir, user, req.Msg.GetRecursive())
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return h.connectError(ctx, err)
		}
		evs := diff(cur, next)
		cur = next
		for _, ev := range evs {
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
				return err
			}
		}
		if len(evs) > 0 {
			quiet = time.Now()
		} else if time.Since(quiet) >= h.cfg.Keepalive {
			quiet = time.Now()
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		}
	}
}

// watcher is a polled watch (CreateWatcher / GetWatcherEvents).
type watcher struct {
	sandbox   string
	dir, user string
	recursive bool

	mu   sync.Mutex
	last snapshot
}

func (s *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	h, t := s.h, targetFrom(ctx)
	dir, user, err := pathArg(req, req.Msg.GetPath())
	if err != nil {
		return nil, h.connectError(ctx, err)
	}
	cur, err := h.snap(ctx, t, dir, user, req.Msg.GetRecursive())
	if err != nil {
		return nil, h.connectError(ctx, err)
	}
	w := &watcher{sandbox: t.id, dir: dir, user: user, recursive: req.Msg.GetRecursive(), last: cur}
	id := auth.RandomID("w_", 10)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watchers == nil {
		s.watchers = map[string]*watcher{}
	}
	if len(s.watchers) >= maxWatchers {
		// Watchers of sandboxes that are gone are never removed by their
		// clients: drop those first.
		for wid, old := range s.watchers {
			if sb, err := h.m.Get(ctx, auth.Principal{Admin: true}, old.sandbox); err != nil || sb.State != api.StateRunning && sb.State != api.StatePaused {
				delete(s.watchers, wid)
			}
		}
	}
	if len(s.watchers) >= maxWatchers {
		return nil, h.connectError(ctx, errf(errdefs.ErrRateLimited, "too many watchers; remove some"))
	}
	s.watchers[id] = w
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: id}), nil
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

func (s *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	w, err := s.watcher(ctx, req.Msg.GetWatcherId())
	if err != nil {
		return nil, s.h.connectError(ctx, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	cur, err := s.h.snap(ctx, targetFrom(ctx), w.dir, w.user, w.recursive)
	if err != nil {
		return nil, s.h.connectError(ctx, err)
	}
	evs := diff(w.last, cur)
	w.last = cur
	return connect.NewResponse(&pb.GetWatcherEventsResponse{Events: evs}), nil
}

func (s *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	if _, err := s.watcher(ctx, req.Msg.GetWatcherId()); err != nil {
		return nil, s.h.connectError(ctx, err)
	}
	s.mu.Lock()
	delete(s.watchers, req.Msg.GetWatcherId())
	s.mu.Unlock()
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}

// auditFile records a file change made through the sandbox plane.
func (h *Handler) auditFile(ctx context.Context, t target, d api.FileAuditDetail, err error) {
	d.OK = err == nil
	if err != nil {
		c, _ := classify(err)
		d.Code = strconv.Itoa(c.status)
	}
	h.m.AuditFileOp(ctx, t.p, t.id, d)
}
