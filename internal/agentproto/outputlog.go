package agentproto

import "sort"

// OutputLog holds an exec's output under a cap per stream, the same way in
// the agent (which reads the process's pipes) and in the daemon (which keeps
// what the agent sent, masked): each stream keeps its first half-cap bytes
// (the head) and its last half-cap bytes (the tail); the bytes in between
// are dropped and counted. So a program that floods stdout and then crashes
// still has the first lines of its output and its traceback on stderr.
//
// Every byte has a fixed offset in the exec's combined output (stdout and
// stderr in arrival order), whether it is kept or not: a reader that asks
// for an offset that was dropped gets the next kept byte, at its own offset,
// and sees the gap as a jump. Bytes once added never change: pieces handed
// out alias the log. OutputLog is not safe for concurrent use.
type OutputLog struct {
	// cap is the per-stream cap (0: unlimited).
	cap     int64
	streams [3]streamLog
	// end is the offset after the last byte added: offsets only grow.
	end int64
}

// OutputPiece is a run of one stream's output at an offset of the combined
// output.
type OutputPiece struct {
	Stream string
	Off    int64
	Data   []byte
}

// End is the offset after the piece's last byte.
func (p OutputPiece) End() int64 { return p.Off + int64(len(p.Data)) }

// maxPieceBytes bounds one piece: adjacent output of a stream is joined into
// one piece up to this size, and the tail drops whole pieces from its front,
// so a piece must be small against the tail for memory to track the cap.
const maxPieceBytes = 64 << 10

// streamLog is one stream's head and tail.
type streamLog struct {
	head, tail []OutputPiece
	// headN and tailN are the bytes in head and tail.
	headN, tailN int64
	// headDone is set once the head is full: later bytes go to the tail.
	headDone bool
	// added counts every byte added, dropped those dropped.
	added, dropped int64
}

// NewOutputLog returns a log that keeps at most capPerStream bytes of each
// stream (half of it as the head, the rest as the tail); 0 keeps all.
func NewOutputLog(capPerStream int64) *OutputLog {
	return &OutputLog{cap: max(capPerStream, 0)}
}

func streamIndex(s string) int {
	switch s {
	case StreamStderr:
		return 1
	case StreamPTY:
		return 2
	}
	return 0
}

var streamNames = [3]string{StreamStdout, StreamStderr, StreamPTY}

// maxPieces bounds the pieces of one half: many tiny writes alternating
// between stdout and stderr cannot be joined, and each piece costs about
// as much as 64 bytes of output, so the count, not only the bytes, is
// bounded (such a half then keeps fewer bytes than its cap).
func (l *OutputLog) maxPieces(half int64) int { return int(half/64) + 64 }

// halves returns the head and tail caps.
func (l *OutputLog) halves() (head, tail int64) {
	return l.cap / 2, l.cap - l.cap/2
}

// Add appends data read from stream at offset off (data is copied). Offsets
// must grow: bytes below the end of what was added before are ignored (a
// peer that repeats itself cannot rewrite the log).
func (l *OutputLog) Add(stream string, off int64, data []byte) {
	if off < l.end {
		skip := l.end - off
		if skip >= int64(len(data)) {
			return
		}
		data, off = data[skip:], l.end
	}
	if len(data) == 0 {
		return
	}
	l.end = off + int64(len(data))
	i := streamIndex(stream)
	s, name := &l.streams[i], streamNames[i]
	s.added += int64(len(data))
	if l.cap == 0 {
		var k int
		s.head, k = appendPiece(s.head, name, off, data, 0)
		s.headN += int64(k)
		return
	}
	headCap, tailCap := l.halves()
	if !s.headDone {
		n := min(headCap-s.headN, int64(len(data)))
		var k int
		s.head, k = appendPiece(s.head, name, off, data[:n], l.maxPieces(headCap))
		s.headN += int64(k)
		if s.headN >= headCap || int64(k) < n {
			// Full (of bytes, or of pieces): the rest is the tail's.
			s.headDone = true
		}
		data, off = data[k:], off+int64(k)
	}
	if len(data) == 0 {
		return
	}
	if int64(len(data)) > tailCap {
		// Only its end can stay.
		cut := int64(len(data)) - tailCap
		s.dropped += cut
		data, off = data[cut:], off+cut
	}
	var k int
	s.tail, k = appendPiece(s.tail, name, off, data, 0)
	s.tailN += int64(k)
	for s.tailN > tailCap || len(s.tail) > l.maxPieces(tailCap) {
		f := &s.tail[0]
		excess := s.tailN - tailCap
		if excess <= 0 || excess >= int64(len(f.Data)) {
			n := int64(len(f.Data))
			s.tailN -= n
			s.dropped += n
			s.tail[0] = OutputPiece{}
			s.tail = s.tail[1:]
			continue
		}
		// Reslicing the front changes no byte a reader may hold.
		f.Data = f.Data[excess:]
		f.Off += excess
		s.tailN -= excess
		s.dropped += excess
	}
	if len(s.tail) == 0 {
		s.tail = nil
	}
}

