package build

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// defaultLogMax is how much of a build's log is kept: enough for the
// output of a big apt-get; beyond it the head is dropped, the tail (where
// failures are) kept.
const defaultLogMax = 4 << 20

// buildLog is a build's log: appended to by the build, read from any offset
// by any number of followers. Offsets count every byte ever written, so a
// follower that re-attaches with its last offset continues exactly.
type buildLog struct {
	mu    sync.Mutex
	buf   []byte
	start int64 // offset of buf[0]
	max   int
	done  bool
	wake  chan struct{} // closed and replaced at every write and at close
	began time.Time
}

func newBuildLog(max int) *buildLog {
	if max <= 0 {
		max = defaultLogMax
	}
	return &buildLog{max: max, wake: make(chan struct{}), began: time.Now()}
}

// Write appends p.
func (l *buildLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return len(p), nil
	}
	l.buf = append(l.buf, p...)
	if over := len(l.buf) - l.max; over > 0 {
		l.buf = append(l.buf[:0:0], l.buf[over:]...)
		l.start += int64(over)
	}
	close(l.wake)
	l.wake = make(chan struct{})
	return len(p), nil
}

// logf writes one progress line with the seconds since the build began.
func (l *buildLog) logf(format string, args ...any) {
	fmt.Fprintf(l, "[%6.1fs] %s\n", time.Since(l.began).Seconds(), fmt.Sprintf(format, args...))
}

// close marks the end of the log: followers get io.EOF after the rest.
func (l *buildLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.done = true
		close(l.wake)
	}
}

// bytes returns the retained log.
func (l *buildLog) bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]byte(nil), l.buf...)
}

// read returns what is retained from offset from on, the offset after it,
// and whether the log is complete (nothing will follow). If from is before
// what is retained, the data starts at the oldest byte kept.
func (l *buildLog) read(from int64) ([]byte, int64, bool, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if from < l.start {
		from = l.start
	}
	end := l.start + int64(len(l.buf))
	if from > end {
		from = end
	}
	data := append([]byte(nil), l.buf[from-l.start:]...)
	return data, end, l.done, l.wake
}

// LogFollower reads a build's log as it grows.
type LogFollower struct {
	log    *buildLog
	offset int64
	// final holds the whole log of a build that ended before it was
	// followed (read back from the store).
	final []byte
}

// Next returns the next chunk of the log and its offset, waiting up to
// wait for one; ok is false on a timeout with nothing new, done is true
// once the log is complete and everything was returned.
func (f *LogFollower) Next(ctx context.Context, wait time.Duration) (data []byte, offset int64, ok, done bool, err error) {
	if f.log == nil {
		if f.offset >= int64(len(f.final)) {
			return nil, f.offset, false, true, nil
		}
		data, offset = f.final[f.offset:], f.offset
		f.offset = int64(len(f.final))
		return data, offset, true, false, nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		data, end, complete, wake := f.log.read(f.offset)
		if len(data) > 0 {
			offset = end - int64(len(data))
			f.offset = end
			return data, offset, true, false, nil
		}
		if complete {
			return nil, end, false, true, nil
		}
		select {
		case <-wake:
		case <-t.C:
			return nil, f.offset, false, false, nil
		case <-ctx.Done():
			return nil, f.offset, false, false, ctx.Err()
		}
	}
}
