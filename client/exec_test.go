package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/airlockhq/airlock/api"
)

type chunk struct {
	stream string
	data   []byte
}

// fakeExec plays one exec's SSE streams: POST …/exec with Accept
// text/event-stream, and GET …/execs/{eid}/events?from_offset=N.
type fakeExec struct {
	t      *testing.T
	chunks []chunk
	result api.ExecResult

	// dropAfter > 0 makes the first stream (the POST) break its connection
	// after that many output events, without an exit event.
	dropAfter int
	// abort breaks connections abruptly (RST-like) instead of ending the
	// response cleanly.
	abort bool
	// replayWholeChunk makes the events endpoint resend the whole chunk that
	// holds from_offset instead of its tail (a server may do either).
	replayWholeChunk bool
	// stallFirst makes the first stream go silent (no heartbeat) after
	// dropAfter events, until the client hangs up.
	stallFirst bool
	// heartbeatFor makes the first stream send only heartbeats this long
	// before its output.
	heartbeatFor time.Duration
	// eventsStatus answers the events endpoint with this status (503, 404).
	eventsStatus int

	mu       sync.Mutex
	posts    int
	attaches []int64
}

func (f *fakeExec) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.posts++
		f.mu.Unlock()
		var req api.ExecRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeAPIError(w, 400, api.CodeInvalidArgument, "bad json")
			return
		}
		if r.Header.Get("Accept") != "text/event-stream" {
			writeAPIError(w, 400, api.CodeInvalidArgument, "test server speaks sse only")
			return
		}
		f.serve(w, r, 0, true)
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/execs/{eid}/events", func(w http.ResponseWriter, r *http.Request) {
		from, err := strconv.ParseInt(r.URL.Query().Get("from_offset"), 10, 64)
		if err != nil {
			writeAPIError(w, 400, api.CodeInvalidArgument, "from_offset")
			return
		}
		f.mu.Lock()
		f.attaches = append(f.attaches, from)
		f.mu.Unlock()
		if r.PathValue("eid") != "ex_1" {
			writeAPIError(w, 404, api.CodeExecNotFound, "exec not found")
			return
		}
		if f.eventsStatus != 0 {
			w.WriteHeader(f.eventsStatus)
			return
		}
		f.serve(w, r, from, false)
	})
	return mux
}

func sseWrite(w http.ResponseWriter, event string, v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b)
	w.(http.Flusher).Flush()
}

