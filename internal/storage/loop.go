package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// loopAttempts bounds the retries when another process takes the device
// LOOP_CTL_GET_FREE handed us before we configure it (EBUSY).
const loopAttempts = 32

// attachLoop binds image to a free loop device with LO_FLAGS_AUTOCLEAR and
// returns the open device. The device detaches itself at its last close, so
// the caller must keep the file open until something else (a mount) holds it.
func attachLoop(image string) (*os.File, error) {
	img, err := os.OpenFile(image, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("opening image: %w", err)
	}
	defer img.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: opening loop control: %w", errdefs.ErrRuntimeUnavailable, err)
	}
	defer ctl.Close()

	cfg := unix.LoopConfig{Fd: uint32(img.Fd())}
	cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], image)

	var lastErr error
	for range loopAttempts {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("%w: finding a free loop device: %w", errdefs.ErrCapacityExhausted, err)
		}
		dev, err := openLoop(n)
		if err != nil {
			lastErr = err
			continue
		}
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		if !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("configuring %s: %w", dev.Name(), classify(err))
		}
		lastErr = err
	}
	return nil, fmt.Errorf("%w: no loop device after %d attempts: %w", errdefs.ErrCapacityExhausted, loopAttempts, lastErr)
}

// openLoop opens /dev/loopN, waiting briefly for devtmpfs to create a node
// that LOOP_CTL_GET_FREE has just added.
func openLoop(n int) (*os.File, error) {
	name := fmt.Sprintf("/dev/loop%d", n)
	var err error
	for i := range 20 {
		var f *os.File
		f, err = os.OpenFile(name, os.O_RDWR, 0)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			break
		}
		time.Sleep(time.Duration(i+1) * 100 * time.Microsecond)
	}
	return nil, fmt.Errorf("opening %s: %w", name, err)
}

// loopDevice is a bound loop device and its backing file.
type loopDevice struct {
	Name    string // loopN
	Backing string // path of the backing file, " (deleted)" suffix removed
}

// boundLoops lists loop devices that have a backing file.
func boundLoops() ([]loopDevice, error) {
	paths, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return nil, err
	}
	var out []loopDevice
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // unbound between glob and read
		}
		name := filepath.Base(filepath.Dir(filepath.Dir(p)))
		backing := strings.TrimSuffix(strings.TrimRight(string(b), "\n"), " (deleted)")
		out = append(out, loopDevice{Name: name, Backing: backing})
	}
	return out, nil
}

// detachLoop unbinds /dev/<name>. A device still in use (a lazily unmounted
// filesystem) is switched to autoclear by the kernel instead, so it goes away
// with its last user.
func detachLoop(name string) error {
	f, err := os.OpenFile("/dev/"+name, os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("detaching %s: %w", name, err)
	}
	return nil
}
