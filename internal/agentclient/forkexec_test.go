package agentclient_test

import "syscall"

// syscallForkExec starts argv with stdout on fd, for the fork/exec baseline.
func syscallForkExec(path string, argv []string, fd int) (int, error) {
	return syscall.ForkExec(path, argv, &syscall.ProcAttr{
		Env:   []string{"PATH=/usr/bin:/bin"},
		Files: []uintptr{0, uintptr(fd), 2},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
}
