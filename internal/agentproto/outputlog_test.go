package agentproto_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// addSeq adds writes in order at consecutive offsets, as the agent does.
func addSeq(l *agentproto.OutputLog, writes ...[2]string) {
	off := l.End()
	for _, w := range writes {
		l.Add(w[0], off, []byte(w[1]))
		off += int64(len(w[1]))
	}
}

func streamText(l *agentproto.OutputLog, s string) string {
	b, _ := l.Stream(s)
	return string(b)
}

func TestOutputLogUnderCap(t *testing.T) {
	l := agentproto.NewOutputLog(100)
	addSeq(l, [2]string{"stdout", "abc"}, [2]string{"stdout", "de"}, [2]string{"stderr", "XY"}, [2]string{"stdout", "f"})
	ps := l.Pieces()
	if len(ps) != 3 || string(ps[0].Data) != "abcde" || ps[1].Off != 5 || ps[1].Stream != "stderr" || ps[2].Off != 7 {
		t.Fatalf("pieces %+v", ps)
	}
	if p, ok := l.Next(1, 2); !ok || string(p.Data) != "bc" || p.Off != 1 {
		t.Fatalf("Next(1, 2) = %+v %v", p, ok)
	}
	if p, ok := l.Next(6, 0); !ok || string(p.Data) != "Y" || p.Off != 6 {
		t.Fatalf("Next(6) = %+v %v", p, ok)
	}
	if _, ok := l.Next(8, 0); ok {
		t.Fatal("Next past the end found output")
	}
	if l.Dropped() || l.Stats("stdout") != (agentproto.OutputStats{Added: 6, Kept: 6}) {
		t.Fatalf("stats %+v", l.Stats("stdout"))
	}
}

// TestOutputLogFloodKeepsTraceback is the case the cap exists for: stdout
// floods, then stderr says why the program died. Each stream keeps its head
// and tail; stderr, small, is whole.
func TestOutputLogFloodKeepsTraceback(t *testing.T) {
	l := agentproto.NewOutputLog(100)
	var writes [][2]string
	for i := range 100 {
		writes = append(writes, [2]string{"stdout", string(rune('a'+i%26)) + strings.Repeat(".", 9)})
	}
	addSeq(l, writes...)
	addSeq(l, [2]string{"stderr", "Traceback: boom\n"})
	var all strings.Builder
	for _, w := range writes {
		all.WriteString(w[1])
	}
	full := all.String()
	out, head := l.Stream("stdout")
	if head != 50 || string(out) != full[:50]+full[len(full)-50:] {
		t.Fatalf("stdout %q (head %d)", out, head)
	}
	if got := streamText(l, "stderr"); got != "Traceback: boom\n" {
		t.Fatalf("stderr %q", got)
	}
	if st := l.Stats("stdout"); st != (agentproto.OutputStats{Added: 1000, Kept: 100, Dropped: 900}) {
		t.Fatalf("stdout stats %+v", st)
	}
	if st := l.Stats("stderr"); st.Dropped != 0 || st.Kept != 16 {
		t.Fatalf("stderr stats %+v", st)
	}
	// Offsets stay those of the whole output: a reader asking for a
	// dropped offset gets the next kept byte, and sees the jump.
	if p, ok := l.Next(50, 0); !ok || p.Off != 950 || p.Stream != "stdout" {
		t.Fatalf("Next(50) = %+v", p)
	}
	if p, ok := l.Next(1000, 0); !ok || p.Off != 1000 || p.Stream != "stderr" {
		t.Fatalf("Next(1000) = %+v", p)
	}
	var replay bytes.Buffer
	for _, p := range l.Pieces() {
		replay.Write(p.Data)
	}
	if replay.String() != full[:50]+full[950:]+"Traceback: boom\n" {
		t.Fatalf("replay %q", replay.String())
	}
}

func TestOutputLogOneBigWrite(t *testing.T) {
	l := agentproto.NewOutputLog(10)
	addSeq(l, [2]string{"stdout", "0123456789abcdefghij"}, [2]string{"stdout", "KLM"})
	if got := streamText(l, "stdout"); got != "01234ijKLM" {
		t.Fatalf("stdout %q", got)
	}
	if st := l.Stats("stdout"); st.Dropped != 13 || st.Kept != 10 || st.Added != 23 {
		t.Fatalf("stats %+v", st)
	}
}

