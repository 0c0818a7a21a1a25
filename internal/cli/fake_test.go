package cli

import (
	"archive/tar"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/airlockhq/airlock/api"
)

// fakeAPI plays the airlock HTTP API in memory for CLI tests: sandboxes,
// scripted execs over SSE, a flat file store with tar in and out, keys, a
// PTY. It checks the API key like the server (Bearer or X-API-Key).
type fakeAPI struct {
	t   *testing.T
	key string

	mu        sync.Mutex
	sandboxes map[string]*api.Sandbox
	files     map[string]*fakeFile // sandbox path → entry, for every sandbox
	evilTars  map[string][]byte    // path → tar served for it as a directory
	calls     []string             // "METHOD /path" of every request
	signals   []string
	created   []api.CreateSandboxRequest
	execs     []api.ExecRequest
	idem      []string
	// execStarted is closed when an exec stream has sent its start event
	// (tests that interrupt wait for it).
	execStarted chan struct{}
	startOnce   sync.Once
	// stdin carries what POST …/stdin wrote to the running exec; closed on eof.
	stdin      chan []byte
	stdinSizes []int
	// builds are templates being built, by name: a create of one answers
	// template_building until its build was followed to its end.
	builds map[string]*fakeBuild
	// keyRequests are the bodies of POST /v1/keys, keysDeleted the ids
	// DELETE /v1/keys/{id} named; with ignoreKeyFormat the fake acts as a
	// daemon that drops the format field (it issues a native key).
	keyRequests     []api.CreateKeyRequest
	keysDeleted     []string
	ignoreKeyFormat bool
}

// fakeBuild is a template build that ends as soon as a client follows it.
type fakeBuild struct {
	id, log string
	failed  bool
	done    bool
}

type fakeFile struct {
	data  []byte
	mode  string
	dir   bool
	link  string
	mtime time.Time
}

func newFakeAPI(t *testing.T) (*fakeAPI, *httptest.Server) {
	f := &fakeAPI{
		t: t, key: "ak_good",
		sandboxes:   map[string]*api.Sandbox{},
		files:       map[string]*fakeFile{"/home/user": {dir: true, mode: "0755"}},
		evilTars:    map[string][]byte{},
		execStarted: make(chan struct{}),
		stdin:       make(chan []byte, 64),
		builds:      map[string]*fakeBuild{},
	}
	srv := httptest.NewServer(f.routes())
	t.Cleanup(srv.Close)
	return f, srv
}

func (f *fakeAPI) addSandbox(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	exp := time.Now().Add(5 * time.Minute)
	f.sandboxes[id] = &api.Sandbox{ID: id, Tenant: "t1", Template: "base", TemplateVersion: 1, Runtime: "runc",
		State: api.StateRunning, CreatedAt: time.Now().Add(-time.Minute), ExpiresAt: &exp, Metadata: map[string]string{"user": "u-42"}}
}

func (f *fakeAPI) callList() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func fwriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func fwriteErr(w http.ResponseWriter, status int, code, msg, sbx string) {
	fwriteJSON(w, status, api.ErrorBody{Error: api.ErrorDetail{Code: code, Message: msg, RequestID: "req_t", SandboxID: sbx}})
}

