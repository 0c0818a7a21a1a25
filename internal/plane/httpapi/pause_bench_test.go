package httpapi_test

import (
	"context"
	"testing"
	"time"
)

// BenchmarkResumeFromMemory: POST /v1/sandboxes/{id}/resume of a sandbox
// paused with its memory kept (runc: its cgroup frozen), until the answer,
// and then until the first command's result, beside a plain exec of the
// running sandbox (what a command costs on the host now), interleaved.
// The pauses are outside the timing. Reports resume-p50-ms (the target: at
// most 10 ms), resume-exec-p50-ms and exec-p50-ms.
func BenchmarkResumeFromMemory(b *testing.B) {
	e := newE2E(b)
	ctx := context.Background()
	cl := e.env.Client(e.env.Key(b, "bench"))
	sb, err := cl.NewSandbox(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer sb.Close()
	// Something that runs across the pause, as a real workload would.
	run(b, sb, "(setsid sh -c 'while :; do sleep 1; done' >/dev/null 2>&1 &)")
	var resumes, firsts, execs []time.Duration
	for b.Loop() {
		b.StopTimer()
		if err := sb.Pause(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		if err := sb.Resume(ctx); err != nil {
			b.Fatal(err)
		}
		resumes = append(resumes, time.Since(start))
		if _, err := sb.Run(ctx, "true"); err != nil {
			b.Fatal(err)
		}
		firsts = append(firsts, time.Since(start))
		execs = append(execs, timeIt(b, "exec", func() error { _, err := sb.Run(ctx, "true"); return err }))
	}
	b.StopTimer()
	b.ReportMetric(float64(median(resumes).Microseconds())/1000, "resume-p50-ms")
	b.ReportMetric(float64(median(firsts).Microseconds())/1000, "resume-exec-p50-ms")
	b.ReportMetric(float64(median(execs).Microseconds())/1000, "exec-p50-ms")
}
