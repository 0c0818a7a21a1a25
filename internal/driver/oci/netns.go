package oci

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// sysDirName is the host directory in a sandbox dir where the daemon mounts
// a sysfs of a joined network namespace (see mountNetnsSysfs).
const sysDirName = "sys"

// mountNetnsSysfs mounts, at dir, a read-only sysfs whose network view is
// the namespace at netnsPath. A sandbox that joins a namespace the daemon
// prepared cannot mount sysfs itself: that needs privilege over the network
// namespace, which belongs to the host's user namespace. A bind of the
// host's /sys would show the host's interfaces instead, so the daemon mounts
// the right one from inside the namespace and runc binds it. The mount lives
// under the sandbox dir, where storage.TeardownDir finds and removes it.
func mountNetnsSysfs(netnsPath, dir string) error {
	ns, err := os.Open(netnsPath)
	if err != nil {
		return fmt.Errorf("opening network namespace: %w", err)
	}
	defer ns.Close()
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		// The thread enters the namespace and never unlocks: the runtime
		// ends it with the goroutine, so no other goroutine runs there.
		runtime.LockOSThread()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("entering network namespace: %w", err)
			return
		}
		if err := unix.Mount("sysfs", dir, "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC|unix.MS_NODEV, ""); err != nil {
			errc <- fmt.Errorf("mounting sysfs of the network namespace: %w", err)
			return
		}
		errc <- nil
	}()
	return <-errc
}
