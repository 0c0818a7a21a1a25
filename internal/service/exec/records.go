package exec

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/redact"
	"github.com/airlockhq/airlock/internal/service/sandbox"
	"github.com/airlockhq/airlock/internal/store"
)

// findExec returns the tracker of exec eid of sandbox id: the live one, or
// one rebuilt from the store for an ended exec.
func (m *Service) findExec(ctx context.Context, p auth.Principal, id, eid string) (*tracker, *sandbox.Live, error) {
	sb := m.sandboxes.Lookup(id)
	if sb != nil && p.CanSee(sb.Tenant()) {
		if t := m.eng.tracker(id, eid); t != nil {
			return t, sb, nil
		}
	} else {
		sb = nil
		if _, err := m.sandboxes.Record(ctx, p, id); err != nil {
			return nil, nil, err
		}
	}
	rec, err := m.eng.store.GetExec(ctx, id, eid)
	if errdefs.IsNotFound(err) {
		return nil, nil, execNotFound()
	}
	if err != nil {
		return nil, nil, err
	}
	blob, err := m.eng.store.ExecOutput(ctx, eid)
	if err != nil {
		return nil, nil, err
	}
	events, err := decodeEvents(blob)
	if err != nil {
		return nil, nil, fmt.Errorf("exec %s output: %w", eid, err)
	}
	t := newTracker(m.eng, nil, rec, 0)
	// Stored output was capped when it was kept: hold all of it.
	t.out = agentproto.NewOutputLog(0)
	for _, c := range events {
		t.out.Add(c.Stream, c.Off, c.Data)
	}
	v := buildResult(rec, nil, false)
	t.result = &v
	close(t.done)
	return t, sb, nil
}

// GetExec returns exec eid of sandbox id, with its output once it ended.
func (m *Service) GetExec(ctx context.Context, p auth.Principal, id, eid string) (api.ExecResult, error) {
	t, _, err := m.findExec(ctx, p, id, eid)
	if err != nil {
		return api.ExecResult{}, err
	}
	return t.view(true), nil
}

// ListExecs returns one page of sandbox id's exec records, newest first.
func (m *Service) ListExecs(ctx context.Context, p auth.Principal, id string, limit int, cursor string) (api.ExecList, error) {
	if _, err := m.sandboxes.Record(ctx, p, id); err != nil {
		return api.ExecList{}, err
	}
	recs, next, err := m.eng.store.ListExecs(ctx, id, limit, cursor)
	if err != nil {
		if errdefs.IsInvalidArgument(err) {
			return api.ExecList{}, public(errInvalid, "%s", publicText(err))
		}
		return api.ExecList{}, err
	}
	out := api.ExecList{Execs: make([]api.ExecResult, 0, len(recs)), NextCursor: next}
	sb := m.sandboxes.Lookup(id)
	for _, r := range recs {
		if sb != nil && r.EndedAt == nil {
			// An exec that has just ended may not be recorded as ended yet
			// (finish writes the store after answering): its tracker knows.
			if t := m.eng.tracker(id, r.ID); t != nil {
				if v, ended := t.ended(); ended {
					out.Execs = append(out.Execs, v)
					continue
				}
			}
			// Live duration of a running exec.
			r.DurationMS = m.eng.now().Sub(r.StartedAt).Milliseconds()
		}
		out.Execs = append(out.Execs, buildResult(r, nil, false))
	}
	return out, nil
}

// Events follows exec eid's output from offset from.
func (m *Service) Events(ctx context.Context, p auth.Principal, id, eid string, from int64) (*Subscription, error) {
	if from < 0 {
		return nil, public(errInvalid, "from_offset must not be negative")
	}
	t, _, err := m.findExec(ctx, p, id, eid)
	if err != nil {
		return nil, err
	}
	return t.subscribe(from), nil
}

func piecesToChunks(ps []agentproto.OutputPiece) []redact.Chunk {
	out := make([]redact.Chunk, len(ps))
	for i, p := range ps {
		out[i] = redact.Chunk{Stream: p.Stream, Off: p.Off, Data: p.Data}
	}
	return out
}

// Stream ids in encoded event logs.
var streamIDs = map[string]byte{agentproto.StreamStdout: 1, agentproto.StreamStderr: 2, agentproto.StreamPTY: 3}

var streamNames = map[byte]string{1: agentproto.StreamStdout, 2: agentproto.StreamStderr, 3: agentproto.StreamPTY}

// encodeEvents serialises events for the store: per event a stream byte, a
// uvarint offset, a uvarint length and the bytes.
func encodeEvents(events []redact.Chunk) []byte {
	n := 0
	for _, c := range events {
		n += 1 + 2*binary.MaxVarintLen64 + len(c.Data)
	}
	out := make([]byte, 0, n)
	for _, c := range events {
		out = append(out, streamIDs[c.Stream])
		out = binary.AppendUvarint(out, uint64(c.Off))
		out = binary.AppendUvarint(out, uint64(len(c.Data)))
		out = append(out, c.Data...)
	}
	return out
}

func decodeEvents(b []byte) ([]redact.Chunk, error) {
	var out []redact.Chunk
	for len(b) > 0 {
		name, ok := streamNames[b[0]]
		if !ok {
			return nil, errors.New("bad stream id")
		}
		b = b[1:]
		off, k := binary.Uvarint(b)
		if k <= 0 {
			return nil, errors.New("bad offset")
		}
		b = b[k:]
		l, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < l {
			return nil, errors.New("bad length")
		}
		b = b[k:]
		out = append(out, redact.Chunk{Stream: name, Off: int64(off), Data: b[:l:l]})
		b = b[l:]
	}
	return out, nil
}

// finishExec writes an exec's end to its record and records its audit
// event: every exec's record is written once at its end, whichever path
// ends it, and that write is its audit event (with the request that
// started it, which the record keeps). Its argv and error are masked
// already; masking again is harmless.
func (e *Engine) finishExec(ctx context.Context, sb *sandbox.Live, x store.Exec, events []byte) error {
	rid, err := e.store.FinishExec(ctx, x, events)
	if err != nil || e.audit == nil {
		return err
	}
	at := e.now()
	if x.EndedAt != nil {
		at = *x.EndedAt
	}
	e.audit.RecordDetail(audit.Event{
		Time: at, Type: audit.TypeExec, Tenant: x.Tenant, SandboxID: x.SandboxID, Template: sb.Record().Template, RequestID: rid,
	}, api.ExecAuditDetail{
		ExecID: x.ID, Cmd: x.Argv, Shell: x.Shell, User: x.User, Cwd: x.Cwd, PTY: x.PTY, Status: x.Status,
		ExitCode: x.ExitCode, Signal: x.Signal, Error: x.Error, StartedAt: x.StartedAt, EndedAt: x.EndedAt,
		DurationMS: x.DurationMS, StdoutB: x.StdoutBytes, StderrB: x.StderrBytes, Truncated: x.Truncated,
	}, sb.Redactor().Func())
	return nil
}

func execNotFound() error {
	return &errdefs.Public{Msg: "exec not found", Err: errdefs.ErrExecNotFound}
}
