package oci

import (
	"errors"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// unixPair returns both ends of a connected unix stream socket pair.
func unixPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]*net.UnixConn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "pair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c.(*net.UnixConn)
		t.Cleanup(func() { c.Close() })
	}
	return conns[0], conns[1]
}

// TestSealOnReply: the socket dir is sealed once, when the agent's first
// bytes arrive and before the reader sees them, never at connect time
// (the agent still sets up its socket then: sealing early killed it); a
// failed seal closes the connection.
func TestSealOnReply(t *testing.T) {
	client, agent := unixPair(t)
	seals := 0
	conn := sealOnReply(client, func() error { seals++; return nil })
	if _, err := conn.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if seals != 0 {
		t.Fatalf("sealed %d times before the agent answered", seals)
	}
	buf := make([]byte, 5)
	if _, err := agent.Read(buf); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := agent.Write([]byte("reply")); err != nil {
			t.Fatal(err)
		}
		if n, err := conn.Read(buf); err != nil || string(buf[:n]) != "reply" {
			t.Fatalf("Read = %q, %v", buf[:n], err)
		}
	}
	if seals != 1 {
		t.Errorf("sealed %d times after two replies, want once", seals)
	}

	client, agent = unixPair(t)
	boom := errors.New("boom")
	conn = sealOnReply(client, func() error { return boom })
	agent.Write([]byte("reply"))
	if _, err := conn.Read(buf); !errors.Is(err, boom) {
		t.Errorf("Read with a failed seal = %v, want its error", err)
	}
	if _, err := conn.Write([]byte("x")); err == nil {
		t.Error("the connection still works after a failed seal")
	}
}
