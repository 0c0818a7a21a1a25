package agentclient_test

import (
	"bytes"
	"errors"
	"io"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// hostileAgent is a session whose every stream after the hello is served by
// serve (pings are answered), which may write anything; its session is returned for tests that
// act on it. The client is connected and closed at the end of tb.
func hostileAgent(tb testing.TB, serve func(req agentproto.Request, fw *agentproto.FrameWriter, st *yamux.Stream)) (*agentclient.Client, *yamux.Session) {
	tb.Helper()
	a, b := socketPair(tb)
	sess, err := yamux.Server(b, agentproto.YamuxConfig())
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			st, err := sess.AcceptStream()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer st.Close()
				fr, fw := agentproto.NewFrameReader(st), agentproto.NewFrameWriter(st)
				var req agentproto.Request
				if err := fr.ReadJSON(&req); err != nil {
					return
				}
				switch req.Op {
				case agentproto.OpHello:
					_ = fw.WriteJSON(&agentproto.Response{Hello: &agentproto.Hello{Version: agentproto.ProtocolVersion}})
					return
				case agentproto.OpPing:
					_ = fw.WriteJSON(&agentproto.Response{})
					return
				}
				serve(req, fw, st)
			}()
		}
	}()
	c, err := agentclient.New(a)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		c.Close()
		sess.Close()
		wg.Wait()
	})
	return c, sess
}

// answer serves every request with resp.
func answer(resp agentproto.Response) func(agentproto.Request, *agentproto.FrameWriter, *yamux.Stream) {
	return func(_ agentproto.Request, fw *agentproto.FrameWriter, _ *yamux.Stream) { _ = fw.WriteJSON(&resp) }
}

// rawFrame writes a header frame holding payload as is.
func rawFrame(fw *agentproto.FrameWriter, st *yamux.Stream, payload []byte) {
	hdr := []byte{byte(agentproto.FrameHeader), 0, 0, 0, 0}
	n := len(payload)
	hdr[1], hdr[2], hdr[3], hdr[4] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
	st.Write(append(hdr, payload...))
}

// events answers an exec or attach with OK and then the frames of write.
func events(write func(fw *agentproto.FrameWriter, st *yamux.Stream)) func(agentproto.Request, *agentproto.FrameWriter, *yamux.Stream) {
	return func(_ agentproto.Request, fw *agentproto.FrameWriter, st *yamux.Stream) {
		if err := fw.WriteJSON(&agentproto.Response{}); err != nil {
			return
		}
		write(fw, st)
	}
}

func exitEvent(fw *agentproto.FrameWriter, r agentproto.ExecResult) {
	_ = fw.WriteJSON(&agentproto.Event{Type: agentproto.EventExit, Result: &r})
}

func okResult(id string) agentproto.ExecResult {
	return agentproto.ExecResult{ID: id, Status: agentproto.StatusExited}
}

// drain reads s to its end and returns the error that ended it (nil at a
// clean end) and the output bytes delivered.
func drain(s *agentclient.Stream) (int64, error) {
	var n int64
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		n += int64(len(ev.Data))
	}
}

// wantProtocol fails t unless err is a protocol violation (and so, for the
// error mapping, unavailable).
func wantProtocol(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, agentclient.ErrProtocol) || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("err = %v, want a protocol violation (unavailable)", err)
	}
}

// TestHostileAnswers: answers no honest agent gives are refused with a
// protocol error, whatever the call, before anything reaches the caller.
func TestHostileAnswers(t *testing.T) {
	files := func(n int) []agentproto.FileInfo {
		fs := make([]agentproto.FileInfo, n)
		for i := range fs {
			fs[i] = agentproto.FileInfo{Name: "f", Path: "/f", Type: agentproto.FileTypeFile}
		}
		return fs
	}
	tests := []struct {
		name  string
		serve func(agentproto.Request, *agentproto.FrameWriter, *yamux.Stream)
		call  func(c *agentclient.Client) error
	}{
		{"stat_no_info", answer(agentproto.Response{}), func(c *agentclient.Client) error { _, err := c.Stat(ctxT(t), "/x", ""); return err }},
		{"stat_bad_type", answer(agentproto.Response{File: &agentproto.FileInfo{Type: "device"}}),
			func(c *agentclient.Client) error { _, err := c.Stat(ctxT(t), "/x", ""); return err }},
		{"stat_negative_size", answer(agentproto.Response{File: &agentproto.FileInfo{Type: agentproto.FileTypeFile, Size: -1}}),
			func(c *agentclient.Client) error { _, err := c.Stat(ctxT(t), "/x", ""); return err }},
		{"stat_bad_mode", answer(agentproto.Response{File: &agentproto.FileInfo{Type: agentproto.FileTypeFile, Mode: 0o170755}}),
			func(c *agentclient.Client) error { _, err := c.Stat(ctxT(t), "/x", ""); return err }},
		{"stat_long_name", answer(agentproto.Response{File: &agentproto.FileInfo{Type: agentproto.FileTypeFile, Name: strings.Repeat("n", 1<<16)}}),
			func(c *agentclient.Client) error { _, err := c.Stat(ctxT(t), "/x", ""); return err }},
		{"read_file_negative_size", answer(agentproto.Response{File: &agentproto.FileInfo{Type: agentproto.FileTypeFile, Size: -5}}),
			func(c *agentclient.Client) error { _, _, err := c.ReadFile(ctxT(t), "/x", ""); return err }},
		{"list_too_long", answer(agentproto.Response{Files: files(20001)}),
			func(c *agentclient.Client) error { _, err := c.List(ctxT(t), "/", "", 1); return err }},
		{"list_json_bomb", func(_ agentproto.Request, fw *agentproto.FrameWriter, st *yamux.Stream) {
			// 4 MiB of empty entries: over a million structs if decoded.
			var b bytes.Buffer
			b.WriteString(`{"files":[`)
			for b.Len() < agentproto.MaxFramePayload-16 {
				b.WriteString(`{},`)
			}
			b.WriteString(`{}]}`)
			rawFrame(fw, st, b.Bytes())
		}, func(c *agentclient.Client) error { _, err := c.List(ctxT(t), "/", "", 1); return err }},
		{"list_execs_bad_status", answer(agentproto.Response{Execs: []agentproto.ExecInfo{{ID: "ex_1", Status: "zombie"}}}),
			func(c *agentclient.Client) error { _, err := c.ListExecs(ctxT(t)); return err }},
		{"wait_no_result", answer(agentproto.Response{}),
			func(c *agentclient.Client) error { _, err := c.Wait(ctxT(t), "ex_1"); return err }},
		{"wait_other_exec", answer(agentproto.Response{Result: &agentproto.ExecResult{ID: "ex_other", Status: agentproto.StatusExited}}),
			func(c *agentclient.Client) error { _, err := c.Wait(ctxT(t), "ex_1"); return err }},
		{"wait_running", answer(agentproto.Response{Result: &agentproto.ExecResult{ID: "ex_1", Status: agentproto.StatusRunning}}),
			func(c *agentclient.Client) error { _, err := c.Wait(ctxT(t), "ex_1"); return err }},
		{"wait_exit_code", answer(agentproto.Response{Result: &agentproto.ExecResult{ID: "ex_1", Status: agentproto.StatusExited, ExitCode: 4096}}),
			func(c *agentclient.Client) error { _, err := c.Wait(ctxT(t), "ex_1"); return err }},
		{"wait_signal", answer(agentproto.Response{Result: &agentproto.ExecResult{ID: "ex_1", Status: agentproto.StatusKilled, Signal: "SIGKILL\nforged log line"}}),
			func(c *agentclient.Client) error { _, err := c.Wait(ctxT(t), "ex_1"); return err }},
		{"wait_negative_counts", answer(agentproto.Response{Result: &agentproto.ExecResult{ID: "ex_1", Status: agentproto.StatusExited, StdoutBytes: -1}}),
			func(c *agentclient.Client) error { _, err := c.Wait(ctxT(t), "ex_1"); return err }},
		{"not_a_header", func(_ agentproto.Request, fw *agentproto.FrameWriter, _ *yamux.Stream) { _ = fw.WriteData([]byte("x")) },
			func(c *agentclient.Client) error { _, err := c.ListExecs(ctxT(t)); return err }},
		{"write_more_than_sent", func(_ agentproto.Request, fw *agentproto.FrameWriter, st *yamux.Stream) {
			_ = fw.WriteJSON(&agentproto.Response{})
			fr := agentproto.NewFrameReader(st)
			for {
				ft, _, err := fr.Next()
				if err != nil || ft == agentproto.FrameEnd {
					break
				}
			}
			_ = fw.WriteJSON(&agentproto.Response{Written: 1 << 30})
		}, func(c *agentclient.Client) error {
			_, err := c.WriteFile(ctxT(t), "/f", "", 0, strings.NewReader("four"), 0)
			return err
		}},
		{"watch_unknown_event", events(func(fw *agentproto.FrameWriter, _ *yamux.Stream) {
			_ = fw.WriteJSON(&agentproto.WatchBatch{Events: []agentproto.WatchEvent{{Type: "explode", Path: "/x"}}})
		}), func(c *agentclient.Client) error {
			w, err := c.Watch(ctxT(t), "/", "", false)
			if err != nil {
				return err
			}
			defer w.Close()
			_, err = w.Next()
			return err
		}},
		{"watch_too_many", events(func(fw *agentproto.FrameWriter, _ *yamux.Stream) {
			evs := make([]agentproto.WatchEvent, 3*agentproto.MaxWatchQueue)
			for i := range evs {
				evs[i] = agentproto.WatchEvent{Type: agentproto.WatchWrite, Path: "/x"}
			}
			_ = fw.WriteJSON(&agentproto.WatchBatch{Events: evs})
		}), func(c *agentclient.Client) error {
			w, err := c.Watch(ctxT(t), "/", "", false)
			if err != nil {
				return err
			}
			defer w.Close()
			_, err = w.Next()
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := hostileAgent(t, tt.serve)
			wantProtocol(t, tt.call(c))
			// The session itself stays usable: only the call failed.
			if err := c.Ping(ctxT(t)); err != nil {
				t.Errorf("ping after the violation: %v", err)
			}
		})
	}
}

