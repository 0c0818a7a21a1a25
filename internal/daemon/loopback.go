package daemon

import (
	"net"
	"strings"

	"golang.org/x/sys/unix"
)

// localCongestion are the TCP congestion controls, in order of preference,
// that an API connection from this host gets in place of a pacing one
// (see tuneLocal): cubic is the kernel's usual default, reno is built into
// every kernel.
var localCongestion = []string{"cubic", "reno"}

// tuneLocal gives a TCP connection whose peer is on this host (a loopback
// address, or this host's own address at both ends) a congestion control
// that does not pace, when the host's choice is BBR. BBR paces every
// connection, and without the fq qdisc TCP paces by itself with timers:
// on loopback there is no path to probe, and on a 2-vCPU PVM guest the
// pacing halved a 100 MiB download (docs/benchmarks.md). Remote clients keep
// the host's choice. Best effort: the connection works either way.
func tuneLocal(c net.Conn) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	la, lok := tc.LocalAddr().(*net.TCPAddr)
	ra, rok := tc.RemoteAddr().(*net.TCPAddr)
	if !lok || !rok || !isLocal(la, ra) {
		return
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		cur, err := unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
		if err != nil || !strings.HasPrefix(cur, "bbr") {
			return
		}
		for _, cc := range localCongestion {
			if unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, cc) == nil {
				return
			}
		}
	})
}

// isLocal reports whether a connection between la (ours) and ra is on
// this host: from a loopback address, or with the same address at both
// ends (a client dialling this host's own address).
func isLocal(la, ra *net.TCPAddr) bool {
	return ra.IP.IsLoopback() || ra.IP.Equal(la.IP)
}
