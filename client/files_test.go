package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/api"
)

// fakeFS is a sandbox filesystem of one level: path → content.
type fakeFS struct {
	files   map[string][]byte
	tars    map[string][]byte // dir → last tar body uploaded
	lengths []int64           // Content-Length of each upload as the server saw it
	modes   []string
	maxSize int64
}

func (f *fakeFS) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Query().Get("path")
		f.lengths = append(f.lengths, r.ContentLength)
		f.modes = append(f.modes, r.URL.Query().Get("mode"))
		if f.maxSize > 0 && r.ContentLength > f.maxSize {
			writeAPIError(w, 413, api.CodePayloadTooLarge, "upload over the limit")
			return
		}
		b, err := io.ReadAll(r.Body)
		if err != nil {
			writeAPIError(w, 400, api.CodeInvalidArgument, "read")
			return
		}
		if r.Header.Get("Content-Type") == ContentTypeTar {
			f.tars[p] = b
		} else {
			f.files[p] = b
		}
		writeJSON(w, 201, api.FileWritten{Path: p, Size: int64(len(b))})
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Query().Get("path")
		if r.Header.Get("Accept") == ContentTypeTar {
			w.Header().Set("Content-Type", ContentTypeTar)
			io.WriteString(w, "TAR:"+p)
			return
		}
		b, ok := f.files[p]
		if !ok {
			writeAPIError(w, 404, api.CodeNotFound, "no such file")
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Write(b)
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/fs/stat", func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Query().Get("path")
		b, ok := f.files[p]
		if !ok {
			writeAPIError(w, 404, api.CodeNotFound, "no such file")
			return
		}
		writeJSON(w, 200, api.FileInfo{Name: filepath.Base(p), Path: p, Type: "file", Size: int64(len(b)), Mode: "0644"})
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/fs/list", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("depth") != "2" {
			writeAPIError(w, 400, api.CodeInvalidArgument, "depth")
			return
		}
		var l api.FileList
		for p := range f.files {
			l.Entries = append(l.Entries, api.FileInfo{Path: p, Type: "file"})
		}
		writeJSON(w, 200, l)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/fs/move", func(w http.ResponseWriter, r *http.Request) {
		var m api.MoveRequest
		if err := jsonDecodeStrict(r, &m); err != nil {
			writeAPIError(w, 400, api.CodeInvalidArgument, err.Error())
			return
		}
		b, ok := f.files[m.From]
		if !ok {
			writeAPIError(w, 404, api.CodeNotFound, "no such file")
			return
		}
		delete(f.files, m.From)
		f.files[m.To] = b
		writeJSON(w, 200, api.FileInfo{Path: m.To, Type: "file", Size: int64(len(b))})
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/fs/mkdir", func(w http.ResponseWriter, r *http.Request) {
		var m api.MkdirRequest
		if err := jsonDecodeStrict(r, &m); err != nil || m.Path == "" {
			writeAPIError(w, 400, api.CodeInvalidArgument, "path")
			return
		}
		f.files[m.Path+"/"] = nil
		writeJSON(w, 201, api.FileInfo{Path: m.Path, Type: "dir"})
	})
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/fs", func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Query().Get("path")
		if strings.HasSuffix(p, "/") && r.URL.Query().Get("recursive") != "true" {
			writeAPIError(w, 409, api.CodeConflict, "directory not empty")
			return
		}
		delete(f.files, p)
		w.WriteHeader(204)
	})
	return mux
}

