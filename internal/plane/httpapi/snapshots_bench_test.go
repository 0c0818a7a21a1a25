package httpapi_test

import (
	"context"
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
