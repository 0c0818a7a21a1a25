package daemon

import (
	"context"
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// acceptWith accepts one loopback connection on a listener whose sockets
// use congestion control cc, or skips when this kernel cannot give it.
func acceptWith(t *testing.T, cc string) net.Conn {
	t.Helper()
	var setErr error
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) {
			setErr = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, cc)
		})
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if setErr != nil {
		t.Skipf("congestion control %s not available here: %v", cc, setErr)
	}
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func congestion(t *testing.T, c net.Conn) string {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var cc string
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		cc, gerr = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
	}); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	return cc
}

// TestTuneLocal checks that a connection from this host loses BBR's
// pacing and that any other congestion control is left alone.
func TestTuneLocal(t *testing.T) {
	t.Run("bbr", func(t *testing.T) {
		conn := acceptWith(t, "bbr")
		tuneLocal(conn)
		if cc := congestion(t, conn); cc != "cubic" && cc != "reno" {
			t.Errorf("congestion control %q after tuneLocal, want cubic or reno", cc)
		}
	})
	t.Run("reno_kept", func(t *testing.T) {
		conn := acceptWith(t, "reno")
		tuneLocal(conn)
		if cc := congestion(t, conn); cc != "reno" {
			t.Errorf("congestion control %q, want reno kept", cc)
		}
	})
	t.Run("not_tcp", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		tuneLocal(a) // no socket: nothing to do, and no panic
	})
}

func TestIsLocal(t *testing.T) {
	addr := func(s string) *net.TCPAddr { return &net.TCPAddr{IP: net.ParseIP(s), Port: 7070} }
	for _, tt := range []struct {
		local, remote string
		want          bool
	}{
		{"127.0.0.1", "127.0.0.1", true},
		{"127.0.0.1", "127.0.0.2", true},
		{"::1", "::1", true},
		{"10.1.2.3", "10.1.2.3", true}, // this host's own address at both ends
		{"10.1.2.3", "10.1.2.4", false},
		{"0.0.0.0", "192.0.2.7", false},
	} {
		if got := isLocal(addr(tt.local), addr(tt.remote)); got != tt.want {
			t.Errorf("isLocal(%s, %s) = %v, want %v", tt.local, tt.remote, got, tt.want)
		}
	}
}
