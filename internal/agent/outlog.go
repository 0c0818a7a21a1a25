package agent

import (
	"sort"
	"sync"
)

// chunk is one read of a process's output, placed in the combined log.
type chunk struct {
	stream string
	off    int64 // offset of the first byte in the log
	n      int64
}

// outLog is an exec's combined output log: stdout and stderr (or the PTY)
// appended in the order they were read, each byte at a fixed offset, kept up
// to a cap. Output past the cap is counted and discarded, so a chatty process
// never blocks on a full pipe. Readers attach at any offset and follow.
type outLog struct {
	mu        sync.Mutex
	buf       []byte // the log; bytes once written never change
	chunks    []chunk
	max       int64
	truncated bool
	counts    map[string]int64 // all bytes read per stream, also discarded ones
	closed    bool             // no more output will come
	notify    chan struct{}    // closed and replaced on every change
}

func newOutLog(max int64) *outLog {
	return &outLog{max: max, counts: make(map[string]int64, 2), notify: make(chan struct{})}
}

// write appends p read from stream; p is copied.
func (l *outLog) write(stream string, p []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.counts[stream] += int64(len(p))
	room := l.max - int64(len(l.buf))
	if room <= 0 {
		l.truncated = true
		return
	}
	if int64(len(p)) > room {
		p = p[:room]
		l.truncated = true
	}
	off := int64(len(l.buf))
	if n := len(l.chunks); n > 0 && l.chunks[n-1].stream == stream {
		// Adjacent output of one stream is one chunk: fewer events.
		l.chunks[n-1].n += int64(len(p))
	} else {
		l.chunks = append(l.chunks, chunk{stream: stream, off: off, n: int64(len(p))})
	}
	l.buf = append(l.buf, p...)
	close(l.notify)
	l.notify = make(chan struct{})
}

// close marks the end of output and wakes every reader.
func (l *outLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	close(l.notify)
}

// stats returns the per-stream byte counts and the truncated flag.
func (l *outLog) stats() (stdout, stderr int64, truncated bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts["stdout"] + l.counts["pty"], l.counts["stderr"], l.truncated
}

// piece is output handed to a reader; data aliases the log, which never
// changes bytes once written.
type piece struct {
	stream string
	off    int64
	data   []byte
}

// outCursor is a reader's position in an outLog.
type outCursor struct {
	pos    int64 // next offset to deliver
	idx    int   // index of the chunk holding pos (or len(chunks))
	seeked bool
}

// read returns the output from the cursor on that the log holds now, in
// pieces of at most max bytes, and advances the cursor. If the cursor falls
// inside a chunk, the tail of that chunk comes first. closed reports that no
// more output will come after these pieces; changed is closed on the next
// change of the log.
func (l *outLog) read(c *outCursor, max int64, pieces []piece) (_ []piece, closed bool, changed <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !c.seeked {
		c.seeked = true
		c.idx = sort.Search(len(l.chunks), func(i int) bool { return l.chunks[i].off+l.chunks[i].n > c.pos })
	}
	for ; c.idx < len(l.chunks); c.idx++ {
		ch := l.chunks[c.idx]
		end := ch.off + ch.n
		for start := max64(ch.off, c.pos); start < end; {
			n := min(end-start, max)
			pieces = append(pieces, piece{stream: ch.stream, off: start, data: l.buf[start : start+n : start+n]})
			start += n
			c.pos = start
		}
		if c.idx == len(l.chunks)-1 {
			// The last chunk can still grow: stay on it.
			break
		}
	}
	return pieces, l.closed, l.notify
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}