func TestOutputLogPiecesNeverChange(t *testing.T) {
	l := agentproto.NewOutputLog(8)
	addSeq(l, [2]string{"stdout", "abcdef"})
	p, _ := l.Next(4, 0) // the tail's "ef"
	held := string(p.Data)
	addSeq(l, [2]string{"stdout", "ghijklmnop"})
	if string(p.Data) != held {
		t.Fatalf("a handed-out piece changed: %q, was %q", p.Data, held)
	}
	if got := streamText(l, "stdout"); got != "abcdmnop" {
		t.Fatalf("stdout %q", got)
	}
}

func TestOutputLogIgnoresRewrites(t *testing.T) {
	l := agentproto.NewOutputLog(0)
	l.Add("stdout", 0, []byte("hello"))
	l.Add("stderr", 3, []byte("XXXXworld")) // overlaps 3..5: only "XX" past the end is new
	l.Add("stdout", 1, []byte("zz"))        // entirely old
	if got := streamText(l, "stdout") + "|" + streamText(l, "stderr"); got != "hello|XXworld" {
		t.Fatalf("got %q", got)
	}
	if l.End() != 12 {
		t.Fatalf("end %d", l.End())
	}
}

// TestOutputLogBoundsPieces: tiny writes alternating between the streams
// cannot be joined; the number of pieces, not just the bytes, stays bounded.
func TestOutputLogBoundsPieces(t *testing.T) {
	const capPerStream = 1 << 12
	l := agentproto.NewOutputLog(capPerStream)
	for i := range 200_000 {
		s := "stdout"
		if i%2 == 1 {
			s = "stderr"
		}
		addSeq(l, [2]string{s, "x"})
	}
	// head and tail of two streams, each at most cap/2/64+64 pieces
	if n, limit := len(l.Pieces()), 4*(capPerStream/2/64+64); n > limit {
		t.Fatalf("%d pieces kept, want at most %d", n, limit)
	}
	for _, s := range []string{"stdout", "stderr"} {
		st := l.Stats(s)
		if st.Added != 100_000 || st.Kept+st.Dropped != st.Added || st.Kept > capPerStream {
			t.Fatalf("%s stats %+v", s, st)
		}
	}
	// The very last bytes are kept.
	if p, ok := l.Next(199_999, 0); !ok || p.Off != 199_999 {
		t.Fatalf("last byte %+v %v", p, ok)
	}
}

func TestOutputLogZeroTail(t *testing.T) {
	l := agentproto.NewOutputLog(1) // head 0, tail 1
	addSeq(l, [2]string{"stdout", "abc"})
	if got := streamText(l, "stdout"); got != "c" {
		t.Fatalf("stdout %q", got)
	}
}

// TestOutputLogRewrite: Rewrite changes kept bytes only, and a piece handed
// out before keeps the bytes it had (readers may hold it outside any lock).
func TestOutputLogRewrite(t *testing.T) {
	l := agentproto.NewOutputLog(8) // head 4, tail 4 per stream
	l.Add(agentproto.StreamStdout, 0, []byte("ab**"))
	l.Add(agentproto.StreamStderr, 4, []byte("x*"))
	l.Add(agentproto.StreamStdout, 6, []byte("0123456789"))
	before, ok := l.Next(0, 0)
	if !ok || string(before.Data) != "ab**" {
		t.Fatalf("first piece %q %v", before.Data, ok)
	}
	l.Rewrite(map[int64]byte{2: 'c', 3: 'd', 5: 'y', 7: '!', 15: '?'})
	if string(before.Data) != "ab**" {
		t.Errorf("a piece handed out changed to %q", before.Data)
	}
	out, head := l.Stream(agentproto.StreamStdout)
	if string(out) != "abcd678?" || head != 4 {
		t.Errorf("stdout %q (head %d), want abcd678? (4): offset 7 was dropped, 15 kept", out, head)
	}
	if errOut, _ := l.Stream(agentproto.StreamStderr); string(errOut) != "xy" {
		t.Errorf("stderr %q, want xy", errOut)
	}
}
