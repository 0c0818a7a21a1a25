package build

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// FuzzParse: any spec text parses to a spec that starts FROM something, or
// to a SpecError (invalid argument); never a panic.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"FROM base\nRUN echo hi\n",
		"FROM base\nCOPY --chown=user:user a b /dst/\nENV A=1 B=\"2 3\"\nWORKDIR /app\nUSER user\nCMD [\"sleep\", \"1\"]\n",
		"FROM base\nRUN [\"sh\", \"-c\", \"x\"]\nRUN a \\\n  b\n# c\nARG X=1\n",
		"FROM\n", "RUN x\n", "FROM base\nCOPY\n", "FROM base\nENV\n", "FROM base\nRUN \\", "\x00",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		sp, err := Parse(text)
		if err != nil {
			var se *SpecError
			if !errors.As(err, &se) || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Parse(%q): unclassified error %T %v", text, err, err)
			}
			return
		}
		if sp.From.From == "" || sp.From.Cmd != "FROM" {
			t.Fatalf("Parse(%q) = a spec without FROM: %+v", text, sp.From)
		}
		for _, st := range sp.Steps {
			if st.Cmd == "" || st.Cmd == "FROM" {
				t.Fatalf("Parse(%q): step %+v", text, st)
			}
		}
	})
}

// FuzzOpenContext: an uploaded build context, whatever it holds, is
// indexed with every name inside its root (or refused), and what a COPY of
// all of it writes names nothing outside the destination.
func FuzzOpenContext(f *testing.F) {
	tarOf := func(hs ...tar.Header) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, h := range hs {
			body := ""
			if h.Typeflag == tar.TypeReg {
				body = "content"
				h.Size = int64(len(body))
			}
			tw.WriteHeader(&h)
			tw.Write([]byte(body))
		}
		tw.Close()
		return b.Bytes()
	}
	f.Add(tarOf(tar.Header{Name: "a/", Typeflag: tar.TypeDir, Mode: 0o755}, tar.Header{Name: "a/f", Typeflag: tar.TypeReg, Mode: 0o644}))
	f.Add(tarOf(tar.Header{Name: "../x", Typeflag: tar.TypeReg}))
	f.Add(tarOf(tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"}, tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "l"}))
	f.Add(tarOf(tar.Header{Name: "f", Typeflag: tar.TypeReg}, tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "f"}, tar.Header{Name: "h2", Typeflag: tar.TypeLink, Linkname: "../f"}))
	// A sparse file claiming a petabyte in a few hundred bytes.
	var sparse bytes.Buffer
	stw := tar.NewWriter(&sparse)
	stw.WriteHeader(&tar.Header{Name: "big", Typeflag: tar.TypeReg, Size: 1 << 50, Format: tar.FormatPAX,
		PAXRecords: map[string]string{"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "big", "GNU.sparse.realsize": "1125899906842624"}})
	f.Add(sparse.Bytes())
	f.Add([]byte("junk"))
	p := filepath.Join(f.TempDir(), "ctx.tar")
	f.Fuzz(func(t *testing.T, archive []byte) {
		if err := os.WriteFile(p, archive, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := openContext(p)
		if err != nil {
			return
		}
		for name := range c.entries {
			if name == ".." || strings.HasPrefix(name, "../") || strings.HasPrefix(name, "/") || path.Clean("/"+name) != "/"+name && name != "" {
				t.Fatalf("indexed name %q", name)
			}
		}
		sel, err := c.selectSources([]string{"."})
		if err != nil {
			return
		}
		var out bytes.Buffer
		if err := c.writeTar(&out, sel, ""); err != nil {
			return
		}
		tr := tar.NewReader(&out)
		for {
			h, err := tr.Next()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					t.Fatalf("COPY wrote a malformed tar: %v", err)
				}
				return
			}
			n := path.Clean(h.Name)
			if n == ".." || strings.HasPrefix(n, "../") || strings.HasPrefix(h.Name, "/") {
				t.Fatalf("COPY writes %q, outside its destination", h.Name)
			}
			if h.Typeflag == tar.TypeLink {
				if l := path.Clean(h.Linkname); l == ".." || strings.HasPrefix(l, "../") || strings.HasPrefix(h.Linkname, "/") {
					t.Fatalf("COPY writes a hard link to %q, outside its destination", h.Linkname)
				}
			}
		}
	})
}