func TestFiles(t *testing.T) {
	f := &fakeFS{files: map[string][]byte{}, tars: map[string][]byte{}, maxSize: 1 << 20}
	c := newTestClient(t, f.handler())
	ctx := context.Background()

	// Upload from a bytes.Reader: the length is known up front.
	data := bytes.Repeat([]byte{0, 1, 2, 0xff}, 1000)
	fw, err := c.WriteFile(ctx, "sbx_1", "/home/user/a.bin", bytes.NewReader(data), WithMode(0o600))
	if err != nil || fw.Size != int64(len(data)) || fw.Path != "/home/user/a.bin" {
		t.Fatalf("WriteFile = %+v, %v", fw, err)
	}
	// Upload from a file, positioned past its start: only the rest is sent.
	tmp := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(tmp, []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	fh, err := os.Open(tmp)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	fh.Seek(4, io.SeekStart)
	if _, err := c.WriteFile(ctx, "sbx_1", "/tmp/b", fh); err != nil {
		t.Fatal(err)
	}
	if _, err := fh.Seek(0, io.SeekCurrent); err != nil {
		t.Errorf("WriteFile closed the caller's file: %v", err)
	}
	// An unknown-length stream goes chunked.
	pr, pw := io.Pipe()
	go func() { pw.Write([]byte("streamed")); pw.Close() }()
	if _, err := c.WriteFile(ctx, "sbx_1", "/tmp/c", pr); err != nil {
		t.Fatal(err)
	}
	// Empty file.
	if _, err := c.WriteFile(ctx, "sbx_1", "/tmp/empty", strings.NewReader("")); err != nil {
		t.Fatal(err)
	}
	if want := []int64{4000, 6, -1, 0}; len(f.lengths) != 4 || f.lengths[0] != want[0] || f.lengths[1] != want[1] || f.lengths[2] != want[2] || f.lengths[3] != want[3] {
		t.Errorf("content lengths = %v, want %v", f.lengths, want)
	}
	if f.modes[0] != "0600" || f.modes[1] != "" {
		t.Errorf("modes = %v", f.modes)
	}
	if string(f.files["/tmp/b"]) != "456789" || string(f.files["/tmp/c"]) != "streamed" {
		t.Errorf("server files = %q %q", f.files["/tmp/b"], f.files["/tmp/c"])
	}

	// A declared size over the cap is refused before the body is read.
	_, err = c.WriteFile(ctx, "sbx_1", "/tmp/big", io.LimitReader(zeroReader{}, 2<<20), WithSize(2<<20))
	if !errors.Is(err, ErrTooLarge) {
		t.Errorf("big upload: %v, want ErrTooLarge", err)
	}

	rc, err := c.ReadFile(ctx, "sbx_1", "/home/user/a.bin")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(got, data) {
		t.Errorf("ReadFile returned %d bytes, want the %d uploaded", len(got), len(data))
	}
	if _, err := c.ReadFile(ctx, "sbx_1", "/nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("ReadFile missing: %v", err)
	}

	if _, err := c.UploadTar(ctx, "sbx_1", "/home/user/dir", strings.NewReader("tarbytes")); err != nil {
		t.Fatal(err)
	}
	if string(f.tars["/home/user/dir"]) != "tarbytes" {
		t.Errorf("tar upload not sent as a tar: %v", f.tars)
	}
	rc, err = c.DownloadTar(ctx, "sbx_1", "/home/user/dir")
	if err != nil {
		t.Fatal(err)
	}
	got, _ = io.ReadAll(rc)
	rc.Close()
	if string(got) != "TAR:/home/user/dir" {
		t.Errorf("DownloadTar = %q", got)
	}

	st, err := c.Stat(ctx, "sbx_1", "/tmp/b")
	if err != nil || st.Size != 6 || st.Type != "file" {
		t.Fatalf("Stat = %+v, %v", st, err)
	}
	if fi, err := c.Move(ctx, "sbx_1", "/tmp/b", "/tmp/b2"); err != nil || fi.Path != "/tmp/b2" || fi.Size != 6 {
		t.Fatalf("Move = %+v, %v", fi, err)
	}
	if _, ok := f.files["/tmp/b2"]; !ok {
		t.Error("Move did not move")
	}
	if fi, err := c.Mkdir(ctx, "sbx_1", "/tmp/d"); err != nil || fi.Type != "dir" {
		t.Fatalf("Mkdir = %+v, %v", fi, err)
	}
	if err := c.Remove(ctx, "sbx_1", "/tmp/d/", false); !errors.Is(err, ErrConflict) {
		t.Errorf("Remove dir without recursive: %v", err)
	}
	if err := c.Remove(ctx, "sbx_1", "/tmp/d/", true); err != nil {
		t.Fatal(err)
	}
	entries, err := c.List(ctx, "sbx_1", "/", 2)
	if err != nil || len(entries) != len(f.files) {
		t.Fatalf("List = %v, %v", entries, err)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }
