package network

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// nsRunner runs code in the network namespace the Manager's host side lives
// in: the daemon's own, or (in tests) one given by path.
type nsRunner struct {
	f *os.File // nil: the calling thread's own namespace
}

func openNS(path string) (*nsRunner, error) {
	if path == "" {
		// The daemon's own namespace, pinned now by descriptor: later calls
		// can come from threads that joined a sandbox's namespace (wireVeth
		// runs on one), where "the calling thread's namespace" would be the
		// sandbox's, not the host's.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		path = "/proc/thread-self/ns/net"
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening host network namespace: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil || st.Type != unix.NSFS_MAGIC {
		f.Close()
		return nil, fmt.Errorf("%s is not a network namespace", path)
	}
	return &nsRunner{f: f}, nil
}

func (n *nsRunner) close() {
	if n.f != nil {
		n.f.Close()
	}
}

// fd is the namespace's descriptor for netlink libraries, 0 for "current".
func (n *nsRunner) fd() int {
	if n.f == nil {
		return 0
	}
	return int(n.f.Fd())
}

// run calls fn on a thread in the namespace. Sockets fn creates stay in the
// namespace whichever thread later uses them.
func (n *nsRunner) run(fn func() error) error {
	if n.f == nil {
		return fn()
	}
	return inNetNS(int(n.f.Fd()), fn)
}

// inNetNS calls fn on a fresh OS thread that joined the network namespace
// nsfd. The thread is never unlocked, so the runtime ends it with the
// goroutine: no other goroutine can ever run in the wrong namespace.
func inNetNS(nsfd int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("entering network namespace: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// listen opens a TCP listener in the namespace.
func (n *nsRunner) listen(ctx context.Context, addr string) (net.Listener, error) {
	var ln net.Listener
	err := n.run(func() error {
		var err error
		ln, err = freebindLC.Listen(ctx, "tcp4", addr)
		return err
	})
	return ln, err
}

// listenPacket opens a UDP socket in the namespace.
func (n *nsRunner) listenPacket(ctx context.Context, addr string) (net.PacketConn, error) {
	var pc net.PacketConn
	err := n.run(func() error {
		var err error
		pc, err = freebindLC.ListenPacket(ctx, "udp4", addr)
		return err
	})
	return pc, err
}

// dial connects from the namespace.
func (n *nsRunner) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.run(func() error {
		var err error
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// writeSysctl writes a /proc/sys/net value in the namespace.
func (n *nsRunner) writeSysctl(name, value string) error {
	return n.run(func() error { return writeProcSys(name, value) })
}

// writeProcSys writes a sysctl of the calling thread's network namespace:
// /proc/sys/net resolves against the namespace of the thread that opens it.
func writeProcSys(name, value string) error {
	f, err := os.OpenFile(filepath.Join("/proc/sys", name), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// freebindLC binds listeners with IP_FREEBIND, so that binding a gateway
// address never races the kernel installing its local route.
var freebindLC = net.ListenConfig{
	Control: func(network, address string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1)
		})
		if err != nil {
			return err
		}
		return serr
	},
}

// makeSharedDir makes dir a mount point with shared propagation, as
// `ip netns` does for /run/netns: namespace bind mounts under it are then
// also unmounted from mount namespaces cloned from ours after they were
// made (a copy elsewhere would keep the namespace alive).
func makeSharedDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == nil {
		return nil // already a mount point of its own
	}
	if !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("making %s shared: %w", dir, err)
	}
	if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mounting %s: %w", dir, err)
	}
	if err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		return fmt.Errorf("making %s shared: %w", dir, err)
	}
	return nil
}

// isNetNSMount reports whether path is a bind mount of a network namespace.
func isNetNSMount(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// unmountNetNS removes a namespace bind mount and its file; a missing one is
// not an error.
func unmountNetNS(path string) error {
	// Mounted twice (a crash between two setups) unmounts twice.
	for i := 0; i < 4 && isNetNSMount(path); i++ {
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmounting network namespace: %w", err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
