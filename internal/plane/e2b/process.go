package e2b

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	pb "github.com/airlockhq/airlock/internal/plane/e2b/envd/processpb"
	"github.com/airlockhq/airlock/internal/plane/e2b/envd/processpb/processpbconnect"
	"github.com/airlockhq/airlock/internal/service/exec"
)

// firstPID is the first pid handed out in a sandbox. E2B pids are envd's
// host-side process ids; ours name airlock execs and only have to be
// unique per sandbox and stable while the exec lives.
const firstPID = 1000

// procTable maps one sandbox's pids to its execs.
type procTable struct {
	mu     sync.Mutex
	next   uint32
	byPID  map[uint32]*proc
	byExec map[string]*proc
}

// maxProcs bounds a table: past it, ended processes are forgotten (their
// pids are never reused, so a late call gets not-found).
const maxProcs = 4096

// maxTables bounds the tables kept: past it, the tables of sandboxes that
// are no longer running are dropped (a sandbox killed through the E2B API
// drops its own at once; this catches expired and deleted ones).
const maxTables = 4096

// proc is one exec as the process service knows it.
type proc struct {
	tab  *procTable
	pid  uint32
	eid  string
	tag  string
	cfg  *pb.ProcessConfig
	ends bool // the exec ended (its entry stays so that late calls find it); guarded by tab.mu
}

// ended marks p's exec as ended.
func (p *proc) ended() {
	p.tab.mu.Lock()
	p.ends = true
	p.tab.mu.Unlock()
}

func (h *Handler) table(id string) *procTable {
	h.procsMu.Lock()
	defer h.procsMu.Unlock()
	t := h.procs[id]
	if t == nil {
		if len(h.procs) >= maxTables {
			h.pruneTablesLocked()
		}
		t = &procTable{next: firstPID, byPID: map[uint32]*proc{}, byExec: map[string]*proc{}}
		h.procs[id] = t
	}
	return t
}

// pruneTablesLocked drops the tables of sandboxes that are not live.
func (h *Handler) pruneTablesLocked() {
	for id := range h.procs {
		if sb, err := h.sandboxes.Get(context.Background(), auth.Principal{Admin: true}, id); err != nil || sb.State == api.StateStopped || sb.State == api.StateError {
			delete(h.procs, id)
		}
	}
}

// forgetProcs drops sandbox id's table (it was killed).
func (h *Handler) forgetProcs(id string) {
	h.procsMu.Lock()
	delete(h.procs, id)
	h.procsMu.Unlock()
}

// add records exec eid and returns its pid (the existing one if known).
func (t *procTable) add(eid, tag string, cfg *pb.ProcessConfig) *proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.byExec[eid]; p != nil {
		return p
	}
	if len(t.byPID) >= maxProcs {
		for pid, old := range t.byPID {
			if old.ends {
				delete(t.byPID, pid)
				delete(t.byExec, old.eid)
			}
		}
	}
	p := &proc{tab: t, pid: t.next, eid: eid, tag: tag, cfg: cfg}
	t.next++
	t.byPID[p.pid], t.byExec[eid] = p, p
	return p
}

// find returns the process a selector names.
func (t *procTable) find(sel *pb.ProcessSelector) (*proc, error) {
	if sel == nil {
		return nil, errf(errdefs.ErrInvalidArgument, "process selector is required")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s := sel.Selector.(type) {
	case *pb.ProcessSelector_Pid:
		if p := t.byPID[s.Pid]; p != nil {
			return p, nil
		}
		return nil, errf(errdefs.ErrNotFound, "process with pid %d not found", s.Pid)
	case *pb.ProcessSelector_Tag:
		for _, p := range t.byPID {
			if p.tag == s.Tag && !p.ends {
				return p, nil
			}
		}
		return nil, errf(errdefs.ErrNotFound, "process with tag %q not found", s.Tag)
	}
	return nil, errf(errdefs.ErrInvalidArgument, "process selector is required")
}

// processService implements envd's process.Process on the exec service.
type processService struct {
	processpbconnect.UnimplementedProcessHandler
	h *Handler
}

var _ processpbconnect.ProcessHandler = (*processService)(nil)

func (s *processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	h, t := s.h, targetFrom(ctx)
	cfg := req.Msg.GetProcess()
	if cfg == nil || cfg.GetCmd() == "" {
		return h.connectError(ctx, errf(errdefs.ErrInvalidArgument, "process.cmd is required"))
	}
	user := userOf(req.Header())
	ereq := api.ExecRequest{Cmd: append([]string{cfg.GetCmd()}, cfg.GetArgs()...), Env: cfg.GetEnvs(), User: user}
	if !namesUser(req.Header()) {
		// No user named: the template's USER, as envd's default user.
		ereq.User = ""
	}
	if cfg.Cwd != nil && cfg.GetCwd() != "" {
		cwd, err := resolvePath(cfg.GetCwd(), user)
		if err != nil {
			return h.connectError(ctx, err)
		}
		ereq.Cwd = cwd
	}
	// The SDK's timeoutMs arrives as the stream's deadline: the command is
	// killed then, whether or not the client is still there (E2B's
	// semantics, and airlock enforces exec timeouts server-side anyway).
	if dl, ok := ctx.Deadline(); ok {
		secs := min(time.Until(dl).Seconds(), h.cfg.MaxExecTimeout.Seconds())
		ereq.TimeoutS = &secs
	}
	opts := exec.Options{StdinOpen: req.Msg.GetStdin()}
	if pty := req.Msg.GetPty(); pty != nil {
		ereq.PTY = true
		opts.StdinOpen = true
		if sz := pty.GetSize(); sz != nil && sz.GetCols() > 0 && sz.GetRows() > 0 {
			opts.PTYSize = &exec.PTYSize{Cols: uint16(min(sz.GetCols(), 1<<15)), Rows: uint16(min(sz.GetRows(), 1<<15))}
		}
	}
	ex, err := h.execs.Exec(ctx, t.p, t.id, ereq, opts)
	if err != nil {
		return h.connectError(ctx, err)
	}
	p := h.table(t.id).add(ex.ID(), req.Msg.GetTag(), cfg)
	start := &pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: p.pid}}}
	if err := stream.Send(&pb.StartResponse{Event: start}); err != nil {
		return err
	}
	return h.connectError(ctx, h.follow(ctx, p, ex.Subscribe(0), func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.StartResponse{Event: ev})
	}))
}

