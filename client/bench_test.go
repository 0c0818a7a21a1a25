package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
)

// execServer answers POST …/exec at once, in the JSON mode and in the SSE
// mode, with a small output: what is measured is the client's cost.
func execServer() http.Handler {
	out, errs, code := "hello\n", "", 0
	result := api.ExecResult{ID: "ex_1", Status: api.ExecExited, ExitCode: &code, DurationMS: 1}
	withOut := result
	withOut.Stdout, withOut.Stderr = &out, &errs
	jsonBody, _ := json.Marshal(withOut)
	exitBody, _ := json.Marshal(result)
	outBody, _ := json.Marshal(api.OutputEvent{Data: out})
	sse := []byte("event: start\ndata: {\"id\":\"ex_1\"}\n\nevent: stdout\ndata: " + string(outBody) +
		"\n\nevent: exit\ndata: " + string(exitBody) + "\n\n")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.Header.Get("Accept") == "text/event-stream" {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Write(sse)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(jsonBody)
	})
}

// BenchmarkExecRoundTrip measures what the SDK adds to an exec round trip
// over raw net/http from Go (the budget: 0.5 ms), against a server
// that answers at once on loopback:
//
//	raw-http      POST …/exec with net/http, decode the JSON result
//	client-exec   Client.Exec (the JSON mode)
//	sandbox-run   Sandbox.Run (the SSE mode: output kept, kill on cancel)
//	sandbox-run-streamed   Sandbox.Run with OnStdout
//
// Run one after the other they may see different loads of a shared
// machine: BenchmarkExecOverhead measures the difference.
func BenchmarkExecRoundTrip(b *testing.B) {
	srv := httptest.NewServer(execServer())
	defer srv.Close()
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	c, err := New(srv.URL, "ak_bench", WithHTTPClient(hc))
	if err != nil {
		b.Fatal(err)
	}
	sb := &Sandbox{c: c, id: "sbx_1"}
	ctx := context.Background()
	reqBody, _ := json.Marshal(api.ExecRequest{Cmd: []string{"echo", "hello"}})

	b.Run("raw-http", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/sandboxes/sbx_1/exec", bytes.NewReader(reqBody))
			req.Header.Set("Authorization", "Bearer ak_bench")
			req.Header.Set("Content-Type", "application/json")
			resp, err := hc.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			var res api.ExecResult
			err = json.NewDecoder(resp.Body).Decode(&res)
			resp.Body.Close()
			if err != nil || res.Stdout == nil || *res.Stdout != "hello\n" {
				b.Fatalf("raw: %+v, %v", res, err)
			}
		}
	})
	b.Run("client-exec", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			res, err := c.Exec(ctx, "sbx_1", api.ExecRequest{Cmd: []string{"echo", "hello"}})
			if err != nil || *res.Stdout != "hello\n" {
				b.Fatalf("exec: %+v, %v", res, err)
			}
		}
	})
	b.Run("sandbox-run", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			res, err := sb.RunArgs(ctx, []string{"echo", "hello"})
			if err != nil || res.Stdout != "hello\n" {
				b.Fatalf("run: %+v, %v", res, err)
			}
		}
	})
	b.Run("sandbox-run-streamed", func(b *testing.B) {
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			res, err := sb.RunArgs(ctx, []string{"echo", "hello"}, OnStdout(func(s string) { n += len(s) }))
			if err != nil || res.Stdout != "hello\n" {
				b.Fatalf("run: %+v, %v", res, err)
			}
		}
	})
}

// BenchmarkExecOverhead alternates a raw net/http exec and a Sandbox.Run
// in each iteration, so that both see the same load (on a shared machine
// sub-benchmarks run one after the other see different ones), and reports
// the mean of each and their difference: the SDK's overhead, whose budget
// is 0.5 ms.
//
//	go -C client test -run '^$' -bench BenchmarkExecOverhead -benchtime 3000x ./
func BenchmarkExecOverhead(b *testing.B) {
	srv := httptest.NewServer(execServer())
	defer srv.Close()
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	c, err := New(srv.URL, "ak_bench", WithHTTPClient(hc))
	if err != nil {
		b.Fatal(err)
	}
	sb := &Sandbox{c: c, id: "sbx_1"}
	ctx := context.Background()
	reqBody, _ := json.Marshal(api.ExecRequest{Cmd: []string{"echo", "hello"}})
	raw := func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/sandboxes/sbx_1/exec", bytes.NewReader(reqBody))
		req.Header.Set("Authorization", "Bearer ak_bench")
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		var res api.ExecResult
		err = json.NewDecoder(resp.Body).Decode(&res)
		resp.Body.Close()
		if err != nil || res.Stdout == nil {
			b.Fatalf("raw: %+v, %v", res, err)
		}
	}
	sdk := func() {
		if res, err := sb.RunArgs(ctx, []string{"echo", "hello"}); err != nil || res.Stdout != "hello\n" {
			b.Fatalf("run: %+v, %v", res, err)
		}
	}
	raw()
	sdk()
	var rawTotal, sdkTotal time.Duration
	for b.Loop() {
		t0 := time.Now()
		raw()
		t1 := time.Now()
		sdk()
		rawTotal += t1.Sub(t0)
		sdkTotal += time.Since(t1)
	}
	n := float64(b.N)
	b.ReportMetric(float64(rawTotal.Nanoseconds())/n/1e3, "raw-µs/op")
	b.ReportMetric(float64(sdkTotal.Nanoseconds())/n/1e3, "sdk-µs/op")
	b.ReportMetric(float64((sdkTotal-rawTotal).Nanoseconds())/n/1e3, "overhead-µs/op")
}

