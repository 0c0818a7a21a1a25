package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// A baseline is a local operation timed beside the airlock measurement it
// is the floor of. Run interleaves their samples (one airlock sample, one
// baseline sample) so that both see the same load on a shared host: a
// baseline taken minutes apart from its measurement makes the ratio
// measure the neighbours as much as airlock.
type baseline struct {
	name string
	// once times one run of the operation.
	once func(ctx context.Context) (time.Duration, error)
	// close removes what the baseline made.
	close func() error
	// samples are the measured runs; err is the first failure, after which
	// the baseline is not run again.
	samples Samples
	err     error
}

// sample runs the baseline once if it has not failed; keep says whether the
// run counts (warm-up runs do not).
func (b *baseline) sample(ctx context.Context, keep bool) {
	if b == nil || b.err != nil {
		return
	}
	d, err := b.once(ctx)
	if err != nil {
		b.err = err
		return
	}
	if keep {
		b.samples = append(b.samples, d)
	}
}

// finish closes the baseline and returns its samples, or nil and a note
// saying why there are none.
func (b *baseline) finish() (Samples, string) {
	if b == nil {
		return nil, ""
	}
	if b.close != nil {
		if err := b.close(); err != nil && b.err == nil {
			b.err = err
		}
	}
	if b.err != nil {
		return nil, b.name + " baseline failed: " + b.err.Error()
	}
	return b.samples, ""
}

// forkExecBaseline times a local fork/exec of /bin/echo, the floor of any
// exec.
func forkExecBaseline() *baseline {
	return &baseline{name: "fork/exec", once: func(ctx context.Context) (time.Duration, error) {
		start := time.Now()
		out, err := exec.CommandContext(ctx, "/bin/echo", "hi").Output()
		d := time.Since(start)
		if err != nil {
			return 0, err
		}
		if string(out) != "hi\n" {
			return 0, fmt.Errorf("echo printed %q", out)
		}
		return d, nil
	}}
}

// cpBaseline times `cp` of data from one local file to another, the floor of
// a file transfer on this host. The target is removed before each run,
// outside the timing.
func cpBaseline(workDir string, data []byte) (*baseline, error) {
	dir, err := os.MkdirTemp(workDir, "airlock-bench-cp-")
	if err != nil {
		return nil, err
	}
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &baseline{
		name: "cp",
		once: func(ctx context.Context) (time.Duration, error) {
			os.Remove(dst)
			start := time.Now()
			if out, err := exec.CommandContext(ctx, "cp", src, dst).CombinedOutput(); err != nil {
				return 0, fmt.Errorf("cp: %v: %s", err, out)
			}
			return time.Since(start), nil
		},
		close: func() error { return os.RemoveAll(dir) },
	}, nil
}

// runcBaseline times `runc run` of /bin/true in rootfs with runc's default
// spec (namespaces, read-only root, no user namespace, no network setup):
// what a container costs before anything airlock adds.
func runcBaseline(ctx context.Context, runcPath, rootfs, workDir string) (*baseline, error) {
	return ociBaseline(ctx, "runc", runcPath, nil, rootfs, workDir)
}

// ociBaseline times `<name> run` of /bin/true in rootfs with the runtime's
// own default spec (`<name> spec`), global flags before `run`: runc, or
// runsc, whose CLI is runc's.
func ociBaseline(ctx context.Context, name, path string, global []string, rootfs, workDir string) (*baseline, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("needs root")
	}
	if _, err := exec.LookPath(path); err != nil {
		return nil, err
	}
	if fi, err := os.Stat(filepath.Join(rootfs, "bin", "true")); err != nil || fi.IsDir() {
		return nil, fmt.Errorf("rootfs %s has no /bin/true", rootfs)
	}
	dir, err := os.MkdirTemp(workDir, "airlock-bench-"+name+"-")
	if err != nil {
		return nil, err
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	group := "airlock-bench-" + hex.EncodeToString(b)
	// runc leaves empty cgroup directories behind: remove ours even when a
	// run failed.
	cleanup := func() error {
		err := removeCgroups(group)
		return errors.Join(err, os.RemoveAll(dir))
	}
	bundle, state := filepath.Join(dir, "bundle"), filepath.Join(dir, "state")
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		cleanup()
		return nil, err
	}
	if out, err := exec.CommandContext(ctx, path, "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		cleanup()
		return nil, fmt.Errorf("%s spec: %v: %s", name, err, out)
	}
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		cleanup()
		return nil, err
	}
	i := 0
	return &baseline{
		name: "bare " + name,
		once: func(ctx context.Context) (time.Duration, error) {
			id := fmt.Sprintf("%s-%d", group, i)
			i++
			if err := writeSpec(filepath.Join(bundle, "config.json"), rootfs, "/"+group+"/"+id); err != nil {
				return 0, err
			}
			args := append(append([]string{"--root", state}, global...), "run", "--bundle", bundle, id)
			cmd := exec.CommandContext(ctx, path, args...)
			// Never a pipe: the runtime hands its stdio to the container.
			cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, devnull, devnull
			start := time.Now()
			err := cmd.Run()
			d := time.Since(start)
			if err != nil {
				// Clean up a half-made container before reporting.
				_ = exec.Command(path, "--root", state, "delete", "--force", id).Run()
				return 0, fmt.Errorf("%s run: %w", name, err)
			}
			return d, nil
		},
		close: func() error {
			devnull.Close()
			return cleanup()
		},
	}, nil
}

// bareRunc runs the runc baseline n times after one warm-up run.
func bareRunc(ctx context.Context, runcPath, rootfs, workDir string, n int) (Samples, error) {
	b, err := runcBaseline(ctx, runcPath, rootfs, workDir)
	if err != nil {
		return nil, err
	}
	for i := -1; i < n; i++ {
		b.sample(ctx, i >= 0)
	}
	s, _ := b.finish()
	return s, b.err
}

// writeSpec adapts runc's default spec: the rootfs, /bin/true without a
// terminal, and a cgroup path the bench can remove afterwards.
func writeSpec(path, rootfs, cgroupsPath string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec map[string]any
	if err := json.Unmarshal(b, &spec); err != nil {
		return fmt.Errorf("parsing runc spec: %w", err)
	}
	proc, _ := spec["process"].(map[string]any)
	linux, _ := spec["linux"].(map[string]any)
	if proc == nil || linux == nil {
		return fmt.Errorf("runc spec without process or linux")
	}
	proc["terminal"] = false
	proc["args"] = []string{"/bin/true"}
	spec["root"] = map[string]any{"path": rootfs, "readonly": true}
	linux["cgroupsPath"] = cgroupsPath
	out, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o600)
}

// removeCgroups removes /group (and its children) in every cgroup hierarchy.
func removeCgroups(group string) error {
	dirs, err := filepath.Glob("/sys/fs/cgroup/*/" + group)
	if err != nil {
		return err
	}
	if d := "/sys/fs/cgroup/" + group; dirExists(d) {
		dirs = append(dirs, d) // cgroup v2 (unified at the root)
	}
	var firstErr error
	for _, d := range dirs {
		kids, _ := filepath.Glob(d + "/*")
		for _, k := range kids {
			if dirExists(k) {
				if err := os.Remove(k); err != nil && !errors.Is(err, fs.ErrNotExist) && firstErr == nil {
					firstErr = err
				}
			}
		}
		// Hierarchies reached twice (cpu and cpu,cpuacct) are gone already.
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) && firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

func dirExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}
