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

// forkExec times a local fork/exec of /bin/echo, the floor of any exec.
func forkExec(ctx context.Context, n int) (Samples, error) {
	var s Samples
	for i := -5; i < n; i++ {
		start := time.Now()
		out, err := exec.CommandContext(ctx, "/bin/echo", "hi").Output()
		d := time.Since(start)
		if err != nil {
			return nil, err
		}
		if string(out) != "hi\n" {
			return nil, fmt.Errorf("echo printed %q", out)
		}
		if i >= 0 {
			s = append(s, d)
		}
	}
	return s, nil
}

// localCp times `cp` of data from one local file to another, the floor of a
// file transfer on this host.
func localCp(ctx context.Context, workDir string, data []byte, n int) (Samples, error) {
	dir, err := os.MkdirTemp(workDir, "airlock-bench-cp-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		return nil, err
	}
	var s Samples
	for range n {
		os.Remove(dst)
		start := time.Now()
		if out, err := exec.CommandContext(ctx, "cp", src, dst).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("cp: %v: %s", err, out)
		}
		s = append(s, time.Since(start))
	}
	return s, nil
}

// bareRunc times `runc run` of /bin/true in rootfs with runc's default spec
// (namespaces, read-only root, no user namespace, no network setup): what a
// container costs before anything airlock adds.
func bareRunc(ctx context.Context, runcPath, rootfs, workDir string, n int) (s Samples, err error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("needs root")
	}
	if fi, err := os.Stat(filepath.Join(rootfs, "bin", "true")); err != nil || fi.IsDir() {
		return nil, fmt.Errorf("rootfs %s has no /bin/true", rootfs)
	}
	dir, err := os.MkdirTemp(workDir, "airlock-bench-runc-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	group := "airlock-bench-" + hex.EncodeToString(b)
	// runc leaves empty cgroup directories behind: remove ours even when a
	// run failed.
	defer func() {
		if cerr := removeCgroups(group); cerr != nil && err == nil {
			err = cerr
		}
	}()
	bundle, state := filepath.Join(dir, "bundle"), filepath.Join(dir, "state")
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return nil, err
	}
	if out, err := exec.CommandContext(ctx, runcPath, "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("runc spec: %v: %s", err, out)
	}
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer devnull.Close()
	for i := -1; i < n; i++ {
		id := fmt.Sprintf("%s-%d", group, i+1)
		if err := writeSpec(filepath.Join(bundle, "config.json"), rootfs, "/"+group+"/"+id); err != nil {
			return nil, err
		}
		cmd := exec.CommandContext(ctx, runcPath, "--root", state, "run", "--bundle", bundle, id)
		// Never a pipe: runc hands its stdio to the container.
		cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, devnull, devnull
		start := time.Now()
		err := cmd.Run()
		d := time.Since(start)
		if err != nil {
			// Clean up a half-made container before reporting.
			_ = exec.Command(runcPath, "--root", state, "delete", "--force", id).Run()
			return nil, fmt.Errorf("runc run: %w", err)
		}
		if i >= 0 {
			s = append(s, d)
		}
	}
	return s, nil
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