func (f *fakeAPI) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, r *http.Request) {
		fwriteJSON(w, 200, api.Info{Version: "9.9.9"})
	})
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateSandboxRequest
		if !decodeStrict(w, r, &req) {
			return
		}
		f.mu.Lock()
		f.created = append(f.created, req)
		f.idem = append(f.idem, r.Header.Get("Idempotency-Key"))
		id := fmt.Sprintf("sbx_new%d", len(f.created))
		b := f.builds[req.Template]
		f.mu.Unlock()
		if b != nil && !b.done {
			// The real server waits with wait_for_template; this fake's
			// builds only end when followed, so it refuses either way.
			w.Header().Set("Retry-After", "60")
			fwriteJSON(w, 503, api.ErrorBody{Error: api.ErrorDetail{Code: api.CodeTemplateBuilding, BuildID: b.id,
				Message: "template " + req.Template + " is being built", RequestID: "req_t"}})
			return
		}
		if b != nil && b.failed {
			fwriteJSON(w, 424, api.ErrorBody{Error: api.ErrorDetail{Code: api.CodeTemplateBuildFailed, BuildID: b.id,
				Message: "template " + req.Template + " could not be built", RequestID: "req_t"}})
			return
		}
		f.addSandbox(id)
		f.mu.Lock()
		s := *f.sandboxes[id]
		if req.Template != "" {
			f.sandboxes[id].Template = req.Template
			s.Template = req.Template
		}
		f.mu.Unlock()
		fwriteJSON(w, 201, s)
	})
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		var ids []string
		for id, s := range f.sandboxes {
			if st := r.URL.Query().Get("state"); st != "" && s.State != st {
				continue
			}
			ids = append(ids, id)
		}
		sort.Strings(ids)
		// One per page, to exercise the cursor.
		start := 0
		if c := r.URL.Query().Get("cursor"); c != "" {
			start, _ = strconv.Atoi(c)
		}
		var l api.SandboxList
		if start < len(ids) {
			l.Sandboxes = []api.Sandbox{*f.sandboxes[ids[start]]}
			if start+1 < len(ids) {
				l.NextCursor = strconv.Itoa(start + 1)
			}
		}
		fwriteJSON(w, 200, l)
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}", f.withSandbox(func(w http.ResponseWriter, r *http.Request, s *api.Sandbox) {
		fwriteJSON(w, 200, s)
	}))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		delete(f.sandboxes, r.PathValue("id"))
		f.mu.Unlock()
		w.WriteHeader(204)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", f.withSandbox(func(w http.ResponseWriter, r *http.Request, s *api.Sandbox) {
		if s.State == api.StatePaused {
			fwriteErr(w, 409, api.CodeInvalidState, "sandbox is paused", s.ID)
			return
		}
		s.State = api.StatePaused
		fwriteJSON(w, 200, s)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/keepalive", f.withSandbox(func(w http.ResponseWriter, r *http.Request, s *api.Sandbox) {
		fwriteJSON(w, 200, s)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", f.withSandbox(f.exec))
	mux.HandleFunc("POST /v1/sandboxes/{id}/execs/{eid}/signal", f.withSandbox(func(w http.ResponseWriter, r *http.Request, s *api.Sandbox) {
		var req api.SignalRequest
		if !decodeStrict(w, r, &req) {
			return
		}
		f.mu.Lock()
		f.signals = append(f.signals, r.PathValue("eid")+":"+req.Signal)
		f.mu.Unlock()
		w.WriteHeader(204)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/execs/{eid}/stdin", f.withSandbox(func(w http.ResponseWriter, r *http.Request, s *api.Sandbox) {
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		if len(b) > 0 {
			f.stdinSizes = append(f.stdinSizes, len(b))
			f.stdin <- b
		}
		if r.URL.Query().Get("eof") == "true" {
			close(f.stdin)
		}
		f.mu.Unlock()
		fwriteJSON(w, 200, map[string]int{"written": len(b)})
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/fs/stat", f.withSandbox(func(w http.ResponseWriter, r *http.Request, s *api.Sandbox) {
		p := path.Clean(r.URL.Query().Get("path"))
		f.mu.Lock()
		e, ok := f.files[p]
		_, evil := f.evilTars[p]
		f.mu.Unlock()
		switch {
		case evil:
			fwriteJSON(w, 200, api.FileInfo{Name: path.Base(p), Path: p, Type: "dir", Mode: "0755"})
		case !ok:
			fwriteErr(w, 404, api.CodeNotFound, "no such file or directory", s.ID)
		case e.dir:
			fwriteJSON(w, 200, api.FileInfo{Name: path.Base(p), Path: p, Type: "dir", Mode: e.mode, ModifiedAt: e.mtime})
		default:
			fwriteJSON(w, 200, api.FileInfo{Name: path.Base(p), Path: p, Type: "file", Size: int64(len(e.data)), Mode: e.mode, ModifiedAt: e.mtime})
		}
	}))
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", f.withSandbox(f.putFiles))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", f.withSandbox(f.getFiles))
	mux.HandleFunc("POST /v1/keys", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateKeyRequest
		if !decodeStrict(w, r, &req) {
			return
		}
		f.mu.Lock()
		f.keyRequests = append(f.keyRequests, req)
		f.mu.Unlock()
		secret := "ak_newsecret"
		switch req.Format {
		case "", api.KeyFormatNative:
		case api.KeyFormatE2B:
			if !f.ignoreKeyFormat {
				secret = "e2b_0123456789abcdef0123456789abcdef01234567"
			}
		default:
			fwriteErr(w, 400, api.CodeInvalidArgument, "format must be native or e2b", "")
			return
		}
		fwriteJSON(w, 201, api.Key{ID: "key_2", Tenant: req.Tenant, Name: req.Name, Key: secret})
	})
	mux.HandleFunc("GET /v1/keys", func(w http.ResponseWriter, r *http.Request) {
		fwriteJSON(w, 200, api.KeyList{Keys: []api.Key{{ID: "key_1", Tenant: "t1", Name: "ci", Prefix: "ak_go", CreatedAt: time.Now()}}})
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/pty", f.withSandbox(f.pty))
	mux.HandleFunc("GET /v1/templates/builds/{bid}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		var b *fakeBuild
		var name string
		for n, fb := range f.builds {
			if fb.id == r.PathValue("bid") {
				b, name = fb, n
			}
		}
		f.mu.Unlock()
		if b == nil {
			fwriteErr(w, 404, api.CodeNotFound, "build not found", "")
			return
		}
		if r.Header.Get("Accept") != "text/event-stream" {
			st := api.BuildReady
			if b.failed {
				st = api.BuildFailed
			}
			fwriteJSON(w, 200, api.TemplateBuild{ID: b.id, Name: name, Version: 1, Status: st, Log: b.log})
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		sse(w, "log", api.TemplateLogEvent{Data: b.log, Offset: 0})
		f.mu.Lock()
		b.done = true
		f.mu.Unlock()
		end := api.TemplateBuild{ID: b.id, Name: name, Version: 1, Status: api.BuildReady}
		if b.failed {
			end.Status, end.Error = api.BuildFailed, "step 2/2 RUN exit 3: exit code 3"
		}
		sse(w, "end", end)
	})
	f.moreRoutes(mux)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.calls = append(f.calls, r.Method+" "+r.URL.Path)
		f.mu.Unlock()
		if r.URL.Path != "/healthz" {
			k := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
			if k == "" {
				k = r.Header.Get("X-API-Key")
			}
			if k != f.key {
				fwriteErr(w, 401, api.CodeUnauthenticated, "missing or unknown api key", "")
				return
			}
		}
		mux.ServeHTTP(w, r)
	})
}

