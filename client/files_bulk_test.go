package client

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
)

// recordConn records the sizes of the writes made on it, and whether its
// own ReadFrom was used.
type recordConn struct {
	net.Conn
	writes   []int
	readFrom bool
}

func (c *recordConn) Write(p []byte) (int, error) {
	c.writes = append(c.writes, len(p))
	return len(p), nil
}

func (c *recordConn) ReadFrom(r io.Reader) (int64, error) {
	c.readFrom = true
	return io.Copy(io.Discard, r)
}

// TestBulkConnReadFrom checks how bulkConn sends a body: at once when it is
// in memory (behind net/http's LimitReader too), in uploadWrite pieces when
// it is a stream or longer than the limit, and
// through the connection's own ReadFrom (sendfile) from a file.
func TestBulkConnReadFrom(t *testing.T) {
	const size = 3*uploadWrite + 5
	data := bytes.Repeat([]byte{7}, size)
	tmp := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		src        func(t *testing.T) io.Reader
		wantWrites []int // nil: the connection's ReadFrom is used
	}{
		// A body in memory behind net/http's LimitReader writes itself.
		{"limited_in_memory", func(*testing.T) io.Reader { return io.LimitReader(bytes.NewReader(data), size) }, []int{size}},
		// A stream (no Len) goes in uploadWrite pieces.
		{"limited_stream", func(*testing.T) io.Reader { return io.LimitReader(struct{ io.Reader }{bytes.NewReader(data)}, size) },
			[]int{uploadWrite, uploadWrite, uploadWrite, 5}},
		// A body longer than the limit is cut at it, in pieces.
		{"limited_longer_body", func(*testing.T) io.Reader { return io.LimitReader(bytes.NewReader(append(data, 1, 2, 3)), size) },
			[]int{uploadWrite, uploadWrite, uploadWrite, 5}},
		{"writer_to", func(*testing.T) io.Reader { return bytes.NewReader(data) }, []int{size}},
		{"limited_file", func(t *testing.T) io.Reader {
			f, err := os.Open(tmp)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			return io.LimitReader(f, size)
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc := &recordConn{}
			n, err := (&bulkConn{Conn: rc}).ReadFrom(tt.src(t))
			if err != nil || n != size {
				t.Fatalf("ReadFrom = %d, %v", n, err)
			}
			if rc.readFrom != (tt.wantWrites == nil) {
				t.Errorf("connection's own ReadFrom used: %v", rc.readFrom)
			}
			if tt.wantWrites != nil && !equalInts(rc.writes, tt.wantWrites) {
				t.Errorf("writes %v, want %v", rc.writes, tt.wantWrites)
			}
		})
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestBulkDialerUpload sends uploads through a Transport whose connections
// come from bulkDialer: net/http must still frame them right (the bytes and
// the Content-Length arrive, the connection is reused).
func TestBulkDialerUpload(t *testing.T) {
	f := &fakeFS{files: map[string][]byte{}, tars: map[string][]byte{}}
	srv := httptest.NewServer(f.handler())
	t.Cleanup(srv.Close)
	var d net.Dialer
	dials := 0
	tr := &http.Transport{DialContext: bulkDialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials++
		return d.DialContext(ctx, network, addr)
	})}
	t.Cleanup(tr.CloseIdleConnections)
	c, err := New(srv.URL, "ak_test", WithHTTPClient(&http.Client{Transport: tr}))
	if err != nil {
		t.Fatal(err)
	}
	for i, size := range []int{1, 2*uploadWrite + 3} {
		data := bytes.Repeat([]byte{byte(i + 1)}, size)
		fw, err := c.WriteFile(context.Background(), "sbx_1", "/f", bytes.NewReader(data))
		if err != nil || fw.Size != int64(size) {
			t.Fatalf("WriteFile = %+v, %v", fw, err)
		}
		if !bytes.Equal(f.files["/f"], data) || f.lengths[i] != int64(size) {
			t.Fatalf("server got %d bytes, Content-Length %d; want %d", len(f.files["/f"]), f.lengths[i], size)
		}
	}
	if dials != 1 {
		t.Errorf("%d connections for two uploads, want 1", dials)
	}
}
