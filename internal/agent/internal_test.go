package agent

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentproto"
)

func TestParseSignal(t *testing.T) {
	tests := []struct {
		in   string
		want syscall.Signal
		ok   bool
	}{
		{"SIGTERM", syscall.SIGTERM, true},
		{"TERM", syscall.SIGTERM, true},
		{"term", syscall.SIGTERM, true},
		{"15", syscall.SIGTERM, true},
		{" SIGKILL ", syscall.SIGKILL, true},
		{"HUP", syscall.SIGHUP, true},
		{"SIGUSR1", syscall.SIGUSR1, true},
		{"0", 0, false},
		{"65", 0, false},
		{"SIGNOPE", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseSignal(tt.in)
			if (err == nil) != tt.ok || got != tt.want {
				t.Fatalf("parseSignal(%q) = %v, %v", tt.in, got, err)
			}
		})
	}
	if signalName(syscall.SIGKILL) != "SIGKILL" {
		t.Fatal(signalName(syscall.SIGKILL))
	}
}

func drainLog(l *outLog, c *outCursor, max int64) (string, []piece, bool) {
	pieces, closed, _, _ := l.read(c, max, nil)
	var b strings.Builder
	for _, p := range pieces {
		b.Write(p.data)
	}
	return b.String(), pieces, closed
}

func TestOutLog(t *testing.T) {
	l := newOutLog(10)
	l.write("stdout", []byte("abc"))
	l.write("stdout", []byte("de")) // joins the chunk
	l.write("stderr", []byte("XY"))
	c := &outCursor{pos: 1}
	got, pieces, closed := drainLog(l, c, 1<<20)
	if got != "bcdeXY" || closed || len(pieces) != 2 || pieces[0].off != 1 || pieces[1].off != 5 || pieces[1].stream != "stderr" {
		t.Fatalf("got %q %+v", got, pieces)
	}
	// The last chunk grows; the cursor stays on it.
	l.write("stderr", []byte("Z"))
	if got, pieces, _ := drainLog(l, c, 1<<20); got != "Z" || pieces[0].off != 7 {
		t.Fatalf("growth: %q %+v", got, pieces)
	}
	// Past the cap of a stream (10 each: head 5, tail 5): its head and
	// tail are kept, the middle dropped and counted; the other stream
	// keeps all of its own.
	l.write("stdout", []byte("12345"))
	l.write("stdout", []byte("6789"))
	if _, _, capped, _ := l.read(&outCursor{pos: 1000}, 8, nil); !capped {
		t.Fatal("a stream past its cap is not reported capped")
	}
	l.close()
	got, pieces, closed = drainLog(l, c, 1<<20)
	if got != "56789" || !closed || pieces[0].off != 12 {
		t.Fatalf("capped: %q %+v closed %v", got, pieces, closed)
	}
	st := l.stats()
	if st.stdout != 14 || st.stderr != 3 || !st.truncated || st.stdoutDropped != 4 || st.stderrDropped != 0 {
		t.Fatalf("stats %+v", st)
	}
	// Pieces are split at max.
	c2 := &outCursor{}
	if _, pieces, _ := drainLog(l, c2, 2); len(pieces) != 8 {
		t.Fatalf("split into %d pieces: %+v", len(pieces), pieces)
	}
	// A cursor past the end gets nothing.
	if got, _, closed := drainLog(l, &outCursor{pos: 50}, 8); got != "" || !closed {
		t.Fatalf("past end %q", got)
	}
}

func TestTarPath(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"a/b", "a/b", true},
		{"./a//b/", "a/b", true},
		{".", "", true},
		{"./", "", true},
		{"a/./b", "a/b", true},
		{"..", "", false},
		{"../a", "", false},
		{"a/../../b", "", false},
		{"a/../b", "", false}, // refused, not rewritten
		{"/etc/passwd", "", false},
		{"a\x00b", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := tarPath(tt.in)
			if (err == nil) != tt.ok || got != tt.want {
				t.Fatalf("tarPath(%q) = %q, %v", tt.in, got, err)
			}
			var pe *agentproto.Error
			if err != nil && (!errors.As(err, &pe) || pe.Code != agentproto.CodeInvalidArgument) {
				t.Fatalf("error class %v", err)
			}
		})
	}
}

// An exit reaped before start registered its pid is kept and claimed; one
// older than the fork (an earlier process with the same pid) is not.
func TestReaperUnclaimed(t *testing.T) {
	r := &reaper{waiters: map[int]chan exitStatus{}, unclaimed: map[int]exitStatus{}}
	r.dispatch(4242, exitStatus{ws: 3 << 8, when: time.Now().Add(time.Hour)})
	pid, ch, err := r.start(func() (int, error) { return 4242, nil })
	if err != nil || pid != 4242 {
		t.Fatal(pid, err)
	}
	select {
	case st := <-ch:
		if st.ws.ExitStatus() != 3 {
			t.Fatalf("status %v", st.ws)
		}
	default:
		t.Fatal("unclaimed status not delivered")
	}

	r.dispatch(4343, exitStatus{ws: 0, when: time.Now().Add(-time.Hour)})
	_, ch, _ = r.start(func() (int, error) { return 4343, nil })
	select {
	case st := <-ch:
		t.Fatalf("stale status delivered: %v", st)
	default:
	}
	r.dispatch(4343, exitStatus{ws: 1 << 8, when: time.Now()})
	if st := <-ch; st.ws.ExitStatus() != 1 {
		t.Fatalf("status %v", st.ws)
	}

	// Unclaimed statuses are bounded.
	for pid := range maxUnclaimed + 100 {
		r.dispatch(100000+pid, exitStatus{when: time.Now()})
	}
	if len(r.unclaimed) > maxUnclaimed {
		t.Fatalf("%d unclaimed kept", len(r.unclaimed))
	}
}
