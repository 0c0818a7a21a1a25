package build

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// imageLayer makes an image layer of files (path → content; "" with a
// trailing / in the path makes a directory).
func imageLayer(t testing.TB, files [][2]string) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f[0], Mode: 0o644, ModTime: time.Unix(1700000000, 0), Typeflag: tar.TypeReg, Size: int64(len(f[1]))}
		if f[0][len(f[0])-1] == '/' {
			h.Typeflag, h.Mode, h.Size = tar.TypeDir, 0o755, 0
		} else if filepath.Dir(f[0]) == "bin" || regexp.MustCompile(`\.so`).MatchString(f[0]) {
			h.Mode = 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(f[1]))
	}
	tw.Close()
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// shellImage is a three-layer image with a working /bin/sh (the host's
// dash and the libraries it links), written as `docker save` does. The
// second layer deletes /gone and makes /opq opaque.
func shellImage(t testing.TB) string {
	t.Helper()
	dash, err := exec.LookPath("dash")
	if err != nil {
		t.Skip("dash is not installed on the host")
	}
	rm, err := exec.LookPath("rm")
	if err != nil {
		t.Skip("rm is not installed on the host")
	}
	out, err := exec.Command("ldd", dash, rm).Output()
	if err != nil {
		t.Skipf("ldd: %v", err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	files := [][2]string{{"bin/", ""}, {"bin/sh", read(dash)}, {"bin/rm", read(rm)}, {"etc/", ""}, {"etc/motd", "welcome\n"}, {"gone", "x"}, {"opq/", ""}, {"opq/old", "old"}}
	dirs := map[string]bool{"bin": true, "etc": true}
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile(`(/\S+\.so[.0-9]*)`).FindAllString(string(out), -1) {
		rel := m[1:]
		if seen[rel] {
			continue
		}
		seen[rel] = true
		for d := filepath.Dir(rel); d != "."; d = filepath.Dir(d) {
			if !dirs[d] {
				dirs[d] = true
				files = append(files, [2]string{d + "/", ""})
			}
		}
		files = append(files, [2]string{rel, read(m)})
	}
	// Parents before children.
	for i := range files {
		for j := i + 1; j < len(files); j++ {
			if files[j][0] < files[i][0] {
				files[i], files[j] = files[j], files[i]
			}
		}
	}
	l1 := imageLayer(t, files)
	l2 := imageLayer(t, [][2]string{{".wh.gone", ""}, {"opq/", ""}, {"opq/.wh..wh..opq", ""}, {"opq/new", "new"}})
	l3 := imageLayer(t, [][2]string{{"etc/", ""}, {"etc/image-release", "test\n"}})
	img, err := mutate.AppendLayers(empty.Image, l1, l2, l3)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "IMAGE_VAR=from-image"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "image.tar")
	tag, _ := name.NewTag("test/shell:1")
	if err := tarball.WriteToFile(p, tag, img); err != nil {
		t.Fatal(err)
	}
	return p
}