func (f *fakeExec) serve(w http.ResponseWriter, r *http.Request, from int64, first bool) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	w.(http.Flusher).Flush()
	if first {
		sseWrite(w, "start", api.ExecStarted{ID: "ex_1"})
		if f.heartbeatFor > 0 {
			end := time.Now().Add(f.heartbeatFor)
			for time.Now().Before(end) {
				io.WriteString(w, ": ping\n\n")
				w.(http.Flusher).Flush()
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	list := f.chunks
	if !first && f.replayWholeChunk {
		// Replay with other chunk boundaries than the live stream had:
		// same-stream neighbours merged, starting one byte early, so the
		// client must trim what it already delivered.
		list = nil
		for _, c := range f.chunks {
			if n := len(list); n > 0 && list[n-1].stream == c.stream {
				list[n-1].data = append(append([]byte{}, list[n-1].data...), c.data...)
				continue
			}
			list = append(list, c)
		}
		from = max(from-1, 0)
	}
	var off int64
	sent := 0
	for _, c := range list {
		start, end := off, off+int64(len(c.data))
		off = end
		if end <= from {
			continue
		}
		data := c.data
		evOff := start
		if from > start && !f.replayWholeChunk {
			data, evOff = c.data[from-start:], from
		}
		ev := api.OutputEvent{Data: string(data), Offset: evOff}
		if !utf8.Valid(data) {
			ev = api.OutputEvent{Data: base64.StdEncoding.EncodeToString(data), Offset: evOff, Encoding: "base64"}
		}
		sseWrite(w, c.stream, ev)
		sent++
		if first && f.dropAfter > 0 && sent == f.dropAfter {
			if f.stallFirst {
				<-r.Context().Done()
				return
			}
			if f.abort {
				panic(http.ErrAbortHandler)
			}
			return // clean end of the response without an exit event
		}
	}
	sseWrite(w, "exit", f.result)
}

func (f *fakeExec) output() (stdout, stderr string) {
	var o, e strings.Builder
	for _, c := range f.chunks {
		if c.stream == "stdout" {
			o.Write(c.data)
		} else {
			e.Write(c.data)
		}
	}
	return o.String(), e.String()
}

func newFakeExec(t *testing.T) *fakeExec {
	code := 3
	return &fakeExec{
		t: t,
		chunks: []chunk{
			{"stdout", []byte("hello ")},
			{"stderr", []byte{0xff, 0xfe, 'x'}}, // not UTF-8: sent as base64
			{"stdout", []byte("world\n")},
			{"stdout", []byte("line two\nline three\n")},
			{"stderr", []byte("warning\n")},
		},
		result: api.ExecResult{ID: "ex_1", ExitCode: &code, Status: api.ExecExited, DurationMS: 5},
	}
}

// collect drains an exec stream the way a caller would.
func collect(t *testing.T, events func(func(ExecEvent, error) bool)) (types []string, stdout, stderr string, res *api.ExecResult, err error) {
	t.Helper()
	var o, e bytes.Buffer
	var next int64
	for ev, evErr := range events {
		if evErr != nil {
			return types, o.String(), e.String(), nil, evErr
		}
		types = append(types, ev.Type)
		if ev.ExecID != "ex_1" {
			t.Errorf("event %s has exec id %q", ev.Type, ev.ExecID)
		}
		switch ev.Type {
		case EventStdout, EventStderr:
			if ev.Offset != next {
				t.Errorf("event offset %d, want %d: output skipped or repeated", ev.Offset, next)
			}
			next = ev.Offset + int64(len(ev.Data))
			if ev.Type == EventStdout {
				o.Write(ev.Data)
			} else {
				e.Write(ev.Data)
			}
		case EventExit:
			res = ev.Result
		}
	}
	return types, o.String(), e.String(), res, nil
}

func TestExecStream(t *testing.T) {
	tests := []struct {
		name         string
		setup        func(f *fakeExec)
		opts         []Option
		wantAttaches []int64
	}{
		{name: "whole stream", wantAttaches: nil},
		{name: "clean drop resumes from last offset", setup: func(f *fakeExec) { f.dropAfter = 2 },
			wantAttaches: []int64{9}},
		{name: "abrupt drop resumes", setup: func(f *fakeExec) { f.dropAfter = 3; f.abort = true },
			wantAttaches: []int64{15}},
		{name: "overlapping replay is trimmed", setup: func(f *fakeExec) { f.dropAfter = 3; f.replayWholeChunk = true },
			wantAttaches: []int64{15}},
		{name: "silent connection is dropped and resumed", setup: func(f *fakeExec) { f.dropAfter = 4; f.stallFirst = true },
			opts: []Option{WithStreamIdleTimeout(300 * time.Millisecond)}, wantAttaches: []int64{35}},
		{name: "heartbeats keep a quiet stream alive", setup: func(f *fakeExec) { f.heartbeatFor = 600 * time.Millisecond },
			opts: []Option{WithStreamIdleTimeout(250 * time.Millisecond)}, wantAttaches: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeExec(t)
			if tt.setup != nil {
				tt.setup(f)
			}
			opts := append([]Option{WithResume(3, time.Millisecond)}, tt.opts...)
			c := newTestClient(t, f.handler(), opts...)
			types, stdout, stderr, res, err := collect(t, c.ExecStream(context.Background(), "sbx_1", api.ExecRequest{Cmd: []string{"x"}}))
			if err != nil {
				t.Fatal(err)
			}
			wantOut, wantErr := f.output()
			if stdout != wantOut || stderr != wantErr {
				t.Errorf("stdout %q stderr %q, want %q %q", stdout, stderr, wantOut, wantErr)
			}
			if types[0] != EventStart || types[len(types)-1] != EventExit {
				t.Errorf("event types %v: want start first and exit last", types)
			}
			if res == nil || res.ExitCode == nil || *res.ExitCode != 3 || res.Status != api.ExecExited {
				t.Errorf("result = %+v", res)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.posts != 1 {
				t.Errorf("exec POSTed %d times: a resume must never re-run the command", f.posts)
			}
			if fmt.Sprint(f.attaches) != fmt.Sprint(tt.wantAttaches) {
				t.Errorf("attaches from offsets %v, want %v", f.attaches, tt.wantAttaches)
			}
		})
	}
}

func TestAttach(t *testing.T) {
	f := newFakeExec(t)
	c := newTestClient(t, f.handler())
	// From the middle of the third chunk ("world\n" starts at 9).
	var out strings.Builder
	var first int64 = -1
	for ev, err := range c.Attach(context.Background(), "sbx_1", "ex_1", 11) {
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == EventStdout || ev.Type == EventStderr {
			if first < 0 {
				first = ev.Offset
			}
			out.Write(ev.Data)
		}
	}
	if first != 11 || out.String() != "rld\nline two\nline three\nwarning\n" {
		t.Errorf("attach from 11: first offset %d, output %q", first, out.String())
	}
}

func TestExecStreamFailures(t *testing.T) {
	tests := []struct {
		name      string
		setup     func(f *fakeExec)
		execID    string // "" runs ExecStream, else Attach to this id
		wantIs    error
		wantText  string
		wantTries int // attaches the client made
	}{
		{name: "drop before start is not resumed", setup: func(f *fakeExec) { f.chunks = nil; f.dropAfter = 0 },
			wantText: "", wantTries: 0},
		{name: "resume gives up on a gone server", setup: func(f *fakeExec) { f.dropAfter = 1; f.eventsStatus = 503 },
			wantIs: ErrUnavailable, wantTries: 3},
		{name: "resume stops on exec not found", execID: "ex_gone", wantIs: ErrNotFound, wantTries: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeExec(t)
			if tt.setup != nil {
				tt.setup(f)
			}
			h := f.handler()
			if tt.name == "drop before start is not resumed" {
				h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					f.mu.Lock()
					f.posts++
					f.mu.Unlock()
					panic(http.ErrAbortHandler)
				})
			}
			c := newTestClient(t, h, WithResume(3, time.Millisecond))
			events := c.ExecStream(context.Background(), "sbx_1", api.ExecRequest{Cmd: []string{"x"}})
			if tt.execID != "" {
				events = c.Attach(context.Background(), "sbx_1", tt.execID, 0)
			}
			_, err := Consume(events, StreamHandlers{})
			if err == nil {
				t.Fatal("want an error")
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("err = %v, want %v", err, tt.wantIs)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if len(f.attaches) != tt.wantTries {
				t.Errorf("attaches = %v, want %d", f.attaches, tt.wantTries)
			}
			if tt.execID == "" && f.posts != 1 {
				t.Errorf("posts = %d, want 1", f.posts)
			}
		})
	}
}

