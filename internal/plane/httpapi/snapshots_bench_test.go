package httpapi_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// Benchmarks of snapshots (issue 15's performance rows), each beside its
// baseline measured in the same run, interleaved so both see the same
// host load. Root and runc (daemontest); run with -benchtime=20x or so.

// timeIt returns how long fn took, failing the benchmark on its error.
func timeIt(b *testing.B, what string, fn func() error) time.Duration {
	b.Helper()
	start := time.Now()
	if err := fn(); err != nil {
		b.Fatalf("%s: %v", what, err)
	}
	return time.Since(start)
}

// BenchmarkCreateFromSnapshotVsCold: POST /v1/sandboxes from a filesystem
// snapshot (a sandbox with a few MB written) against a cold create from
// the template; reports both p50s and their difference (the target: at
// most cold + 10 ms).
func BenchmarkCreateFromSnapshotVsCold(b *testing.B) {
	e := newE2E(b)
	ctx := context.Background()
	cl := e.env.Client(e.env.Key(b, "bench"))
	src, err := cl.NewSandbox(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	run(b, src, "dd if=/dev/urandom of=/home/user/state bs=1M count=8 2>/dev/null; mkdir -p /opt/app && echo ok > /opt/app/flag")
	sn, err := src.Snapshot(ctx, "", false)
	if err != nil {
		b.Fatal(err)
	}
	create := func(req api.CreateSandboxRequest) time.Duration {
		var sb *api.Sandbox
		d := timeIt(b, "create", func() (err error) { sb, err = cl.CreateSandbox(ctx, req); return err })
		if err := cl.DeleteSandbox(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
		return d
	}
	cold, snap := api.CreateSandboxRequest{}, api.CreateSandboxRequest{Snapshot: sn.ID}
	for range 2 {
		create(cold)
		create(snap)
	}
	var dCold, dSnap []time.Duration
	i := 0
	b.ResetTimer()
	for b.Loop() {
		if i%2 == 0 {
			dCold = append(dCold, create(cold))
			dSnap = append(dSnap, create(snap))
		} else {
			dSnap = append(dSnap, create(snap))
			dCold = append(dCold, create(cold))
		}
		i++
	}
	b.StopTimer()
	pc, ps := median(dCold), median(dSnap)
	b.ReportMetric(float64(pc.Microseconds())/1000, "cold-p50-ms")
	b.ReportMetric(float64(ps.Microseconds())/1000, "snapshot-p50-ms")
	b.ReportMetric(float64((ps-pc).Microseconds())/1000, "snapshot-minus-cold-ms")
}

// BenchmarkResetVsDeleteCreate: POST /v1/sandboxes/{id}/reset of a sandbox
// that wrote a file, against DELETE + POST of a sandbox like it, both with
// sandbox networking (an allowlist policy, as a daemon serves them);
// reports both p50s and their ratio (the target: at most 0.5).
func BenchmarkResetVsDeleteCreate(b *testing.B) {
	e := newE2E(b, e2eWorld(newWorld(b)))
	ctx := context.Background()
	cl := e.env.Client(e.env.Key(b, "bench"))
	netw := &api.Network{Mode: "allowlist", Allow: []string{"allowed.test"}}
	sb, err := cl.NewSandbox(ctx, client.WithNetwork(netw.Mode, netw.Allow...))
	if err != nil {
		b.Fatal(err)
	}
	defer sb.Close()
	other, err := cl.CreateSandbox(ctx, api.CreateSandboxRequest{Network: netw})
	if err != nil {
		b.Fatal(err)
	}
	reset := func() time.Duration {
		run(b, sb, "echo episode > /home/user/episode")
		return timeIt(b, "reset", func() error { return sb.Reset(ctx, "") })
	}
	recreate := func() time.Duration {
		return timeIt(b, "delete+create", func() error {
			if err := cl.DeleteSandbox(ctx, other.ID); err != nil {
				return err
			}
			other, err = cl.CreateSandbox(ctx, api.CreateSandboxRequest{Network: netw})
			return err
		})
	}
	for range 2 {
		reset()
		recreate()
	}
	var dReset, dRe []time.Duration
	i := 0
	b.ResetTimer()
	for b.Loop() {
		if i%2 == 0 {
			dReset = append(dReset, reset())
			dRe = append(dRe, recreate())
		} else {
			dRe = append(dRe, recreate())
			dReset = append(dReset, reset())
		}
		i++
	}
	b.StopTimer()
	cl.DeleteSandbox(ctx, other.ID)
	pr, pd := median(dReset), median(dRe)
	b.ReportMetric(float64(pr.Microseconds())/1000, "reset-p50-ms")
	b.ReportMetric(float64(pd.Microseconds())/1000, "delete+create-p50-ms")
	if pd > 0 {
		b.ReportMetric(float64(pr)/float64(pd), "reset/delete+create")
	}
}

// BenchmarkSnapshot200MB: a filesystem snapshot of a sandbox that wrote
// 200 MB; reports its time (p50) and the bytes it stores (its own layer:
// the template's layers are shared, not copied).
func BenchmarkSnapshot200MB(b *testing.B) {
	e := newE2E(b)
	ctx := context.Background()
	cl := e.env.Client(e.env.Key(b, "bench"))
	sb, err := cl.NewSandbox(ctx, client.WithDiskMB(1024))
	if err != nil {
		b.Fatal(err)
	}
	defer sb.Close()
	run(b, sb, "dd if=/dev/urandom of=/home/user/big bs=1M count=200 2>/dev/null && sync")
	var ds []time.Duration
	var stored int64
	b.ResetTimer()
	for b.Loop() {
		var sn *api.Snapshot
		ds = append(ds, timeIt(b, "snapshot", func() (err error) { sn, err = sb.Snapshot(ctx, "", false); return err }))
		stored = sn.SizeBytes
		b.StopTimer()
		if err := cl.DeleteSnapshot(ctx, sn.ID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(median(ds).Microseconds())/1000, "snapshot-p50-ms")
	b.ReportMetric(float64(stored)/(1<<20), "stored-MB")
}

// BenchmarkFork10Of200MB: POST /v1/sandboxes/{id}/fork {count: 10} of a
// sandbox that wrote a 200 MB working set (a file: the runc driver forks
// the filesystem), against ten cold creates of a sandbox like it in a row,
// interleaved. Reports both totals, what the host's MemAvailable dropped
// by while the ten forks run, and the forks' own memory (their cgroups).
// Every fork is checked to hold the whole file.
func BenchmarkFork10Of200MB(b *testing.B) {
	e := newE2E(b)
	ctx := context.Background()
	cl := e.env.Client(e.env.Key(b, "bench"))
	// Small sandboxes: eleven of them fit the tenant's default quota.
	opts := []client.SandboxOption{client.WithDiskMB(1024), client.WithCPU(0.2), client.WithMemoryMB(256)}
	src, err := cl.NewSandbox(ctx, opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	run(b, src, "dd if=/dev/urandom of=/home/user/big bs=1M count=200 2>/dev/null && sync")
	const n = 10
	var dFork, dCold []time.Duration
	var hostMB, cgMB []float64
	fork := func() {
		before := memAvailableMB(b)
		var forks []*client.Sandbox
		dFork = append(dFork, timeIt(b, "fork", func() (err error) { forks, err = src.Fork(ctx, n, nil, nil); return err }))
		if len(forks) != n {
			b.Fatalf("fork made %d sandboxes, want %d", len(forks), n)
		}
		hostMB = append(hostMB, before-memAvailableMB(b))
		var cg float64
		for _, f := range forks {
			if got := run(b, f, "stat -c %s /home/user/big"); got != "209715200" {
				b.Fatalf("fork %s: /home/user/big is %q bytes, want 209715200", f.ID(), got)
			}
			m, err := cl.Metrics(ctx, f.ID())
			if err != nil {
				b.Fatal(err)
			}
			cg += float64(m.MemoryBytes) / (1 << 20)
		}
		cgMB = append(cgMB, cg)
		for _, f := range forks {
			if err := f.Close(); err != nil {
				b.Fatal(err)
			}
		}
	}
	cold := func() {
		sbs := make([]*client.Sandbox, 0, n)
		dCold = append(dCold, timeIt(b, "cold creates", func() error {
			for range n {
				s, err := cl.NewSandbox(ctx, opts...)
				if err != nil {
					return err
				}
				sbs = append(sbs, s)
			}
			return nil
		}))
		for _, s := range sbs {
			if err := s.Close(); err != nil {
				b.Fatal(err)
			}
		}
	}
	i := 0
	b.ResetTimer()
	for b.Loop() {
		if i%2 == 0 {
			fork()
			cold()
		} else {
			cold()
			fork()
		}
		i++
	}
	b.StopTimer()
	medianF := func(v []float64) float64 { s := slices.Clone(v); slices.Sort(s); return s[len(s)/2] }
	b.ReportMetric(float64(median(dFork).Microseconds())/1000, "fork10-ms")
	b.ReportMetric(float64(median(dCold).Microseconds())/1000, "cold10-ms")
	b.ReportMetric(medianF(hostMB), "host-MB-added")
	b.ReportMetric(medianF(cgMB), "forks-cgroup-MB")
}

// memAvailableMB is the host's MemAvailable in MiB.
func memAvailableMB(b *testing.B) float64 {
	b.Helper()
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb / 1024
		}
	}
	b.Fatal("no MemAvailable in /proc/meminfo")
	return 0
}
