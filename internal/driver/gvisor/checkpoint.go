package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// Checkpoint and restore (driver.Checkpointer) with runsc's own: `runsc
// checkpoint --image-path DIR` writes the Sentry's whole state (every
// task, its memory, the kernel's objects, the file descriptors' state) to
// DIR/checkpoint.img, after which the Sentry exits; `runsc restore
// --image-path DIR` is a run of the same bundle that loads that state
// instead of starting init. The files stay where they are: the Gofer
// serves the bundle's root again on restore, so the writable layer is the
// checkpoint's disk. See docs/drivers.md for what works on this host.

// imageName is the file runsc writes in a checkpoint's directory.
const imageName = "checkpoint.img"

// sentryExitWait bounds the wait for a checkpointed Sentry to exit on its
// own (it does once the image is written) before it is killed.
const sentryExitWait = 10 * time.Second

var _ driver.Checkpointer = (*Driver)(nil)

// Checkpoint writes the processes and memory of running sandbox id into
// dir (an existing empty directory of the caller's) and leaves the sandbox
// stopped, its storage kept; with opts.LeaveRunning it then restores the
// sandbox from that image at once (runsc's own --leave-running does the
// same, destroy and restore, but in its own process that stays to wait on
// the sandbox, outside the namespaces Launch sets up).
func (d *Driver) Checkpoint(ctx context.Context, id, dir string, opts driver.CheckpointOptions) error {
	st, err := d.LoadState(id)
	if err != nil {
		return fmt.Errorf("checkpointing sandbox %s: %w", id, err)
	}
	if err := checkImageDir(dir, false); err != nil {
		return err
	}
	cs, err := d.CLI().State(ctx, id)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return errdefs.Wrap(errdefs.ErrInvalidState, "sandbox %s is not running", id)
		}
		return fmt.Errorf("checkpointing sandbox %s: %w", id, err)
	}
	if cs.Status != "running" {
		return errdefs.Wrap(errdefs.ErrInvalidState, "sandbox %s is %s: only a running sandbox is checkpointed", id, cs.Status)
	}
	if p := d.Init(id); p != nil {
		select {
		case <-p.Done():
			return errdefs.Wrap(errdefs.ErrInvalidState, "sandbox %s is not running", id)
		default:
		}
	}
	t0 := time.Now()
	if err := d.dropAgentSocket(ctx, id); err != nil {
		d.relisten(ctx, id)
		return fmt.Errorf("checkpointing sandbox %s (it runs on): %w", id, err)
	}
	t1 := time.Now()
	cerr := d.CLI().Checkpoint(ctx, id, dir)
	t2 := time.Now()
	// Written or not, the sandbox is left in one known state: a Sentry
	// that saved exits; one that failed to save runs on, and is then left
	// running (nothing is lost), its agent listening again, with the error.
	if cerr != nil {
		os.Remove(filepath.Join(dir, imageName))
		if p := d.Init(id); p != nil {
			select {
			case <-p.Done():
			default:
				if err := d.relisten(ctx, id); err != nil {
					return fmt.Errorf("checkpointing sandbox %s (it runs on, its agent does not listen: %v): %w", id, err, cerr)
				}
				return fmt.Errorf("checkpointing sandbox %s (it runs on): %w", id, cerr)
			}
		}
		d.killAfterCheckpoint(ctx, id, cs.Pid)
		return fmt.Errorf("checkpointing sandbox %s (it stopped): %w", id, cerr)
	}
	if err := d.killAfterCheckpoint(ctx, id, cs.Pid); err != nil {
		return fmt.Errorf("checkpointing sandbox %s: %w", id, err)
	}
	d.Logger().Debug("sandbox checkpointed", "sandbox_id", id, "netstack", netstack(st),
		"drop_us", t1.Sub(t0).Microseconds(), "checkpoint_us", t2.Sub(t1).Microseconds(), "stop_us", time.Since(t2).Microseconds())
	if !opts.LeaveRunning {
		return nil
	}
	if err := d.Restore(ctx, id, dir); err != nil {
		return fmt.Errorf("checkpointing sandbox %s: written, but not running again: %w", id, err)
	}
	return nil
}

// killAfterCheckpoint waits for the Sentry (pid) of a checkpointed sandbox
// to exit, as it does once its image is written, and then ends and reaps
// what runsc left (the Gofer, the stubs), as Stop does.
func (d *Driver) killAfterCheckpoint(ctx context.Context, id string, pid int) error {
	if p := d.Init(id); p != nil {
		wctx, cancel := context.WithTimeout(ctx, sentryExitWait)
		select {
		case <-p.Done():
		case <-wctx.Done():
		}
		cancel()
	}
	return d.KillAll(ctx, id, pid)
}