func TestExecStreamErrorEvent(t *testing.T) {
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		sseWrite(w, "start", api.ExecStarted{ID: "ex_1"})
		sseWrite(w, "error", api.ErrorBody{Error: api.ErrorDetail{Code: api.CodeSandboxNotFound, Message: "sandbox gone"}})
		sseWrite(w, "exit", api.ExecResult{ID: "ex_1"})
	}))
	_, err := c.ExecWithHandlers(context.Background(), "sbx_1", api.ExecRequest{Cmd: []string{"x"}}, StreamHandlers{})
	var ae *APIError
	if !errors.As(err, &ae) || ae.Code != api.CodeSandboxNotFound || !errors.Is(err, ErrNotFound) {
		t.Fatalf("err = %v, want sandbox_not_found APIError", err)
	}
}

func TestExecStreamNonSSEAnswer(t *testing.T) {
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, api.ExecResult{ID: "ex_1"})
	}))
	_, err := Consume(c.ExecStream(context.Background(), "sbx_1", api.ExecRequest{Cmd: []string{"x"}}), StreamHandlers{})
	if err == nil || !strings.Contains(err.Error(), "text/event-stream") {
		t.Fatalf("err = %v", err)
	}
}

func TestExecStreamCancel(t *testing.T) {
	f := newFakeExec(t)
	f.dropAfter, f.stallFirst = 1, true
	c := newTestClient(t, f.handler())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got error
	for ev, err := range c.ExecStream(ctx, "sbx_1", api.ExecRequest{Cmd: []string{"x"}}) {
		if err != nil {
			got = err
			break
		}
		if ev.Type == EventStdout {
			cancel()
		}
	}
	if !errors.Is(got, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", got)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.attaches) != 0 {
		t.Errorf("a cancelled stream re-attached: %v", f.attaches)
	}
}

func TestExecWithHandlers(t *testing.T) {
	f := newFakeExec(t)
	f.dropAfter = 2
	c := newTestClient(t, f.handler(), WithResume(3, time.Millisecond))
	var started string
	var o, e bytes.Buffer
	res, err := c.ExecWithHandlers(context.Background(), "sbx_1", api.ExecRequest{Cmd: []string{"x"}}, StreamHandlers{
		OnStart:  func(id string) { started = id },
		OnStdout: func(p []byte) { o.Write(p) },
		OnStderr: func(p []byte) { e.Write(p) },
	})
	if err != nil {
		t.Fatal(err)
	}
	wo, we := f.output()
	if started != "ex_1" || o.String() != wo || e.String() != we || *res.ExitCode != 3 {
		t.Errorf("start %q out %q err %q res %+v", started, o.String(), e.String(), res)
	}
}

