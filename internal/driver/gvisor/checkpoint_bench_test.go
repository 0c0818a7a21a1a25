package gvisor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/drivertest"
)

// benchSandbox creates and starts sandbox id on d, runs shell in it as
// root (to exit 0), and checkpoints it (stopped) into a new image dir,
// which it returns. The sandbox is destroyed at the end of b.
func benchSandbox(b *testing.B, d *Driver, tmpl driver.Template, id string, res driver.Resources, shell string) string {
	b.Helper()
	ctx := context.Background()
	if _, err := d.Create(ctx, driver.Spec{ID: id, Template: tmpl, Resources: res}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := d.Destroy(context.Background(), id); err != nil {
			b.Errorf("Destroy: %v", err)
		}
	})
	if err := d.Start(ctx, id); err != nil {
		b.Fatal(err)
	}
	c := benchDial(b, d, id)
	if shell != "" {
		res, err := c.Exec(ctx, agentproto.ExecRequest{ID: "ex_setup", Shell: shell, User: "root", TimeoutMS: 120_000})
		if err != nil {
			b.Fatal(err)
		}
		for {
			if _, err := res.Next(); err != nil {
				break
			}
		}
		res.Close()
	}
	c.Close()
	img := filepath.Join(drivertest.DataDir(b, "bench-img"), "img")
	if err := os.Mkdir(img, 0o700); err != nil {
		b.Fatal(err)
	}
	if err := d.Checkpoint(ctx, id, img, driver.CheckpointOptions{}); err != nil {
		b.Fatal(err)
	}
	return img
}

// benchDial connects to the agent of id and returns its client once it
// answered (the handshake).
func benchDial(b *testing.B, d *Driver, id string) *agentclient.Client {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := d.DialAgent(ctx, id)
	if err != nil {
		b.Fatal(err)
	}
	c, err := agentclient.New(conn)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkRestore measures the driver's Restore of a checkpoint of an
// idle sandbox until its agent answers (driver-ms/op), and, interleaved
// in the same loop, a bare `runsc restore --detach` of the same image and
// bundle (bare-ms/op: runsc's own restore, no agent, no namespaces of the
// driver's); ratio is their quotient (the target is ≤ 1.3).
func BenchmarkRestore(b *testing.B) {
	requireHost(b)
	tmpl := drivertest.BaseTemplate(b)
	d := newDriver(b, newHost(b))
	ctx := context.Background()
	const id = "sbx_gbenchrestore"
	img := benchSandbox(b, d, tmpl, id, driver.Resources{}, "")
	bareRoot := drivertest.DataDir(b, "bare-runsc")
	bundle := d.Dir(id)
	out, err := os.Create(filepath.Join(bareRoot, "output"))
	if err != nil {
		b.Fatal(err)
	}
	defer out.Close()
	var drv, bare time.Duration
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		if err := d.Restore(ctx, id, img); err != nil {
			b.Fatal(err)
		}
		c := benchDial(b, d, id)
		t1 := time.Now()
		c.Close()
		if err := d.Stop(ctx, id, 0); err != nil {
			b.Fatal(err)
		}
		bid := fmt.Sprintf("bare%d", i)
		args := append([]string{"--root", bareRoot}, globalArgs(d.cfg.Platform)...)
		cmd := exec.Command(d.cfg.RunscPath, append(args, flagNoNet, "restore", "--image-path", img, "--bundle", bundle, "--detach", bid)...)
		// A file, never a pipe: the sandbox's processes inherit it.
		if err := out.Truncate(0); err != nil {
			b.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = out, out
		t2 := time.Now()
		err := cmd.Run()
		t3 := time.Now()
		if err != nil {
			msg, _ := os.ReadFile(out.Name())
			b.Fatalf("bare runsc restore: %v\n%s", err, msg)
		}
		bareKill(b, d, bareRoot, bid)
		drv += t1.Sub(t0)
		bare += t3.Sub(t2)
	}
	n := float64(b.N) * float64(time.Millisecond)
	b.ReportMetric(float64(drv)/n, "driver-ms/op")
	b.ReportMetric(float64(bare)/n, "bare-ms/op")
	b.ReportMetric(float64(drv)/float64(bare), "ratio")
}

// bareKill ends and deletes the bare runsc sandbox bid and reaps what it
// left to this process (the subreaper).
func bareKill(b *testing.B, d *Driver, root, bid string) {
	b.Helper()
	base := []string{"--root", root}
	exec.Command(d.cfg.RunscPath, append(base, "kill", bid, "KILL")...).Run()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := exec.Command(d.cfg.RunscPath, append(base, "delete", "--force", bid)...).CombinedOutput()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("bare runsc delete: %v\n%s", err, out)
		}
		d.reapRuntimeZombies()
		time.Sleep(20 * time.Millisecond)
	}
	d.reapRuntimeZombies()
}

// BenchmarkCheckpoint200MB measures the checkpoint (pause to disk) of a
// sandbox whose process holds 200 MB of its own memory: checkpoint-ms/op
// (until the image is written and the sandbox stopped), image-MB (the
// image's size on disk), and restore-ms/op (until its agent answers).
func BenchmarkCheckpoint200MB(b *testing.B) {
	requireHost(b)
	tmpl := drivertest.BaseTemplate(b)
	d := newDriver(b, newHost(b))
	ctx := context.Background()
	const id = "sbx_gbenchckpt"
	// 200 distinct MiB (a random block each, not compressible), held by a
	// sleeping process.
	hold := `nohup python3 -c '
import os, time
b = [os.urandom(1 << 20) for _ in range(200)]
open("/tmp/held", "w").close()
time.sleep(100000)
' >/dev/null 2>&1 & while [ ! -e /tmp/held ]; do sleep 0.1; done`
	img := benchSandbox(b, d, tmpl, id, driver.Resources{MemoryMB: 1024}, hold)
	if err := d.Restore(ctx, id, img); err != nil {
		b.Fatal(err)
	}
	benchDial(b, d, id).Close()
	root := drivertest.DataDir(b, "bench-imgs")
	var ckpt, rest time.Duration
	var bytes int64
	for i := 0; b.Loop(); i++ {
		dir := filepath.Join(root, fmt.Sprint(i))
		if err := os.Mkdir(dir, 0o700); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		if err := d.Checkpoint(ctx, id, dir, driver.CheckpointOptions{}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		fi, err := os.Stat(filepath.Join(dir, imageName))
		if err != nil {
			b.Fatal(err)
		}
		bytes += fi.Size()
		t2 := time.Now()
		if err := d.Restore(ctx, id, dir); err != nil {
			b.Fatal(err)
		}
		benchDial(b, d, id).Close()
		t3 := time.Now()
		os.RemoveAll(dir)
		ckpt += t1.Sub(t0)
		rest += t3.Sub(t2)
	}
	n := float64(b.N) * float64(time.Millisecond)
	b.ReportMetric(float64(ckpt)/n, "checkpoint-ms/op")
	b.ReportMetric(float64(rest)/n, "restore-ms/op")
	b.ReportMetric(float64(bytes)/float64(b.N)/(1<<20), "image-MB")
}