func (s *processService) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	h, t := s.h, targetFrom(ctx)
	p, err := h.table(t.id).find(req.Msg.GetProcess())
	if err != nil {
		return h.connectError(ctx, err)
	}
	// From the start: a client that connects late still sees all of the
	// output (airlock keeps it), not only what comes after.
	sub, err := h.execs.Events(ctx, t.p, t.id, p.eid, 0)
	if err != nil {
		return h.connectError(ctx, err)
	}
	start := &pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: p.pid}}}
	if err := stream.Send(&pb.ConnectResponse{Event: start}); err != nil {
		return err
	}
	return h.connectError(ctx, h.follow(ctx, p, sub, func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.ConnectResponse{Event: ev})
	}))
}

// follow sends an exec's output and end as process events, with keep-alives
// while it is quiet.
func (h *Handler) follow(ctx context.Context, p *proc, sub *exec.Subscription, send func(*pb.ProcessEvent) error) error {
	for {
		ev, ok, err := sub.Next(ctx, h.cfg.Keepalive)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if !ok {
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
			continue
		}
		switch ev.Type {
		case exec.EventOutput:
			d := &pb.ProcessEvent_DataEvent{}
			switch ev.Stream {
			case exec.StreamStderr:
				d.Output = &pb.ProcessEvent_DataEvent_Stderr{Stderr: ev.Data}
			case exec.StreamPTY:
				d.Output = &pb.ProcessEvent_DataEvent_Pty{Pty: ev.Data}
			default:
				d.Output = &pb.ProcessEvent_DataEvent_Stdout{Stdout: ev.Data}
			}
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: d}}); err != nil {
				return err
			}
		case exec.EventExit:
			p.ended()
			if r := ev.Result; r != nil && (r.ErrorCode == api.ExecCodeSandboxStopped || r.ErrorCode == api.ExecCodeSandboxCrashed) {
				// The sandbox ended under the command: envd's stream
				// breaks with its machine, so the connection is dropped
				// as it would be, and the SDKs, finding the sandbox's
				// health gone (502), report it killed (TimeoutError), not
				// an exit of the command.
				panic(http.ErrAbortHandler)
			}
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: endEvent(ev.Result)}}); err != nil {
				return err
			}
			return nil
		}
	}
}

// namesUser reports whether a request names its user (Basic auth, as the
// SDKs send it); userOf gives the default user otherwise.
func namesUser(hdr http.Header) bool {
	scheme, _, ok := strings.Cut(hdr.Get("Authorization"), " ")
	return ok && strings.EqualFold(scheme, "Basic")
}

// endEvent describes an exec's end the way envd does: a process that exited
// has its code and "exit status N"; one that was killed has exit code -1
// and "signal: …"; one that could not start has its error, and the code a
// shell would give (127 not found, 126 not runnable) when there is one.
func endEvent(res *api.ExecResult) *pb.ProcessEvent_EndEvent {
	e := &pb.ProcessEvent_EndEvent{ExitCode: -1}
	if res == nil {
		e.Status = "unknown"
		return e
	}
	switch {
	case res.Status == api.ExecExited && res.ExitCode != nil:
		e.ExitCode, e.Exited = int32(*res.ExitCode), true
		e.Status = fmt.Sprintf("exit status %d", *res.ExitCode)
	case res.Status == api.ExecError:
		if res.ExitCode != nil {
			e.ExitCode = int32(*res.ExitCode)
		}
		e.Status = "error"
	default:
		sig := strings.ToLower(strings.TrimPrefix(res.Signal, "SIG"))
		if sig == "" || sig == "kill" {
			sig = "killed"
		}
		e.Status = "signal: " + sig
	}
	var msg string
	switch res.Status {
	case api.ExecTimeout:
		msg = "command timed out"
	case api.ExecOOM:
		msg = "out of memory"
	case api.ExecError:
		msg = res.Error
		if msg == "" {
			msg = "command failed"
		}
	}
	if msg != "" {
		e.Error = &msg
	}
	return e
}