// TestHostileExecEvents: an exec's events must move forward from where the
// stream starts (a jump forward is output the agent dropped) and end with a
// real exit event; a stream the agent ends early is a violation, not a
// dropped connection to re-attach over.
func TestHostileExecEvents(t *testing.T) {
	const id = "ex_1"
	chunk := bytes.Repeat([]byte("x"), 1000)
	tests := []struct {
		name   string
		cap    int64 // the exec's MaxOutputBytes
		from   int64 // attach from this offset; -1 for an exec
		write  func(fw *agentproto.FrameWriter, st *yamux.Stream)
		wantOK bool
	}{
		{"honest", 0, -1, func(fw *agentproto.FrameWriter, _ *yamux.Stream) {
			_ = fw.WriteOutput(agentproto.StreamStdout, 0, chunk)
			_ = fw.WriteOutput(agentproto.StreamStderr, 1000, chunk)
			exitEvent(fw, okResult(id))
		}, true},
		{"goes_back", 0, -1, func(fw *agentproto.FrameWriter, _ *yamux.Stream) {
			_ = fw.WriteOutput(agentproto.StreamStdout, 0, chunk)
			_ = fw.WriteOutput(agentproto.StreamStdout, 500, chunk)
			exitEvent(fw, okResult(id))
		}, false},
		{"before_attach_offset", 0, 5000, func(fw *agentproto.FrameWriter, _ *yamux.Stream) {
			_ = fw.WriteOutput(agentproto.StreamStdout, 0, chunk)
			exitEvent(fw, okResult(id))
		}, false},
		{"offset_overflow", 0, -1, func(fw *agentproto.FrameWriter, _ *yamux.Stream) {
			_ = fw.WriteOutput(agentproto.StreamStdout, math.MaxInt64-10, chunk)
			exitEvent(fw, okResult(id))
		}, false},
		{"jump_forward", 0, -1, func(fw *agentproto.FrameWriter, _ *yamux.Stream) {
			// Output the agent dropped between head and tail: a gap.
			_ = fw.WriteOutput(agentproto.StreamStdout, 0, chunk)
			_ = fw.WriteOutput(agentproto.StreamStderr, 1<<40, chunk)
			exitEvent(fw, okResult(id))
		}, true},
		{"negative_offset", 0, -1, func(fw *agentproto.FrameWriter, _ *yamux.Stream) {
			_ = fw.WriteOutput(agentproto.StreamStdout, -1000, chunk)
			exitEvent(fw, okResult(id))
		}, false},
		{"no_exit_event", 0, -1, func(fw *agentproto.FrameWriter, _ *yamux.Stream) {
			_ = fw.WriteOutput(agentproto.StreamStdout, 0, chunk)
		}, false},
		{"not_an_exit", 0, -1, func(fw *agentproto.FrameWriter, _ *yamux.Stream) {
			_ = fw.WriteJSON(&agentproto.Event{Type: agentproto.EventOutput, Data: chunk})
		}, false},
		{"exit_without_result", 0, -1, func(fw *agentproto.FrameWriter, _ *yamux.Stream) {
			_ = fw.WriteJSON(&agentproto.Event{Type: agentproto.EventExit})
		}, false},
		{"exit_of_another_exec", 0, -1, func(fw *agentproto.FrameWriter, _ *yamux.Stream) {
			exitEvent(fw, okResult("ex_other"))
		}, false},
		{"unknown_frame", 0, -1, func(_ *agentproto.FrameWriter, st *yamux.Stream) {
			st.Write([]byte{'Z', 0, 0, 0, 0})
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := hostileAgent(t, events(tt.write))
			var s *agentclient.Stream
			var err error
			if tt.from < 0 {
				s, err = c.Exec(ctxT(t), agentproto.ExecRequest{ID: id, Argv: []string{"true"}, MaxOutputBytes: tt.cap})
			} else {
				s, err = c.Attach(ctxT(t), id, tt.from)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			n, err := drain(s)
			if tt.wantOK {
				if err != nil || n != 2000 {
					t.Fatalf("honest events: %d bytes, %v", n, err)
				}
				return
			}
			wantProtocol(t, err)
		})
	}
}

// TestHostileTexts: an agent's error message and an exec's error text are
// cut to a few KiB before they reach API answers and stored records.
func TestHostileTexts(t *testing.T) {
	huge := strings.Repeat("é", 1<<20)
	c, _ := hostileAgent(t, func(req agentproto.Request, fw *agentproto.FrameWriter, _ *yamux.Stream) {
		switch req.Op {
		case agentproto.OpWait:
			_ = fw.WriteJSON(&agentproto.Response{Result: &agentproto.ExecResult{ID: req.ExecID, Status: agentproto.StatusError, ExitCode: -1, Error: huge}})
		default:
			_ = fw.WriteJSON(&agentproto.Response{Error: &agentproto.Error{Code: strings.Repeat("c", 1<<16), Message: huge}})
		}
	})
	_, err := c.Stat(ctxT(t), "/x", "")
	var pe *agentproto.Error
	if !errors.As(err, &pe) || len(pe.Message) > 5<<10 || len(pe.Code) > 1<<10 || !strings.HasPrefix(huge, strings.TrimSuffix(pe.Message, "…")) {
		t.Errorf("agent error of %d bytes kept as %d bytes (code %d): %.40q", len(huge), len(pe.Message), len(pe.Code), err)
	}
	r, err := c.Wait(ctxT(t), "ex_1")
	if err != nil || len(r.Error) > 5<<10 || !strings.HasPrefix(huge, strings.TrimSuffix(r.Error, "…")) {
		t.Errorf("exec error of %d bytes kept as %d bytes: %v", len(huge), len(r.Error), err)
	}
}

// TestAgentOpensStream: the agent cannot open a stream to the daemon
// (which would park data in its memory): the client refused them all at the
// start of the session, and the session keeps working.
func TestAgentOpensStream(t *testing.T) {
	c, sess := hostileAgent(t, answer(agentproto.Response{}))
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := sess.OpenStream()
		if err != nil {
			if !errors.Is(err, yamux.ErrRemoteGoAway) {
				t.Fatalf("agent's OpenStream: %v, want a refusal (go away)", err)
			}
			break
		}
		// The go-away may still be on its way: a stream the client
		// received meanwhile must be reset, never accepted.
		st.Write(bytes.Repeat([]byte("z"), 1<<10))
		st.Close()
		if time.Now().After(deadline) {
			t.Fatal("the agent can still open streams")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := c.Ping(ctxT(t)); err != nil {
		t.Fatalf("ping: %v", err)
	}
}
