package client

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"testing"
)

// countingWriter records the size of each write it gets.
type countingWriter struct {
	bytes.Buffer
	writes []int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.writes = append(w.writes, len(p))
	return w.Buffer.Write(p)
}

// TestReadFileWriteTo checks that io.Copy of a download goes through the
// body's WriteTo (large reads, not io.Copy's 32 KiB or io.Discard's 8 KiB)
// and delivers every byte, and that a broken transfer is an error.
func TestReadFileWriteTo(t *testing.T) {
	data := bytes.Repeat([]byte("airlock!"), 1<<19) // 4 MiB
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		if r.URL.Query().Get("path") == "/short" {
			w.Write(data[:len(data)/2]) // the server dies half way
			panic(http.ErrAbortHandler)
		}
		w.Write(data)
	})
	c := newTestClient(t, mux)
	ctx := context.Background()

	rc, err := c.ReadFile(ctx, "sbx_1", "/f")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := rc.(io.WriterTo); !ok {
		t.Fatal("the download body has no WriteTo")
	}
	var w countingWriter
	n, err := io.Copy(&w, rc)
	rc.Close()
	if err != nil || n != int64(len(data)) || !bytes.Equal(w.Bytes(), data) {
		t.Fatalf("copied %d bytes, %v", n, err)
	}
	if len(w.writes) > 0 && slicesMax(w.writes) <= 32<<10 {
		t.Errorf("largest write %d bytes: the copy did not use large reads", slicesMax(w.writes))
	}

	rc, err = c.ReadFile(ctx, "sbx_1", "/short")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	n, err = io.Copy(io.Discard, rc)
	if err == nil || n >= int64(len(data)) {
		t.Fatalf("broken download: %d bytes, err %v", n, err)
	}
}

func slicesMax(s []int) int {
	m := 0
	for _, v := range s {
		m = max(m, v)
	}
	return m
}
