package client

import (
	"errors"
	"io"
	"strings"
	"testing"
)

func TestSSEReader(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []sseEvent
		wantErr error
		touches int
	}{
		{name: "two events", in: "event: start\ndata: {\"id\":\"ex_1\"}\n\nevent: exit\ndata: {}\n\n",
			want: []sseEvent{{Event: "start", Data: `{"id":"ex_1"}`}, {Event: "exit", Data: "{}"}}, wantErr: io.EOF, touches: 6},
		{name: "crlf and no space after colon", in: "event:stdout\r\ndata:{\"data\":\"a\"}\r\n\r\n",
			want: []sseEvent{{Event: "stdout", Data: `{"data":"a"}`}}, wantErr: io.EOF, touches: 3},
		{name: "heartbeats and blank lines are skipped", in: ": ping\n\n\n: ping\n\nevent: x\ndata: 1\n\n",
			want: []sseEvent{{Event: "x", Data: "1"}}, wantErr: io.EOF, touches: 8},
		{name: "multi-line data is joined with newlines", in: "data: a\ndata: b\nid: 7\n\n",
			want: []sseEvent{{Data: "a\nb", ID: "7"}}, wantErr: io.EOF, touches: 4},
		{name: "event without data is not dispatched", in: "event: lonely\n\nevent: y\ndata: 2\n\n",
			want: []sseEvent{{Event: "y", Data: "2"}}, wantErr: io.EOF, touches: 5},
		{name: "cut inside an event", in: "event: stdout\ndata: {\"da", wantErr: io.ErrUnexpectedEOF, touches: 1},
		{name: "cut before the blank line", in: "event: stdout\ndata: {}\n", wantErr: io.ErrUnexpectedEOF, touches: 2},
		{name: "line over the limit", in: "data: " + strings.Repeat("x", maxSSELine+1) + "\n\n", wantErr: errSSELineTooLong},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			touches := 0
			r := newSSEReader(strings.NewReader(tt.in), func() { touches++ })
			var got []sseEvent
			var err error
			for {
				var ev sseEvent
				ev, err = r.next()
				if err != nil {
					break
				}
				got = append(got, ev)
			}
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("final error %v, want %v", err, tt.wantErr)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("events %+v, want %+v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("event %d = %+v, want %+v", i, got[i], tt.want[i])
				}
			}
			if tt.touches != 0 && touches != tt.touches {
				t.Errorf("touches = %d, want %d (one per line read)", touches, tt.touches)
			}
		})
	}
}

func TestIsEventStream(t *testing.T) {
	for ct, want := range map[string]bool{
		"text/event-stream": true, "text/event-stream; charset=utf-8": true, "Text/Event-Stream": true,
		"application/json": false, "": false,
	} {
		if got := isEventStream(ct); got != want {
			t.Errorf("isEventStream(%q) = %v, want %v", ct, got, want)
		}
	}
}
