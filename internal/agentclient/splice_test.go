package agentclient_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// tcpSource returns the accepting end of a loopback TCP connection whose
// other end sends data and then closes, like an HTTP client's upload body.
func tcpSource(t *testing.T, data []byte) net.Conn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := ln.Accept()
	if err != nil {
		peer.Close()
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = peer.Write(data) // fails once the test closes conn
		peer.Close()
	}()
	t.Cleanup(func() {
		conn.Close()
		wg.Wait()
	})
	return conn
}

// TestSocketBodyUpload uploads SocketBody sources (read-ahead head, rest in
// a TCP socket) through every transport: spliced on direct unix
// connections, read on the others. The file must hold exactly the bytes.
func TestSocketBodyUpload(t *testing.T) {
	sizes := []int{1, agentproto.DirectChunk, 2*agentproto.DirectChunk + 777}
	heads := []int{0, 100}
	for _, tr := range []transport{viaSocket, viaSession, viaPipe} {
		t.Run(tr.String(), func(t *testing.T) {
			da := startDirectAgent(t, tr)
			ctx := ctxT(t)
			for _, size := range sizes {
				for _, head := range heads {
					head := min(head, size)
					t.Run(fmt.Sprintf("%d_head%d", size, head), func(t *testing.T) {
						data := randomBytes(t, size)
						sb := &agentproto.SocketBody{Head: data[:head], Conn: tcpSource(t, data[head:]), N: int64(size - head)}
						p := fmt.Sprintf("/s/f%d_%d", size, head)
						n, err := da.c.WriteFile(ctx, p, "", 0, sb, 0)
						if err != nil || n != int64(size) {
							t.Fatalf("WriteFile = %d, %v", n, err)
						}
						if sb.Consumed() != int64(size) || sb.N != 0 {
							t.Errorf("body consumed %d, %d left; want %d, 0", sb.Consumed(), sb.N, size)
						}
						if on, err := os.ReadFile(filepath.Join(da.root, p)); err != nil || !bytes.Equal(on, data) {
							t.Fatalf("file on disk differs (%d bytes, %v)", len(on), err)
						}
					})
				}
			}
		})
	}
}

// TestSocketBodyFailures checks a spliced upload whose source ends early
// (the HTTP client left) and one the agent refuses part way: the first
// fails with the source's error, the second with the agent's, and neither
// leaves a file.
func TestSocketBodyFailures(t *testing.T) {
	tests := []struct {
		name     string
		send     int   // bytes the source really has
		n        int64 // bytes announced
		maxBytes int64
		want     error
	}{
		{"source_short", agentproto.DirectChunk + 10, 3 * agentproto.DirectChunk, 0, io.ErrUnexpectedEOF},
		{"source_short_in_first_frame", 1000, 3 * agentproto.DirectChunk, 0, io.ErrUnexpectedEOF},
		{"too_large", 3 * agentproto.DirectChunk, 3 * agentproto.DirectChunk, agentproto.DirectChunk + 1, errdefs.ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			da := startDirectAgent(t, viaSocket)
			ctx := ctxT(t)
			sb := &agentproto.SocketBody{Conn: tcpSource(t, randomBytes(t, tt.send)), N: tt.n}
			if _, err := da.c.WriteFile(ctx, "/partial", "", 0, sb, tt.maxBytes); !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			// The agent notices a broken connection on its own time.
			deadline := time.Now().Add(5 * time.Second)
			for {
				ents, _ := os.ReadDir(da.root)
				if len(ents) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("a failed upload left %v", ents)
				}
				time.Sleep(5 * time.Millisecond)
			}
			if err := da.c.Ping(ctx); err != nil {
				t.Fatalf("session after a failed upload: %v", err)
			}
		})
	}
}

// TestSpliceUploadRecvBuffer checks that a spliced upload bounds the
// client socket's receive buffer: autotuning would grow it to tens of MiB
// on loopback, and the client would run that far ahead.
func TestSpliceUploadRecvBuffer(t *testing.T) {
	da := startDirectAgent(t, viaSocket)
	data := randomBytes(t, 4*agentproto.DirectChunk)
	src := tcpSource(t, data)
	sb := &agentproto.SocketBody{Conn: src, N: int64(len(data))}
	if n, err := da.c.WriteFile(ctxT(t), "/r", "", 0, sb, 0); err != nil || n != int64(len(data)) {
		t.Fatalf("WriteFile = %d, %v", n, err)
	}
	rc, err := src.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var rcvbuf int
	var gerr error
	_ = rc.Control(func(fd uintptr) {
		rcvbuf, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
	})
	if gerr != nil {
		t.Fatal(gerr)
	}
	// The kernel reports twice what was set.
	if rcvbuf > 8*agentproto.DirectChunk {
		t.Errorf("receive buffer %d bytes after the upload, want at most %d", rcvbuf, 8*agentproto.DirectChunk)
	}
}