func decodeStrict(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		fwriteErr(w, 400, api.CodeInvalidArgument, "malformed request body", "")
		return false
	}
	return true
}

func (f *fakeAPI) withSandbox(h func(http.ResponseWriter, *http.Request, *api.Sandbox)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		s, ok := f.sandboxes[r.PathValue("id")]
		f.mu.Unlock()
		if !ok {
			fwriteErr(w, 404, api.CodeSandboxNotFound, "sandbox not found", r.PathValue("id"))
			return
		}
		h(w, r, s)
	}
}

func sse(w http.ResponseWriter, event string, v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b)
	w.(http.Flusher).Flush()
}

// exec plays a command by its argv[0]:
//
//	echo ARGS…   prints ARGS, exits 0
//	exit N       prints "out" and "err", exits N
//	cat          prints its stdin (given up front, or streamed until eof)
//	hang         prints "started", then waits for the client to leave
//	timeout, killed, oom, nosuch   end with that status
//	notfound, noexec, nocwd, failed, agentlost, expired, term   likewise
//	binary       prints non-UTF-8 bytes on stdout, exits 0
func (f *fakeAPI) exec(w http.ResponseWriter, r *http.Request, s *api.Sandbox) {
	var req api.ExecRequest
	if !decodeStrict(w, r, &req) {
		return
	}
	if (len(req.Cmd) > 0) == (req.Shell != nil) {
		fwriteErr(w, 400, api.CodeInvalidArgument, "give exactly one of cmd and shell", s.ID)
		return
	}
	f.mu.Lock()
	f.execs = append(f.execs, req)
	f.mu.Unlock()
	if r.Header.Get("Accept") != "text/event-stream" {
		fwriteErr(w, 400, api.CodeInvalidArgument, "fake speaks sse only", s.ID)
		return
	}
	argv := req.Cmd
	if req.Shell != nil {
		argv = strings.Fields(*req.Shell)
	}
	w.Header().Set("Content-Type", "text/event-stream")
	sse(w, "start", api.ExecStarted{ID: "ex_1"})
	var off int64
	out := func(stream, data string) {
		ev := api.OutputEvent{Data: data, Offset: off}
		if !utf8.ValidString(data) {
			ev.Data, ev.Encoding = base64.StdEncoding.EncodeToString([]byte(data)), "base64"
		}
		sse(w, stream, ev)
		off += int64(len(data))
	}
	code := 0
	res := api.ExecResult{ID: "ex_1", Status: api.ExecExited, ExitCode: &code}
	switch argv[0] {
	case "echo":
		out("stdout", strings.Join(argv[1:], " ")+"\n")
	case "exit":
		code, _ = strconv.Atoi(argv[1])
		out("stdout", "out\n")
		out("stderr", "err\n")
	case "cat":
		if req.Stdin != nil {
			out("stdout", *req.Stdin)
			break
		}
		// Stdin left open: echo what …/stdin brings until eof.
		for b := range f.stdin {
			out("stdout", string(b))
		}
	case "hang":
		out("stdout", "started\n")
		f.startOnce.Do(func() { close(f.execStarted) })
		<-r.Context().Done()
		return
	case "timeout":
		res = api.ExecResult{ID: "ex_1", Status: api.ExecTimeout}
	case "killed":
		res = api.ExecResult{ID: "ex_1", Status: api.ExecKilled, Signal: "SIGKILL"}
	case "oom":
		res = api.ExecResult{ID: "ex_1", Status: api.ExecOOM, Signal: "SIGKILL"}
	case "nosuch":
		res = api.ExecResult{ID: "ex_1", Status: api.ExecError, Error: `exec: "nosuch": executable file not found`}
	case "notfound":
		res = api.ExecResult{ID: "ex_1", Status: api.ExecError, ErrorCode: "exec_failed", Error: `exec: "notfound": executable file not found in $PATH`}
	case "noexec":
		res = api.ExecResult{ID: "ex_1", Status: api.ExecError, ErrorCode: "exec_failed", Error: `fork/exec /home/user/noexec: permission denied`}
	case "nocwd":
		res = api.ExecResult{ID: "ex_1", Status: api.ExecError, ErrorCode: "exec_failed", Error: `chdir /nope: no such file or directory`}
	case "failed":
		res = api.ExecResult{ID: "ex_1", Status: api.ExecError, ErrorCode: "exec_failed"}
	case "badinterp":
		// The script was found; its #! interpreter was not: the server's
		// 126 wins over the "not found" in the reason.
		res = api.ExecResult{ID: "ex_1", Status: api.ExecError, ErrorCode: "exec_failed", ExitCode: ptrTo(126), Error: `/home/user/s.sh: interpreter /nope not found`}
	case "agentlost":
		res = api.ExecResult{ID: "ex_1", Status: api.ExecError, ErrorCode: api.ExecCodeAgentUnavailable, Error: "lost connection to the sandbox agent"}
	case "expired":
		res = api.ExecResult{ID: "ex_1", Status: api.ExecKilled, ErrorCode: api.ExecCodeSandboxStopped, Error: "sandbox stopped"}
	case "term":
		res = api.ExecResult{ID: "ex_1", Status: api.ExecKilled, ErrorCode: api.ExecCodeSignaled, Signal: "SIGTERM"}
	case "binary":
		out("stdout", "\xff\xfe")
		out("stderr", "warn\n")
	default:
		res.ExitCode = nil
		res.Status = api.ExecError
		res.Error = "unknown fake command"
	}
	sse(w, "exit", res)
}

