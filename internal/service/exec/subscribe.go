package exec

import (
	"context"
	"io"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentproto"
)

// Event is one item of an exec's event stream as the API sends it.
type Event struct {
	// Type is EventOutput or EventExit.
	Type string
	// Stream is StreamStdout, StreamStderr or StreamPTY (output).
	Stream string
	// Offset is the position of Data in the exec's combined output.
	Offset int64
	Data   []byte
	// Result is set on the exit event (without output).
	Result *api.ExecResult
}

// Subscription follows an exec's events from an offset. Output that was
// dropped under the cap before the subscriber read it is skipped: the next
// event's offset says where the output resumes.
type Subscription struct {
	t        *tracker
	next     int64
	sentExit bool
}

func (t *tracker) subscribe(from int64) *Subscription {
	return &Subscription{t: t, next: max(from, 0)}
}

// Next returns the next event. When idle elapses first it returns ok=false
// (time for a heartbeat). After the exit event it returns io.EOF.
func (s *Subscription) Next(ctx context.Context, idle time.Duration) (ev Event, ok bool, err error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		t := s.t
		t.mu.Lock()
		if p, ok := t.out.Next(s.next, 0); ok {
			s.next = p.End()
			t.mu.Unlock()
			return Event{Type: agentproto.EventOutput, Stream: p.Stream, Offset: p.Off, Data: p.Data}, true, nil
		}
		if t.result != nil {
			res := *t.result
			t.mu.Unlock()
			if s.sentExit {
				return Event{}, false, io.EOF
			}
			s.sentExit = true
			return Event{Type: agentproto.EventExit, Result: &res}, true, nil
		}
		wait := t.notify
		t.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(idle)
		}
		select {
		case <-wait:
		case <-timer.C:
			return Event{}, false, nil
		case <-ctx.Done():
			return Event{}, false, ctx.Err()
		}
	}
}
