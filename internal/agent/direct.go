package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// directConn is a direct connection (see agentproto): it carries one
// request, like a yamux stream, but file data moves on it by splice and
// sendfile instead of through user-space buffers.
type directConn struct{ net.Conn }

// replayConn gives back the byte firstByte consumed before reading on.
type replayConn struct {
	net.Conn
	first []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.first) > 0 {
		n := copy(p, c.first)
		c.first = c.first[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// errServerClosed refuses connections once Close began.
var errServerClosed = errors.New("server closed")

// track registers conn so that Close can end it; the returned func forgets
// it. It fails once the server is closing.
func (s *Server) track(conn net.Conn) (untrack func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errServerClosed
	}
	s.conns[conn] = struct{}{}
	return func() {
		s.mu.Lock()
		delete(s.conns, conn)
		s.mu.Unlock()
	}, nil
}

// firstByte reads the byte that tells a direct connection from a session.
// Close and ctx interrupt the wait.
func (s *Server) firstByte(ctx context.Context, conn net.Conn) (byte, error) {
	untrack, err := s.track(conn)
	if err != nil {
		return 0, err
	}
	defer untrack()
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Unix(1, 0)) })
	var b [1]byte
	_, err = io.ReadFull(conn, b[:])
	if !stop() {
		return 0, context.Cause(ctx)
	}
	return b[0], err
}

// serveDirect checks the rest of the preamble and serves the connection's
// one request.
func (s *Server) serveDirect(ctx context.Context, conn net.Conn) error {
	defer conn.Close()
	untrack, err := s.track(conn)
	if err != nil {
		return nil
	}
	defer untrack()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	rest := make([]byte, len(agentproto.DirectPreamble)-1)
	if _, err := io.ReadFull(conn, rest); err != nil || string(rest) != agentproto.DirectPreamble[1:] {
		return nil // not our protocol: drop it
	}
	growSendBuffer(conn)
	s.handle(ctx, &directConn{conn})
	return ctx.Err()
}

// directSendBuffer is the send buffer asked for on a direct connection. The
// kernel caps it (net.core.wmem_max: the agent has no CAP_NET_ADMIN for
// more), but even the cap halves how often sendfile waits for the daemon.
const directSendBuffer = 4 * agentproto.DirectChunk

// growSendBuffer raises conn's send buffer, best effort.
func growSendBuffer(conn net.Conn) {
	if sc, ok := conn.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			_ = rc.Control(func(fd uintptr) {
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, directSendBuffer)
			})
		}
	}
}

// sendFileDirect sends the first size bytes of f as data frames and an end
// frame, the bytes moved by sendfile(2) from the page cache to the socket.
// The Response before them announced size, so a file that turns out shorter
// (truncated meanwhile) cannot be sent: the connection is broken instead,
// which the client sees as a failed transfer.
func sendFileDirect(dc *directConn, fw *agentproto.FrameWriter, f *os.File, size int64) (agentproto.Response, error) {
	sc, ok := dc.Conn.(syscall.Conn)
	if !ok {
		// Not a socket (tests use in-memory pipes): plain copies.
		n, err := fw.ReadFrom(io.LimitReader(f, size))
		if err == nil && n == size {
			_ = fw.WriteEnd()
		}
		return agentproto.Response{}, errHandled
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return agentproto.Response{}, errHandled
	}
	in := int(f.Fd())
	var off int64
	for off < size {
		n := int(min(size-off, agentproto.DirectChunk))
		if err := fw.WriteHeader(agentproto.FrameData, n); err != nil {
			return agentproto.Response{}, errHandled
		}
		sent := 0
		var serr error
		werr := rc.Write(func(out uintptr) bool {
			for sent < n {
				k, err := unix.Sendfile(int(out), in, &off, n-sent)
				if k > 0 {
					sent += k
				}
				switch {
				case err == unix.EAGAIN:
					return false // wait until the socket drains
				case err == unix.EINTR:
				case err != nil:
					serr = err
					return true
				case k == 0:
					serr = io.ErrUnexpectedEOF // the file shrank
					return true
				}
			}
			return true
		})
		if werr != nil || serr != nil {
			return agentproto.Response{}, errHandled
		}
	}
	_ = fw.WriteEnd()
	return agentproto.Response{}, errHandled
}
