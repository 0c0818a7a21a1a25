package agentclient

import (
	"errors"
	"io"
	"net"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// spliceUpload sends sb as data frames on the direct connection dst, each
// frame's payload moved from sb's socket to dst by splice(2) through a pipe:
// the bytes never enter the daemon's memory, and with MSG_SPLICE_PAGES
// (Linux 6.5+) the kernel passes the pages on instead of copying them.
// (net's own splice does not serve here: it only goes to EOF, and a frame
// needs exactly its announced length.) ok is false, with nothing sent, when
// either side is not a socket that splice serves; the caller then copies.
// A failure reading sb is a *agentproto.SourceError; a frame cut short
// leaves the stream unusable either way.
func spliceUpload(fw *agentproto.FrameWriter, dst net.Conn, sb *agentproto.SocketBody, chunk int) (n int64, ok bool, err error) {
	src, sok := sb.Conn.(*net.TCPConn)
	uc, dok := dst.(*net.UnixConn)
	if !sok || !dok {
		return 0, false, nil
	}
	srcRaw, err := src.SyscallConn()
	if err != nil {
		return 0, false, nil
	}
	dstRaw, err := uc.SyscallConn()
	if err != nil {
		return 0, false, nil
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return 0, false, nil
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	// A frame's worth in one pipe halves the syscalls; without the right
	// to grow it (pipe-max-size), the default 64 KiB still works.
	pipeCap, err := unix.FcntlInt(uintptr(p[0]), unix.F_SETPIPE_SZ, chunk)
	if err != nil {
		if pipeCap, err = unix.FcntlInt(uintptr(p[0]), unix.F_GETPIPE_SZ, 0); err != nil {
			return 0, false, nil
		}
	}

	if head := sb.TakeHead(); len(head) > 0 {
		if err := fw.WriteData(head); err != nil {
			return n, true, err
		}
		n += int64(len(head))
	}
	// A few frames of receive buffer, locked (see spliceRecvBuffer).
	_ = srcRaw.Control(func(fd uintptr) {
		if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, spliceRecvBuffer) != nil {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, spliceRecvBuffer)
		}
	})
	lowat := 1
	defer func() {
		if lowat != 1 {
			// Whoever reads the socket next (draining after an error)
			// must not wait for a megabyte that may never come.
			_ = srcRaw.Control(func(fd uintptr) {
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT, 1)
			})
		}
	}()
	for sb.N > 0 {
		frame := int(min(sb.N, int64(chunk)))
		if err := fw.WriteHeader(agentproto.FrameData, frame); err != nil {
			return n, true, err
		}
		for left := frame; left > 0; {
			want := min(left, pipeCap)
			if lw := min(want, spliceLowat); lw != lowat {
				// Wake when a good part of the pipe can be filled, not
				// for every packet; never above what is still to come.
				lowat = lw
				_ = srcRaw.Control(func(fd uintptr) {
					_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT, lw)
				})
			}
			in, err := spliceIn(srcRaw, p[1], want)
			if err != nil {
				return n, true, &agentproto.SourceError{Err: err}
			}
			if err := spliceOut(dstRaw, p[0], in); err != nil {
				return n, true, err
			}
			left -= in
			n += int64(in)
			sb.Advance(int64(in))
		}
	}
	return n, true, nil
}

// spliceRecvBuffer is the receive buffer a spliced upload's source socket
// gets (the kernel doubles it for its own bookkeeping): room for the
// low-water mark and a few frames more. Left to autotuning, a client on
// the same host grows it to tens of MiB within the first frames (24 MiB
// measured) and runs that far ahead of the daemon and the agent; locked at
// this size, 100 MiB uploads were faster in each of six interleaved runs on
// a 2-vCPU PVM guest (6 to 31%; docs/benchmarks.md). Root may pass
// net.core.rmem_max (SO_RCVBUFFORCE); anyone else gets what SO_RCVBUF
// allows, which still holds the low-water mark (the kernel caps the mark
// at half the buffer).
const spliceRecvBuffer = 4 * agentproto.DirectChunk

// spliceLowat is the SO_RCVLOWAT set on the source socket while splicing:
// the daemon then wakes once per frame's worth of data instead of once per
// loopback packet (measured: a third less of its CPU time than 256 KiB, half
// of none). The kernel caps it by the receive buffer, so it cannot stall.
const spliceLowat = agentproto.DirectChunk

// spliceIn moves up to max bytes from the socket behind rc into the pipe
// (empty on entry), waiting for data. The end of the socket is an error:
// the caller wants more.
func spliceIn(rc syscall.RawConn, pipeW, max int) (int, error) {
	var n int
	var serr error
	err := rc.Read(func(fd uintptr) bool {
		for {
			k, err := unix.Splice(int(fd), nil, pipeW, nil, max, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				return false // wait for the socket
			case err != nil:
				serr = err
			case k == 0:
				serr = io.ErrUnexpectedEOF
			}
			n = int(k)
			return true
		}
	})
	if err == nil {
		err = serr
	}
	return n, err
}

// spliceOut moves exactly n bytes from the pipe to the socket behind rc,
// waiting while it is full.
func spliceOut(rc syscall.RawConn, pipeR, n int) error {
	var serr error
	err := rc.Write(func(fd uintptr) bool {
		for n > 0 {
			k, err := unix.Splice(pipeR, nil, int(fd), nil, n, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				return false // wait until the socket drains
			case err != nil:
				serr = err
				return true
			case k == 0:
				serr = errors.New("splice to the agent made no progress")
				return true
			}
			n -= int(k)
		}
		return true
	})
	if err == nil {
		err = serr
	}
	return err
}
