package httpapi

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// socketSource returns a unix socket that yields data and then EOF, like an
// agent's direct connection.
func socketSource(t *testing.T, data []byte) net.Conn {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "sp")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	go func() {
		conns[1].Write(data)
		conns[1].Close()
	}()
	t.Cleanup(func() { conns[0].Close() })
	return conns[0]
}

// TestCopyResponse sends a socket's bytes as a response body through the
// request log's recorder: the client gets them all, and the recorder counts
// them whether they went by Write or by the writer's ReadFrom (splice).
func TestCopyResponse(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	tests := []struct {
		name        string
		wrapped     bool // behind the request log's recorder
		writeHeader bool // header sent before the copy
	}{
		{"recorder", true, true},
		{"recorder_header_unsent", true, false},
		{"plain", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			type result struct {
				copied, counted int64
				err             error
			}
			done := make(chan result, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var rec *statusRecorder
				if tt.wrapped {
					rec = &statusRecorder{ResponseWriter: w}
					w = rec
				}
				w.Header().Set("Content-Length", strconv.Itoa(len(data)))
				if tt.writeHeader {
					w.WriteHeader(http.StatusOK)
				}
				src := &io.LimitedReader{R: socketSource(t, data), N: int64(len(data))}
				var res result
				res.copied, res.err = copyResponse(w, src)
				if rec != nil {
					res.counted = rec.bytes
				}
				done <- res
			}))
			defer srv.Close()
			resp, err := http.Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || !bytes.Equal(body, data) {
				t.Fatalf("body %d bytes, %v", len(body), err)
			}
			res := <-done
			if res.err != nil || res.copied != int64(len(data)) {
				t.Fatalf("copyResponse = %d, %v", res.copied, res.err)
			}
			if tt.wrapped && res.counted != int64(len(data)) {
				t.Fatalf("recorder counted %d bytes, want %d", res.counted, len(data))
			}
		})
	}
}
