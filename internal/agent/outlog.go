package agent

import (
	"sync"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// outLog is an exec's combined output log: stdout and stderr (or the PTY)
// in the order they were read, each byte at a fixed offset. Each stream
// keeps its head and its tail under the exec's cap (agentproto.OutputLog);
// the bytes in between are counted and discarded, so a chatty process
// never blocks on a full pipe and its last words are kept. Readers attach
// at any offset and follow.
type outLog struct {
	mu     sync.Mutex
	log    *agentproto.OutputLog
	next   int64         // offset of the next byte read
	closed bool          // no more output will come
	notify chan struct{} // closed and replaced on every change
	done   chan struct{} // closed by close
}

func newOutLog(max int64) *outLog {
	return &outLog{log: agentproto.NewOutputLog(max), notify: make(chan struct{}), done: make(chan struct{})}
}

// write appends p read from stream; p is copied.
func (l *outLog) write(stream string, p []byte) {
	if len(p) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.log.Add(stream, l.next, p)
	l.next += int64(len(p))
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
	close(l.done)
}

// outStats is what the result says about the output.
type outStats struct {
	stdout, stderr               int64 // all bytes read, also dropped ones; PTY output is stdout
	stdoutDropped, stderrDropped int64
	truncated                    bool
}

func (l *outLog) stats() outStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	o, p, e := l.log.Stats(agentproto.StreamStdout), l.log.Stats(agentproto.StreamPTY), l.log.Stats(agentproto.StreamStderr)
	return outStats{
		stdout: o.Added + p.Added, stderr: e.Added,
		stdoutDropped: o.Dropped + p.Dropped, stderrDropped: e.Dropped,
		truncated: l.log.Dropped(),
	}
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
	pos int64 // next offset to deliver
}

// read returns the output from the cursor on that the log holds now, in
// pieces of at most max bytes, and advances the cursor; output that was
// dropped is skipped (the next piece's offset says where it resumes).
// closed reports that no more output will come after these pieces; changed
// is closed on the next change of the log; capped that output was dropped,
// so a follower should pace itself (agentproto.FollowInterval).
func (l *outLog) read(c *outCursor, max int64, pieces []piece) (_ []piece, closed, capped bool, changed <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		p, ok := l.log.Next(c.pos, max)
		if !ok {
			break
		}
		pieces = append(pieces, piece{stream: p.Stream, off: p.Off, data: p.Data})
		c.pos = p.End()
	}
	if c.pos < l.next && l.closed {
		// Nothing more is kept: the reader is at the end.
		c.pos = l.next
	}
	return pieces, l.closed, l.log.Dropped(), l.notify
}
