package e2b

import (
	"archive/tar"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The directory (or file) a COPY source's pattern starts from is what
// E2B copies: its contents for a directory.
func TestCopySource(t *testing.T) {
	for src, want := range map[string]string{
		"folder/*":        "folder",
		"folder/**/*.txt": "folder",
		"./folder/":       "folder",
		"a/b/file.txt":    "a/b/file.txt",
		"*.txt":           ".",
		".":               ".",
		"a/../b":          "b",
		"..myconfig":      "..myconfig",
		"../escape":       "",
		"a/../../escape":  "",
		"/etc/passwd":     "",
	} {
		if got := copySource(src); got != want {
			t.Errorf("copySource(%q) = %q, want %q", src, got, want)
		}
	}
}

// A COPY's mode applies to what the copy puts at the top of its
// destination: the file, or each entry of a directory's contents.
func TestCopyTargets(t *testing.T) {
	p := filepath.Join(t.TempDir(), "up.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for _, n := range []string{"dir/a.txt", "dir/sub/b.txt", "dir/c.txt", "top.txt"} {
		tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644})
	}
	tw.Close()
	f.Close()
	for _, c := range []struct{ src, dest, want string }{
		{"dir", "/opt/x", "/opt/x/a.txt /opt/x/c.txt /opt/x/sub"},
		{"dir", "rel", "rel/a.txt rel/c.txt rel/sub"},
		{"top.txt", "/etc/", "/etc/top.txt"},
		{"top.txt", "/etc/renamed", "/etc/renamed"},
		{".", "/all", "/all/dir /all/top.txt"},
	} {
		got, err := copyTargets(p, c.src, c.dest)
		if err != nil || strings.Join(got, " ") != c.want {
			t.Errorf("copyTargets(%q, %q) = %v, %v; want %s", c.src, c.dest, got, err, c.want)
		}
	}
}

// A build error's spec line is the SDK's step that made it.
func TestFailedStep(t *testing.T) {
	steps := []string{"base", "base", "base", "1", "2", "2", "2", "3"}
	for msg, want := range map[string]string{
		"step 6/6 (line 8) RUN exit 3: exited with status 3": "3",
		"step 3/6 (line 6) RUN id: exited with status 1":     "2",
		"line 1: FROM: template x not found":                 "base",
		"line 9: beyond the spec":                            "",
		"no line here":                                       "",
	} {
		if got := failedStep(msg, steps); got != want {
			t.Errorf("failedStep(%q) = %q, want %q", msg, got, want)
		}
	}
}