// joinable reports whether output at off continues the last piece.
func joinable(ps []OutputPiece, off int64) bool {
	if len(ps) == 0 {
		return false
	}
	last := ps[len(ps)-1]
	return last.End() == off && len(last.Data) < maxPieceBytes
}

// appendPiece adds data at off to ps, joining it to the last piece when it
// continues it, and returns how many bytes it added: with limit > 0 it
// starts no piece beyond the limit.
func appendPiece(ps []OutputPiece, stream string, off int64, data []byte, limit int) (_ []OutputPiece, added int) {
	if joinable(ps, off) {
		last := &ps[len(ps)-1]
		k := min(maxPieceBytes-len(last.Data), len(data))
		// Bytes past len are not visible to anyone holding the piece, so
		// appending in place changes no byte that was handed out.
		last.Data = append(last.Data, data[:k]...)
		data, off, added = data[k:], off+int64(k), k
	}
	for len(data) > 0 {
		if limit > 0 && len(ps) >= limit {
			break
		}
		k := min(maxPieceBytes, len(data))
		ps = append(ps, OutputPiece{Stream: stream, Off: off, Data: append(make([]byte, 0, k), data[:k]...)})
		data, off, added = data[k:], off+int64(k), added+k
	}
	return ps, added
}

// Next returns the first kept output at or after offset from, at most max
// bytes of one piece (max <= 0: the whole piece); ok is false when there is
// none (yet).
func (l *OutputLog) Next(from, max int64) (p OutputPiece, ok bool) {
	for i := range l.streams {
		s := &l.streams[i]
		for _, part := range [2][]OutputPiece{s.head, s.tail} {
			j := sort.Search(len(part), func(k int) bool { return part[k].End() > from })
			if j < len(part) && (!ok || part[j].Off < p.Off) {
				p, ok = part[j], true
			}
			if j < len(part) {
				break // the tail comes after the head
			}
		}
	}
	if !ok {
		return OutputPiece{}, false
	}
	if p.Off < from {
		p.Data, p.Off = p.Data[from-p.Off:], from
	}
	if max > 0 && int64(len(p.Data)) > max {
		p.Data = p.Data[:max:max]
	} else {
		p.Data = p.Data[:len(p.Data):len(p.Data)]
	}
	return p, true
}

// Rewrite replaces the kept bytes at the offsets of fix; offsets that were
// dropped (or never added) are ignored. It is the one exception to bytes
// never changing, for a daemon that masked bytes provisionally while they
// streamed: a piece it changes is copied first, so pieces handed out before
// keep the bytes they had.
func (l *OutputLog) Rewrite(fix map[int64]byte) {
	if len(fix) == 0 {
		return
	}
	copied := map[*OutputPiece]bool{}
	for off, b := range fix {
		for i := range l.streams {
			s := &l.streams[i]
			for _, part := range [2][]OutputPiece{s.head, s.tail} {
				j := sort.Search(len(part), func(k int) bool { return part[k].End() > off })
				if j == len(part) || part[j].Off > off {
					continue
				}
				p := &part[j]
				if !copied[p] {
					p.Data = append([]byte(nil), p.Data...)
					copied[p] = true
				}
				p.Data[off-p.Off] = b
			}
		}
	}
}

// Pieces returns every kept piece in offset order.
func (l *OutputLog) Pieces() []OutputPiece {
	var out []OutputPiece
	for from := int64(0); ; {
		p, ok := l.Next(from, 0)
		if !ok {
			return out
		}
		out = append(out, p)
		from = p.End()
	}
}

// Stream returns one stream's kept bytes (head, then tail) and how many of
// them are the head: when bytes were dropped, they were between the two.
func (l *OutputLog) Stream(stream string) (data []byte, headLen int) {
	s := &l.streams[streamIndex(stream)]
	data = make([]byte, 0, s.headN+s.tailN)
	for _, p := range s.head {
		data = append(data, p.Data...)
	}
	headLen = len(data)
	for _, p := range s.tail {
		data = append(data, p.Data...)
	}
	return data, headLen
}

// OutputStats counts one stream's bytes.
type OutputStats struct {
	// Added is every byte added, Kept those the log holds, Dropped those it
	// dropped (Added = Kept + Dropped).
	Added, Kept, Dropped int64
}

// Stats returns stream's counts.
func (l *OutputLog) Stats(stream string) OutputStats {
	s := &l.streams[streamIndex(stream)]
	return OutputStats{Added: s.added, Kept: s.headN + s.tailN, Dropped: s.dropped}
}

// Dropped reports whether any stream dropped bytes.
func (l *OutputLog) Dropped() bool {
	for i := range l.streams {
		if l.streams[i].dropped > 0 {
			return true
		}
	}
	return false
}

// End is the offset after the last byte added (kept or not).
func (l *OutputLog) End() int64 { return l.end }

// Kept is the bytes the log holds, all streams together.
func (l *OutputLog) Kept() int64 {
	var n int64
	for i := range l.streams {
		n += l.streams[i].headN + l.streams[i].tailN
	}
	return n
}