func (s *processService) List(ctx context.Context, req *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	h, t := s.h, targetFrom(ctx)
	execs, err := h.execs.ListExecs(ctx, t.p, t.id, 100, "")
	if err != nil {
		return nil, h.connectError(ctx, err)
	}
	tab := h.table(t.id)
	out := &pb.ListResponse{}
	for _, ex := range execs.Execs {
		if ex.Status != api.ExecRunning {
			continue
		}
		cfg := &pb.ProcessConfig{}
		if len(ex.Cmd) > 0 {
			cfg.Cmd, cfg.Args = ex.Cmd[0], ex.Cmd[1:]
		} else if ex.Shell != nil {
			cfg.Cmd, cfg.Args = "/bin/sh", []string{"-c", *ex.Shell}
		}
		// Execs started through airlock's own API get a pid here too.
		p := tab.add(ex.ID, "", cfg)
		info := &pb.ProcessInfo{Config: p.cfg, Pid: p.pid}
		if p.tag != "" {
			info.Tag = &p.tag
		}
		out.Processes = append(out.Processes, info)
	}
	return connect.NewResponse(out), nil
}

func (s *processService) SendInput(ctx context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	h, t := s.h, targetFrom(ctx)
	p, err := h.table(t.id).find(req.Msg.GetProcess())
	if err == nil {
		err = h.writeInput(ctx, t, p, req.Msg.GetInput())
	}
	if err != nil {
		return nil, h.connectError(ctx, err)
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func (h *Handler) writeInput(ctx context.Context, t target, p *proc, in *pb.ProcessInput) error {
	var b []byte
	switch v := in.GetInput().(type) {
	case *pb.ProcessInput_Stdin:
		b = v.Stdin
	case *pb.ProcessInput_Pty:
		b = v.Pty
	}
	if len(b) == 0 {
		return nil
	}
	_, err := h.execs.WriteStdin(ctx, t.p, t.id, p.eid, bytes.NewReader(b), false)
	return endedIsNotFound(err)
}

func (s *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	h, t := s.h, targetFrom(ctx)
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			found, err := h.table(t.id).find(ev.Start.GetProcess())
			if err != nil {
				return nil, h.connectError(ctx, err)
			}
			p = found
		case *pb.StreamInputRequest_Data:
			if p == nil {
				return nil, h.connectError(ctx, errf(errdefs.ErrInvalidArgument, "the first event must be start"))
			}
			if err := h.writeInput(ctx, t, p, ev.Data.GetInput()); err != nil {
				return nil, h.connectError(ctx, err)
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

func (s *processService) CloseStdin(ctx context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	h, t := s.h, targetFrom(ctx)
	p, err := h.table(t.id).find(req.Msg.GetProcess())
	if err == nil {
		_, err = h.execs.WriteStdin(ctx, t.p, t.id, p.eid, bytes.NewReader(nil), true)
		err = endedIsNotFound(err)
	}
	if err != nil {
		return nil, h.connectError(ctx, err)
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

func (s *processService) SendSignal(ctx context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	h, t := s.h, targetFrom(ctx)
	var sig string
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = "SIGKILL"
	case pb.Signal_SIGNAL_SIGTERM:
		sig = "SIGTERM"
	default:
		return nil, h.connectError(ctx, errf(errdefs.ErrInvalidArgument, "signal must be SIGKILL or SIGTERM"))
	}
	p, err := h.table(t.id).find(req.Msg.GetProcess())
	if err == nil {
		// The exec service signals the exec's whole process tree.
		err = endedIsNotFound(h.execs.Signal(ctx, t.p, t.id, p.eid, sig))
	}
	if err != nil {
		return nil, h.connectError(ctx, err)
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

func (s *processService) Update(ctx context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	h, t := s.h, targetFrom(ctx)
	p, err := h.table(t.id).find(req.Msg.GetProcess())
	if err == nil {
		if sz := req.Msg.GetPty().GetSize(); sz != nil {
			err = endedIsNotFound(h.execs.Resize(ctx, t.p, t.id, p.eid, uint16(min(sz.GetCols(), 1<<15)), uint16(min(sz.GetRows(), 1<<15))))
		}
	}
	if err != nil {
		return nil, h.connectError(ctx, err)
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}

// endedIsNotFound reports an exec that already ended as envd does: the
// process is not found (the SDK's kill() then returns false).
func endedIsNotFound(err error) error {
	if err != nil && errors.Is(err, errdefs.ErrInvalidState) {
		return errf(errdefs.ErrNotFound, "process not found (it has ended)")
	}
	return err
}
