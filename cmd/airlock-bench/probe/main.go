// Command probe is the baseline of make bench's "CLI start to first request"
// row: the smallest Go program that does what `airlock exec` does before
// its first request (read $AIRLOCK_URL, send one request with net/http).
// scripts/bench.sh builds it static (CGO_ENABLED=0) beside bin/airlock.
package main

import (
	"io"
	"net/http"
	"os"
	"strings"
)

func main() {
	resp, err := http.Post(os.Getenv("AIRLOCK_URL")+"/v1/sandboxes/sbx_bench/exec", "application/json",
		strings.NewReader(`{"cmd":["true"]}`))
	if err != nil {
		os.Exit(2)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}
