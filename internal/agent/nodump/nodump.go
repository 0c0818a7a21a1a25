// Package nodump makes the importing process non-dumpable as it initialises: imported first by airlock-agent, so that no process of the sandbox can read or write the agent's memory, environment or descriptors through /proc or ptrace, whatever the host's ptrace policy.
//
// The agent runs as root of the sandbox's user namespace, the same uid as a
// root exec. Linux lets a process of the same uid whose capabilities cover
// the target's open /proc/<pid>/mem, read /proc/<pid>/environ and follow
// /proc/<pid>/fd/* of a dumpable process (ptrace_may_access), and without
// Yama nothing else stands in the way. A non-dumpable process needs
// CAP_SYS_PTRACE in the user namespace that owns its memory, which no
// process of a sandbox has. Children are dumpable again after their
// execve, as any program expects.
//
// The package depends on syscall alone, so it runs before nearly every other
// package's init. The runc driver also keeps the agent binary unreadable by
// the sandbox's users (mode 0711, host root's), for which the kernel makes the
// exec non-dumpable from its first instruction on (would_dump in fs/exec.c);
// this init holds even where the binary is readable (under gVisor, which
// loads it as the sandbox's root).
package nodump

import "syscall"

func init() {
	if err := set(); err != nil {
		// Fail closed: an agent others could rewrite in memory must not
		// serve the daemon. os is not initialised yet; say it raw.
		msg := "airlock-agent: cannot make the process non-dumpable: " + err.Error() + "\n"
		syscall.Write(2, []byte(msg))
		syscall.Exit(1)
	}
}

// set makes the process non-dumpable and checks that it is.
func set() error {
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 0, 0); e != 0 {
		return e
	}
	v, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_GET_DUMPABLE, 0, 0)
	if e != 0 {
		return e
	}
	if v != 0 {
		return syscall.EPERM
	}
	return nil
}

// Dumpable reports whether the process is dumpable (PR_GET_DUMPABLE): false
// once this package's init ran.
func Dumpable() (bool, error) {
	v, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_GET_DUMPABLE, 0, 0)
	if e != 0 {
		return false, e
	}
	return v != 0, nil
}
