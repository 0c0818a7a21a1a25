package build

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// writeRawTar writes headers (and contents) as they are, for archives a
// well-behaved writer would not make.
func writeRawTar(t *testing.T, entries []tar.Header, data map[string]string) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		h := h
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(data[h.Name]))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(data[h.Name]))
		}
	}
	tw.Close()
	f, err := os.CreateTemp(t.TempDir(), "ctx-*.tar")
	if err != nil {
		t.Fatal(err)
	}
	f.Write(buf.Bytes())
	f.Close()
	return f.Name()
}

func TestContextSelect(t *testing.T) {
	p := writeRawTar(t, []tar.Header{
		{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./src/a.py", Typeflag: tar.TypeReg, Mode: 0o644}, // parent dir implicit
		{Name: "src/pkg/", Typeflag: tar.TypeDir, Mode: 0o700},
		{Name: "src/pkg/b.py", Typeflag: tar.TypeReg, Mode: 0o600},
		{Name: "README", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "README"},
		{Name: "hard", Typeflag: tar.TypeLink, Linkname: "README"},
		{Name: "dev", Typeflag: tar.TypeChar},
	}, map[string]string{"./src/a.py": "A", "src/pkg/b.py": "B", "README": "readme"})
	c, err := openContext(p)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		srcs   []string
		rels   []string
		single bool
		err    string
	}{
		{"dir-contents", []string{"src"}, []string{"a.py", "pkg", "pkg/b.py"}, false, ""},
		{"dir-slash-dot", []string{"./src/"}, []string{"a.py", "pkg", "pkg/b.py"}, false, ""},
		{"one-file", []string{"README"}, []string{"README"}, true, ""},
		{"symlink-itself", []string{"link"}, []string{"link"}, true, ""},
		{"glob", []string{"src/*.py"}, []string{"a.py"}, false, ""},
		{"several", []string{"README", "src/pkg"}, []string{"README", "b.py"}, false, ""},
		{"whole-context", []string{"."}, []string{"README", "hard", "link", "src", "src/a.py", "src/pkg", "src/pkg/b.py"}, false, ""},
		{"missing", []string{"nope.txt"}, nil, false, `source "nope.txt" is not in the build context`},
		{"glob-nothing", []string{"*.go"}, nil, false, "matches nothing"},
		{"escape", []string{"../etc/passwd"}, nil, false, "outside the build context"},
		{"devices-skipped", []string{"dev"}, nil, false, "not in the build context"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sel, err := c.selectSources(tc.srcs)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var rels []string
			for _, it := range sel.items {
				rels = append(rels, it.rel)
			}
			slices.Sort(rels)
			if !slices.Equal(rels, tc.rels) || sel.single != tc.single {
				t.Errorf("items %v single %v, want %v %v", rels, sel.single, tc.rels, tc.single)
			}
		})
	}

	t.Run("tar-out", func(t *testing.T) {
		sel, err := c.selectSources([]string{"README", "hard", "src"})
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := c.writeTar(&buf, sel, ""); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		tr := tar.NewReader(&buf)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(tr)
			switch h.Typeflag {
			case tar.TypeLink:
				got[h.Name] = "link to " + h.Linkname
			case tar.TypeDir:
				got[h.Name] = "dir"
			default:
				got[h.Name] = string(b)
			}
		}
		want := map[string]string{"README": "readme", "hard": "link to README", "a.py": "A", "pkg/": "dir", "pkg/b.py": "B"}
		if !maps.Equal(got, want) {
			t.Errorf("tar has %v, want %v", got, want)
		}
	})
	t.Run("rename-single", func(t *testing.T) {
		sel, _ := c.selectSources([]string{"hard"})
		var buf bytes.Buffer
		if err := c.writeTar(&buf, sel, "renamed"); err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(&buf)
		h, err := tr.Next()
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		// A hard link whose target is not copied carries the content.
		if h.Name != "renamed" || h.Typeflag != tar.TypeReg || string(b) != "readme" {
			t.Errorf("got %s %c %q", h.Name, h.Typeflag, b)
		}
	})
	t.Run("input-hash", func(t *testing.T) {
		a, _ := c.selectSources([]string{"src"})
		b, _ := c.selectSources([]string{"./src/"})
		d, _ := c.selectSources([]string{"README"})
		if a.inputHash() != b.inputHash() || a.inputHash() == d.inputHash() {
			t.Error("input hash does not follow the selected content")
		}
	})
}

func TestContextRejects(t *testing.T) {
	tests := []struct {
		name    string
		entries []tar.Header
		want    string
	}{
		{"dotdot", []tar.Header{{Name: "ok", Typeflag: tar.TypeReg}, {Name: "a/../../evil", Typeflag: tar.TypeReg}}, "escapes the archive's root"},
		{"dotdot-link-target", []tar.Header{{Name: "l", Typeflag: tar.TypeLink, Linkname: "../../etc/shadow"}}, "escapes the archive's root"},
		{"link-before-target", []tar.Header{{Name: "l", Typeflag: tar.TypeLink, Linkname: "later"}, {Name: "later", Typeflag: tar.TypeReg}}, "not a file before it"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := openContext(writeRawTar(t, tc.entries, nil))
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want invalid argument %q", err, tc.want)
			}
		})
	}
	t.Run("not-a-tar", func(t *testing.T) {
		f, _ := os.CreateTemp(t.TempDir(), "x")
		f.WriteString(strings.Repeat("not a tar archive ", 64))
		f.Close()
		if _, err := openContext(f.Name()); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("got %v", err)
		}
	})
}
