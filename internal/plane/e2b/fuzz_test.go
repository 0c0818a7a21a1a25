package e2b

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// FuzzTemplateUpload: the files of a template COPY, as E2B's SDK uploads
// them (a tar, gzipped or not), are checked (refused with a client error)
// or merged into a build context whose names all stay under the upload's
// hash directory and whose size stays in the bound.
func FuzzTemplateUpload(f *testing.F) {
	mk := func(gz bool, hs ...tar.Header) []byte {
		var b bytes.Buffer
		var w *gzip.Writer
		tw := tar.NewWriter(&b)
		if gz {
			w = gzip.NewWriter(&b)
			tw = tar.NewWriter(w)
		}
		for _, h := range hs {
			if h.Typeflag == tar.TypeReg {
				h.Size = 1
			}
			tw.WriteHeader(&h)
			if h.Typeflag == tar.TypeReg {
				tw.Write([]byte("x"))
			}
		}
		tw.Close()
		if w != nil {
			w.Close()
		}
		return b.Bytes()
	}
	f.Add(mk(true, tar.Header{Name: "folder/", Typeflag: tar.TypeDir}, tar.Header{Name: "folder/a.txt", Typeflag: tar.TypeReg}))
	f.Add(mk(false, tar.Header{Name: "../up", Typeflag: tar.TypeReg}))
	f.Add(mk(false, tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc"}, tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "../../x"}))
	f.Add(mk(true, tar.Header{Name: "dev", Typeflag: tar.TypeChar}))
	f.Add([]byte{0x1f, 0x8b, 0, 0})
	const max = 1 << 20
	f.Fuzz(func(t *testing.T, upload []byte) {
		if err := checkUpload(bytes.NewReader(upload), max); err != nil {
			if !errdefs.IsInvalidArgument(err) && !errors.Is(err, errdefs.ErrTooLarge) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		p := filepath.Join(t.TempDir(), "up")
		if err := os.WriteFile(p, upload, 0o600); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		tw := tar.NewWriter(&out)
		const hash = "0123abcd"
		n, err := appendUpload(tw, p, hash, max)
		tw.Close()
		if err != nil {
			return
		}
		if n > max {
			t.Fatalf("%d bytes merged, over the bound %d", n, max)
		}
		tr := tar.NewReader(&out)
		for {
			h, err := tr.Next()
			if err != nil {
				return
			}
			if !strings.HasPrefix(h.Name, hash+"/") || strings.Contains("/"+h.Name+"/", "/../") {
				t.Fatalf("merged entry %q leaves %s/", h.Name, hash)
			}
			if h.Typeflag == tar.TypeLink && (!strings.HasPrefix(h.Linkname, hash+"/") || strings.Contains("/"+h.Linkname+"/", "/../")) {
				t.Fatalf("merged hard link to %q leaves %s/", h.Linkname, hash)
			}
		}
	})
}