// Restore runs sandbox id from the checkpoint image in dir in place of
// Start (driver.Checkpointer): the sandbox checkpointed itself, stopped by
// Checkpoint, or a new created sandbox whose root holds the checkpointed
// one's files. Its processes resume where the checkpoint left them, the
// agent included; DialAgent then reaches it as after a start.
func (d *Driver) Restore(ctx context.Context, id, dir string) error {
	if _, err := d.LoadState(id); err != nil {
		return fmt.Errorf("restoring sandbox %s: %w", id, err)
	}
	if err := checkImageDir(dir, true); err != nil {
		return err
	}
	// The restored agent holds no socket (it closed it for the
	// checkpoint): StartFromImage makes the socket dir ready for it, as
	// for any start, and this file has it listen again at once.
	if err := d.listenAgain(id); err != nil {
		return fmt.Errorf("restoring sandbox %s: %w", id, err)
	}
	t0 := time.Now()
	if err := d.StartFromImage(ctx, id, dir); err != nil {
		return fmt.Errorf("restoring sandbox %s: %w", id, err)
	}
	d.Logger().Debug("sandbox restored", "sandbox_id", id, "restore_us", time.Since(t0).Microseconds())
	return nil
}

// The agent's signals around a checkpoint (cmd/airlock-agent): gVisor
// saves no socket bound or connected on the host, and the agent's socket
// and every connection the daemon made to it are (--host-uds). On sigDrop
// the agent closes its connections and then its listener; on sigListen it
// listens again. Execs run on meanwhile.
const (
	sigDrop   = "USR1"
	sigListen = "USR2"
)

// dropRefusedName is the file the agent makes in its socket dir when it
// refuses sigDrop (cmd/airlock-agent).
const dropRefusedName = "checkpoint-refused"

// dropWait bounds the wait for the agent to close its socket.
const dropWait = 10 * time.Second

// dropAgentSocket asks the agent of running sandbox id to close its
// connections and socket, and waits until it answers by removing the
// socket file (in its dir, handed back to the sandbox's root for that).
func (d *Driver) dropAgentSocket(ctx context.Context, id string) error {
	if err := d.OpenAgentSocketDir(id); err != nil {
		return err
	}
	// Answers of an earlier round go first: the agent may answer before
	// the signal's runsc call returns.
	refused := filepath.Join(d.Dir(id), "uds", dropRefusedName)
	os.Remove(refused)
	os.Remove(filepath.Join(d.Dir(id), "uds", listenAgainName))
	if err := d.CLI().Kill(ctx, id, sigDrop, false); err != nil {
		return fmt.Errorf("asking the agent to close its socket: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, dropWait)
	defer cancel()
	wait := time.Millisecond
	for {
		there, err := d.AgentSocketExists(id)
		if err != nil {
			return err
		}
		if !there {
			return nil
		}
		// The agent's answer that it keeps its socket (a file of the
		// sandbox's: only its presence counts).
		if _, err := os.Lstat(refused); err == nil {
			os.Remove(refused)
			return errdefs.Wrap(errdefs.ErrInvalidState,
				"sandbox %s has TCP connections open, which runsc cannot checkpoint (a failed checkpoint would end its processes): close them first", id)
		}
		select {
		case <-wctx.Done():
			return errdefs.Wrap(errdefs.ErrUnavailable, "the agent did not close its socket within %v", dropWait)
		case <-time.After(wait):
		}
		wait = min(2*wait, 20*time.Millisecond)
	}
}

// relisten has the agent of a sandbox that runs on after a failed
// checkpoint listen again, if it closed its socket (it makes it anew in
// the dir dropAgentSocket opened); an agent that still listens ignores it.
func (d *Driver) relisten(ctx context.Context, id string) error {
	if err := d.listenAgain(id); err != nil {
		return err
	}
	return d.CLI().Kill(ctx, id, sigListen, false)
}

// listenAgainName is the file beside the agent's socket that has an agent
// which closed its socket listen again (cmd/airlock-agent): it looks for
// it every 2 ms, the restored agent too, which saves a signal (a runsc
// call) per restore.
const listenAgainName = "listen-again"

// listenAgain makes the listen-again file of sandbox id.
func (d *Driver) listenAgain(id string) error {
	f, err := os.OpenFile(filepath.Join(d.Dir(id), "uds", listenAgainName), os.O_CREATE|os.O_WRONLY|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return fmt.Errorf("telling the agent to listen again: %w", err)
	}
	return f.Close()
}

// checkImageDir checks that dir is an absolute path to a directory (not a
// symlink); with image, that it holds a checkpoint image; without, that
// it holds none yet (runsc refuses to write over one).
func checkImageDir(dir string, image bool) error {
	if dir == "" || !filepath.IsAbs(dir) {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "checkpoint directory %q must be an absolute path", dir)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return errdefs.Wrap(errdefs.ErrNotFound, "checkpoint directory %s", dir)
		}
		return fmt.Errorf("checkpoint directory: %w", err)
	}
	if !fi.IsDir() {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "checkpoint directory %s is not a directory", dir)
	}
	img, err := os.Lstat(filepath.Join(dir, imageName))
	switch {
	case image && errors.Is(err, fs.ErrNotExist):
		return errdefs.Wrap(errdefs.ErrNotFound, "no checkpoint image in %s", dir)
	case image && err == nil && !img.Mode().IsRegular():
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "checkpoint image in %s is not a regular file", dir)
	case !image && err == nil:
		return errdefs.Wrap(errdefs.ErrAlreadyExists, "checkpoint directory %s already holds an image", dir)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("checkpoint image: %w", err)
	}
	return nil
}
