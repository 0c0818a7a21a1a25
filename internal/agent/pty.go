package agent

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal pair. The master is non-blocking and lives
// in Go's poller, so reading it parks no thread and honours deadlines (which
// is why it is opened here and not with creack/pty, whose Open switches the
// master to blocking mode through File.Fd). The slave is a raw blocking fd
// for the child.
func openPTY(cols, rows uint16) (master *os.File, slave int, err error) {
	mfd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, -1, fmt.Errorf("opening /dev/ptmx: %w", err)
	}
	n, err := unix.IoctlGetUint32(mfd, unix.TIOCGPTN)
	if err != nil {
		unix.Close(mfd)
		return nil, -1, fmt.Errorf("pty number: %w", err)
	}
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(mfd)
		return nil, -1, fmt.Errorf("unlocking pty: %w", err)
	}
	if cols == 0 {
		cols = 80
	}
	if rows == 0 {
		rows = 24
	}
	if err := unix.IoctlSetWinsize(mfd, unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: rows}); err != nil {
		unix.Close(mfd)
		return nil, -1, fmt.Errorf("sizing pty: %w", err)
	}
	sfd, err := unix.Open("/dev/pts/"+strconv.FormatUint(uint64(n), 10), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(mfd)
		return nil, -1, fmt.Errorf("opening pty slave: %w", err)
	}
	return os.NewFile(uintptr(mfd), "ptmx"), sfd, nil
}

// resizePTY sets the terminal size of a master.
func resizePTY(master *os.File, cols, rows uint16) error {
	rc, err := master.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: rows})
	}); err != nil {
		return err
	}
	return ierr
}