// firstOutputServer answers POST …/exec in the SSE mode: the start event
// at once, then, after a pause (so that the client waits on its socket, as
// for a command that prints late), the stdout event, noting when it was
// written, then the exit event.
func firstOutputServer(sent chan<- time.Time) http.Handler {
	code := 0
	exitBody, _ := json.Marshal(api.ExecResult{ID: "ex_1", Status: api.ExecExited, ExitCode: &code, DurationMS: 1})
	outBody, _ := json.Marshal(api.OutputEvent{Data: "hello\n"})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		f := w.(http.Flusher)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte("event: start\ndata: {\"id\":\"ex_1\"}\n\n"))
		f.Flush()
		time.Sleep(2 * time.Millisecond)
		t := time.Now()
		w.Write([]byte("event: stdout\ndata: " + string(outBody) + "\n\n"))
		f.Flush()
		sent <- t
		time.Sleep(time.Millisecond)
		w.Write([]byte("event: exit\ndata: " + string(exitBody) + "\n\n"))
	})
}

// BenchmarkStreamFirstOutput measures how long after the server writes an
// exec's first output the SDK hands it to OnStdout (the budget:
// within 1 ms of the first byte), beside a raw reader of the same stream
// (net/http and a bufio scan for the stdout event), in turn. It reports
// the p50 and p99 of each in µs.
//
//	go -C client test -run '^$' -bench BenchmarkStreamFirstOutput -benchtime 500x ./
func BenchmarkStreamFirstOutput(b *testing.B) {
	sent := make(chan time.Time, 1)
	srv := httptest.NewServer(firstOutputServer(sent))
	defer srv.Close()
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	c, err := New(srv.URL, "ak_bench", WithHTTPClient(hc))
	if err != nil {
		b.Fatal(err)
	}
	sb := &Sandbox{c: c, id: "sbx_1"}
	ctx := context.Background()
	reqBody, _ := json.Marshal(api.ExecRequest{Cmd: []string{"echo", "hello"}})
	raw := func() time.Duration {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/sandboxes/sbx_1/exec", bytes.NewReader(reqBody))
		req.Header.Set("Authorization", "Bearer ak_bench")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "text/event-stream")
		resp, err := hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		var got time.Time
		sc := bufio.NewScanner(resp.Body)
		stdout := false
		for sc.Scan() {
			line := sc.Text()
			if line == "event: stdout" {
				stdout = true
			} else if stdout && strings.HasPrefix(line, "data: ") && got.IsZero() {
				got = time.Now()
			}
		}
		if got.IsZero() {
			b.Fatal("raw: no stdout event")
		}
		return got.Sub(<-sent)
	}
	sdk := func() time.Duration {
		var got time.Time
		res, err := sb.RunArgs(ctx, []string{"echo", "hello"}, OnStdout(func(string) {
			if got.IsZero() {
				got = time.Now()
			}
		}))
		if err != nil || res.Stdout != "hello\n" || got.IsZero() {
			b.Fatalf("run: %+v, %v", res, err)
		}
		return got.Sub(<-sent)
	}
	raw()
	sdk()
	var raws, sdks []time.Duration
	for b.Loop() {
		raws = append(raws, raw())
		sdks = append(sdks, sdk())
	}
	q := func(d []time.Duration, p float64) float64 {
		slices.Sort(d)
		return float64(d[int(p*float64(len(d)-1))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(q(raws, 0.5), "raw-p50-µs")
	b.ReportMetric(q(raws, 0.99), "raw-p99-µs")
	b.ReportMetric(q(sdks, 0.5), "sdk-p50-µs")
	b.ReportMetric(q(sdks, 0.99), "sdk-p99-µs")
}
