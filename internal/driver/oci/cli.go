package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
)

// CLI is a typed wrapper over the command line runc and runsc share (after
// go-runc): one method per subcommand, every call with the runtime's
// --root and global flags.
type CLI struct {
	path string // the runtime's binary
	root string // its state directory (--root)
	// global are flags before every subcommand (Config.GlobalArgs).
	global []string
	// control runs a subcommand about a container (Runtime.Control).
	control func(cmd *exec.Cmd, id string) error
}

// ContainerState is the JSON `runc state` (and `runsc state`) prints.
type ContainerState struct {
	ID      string    `json:"id"`
	Pid     int       `json:"pid"`
	Status  string    `json:"status"` // creating, created, running, paused, stopped
	Bundle  string    `json:"bundle"`
	Rootfs  string    `json:"rootfs"`
	Created time.Time `json:"created"`
}

// Path is the runtime's binary.
func (r *CLI) Path() string { return r.path }

// command builds a runtime invocation with a minimal environment: the
// container's own environment comes from config.json, and nothing of the
// daemon's (tokens, proxies) should reach the runtime or what it starts.
func (r *CLI) command(ctx context.Context, args ...string) *exec.Cmd {
	all := append([]string{"--root", r.root}, r.global...)
	cmd := exec.CommandContext(ctx, r.path, append(all, args...)...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	// A signal to the daemon's process group (Ctrl-C) must not reach runc
	// or, through it, a container init.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// exec runs a short subcommand about container id and returns its stdout.
// Only for subcommands that start no container: pipes are safe there.
func (r *CLI) exec(ctx context.Context, id string, args ...string) ([]byte, error) {
	cmd := r.command(ctx, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	run := cmd.Run
	if r.control != nil {
		run = func() error { return r.control(cmd, id) }
	}
	if err := run(); err != nil {
		return stdout.Bytes(), runcError(args[0], stderr.Bytes(), err)
	}
	return stdout.Bytes(), nil
}

// run starts the container of the bundle in bundleDir, detached. runc's own
// messages go to logPath (JSON lines); the container's stdout and stderr
// go to stdio, which must be a file: a pipe would be held open by the
// container for ever. The container's init gets extra as descriptors 3, 4…
// (--preserve-fds). flags come before the subcommand. launch runs the
// command (Runtime.Launch). With image set the container is restored from
// the checkpoint image in that directory (`restore --image-path`) instead
// of run from its init: the same bundle, the same detached start.
func (r *CLI) run(ctx context.Context, id, bundleDir, pidFile, logPath, image string, stdio *os.File, flags []string, launch func(*exec.Cmd) error, extra ...*os.File) error {
	null, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer null.Close()
	sub := []string{"run"}
	if image != "" {
		sub = []string{"restore", "--image-path", image}
	}
	args := append(slices.Clone(flags), "--log", logPath, "--log-format", "json")
	args = append(append(args, sub...), "--detach", "--pid-file", pidFile, "--bundle", bundleDir)
	if len(extra) > 0 {
		args = append(args, "--preserve-fds", strconv.Itoa(len(extra)))
	}
	cmd := r.command(ctx, append(args, id)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = null, stdio, stdio
	cmd.ExtraFiles = extra
	if err := launch(cmd); err != nil {
		return runcError(sub[0], lastLogError(logPath), err)
	}
	return nil
}

// Exists reports whether the runtime has a record of container id, without
// the cost of running it: runc keeps a directory per container, runsc a
// state file per container of a sandbox (here one, of the same id).
func (r *CLI) Exists(id string) bool {
	if _, err := os.Stat(filepath.Join(r.root, id)); err == nil {
		return true
	}
	_, err := os.Stat(filepath.Join(r.root, id+"_sandbox:"+id+".state"))
	return err == nil
}

// State returns the runtime's view of container id; an error wrapping
// errdefs.ErrNotFound if it has no such container.
func (r *CLI) State(ctx context.Context, id string) (ContainerState, error) {
	var st ContainerState
	if !r.Exists(id) {
		return st, errdefs.Wrap(errdefs.ErrNotFound, "runc container %s", id)
	}
	out, err := r.exec(ctx, id, "state", id)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, fmt.Errorf("parsing runc state: %w", err)
	}
	return st, nil
}

func (r *CLI) Kill(ctx context.Context, id, sig string, all bool) error {
	args := []string{"kill"}
	if all {
		args = append(args, "--all")
	}
	_, err := r.exec(ctx, id, append(args, id, sig)...)
	return err
}

func (r *CLI) Delete(ctx context.Context, id string) error {
	_, err := r.exec(ctx, id, "delete", "--force", id)
	return err
}

// Checkpoint writes the state of running container id into the
// directory image (runsc: checkpoint.img; the container's processes end
// once it is written).
func (r *CLI) Checkpoint(ctx context.Context, id, image string) error {
	_, err := r.exec(ctx, id, "checkpoint", "--image-path", image, id)
	return err
}

func (r *CLI) Pause(ctx context.Context, id string) error {
	_, err := r.exec(ctx, id, "pause", id)
	return err
}

func (r *CLI) Resume(ctx context.Context, id string) error {
	_, err := r.exec(ctx, id, "resume", id)
	return err
}

var versionRE = lazyregexp.New(`^\S+ version (\S+)`)

// Version returns the runtime's version ("1.1.5+ds1", runsc's
// "0.0~20221219.0").
func (r *CLI) Version(ctx context.Context) (string, error) {
	cmd := exec.CommandContext(ctx, r.path, "--version")
	cmd.Env = []string{}
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", filepath.Base(r.path), err)
	}
	m := versionRE.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("%s --version: unexpected output %q", filepath.Base(r.path), firstLine(out))
	}
	return string(m[1]), nil
}

// runcError turns a failed runc call into an error carrying runc's own
// message (its last stderr or log line), classified where runc says why.
func runcError(sub string, msg []byte, err error) error {
	text := strings.TrimSpace(lastLine(msg))
	// runsc's fatal errors come first, followed by a stack dump.
	if _, fatal, ok := strings.Cut(string(msg), "FATAL ERROR: "); ok {
		text, _, _ = strings.Cut(fatal, "\n")
		if len(text) > maxErrorText {
			text = text[:maxErrorText/2] + " … " + text[len(text)-maxErrorText/2:]
		}
	}
	if text == "" {
		text = err.Error()
	}
	switch {
	case strings.Contains(text, "does not exist") || strings.Contains(text, "not exist"):
		return fmt.Errorf("runc %s: %s: %w", sub, text, errdefs.ErrNotFound)
	case strings.Contains(text, "already exists"):
		return fmt.Errorf("runc %s: %s: %w", sub, text, errdefs.ErrAlreadyExists)
	case strings.Contains(text, "not running") || strings.Contains(text, "not paused") ||
		strings.Contains(text, "is paused") || strings.Contains(text, "stopped"):
		return fmt.Errorf("runc %s: %s: %w", sub, text, errdefs.ErrInvalidState)
	}
	return fmt.Errorf("runc %s: %s: %w", sub, text, errdefs.ErrRuntimeUnavailable)
}

// maxErrorText bounds a runtime's message in an error: runsc's encoding
// errors print whole objects.
const maxErrorText = 600

// lastLogError returns the message of the last error line of a runc JSON log.
func lastLogError(path string) []byte {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	// A stream of objects: runc ends each with a newline, runsc does not.
	var last []byte
	dec := json.NewDecoder(bytes.NewReader(b))
	for {
		var e struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		if err := dec.Decode(&e); err != nil {
			return last
		}
		if e.Level == "error" || e.Level == "fatal" {
			last = []byte(e.Msg)
		}
	}
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	return s
}
