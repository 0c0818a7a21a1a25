package previews

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/sandbox"
)

// PortDialer is an optional part of a driver.Driver whose sandboxes do not
// share the host kernel's network stack (gVisor's netstack, a microVM):
// it connects to a TCP port on the sandbox's own loopback. Drivers without
// it are dialled from inside the sandbox's network namespace.
type PortDialer interface {
	// DialPort connects to 127.0.0.1:port inside sandbox id.
	DialPort(ctx context.Context, id string, port int) (net.Conn, error)
}

// NetNS is the network backend's part that knows where sandbox id's
// namespace is bind-mounted (sandbox.NetworkOf's value has it).
type NetNS interface {
	NetNSPathOf(id string) (string, bool)
}

// DialSandbox connects to TCP port on the loopback of sandbox id, as a
// process in the sandbox would: the socket is made on a thread that joined
// the sandbox's network namespace, so it works in every network mode and
// needs no route from the host. The sandbox must be running and p's
// tenant's; another tenant's is not found. Previews and SDK port access
// use it. Refused connections wrap errdefs.ErrUnavailable.
func (m *Service) DialSandbox(ctx context.Context, p auth.Principal, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, public(errInvalid, "port %d is out of range", port)
	}
	sb, err := m.sandboxes.Running(ctx, p, id)
	if err != nil {
		return nil, err
	}
	if d, ok := sb.Driver().(PortDialer); ok {
		return d.DialPort(ctx, sb.ID(), port)
	}
	nsf, err := m.sandboxNetNS(ctx, sb)
	if err != nil {
		return nil, err
	}
	defer nsf.Close()
	c, err := dialInNetNS(ctx, int(nsf.Fd()), port)
	if err != nil {
		var se *os.SyscallError
		if errors.As(err, &se) && (errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ECONNRESET)) {
			return nil, &errdefs.Public{Msg: fmt.Sprintf("nothing listens on port %d in the sandbox", port), Err: fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)}
		}
		return nil, fmt.Errorf("dialing port %d in sandbox %s: %w", port, sb.ID(), err)
	}
	return c, nil
}

// sandboxNetNS opens sandbox sb's network namespace: the network backend's
// bind mount when the sandbox joined one, else its init's through a pidfd
// (so that a recycled pid can not lead into another process's namespace).
func (m *Service) sandboxNetNS(ctx context.Context, sb *sandbox.Live) (*os.File, error) {
	if m.netns != nil && sb.Spec().NetNS {
		if path, ok := m.netns.NetNSPathOf(sb.ID()); ok {
			f, err := os.Open(path)
			if err != nil {
				return nil, fmt.Errorf("opening sandbox network namespace: %w", err)
			}
			return f, nil
		}
	}
	st, err := sb.Driver().Inspect(ctx, sb.ID())
	if err != nil {
		return nil, fmt.Errorf("inspecting sandbox: %w", err)
	}
	if st.State != driver.StateRunning || st.Pid <= 0 {
		return nil, public(errdefs.ErrInvalidState, "sandbox is not running")
	}
	pidfd, err := unix.PidfdOpen(st.Pid, 0)
	if err != nil {
		return nil, fmt.Errorf("opening sandbox init: %w", err)
	}
	f := os.NewFile(uintptr(pidfd), "pidfd:"+strconv.Itoa(st.Pid))
	// The pid was the sandbox's init when Inspect ran; check it still is now
	// that the pidfd pins the process.
	again, err := sb.Driver().Inspect(ctx, sb.ID())
	if err != nil || again.Pid != st.Pid || again.State != driver.StateRunning {
		f.Close()
		return nil, public(errdefs.ErrInvalidState, "sandbox is not running")
	}
	return f, nil
}

// dialInNetNS connects to 127.0.0.1:port from a fresh OS thread that joined
// the namespace nsfd (a namespace file or a pidfd). The thread is never
// unlocked, so the runtime ends it with the goroutine and no other
// goroutine ever runs in the sandbox's namespace; the socket stays in it
// whichever thread later uses it.
func dialInNetNS(ctx context.Context, nsfd, port int) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
			done <- result{err: fmt.Errorf("entering sandbox network namespace: %w", err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		done <- result{c, err}
	}()
	r := <-done
	return r.c, r.err
}