func (f *fakeAPI) putFiles(w http.ResponseWriter, r *http.Request, s *api.Sandbox) {
	p := path.Clean(r.URL.Query().Get("path"))
	if !path.IsAbs(p) {
		fwriteErr(w, 400, api.CodeInvalidArgument, "path must be absolute", s.ID)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Header.Get("Content-Type") != "application/x-tar" {
		b, _ := io.ReadAll(r.Body)
		mode := r.URL.Query().Get("mode")
		if mode == "" {
			mode = "0644"
		}
		f.files[p] = &fakeFile{data: b, mode: mode}
		fwriteJSON(w, 201, api.FileWritten{Path: p, Size: int64(len(b))})
		return
	}
	f.files[p] = &fakeFile{dir: true, mode: "0755"}
	tr := tar.NewReader(r.Body)
	var total int64
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			fwriteErr(w, 400, api.CodeInvalidArgument, "bad tar", s.ID)
			return
		}
		name := path.Clean(h.Name)
		if path.IsAbs(name) || strings.HasPrefix(name, "..") {
			fwriteErr(w, 400, api.CodeInvalidArgument, "unsafe tar entry", s.ID)
			return
		}
		full := path.Join(p, name)
		switch h.Typeflag {
		case tar.TypeDir:
			f.files[full] = &fakeFile{dir: true, mode: fmt.Sprintf("%04o", h.Mode&0o7777), mtime: h.ModTime}
		case tar.TypeReg:
			b, _ := io.ReadAll(tr)
			total += int64(len(b))
			f.files[full] = &fakeFile{data: b, mode: fmt.Sprintf("%04o", h.Mode&0o7777), mtime: h.ModTime}
		case tar.TypeSymlink:
			f.files[full] = &fakeFile{link: h.Linkname}
		}
	}
	fwriteJSON(w, 201, api.FileWritten{Path: p, Size: total})
}

