package agentproto

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
)

// TestSocketBodyRead reads SocketBodies through Read (the path of every
// writer that cannot splice): Head first, then exactly N bytes of Conn, never
// more, and io.ErrUnexpectedEOF when Conn ends early. TakeHead and Advance
// keep Consumed in step.
func TestSocketBodyRead(t *testing.T) {
	tests := []struct {
		name      string
		head      string
		conn      string // what the peer sends before closing
		n         int64
		want      string
		wantErr   error
		splitTake bool // take the head with TakeHead first
	}{
		{"head_only", "abc", "", 0, "abc", nil, false},
		{"head_and_conn", "abc", "defgh", 5, "abcdefgh", nil, false},
		{"conn_has_more", "", "defgh-next-request", 5, "defgh", nil, false},
		{"conn_short", "ab", "cd", 5, "abcd", io.ErrUnexpectedEOF, false},
		{"take_head", "abc", "def", 3, "def", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := net.Pipe()
			t.Cleanup(func() { a.Close() })
			go func() {
				_, _ = b.Write([]byte(tt.conn))
				b.Close()
			}()
			sb := &SocketBody{Head: []byte(tt.head), Conn: a, N: tt.n}
			var taken int
			if tt.splitTake {
				taken = len(sb.TakeHead())
				if sb.Head != nil || sb.Consumed() != int64(taken) {
					t.Fatalf("after TakeHead: head %q, consumed %d", sb.Head, sb.Consumed())
				}
			}
			var got bytes.Buffer
			buf := make([]byte, 3) // small reads cross the head/conn border
			var err error
			for {
				var k int
				k, err = sb.Read(buf)
				got.Write(buf[:k])
				if err != nil {
					break
				}
			}
			if tt.wantErr == nil && err == io.EOF {
				err = nil
			}
			if got.String() != tt.want || !errors.Is(err, tt.wantErr) {
				t.Fatalf("read %q, %v; want %q, %v", got.String(), err, tt.want, tt.wantErr)
			}
			if c := sb.Consumed(); c != int64(taken+got.Len()) {
				t.Errorf("consumed %d, want %d", c, taken+got.Len())
			}
		})
	}
	t.Run("advance", func(t *testing.T) {
		sb := &SocketBody{N: 10}
		sb.Advance(4)
		if sb.N != 6 || sb.Consumed() != 4 {
			t.Fatalf("N %d consumed %d after Advance(4)", sb.N, sb.Consumed())
		}
	})
}