func TestExecJSONAsyncStdinSignal(t *testing.T) {
	type seen struct{ method, path, query, ctype, body string }
	var calls []seen
	mux := http.NewServeMux()
	rec := func(r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		calls = append(calls, seen{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"), string(b)})
	}
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", func(w http.ResponseWriter, r *http.Request) {
		rec(r)
		if r.URL.Query().Get("async") == "true" {
			writeJSON(w, 202, api.ExecStarted{ID: "ex_2"})
			return
		}
		out := base64.StdEncoding.EncodeToString([]byte{0xff, 'a'})
		errs := base64.StdEncoding.EncodeToString([]byte("e"))
		code := 0
		writeJSON(w, 200, api.ExecResult{ID: "ex_1", ExitCode: &code, Status: "exited", Stdout: &out, Stderr: &errs, Encoding: "base64"})
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/execs/{eid}/stdin", func(w http.ResponseWriter, r *http.Request) {
		rec(r)
		w.WriteHeader(204)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/execs/{eid}/signal", func(w http.ResponseWriter, r *http.Request) {
		rec(r)
		w.WriteHeader(204)
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/execs", func(w http.ResponseWriter, r *http.Request) {
		rec(r)
		writeJSON(w, 200, api.ExecList{Execs: []api.ExecResult{{ID: "ex_2", Status: "running"}, {ID: "ex_1", Status: "exited"}}})
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/execs/{eid}", func(w http.ResponseWriter, r *http.Request) {
		rec(r)
		writeJSON(w, 200, api.ExecResult{ID: r.PathValue("eid"), Status: "running"})
	})
	c := newTestClient(t, mux)
	ctx := context.Background()
	res, err := c.Exec(ctx, "sbx_1", api.ExecRequest{Cmd: []string{"cat"}})
	if err != nil {
		t.Fatal(err)
	}
	so, se, err := Output(res)
	if err != nil || !bytes.Equal(so, []byte{0xff, 'a'}) || string(se) != "e" {
		t.Errorf("Output = %q %q %v", so, se, err)
	}
	id, err := c.ExecAsync(ctx, "sbx_1", api.ExecRequest{Cmd: []string{"cat"}})
	if err != nil || id != "ex_2" {
		t.Fatalf("ExecAsync = %q, %v", id, err)
	}
	if err := c.WriteStdin(ctx, "sbx_1", id, strings.NewReader("raw\x00bytes")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseStdin(ctx, "sbx_1", id); err != nil {
		t.Fatal(err)
	}
	if err := c.Signal(ctx, "sbx_1", id, "SIGTERM"); err != nil {
		t.Fatal(err)
	}
	if l, err := c.Execs(ctx, "sbx_1", ExecListOptions{Limit: 5}); err != nil || len(l.Execs) != 2 {
		t.Fatalf("Execs = %+v, %v", l, err)
	}
	if e, err := c.GetExec(ctx, "sbx_1", id); err != nil || e.ID != "ex_2" {
		t.Fatalf("GetExec = %+v, %v", e, err)
	}
	want := []seen{
		{"POST", "/v1/sandboxes/sbx_1/exec", "", "application/json", `{"cmd":["cat"]}`},
		{"POST", "/v1/sandboxes/sbx_1/exec", "async=true", "application/json", `{"cmd":["cat"]}`},
		{"POST", "/v1/sandboxes/sbx_1/execs/ex_2/stdin", "", "application/octet-stream", "raw\x00bytes"},
		{"POST", "/v1/sandboxes/sbx_1/execs/ex_2/stdin", "eof=true", "application/octet-stream", ""},
		{"POST", "/v1/sandboxes/sbx_1/execs/ex_2/signal", "", "application/json", `{"signal":"SIGTERM"}`},
		{"GET", "/v1/sandboxes/sbx_1/execs", "limit=5", "", ""},
		{"GET", "/v1/sandboxes/sbx_1/execs/ex_2", "", "", ""},
	}
	if len(calls) != len(want) {
		t.Fatalf("calls = %+v", calls)
	}
	for i := range want {
		if calls[i] != want[i] {
			t.Errorf("call %d = %+v, want %+v", i, calls[i], want[i])
		}
	}
}