func (f *fakeAPI) getFiles(w http.ResponseWriter, r *http.Request, s *api.Sandbox) {
	p := path.Clean(r.URL.Query().Get("path"))
	f.mu.Lock()
	defer f.mu.Unlock()
	if evil, ok := f.evilTars[p]; ok {
		w.Header().Set("Content-Type", "application/x-tar")
		w.Write(evil)
		return
	}
	e, ok := f.files[p]
	if !ok {
		fwriteErr(w, 404, api.CodeNotFound, "no such file or directory", s.ID)
		return
	}
	if !e.dir {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(e.data)
		return
	}
	w.Header().Set("Content-Type", "application/x-tar")
	tw := tar.NewWriter(w)
	var names []string
	for name := range f.files {
		if strings.HasPrefix(name, p+"/") {
			names = append(names, name)
		}
	}
	sort.Strings(names) // parents before children
	for _, name := range names {
		e := f.files[name]
		rel := strings.TrimPrefix(name, p+"/")
		mode, _ := strconv.ParseInt(e.mode, 8, 64)
		switch {
		case e.dir:
			tw.WriteHeader(&tar.Header{Name: rel + "/", Typeflag: tar.TypeDir, Mode: mode, ModTime: e.mtime})
		case e.link != "":
			tw.WriteHeader(&tar.Header{Name: rel, Typeflag: tar.TypeSymlink, Linkname: e.link, Mode: 0o777})
		default:
			tw.WriteHeader(&tar.Header{Name: rel, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(e.data)), ModTime: e.mtime})
			tw.Write(e.data)
		}
	}
	tw.Close()
}

