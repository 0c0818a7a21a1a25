package agent

import (
	"errors"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// errSwitchUser means the thread could not take on the user's identity.
var errSwitchUser = errors.New("cannot switch file system identity")

// asUser runs fn with the file system identity (fsuid, fsgid, supplementary
// groups) of acct, so the kernel checks every path lookup, open, create and
// unlink of fn against that user's permissions and new files are owned by it.
//
// The identity is a property of one OS thread: fn runs in a fresh goroutine
// locked to its thread, with raw syscalls (Go's syscall.Setgroups would change
// every thread of the process). If restoring the agent's identity fails, the
// thread is never unlocked, so it dies with the goroutine instead of going
// back to the scheduler with the user's identity.
func (s *Server) asUser(acct *account, fn func() error) error {
	if acct.Uid == s.euid && acct.Gid == uint32(unix.Getegid()) && s.euid != 0 {
		return fn()
	}
	if s.euid != 0 {
		return &agentproto.Error{Code: agentproto.CodePermissionDenied, Message: "agent cannot act as user " + acct.Name}
	}
	if acct.Uid == 0 && acct.Gid == 0 {
		// The agent's own identity: nothing to switch.
		return fn()
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		restored := false
		defer func() {
			if restored {
				runtime.UnlockOSThread()
			}
		}()
		origGroups, err := unix.Getgroups()
		if err != nil {
			restored = true
			done <- err
			return
		}
		var restore func() bool
		var switched bool
		if hasFSID() {
			origUID, origGID := setfsuid(-1), setfsgid(-1)
			restore = func() bool {
				ok := setgroups(intsToU32(origGroups)) == nil
				setfsgid(int(origGID))
				setfsuid(int(origUID))
				return ok && setfsuid(-1) == origUID && setfsgid(-1) == origGID
			}
			// Groups first: once fsuid is not root the thread may lose
			// the capability to change them.
			if setgroups(acct.Groups) == nil {
				setfsgid(int(acct.Gid))
				setfsuid(int(acct.Uid))
				switched = setfsuid(-1) == acct.Uid && setfsgid(-1) == acct.Gid
			}
		} else {
			// gVisor (Debian's 20221219) has no setfsuid: the thread's
			// effective ids do the same for file access, and the saved
			// ids (root) let it come back.
			restore = func() bool {
				ok := setresuid(-1, 0, -1) == nil
				ok = setgroups(intsToU32(origGroups)) == nil && ok
				ok = setresgid(-1, 0, -1) == nil && ok
				return ok && unix.Geteuid() == 0 && unix.Getegid() == 0
			}
			switched = setgroups(acct.Groups) == nil && setresgid(-1, int(acct.Gid), -1) == nil &&
				setresuid(-1, int(acct.Uid), -1) == nil
		}
		if !switched {
			restored = restore()
			done <- errSwitchUser
			return
		}
		var ferr error
		func() {
			defer func() {
				if r := recover(); r != nil {
					ferr = errors.New("panic in file operation")
				}
			}()
			ferr = fn()
		}()
		restored = restore()
		done <- ferr
	}()
	return <-done
}

var (
	fsidOnce sync.Once
	fsidOK   bool
)

// hasFSID reports whether the kernel implements setfsuid (gVisor of 2022
// does not: ENOSYS).
func hasFSID() bool {
	fsidOnce.Do(func() {
		_, _, e := unix.RawSyscall(unix.SYS_SETFSUID, ^uintptr(0), 0, 0)
		fsidOK = e != unix.ENOSYS
	})
	return fsidOK
}

// setresuid and setresgid change the calling thread's ids only (raw
// syscalls; Go's would change every thread); -1 keeps one.
func setresuid(r, e, s int) error {
	if _, _, errno := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(r), uintptr(e), uintptr(s)); errno != 0 {
		return errno
	}
	return nil
}

func setresgid(r, e, s int) error {
	if _, _, errno := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(r), uintptr(e), uintptr(s)); errno != 0 {
		return errno
	}
	return nil
}

// setfsuid sets the thread's fsuid and returns the previous one; -1 (an
// invalid id) changes nothing and so reads the current value.
func setfsuid(uid int) uint32 {
	r, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, uintptr(uint32(uid)), 0, 0)
	return uint32(r)
}

func setfsgid(gid int) uint32 {
	r, _, _ := unix.RawSyscall(unix.SYS_SETFSGID, uintptr(uint32(gid)), 0, 0)
	return uint32(r)
}

// setgroups sets the calling thread's supplementary groups only.
func setgroups(gids []uint32) error {
	var p unsafe.Pointer
	if len(gids) > 0 {
		p = unsafe.Pointer(&gids[0])
	}
	_, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(gids)), uintptr(p), 0)
	if e != 0 {
		return e
	}
	return nil
}

func intsToU32(v []int) []uint32 {
	out := make([]uint32, len(v))
	for i, x := range v {
		out[i] = uint32(x)
	}
	return out
}