// pty echoes keystrokes upper-cased; "exit N\r" ends with exit code N.
func (f *fakeAPI) pty(w http.ResponseWriter, r *http.Request, s *api.Sandbox) {
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer conn.CloseNow()
	ctx := r.Context()
	var line bytes.Buffer
	for {
		typ, b, err := conn.Read(ctx)
		if err != nil {
			return
		}
		if typ == websocket.MessageText {
			continue
		}
		conn.Write(ctx, websocket.MessageBinary, bytes.ToUpper(b))
		line.Write(b)
		for {
			l, err := line.ReadString('\n')
			if err != nil {
				line.WriteString(l) // partial line: keep it
				break
			}
			if n, ok := strings.CutPrefix(strings.TrimSpace(l), "exit "); ok {
				code, _ := strconv.Atoi(n)
				ctl, _ := json.Marshal(map[string]any{"exit": api.ExecResult{ID: "ex_p", ExitCode: &code, Status: api.ExecExited}})
				conn.Write(ctx, websocket.MessageText, ctl)
				conn.Close(websocket.StatusNormalClosure, "")
				return
			}
		}
	}
}

// moreRoutes are the routes of the commands the other tests do not drive
// in detail (the -o json walk calls every command): each answers with a
// plausible body.
func (f *fakeAPI) moreRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", f.withSandbox(func(w http.ResponseWriter, r *http.Request, s *api.Sandbox) {
		s.State = api.StateRunning
		fwriteJSON(w, 200, s)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/timeout", f.withSandbox(func(w http.ResponseWriter, r *http.Request, s *api.Sandbox) {
		var req api.TimeoutRequest
		if !decodeStrict(w, r, &req) {
			return
		}
		exp := time.Now().Add(time.Duration(req.TimeoutS) * time.Second)
		s.ExpiresAt = &exp
		fwriteJSON(w, 200, s)
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/metrics", f.withSandbox(func(w http.ResponseWriter, r *http.Request, s *api.Sandbox) {
		if r.URL.Query().Get("since") != "" {
			fwriteJSON(w, 200, api.SandboxMetrics{})
			return
		}
		fwriteJSON(w, 200, api.Metrics{CPUSeconds: 1.5, MemoryBytes: 1 << 20, UptimeS: 60})
	}))
	mux.HandleFunc("PUT /v1/sandboxes/{id}/network", f.withSandbox(func(w http.ResponseWriter, r *http.Request, s *api.Sandbox) {
		var n api.Network
		if !decodeStrict(w, r, &n) {
			return
		}
		s.Network = n
		fwriteJSON(w, 200, s)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/previews", f.withSandbox(func(w http.ResponseWriter, r *http.Request, s *api.Sandbox) {
		var req api.PreviewRequest
		if !decodeStrict(w, r, &req) {
			return
		}
		fwriteJSON(w, 201, api.Preview{URL: fmt.Sprintf("http://%d-%s.preview.test/", req.Port, s.ID), Token: "tok", Port: req.Port, Public: req.Public})
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/previews", f.withSandbox(func(w http.ResponseWriter, r *http.Request, s *api.Sandbox) {
		fwriteJSON(w, 200, api.PreviewList{Previews: []api.Preview{{URL: "http://8080-" + s.ID + ".preview.test/", Port: 8080}}})
	}))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/previews/{port}", f.withSandbox(func(w http.ResponseWriter, r *http.Request, s *api.Sandbox) {
		w.WriteHeader(204)
	}))
	quotas := func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			w.WriteHeader(204)
			return
		}
		q := api.TenantQuotas{Tenant: r.PathValue("tenant"), Quota: api.Quota{Sandboxes: 10}, Default: api.Quota{Sandboxes: 10}}
		if r.Method == http.MethodPut {
			var o api.QuotaOverride
			if !decodeStrict(w, r, &o) {
				return
			}
			q.Override = &o
		}
		fwriteJSON(w, 200, q)
	}
	mux.HandleFunc("GET /v1/tenants/{tenant}/quotas", quotas)
	mux.HandleFunc("PUT /v1/tenants/{tenant}/quotas", quotas)
	mux.HandleFunc("DELETE /v1/tenants/{tenant}/quotas", quotas)
	tpl := api.Template{Name: "base", Version: 1, Status: api.TemplateReady, Versions: []int{1}}
	mux.HandleFunc("GET /v1/templates", func(w http.ResponseWriter, r *http.Request) {
		fwriteJSON(w, 200, api.TemplateList{Templates: []api.Template{tpl}})
	})
	mux.HandleFunc("GET /v1/templates/{name}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("name") != "base" {
			fwriteErr(w, 404, api.CodeTemplateNotFound, "template not found", "")
			return
		}
		fwriteJSON(w, 200, tpl)
	})
	mux.HandleFunc("DELETE /v1/templates/{name}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("name") != "base" {
			fwriteErr(w, 404, api.CodeTemplateNotFound, "template not found", "")
			return
		}
		w.WriteHeader(204)
	})
	mux.HandleFunc("POST /v1/templates", func(w http.ResponseWriter, r *http.Request) {
		var req api.TemplateBuildRequest
		if strings.HasPrefix(r.Header.Get("Content-Type"), "multipart/") {
			mr, err := r.MultipartReader()
			if err != nil {
				fwriteErr(w, 400, api.CodeInvalidArgument, "bad multipart", "")
				return
			}
			for {
				part, err := mr.NextPart()
				if err != nil {
					break
				}
				if part.FormName() == "spec" {
					json.NewDecoder(part).Decode(&req)
				}
				io.Copy(io.Discard, part)
			}
		} else if !decodeStrict(w, r, &req) {
			return
		}
		f.mu.Lock()
		id := fmt.Sprintf("bld_%d", len(f.builds)+1)
		f.builds[req.Name] = &fakeBuild{id: id, log: "step 1/1 FROM base\n"}
		f.mu.Unlock()
		fwriteJSON(w, 202, api.TemplateBuildStarted{BuildID: id, Name: req.Name, Version: 1})
	})
	mux.HandleFunc("DELETE /v1/keys/{kid}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.keysDeleted = append(f.keysDeleted, r.PathValue("kid"))
		f.mu.Unlock()
		if r.PathValue("kid") != "key_1" && r.PathValue("kid") != "key_2" {
			fwriteErr(w, 404, api.CodeNotFound, "key not found", "")
			return
		}
		w.WriteHeader(204)
	})
	mux.HandleFunc("GET /v1/audit", func(w http.ResponseWriter, r *http.Request) {
		fwriteJSON(w, 200, api.AuditList{Events: []api.AuditEvent{{ID: "ev_1", Type: api.AuditCreate, SandboxID: "sbx_1", Detail: json.RawMessage(`{"template":"base"}`)}}})
	})
	mux.HandleFunc("GET /v1/usage", func(w http.ResponseWriter, r *http.Request) {
		fwriteJSON(w, 200, api.UsageReport{GroupBy: "sandbox", Groups: []api.UsageGroup{}})
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/code", f.withSandbox(func(w http.ResponseWriter, r *http.Request, s *api.Sandbox) {
		var req api.CodeRequest
		if !decodeStrict(w, r, &req) {
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		enc.Encode(api.CodeEvent{Type: api.CodeEventStdout, Text: "hi\n"})
		enc.Encode(api.CodeEvent{Type: api.CodeEventResult, IsMainResult: true, Text: "2"})
		enc.Encode(api.CodeEvent{Type: api.CodeEventEnd, ExecutionCount: 1})
	}))
}
