package template

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/testutil"
)

// entry is one file of a test layer.
type entry struct {
	name, data, link string
	typ              byte
	mode             int64
	uid              int
}

func layerTar(t *testing.T, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.uid, Linkname: e.link, ModTime: time.Unix(1700000000, 0)}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.data))
		}
		mk(t, "tar header", tw.WriteHeader(h))
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e.data))
		}
	}
	mk(t, "tar close", tw.Close())
	return buf.Bytes()
}

func layerOf(t *testing.T, entries []entry) v1.Layer {
	t.Helper()
	b := layerTar(t, entries)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	mk(t, "layer", err)
	return l
}

// testImage is two layers: the second deletes /a/b (a whiteout) and
// replaces /opq (an opaque directory).
func testImage(t *testing.T) v1.Image {
	t.Helper()
	l1 := layerOf(t, []entry{
		{name: "a/", typ: tar.TypeDir, mode: 0o755},
		{name: "a/b", data: "b"},
		{name: "a/c", data: "c", uid: 1000},
		{name: "opq/", typ: tar.TypeDir, mode: 0o755},
		{name: "opq/old", data: "old"},
		{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		{name: "etc/passwd", data: "root:x:0:0:root:/root:/bin/sh\n"},
		{name: "bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "bin/run", data: "#!/bin/sh\n", mode: 0o4755},
		{name: "bin/alias", typ: tar.TypeSymlink, link: "run"},
		{name: "bin/hard", typ: tar.TypeLink, link: "bin/run"},
		{name: "dev/", typ: tar.TypeDir, mode: 0o755},
		{name: "dev/null", typ: tar.TypeChar},
	})
	l2 := layerOf(t, []entry{
		{name: "a/.wh.b", data: ""},
		{name: "opq/", typ: tar.TypeDir, mode: 0o700},
		{name: "opq/.wh..wh..opq", data: ""},
		{name: "opq/new", data: "new"},
	})
	img, err := mutate.AppendLayers(empty.Image, l1, l2)
	mk(t, "append", err)
	cf, err := img.ConfigFile()
	mk(t, "config", err)
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}
	cf.Config.WorkingDir, cf.Config.User, cf.Config.Cmd = "/a", "nobody", []string{"serve"}
	img, err = mutate.ConfigFile(img, cf)
	mk(t, "config", err)
	return img
}

// dockerSave writes img as `docker save` does.
func dockerSave(t *testing.T, img v1.Image) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "image.tar")
	tag, err := name.NewTag("test/image:1")
	mk(t, "tag", err)
	mk(t, "write", tarball.WriteToFile(p, tag, img))
	return p
}

// ociLayoutTar writes img as an OCI image layout in a tar.
func ociLayoutTar(t *testing.T, img v1.Image) string {
	t.Helper()
	dir := t.TempDir()
	lp, err := layout.Write(dir, empty.Index)
	mk(t, "layout", err)
	mk(t, "append", lp.AppendImage(img))
	return tarTree(t, dir)
}

// tarTree tars a directory.
func tarTree(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "layout.tar")
	f, err := os.Create(p)
	mk(t, "create", err)
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name = rel
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			tw.Write(b)
		}
		return nil
	})
	mk(t, "walk", err)
	mk(t, "close", tw.Close())
	return p
}

func newLayerStore(t *testing.T) *Store {
	t.Helper()
	return NewStore(filepath.Join(t.TempDir(), "templates"))
}

func TestImportImage(t *testing.T) {
	testutil.RequiresRoot(t)
	img := testImage(t)
	s := newLayerStore(t)
	ctx := context.Background()
	var held []string
	res, err := s.ImportImage(ctx, dockerSave(t, img), ImportOptions{Hold: func(ref string) { held = append(held, ref) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Layers) != 2 || res.Reused != 0 || len(held) != 2 {
		t.Fatalf("imported %+v, held %v", res, held)
	}
	if res.Config.Workdir != "/a" || res.Config.User != "nobody" || res.Config.Env["LANG"] != "C.UTF-8" || strings.Join(res.Config.Cmd, " ") != "serve" {
		t.Errorf("config %+v", res.Config)
	}
	paths, err := s.LayerPaths(res.Layers)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("whiteouts", func(t *testing.T) {
		var st unix.Stat_t
		mk(t, "lstat", unix.Lstat(filepath.Join(paths[1], "a/b"), &st))
		if st.Mode != unix.S_IFCHR || st.Rdev != 0 {
			t.Errorf("a/b in layer 2: mode %o rdev %d, want a whiteout", st.Mode, st.Rdev)
		}
		if _, err := os.Lstat(filepath.Join(paths[1], "a/.wh.b")); !os.IsNotExist(err) {
			t.Errorf(".wh. file kept: %v", err)
		}
		if v, err := getXattr(filepath.Join(paths[1], "opq"), opaqueXattr); err != nil || string(v) != "y" {
			t.Errorf("opq not opaque: %q %v", v, err)
		}
		for rel, want := range map[string]bool{"a/b": false, "a/c": true, "opq/old": false, "opq/new": true, "bin/run": true} {
			if _, ok := LookupLayers(paths, rel); ok != want {
				t.Errorf("merged %s present = %v, want %v", rel, ok, want)
			}
		}
	})
	t.Run("attributes", func(t *testing.T) {
		var st unix.Stat_t
		mk(t, "lstat", unix.Lstat(filepath.Join(paths[0], "bin/run"), &st))
		if st.Mode != unix.S_IFREG|0o4755 || st.Nlink != 2 {
			t.Errorf("bin/run mode %o nlink %d", st.Mode, st.Nlink)
		}
		mk(t, "lstat", unix.Lstat(filepath.Join(paths[0], "a/c"), &st))
		if st.Uid != 1000 || st.Gid != 1000 {
			t.Errorf("a/c owned by %d:%d", st.Uid, st.Gid)
		}
		if l, err := os.Readlink(filepath.Join(paths[0], "bin/alias")); err != nil || l != "run" {
			t.Errorf("symlink %q %v", l, err)
		}
		if _, err := os.Lstat(filepath.Join(paths[0], "dev/null")); !os.IsNotExist(err) {
			t.Errorf("device node unpacked: %v", err)
		}
		mk(t, "lstat", unix.Lstat(filepath.Join(paths[1], "opq"), &st))
		if st.Mode&0o777 != 0o700 {
			t.Errorf("opq mode %o", st.Mode&0o777)
		}
	})
	t.Run("oci-layout-shares-layers", func(t *testing.T) {
		again, err := s.ImportImage(ctx, ociLayoutTar(t, img), ImportOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if again.Reused != 2 || strings.Join(again.Layers, ",") != strings.Join(res.Layers, ",") {
			t.Errorf("OCI layout import %+v, want the docker-save layers reused", again)
		}
	})
	t.Run("accounts", func(t *testing.T) {
		key, write, ok, err := AccountsLayer(paths)
		if err != nil || !ok {
			t.Fatalf("AccountsLayer: %v %v", ok, err)
		}
		w, err := s.NewLayer()
		mk(t, "layer", err)
		mk(t, "write", write(w.Root()))
		ref, err := w.Commit(key, LayerMeta{CreatedBy: "test"})
		mk(t, "commit", err)
		p, _ := s.LayerPath(ref)
		b, _ := os.ReadFile(filepath.Join(p, "etc/passwd"))
		if !strings.HasPrefix(string(b), "root:x:0:0:") || !strings.Contains(string(b), "\nuser:x:1000:1000::/home/user:/bin/sh\n") {
			t.Errorf("passwd:\n%s", b)
		}
		var st unix.Stat_t
		mk(t, "lstat", unix.Lstat(filepath.Join(p, "home/user"), &st))
		if st.Uid != 1000 || st.Mode&0o777 != 0o755 {
			t.Errorf("home %d %o", st.Uid, st.Mode)
		}
		mk(t, "lstat", unix.Lstat(filepath.Join(p, "tmp"), &st))
		if st.Mode&0o7777 != 0o1777 {
			t.Errorf("tmp %o", st.Mode)
		}
		// With the layer on top nothing is missing any more.
		if _, _, ok, err := AccountsLayer(append(paths, p)); ok || err != nil {
			t.Errorf("a second accounts layer wanted: %v %v", ok, err)
		}
	})
}

func TestImportRejects(t *testing.T) {
	testutil.RequiresRoot(t)
	rawTar := func(t *testing.T, files map[string]string) string {
		var entries []entry
		for n, d := range files {
			entries = append(entries, entry{name: n, data: d})
		}
		p := filepath.Join(t.TempDir(), "x.tar")
		mk(t, "write", os.WriteFile(p, layerTar(t, entries), 0o644))
		return p
	}
	escapingLayer := func(t *testing.T) string {
		img, err := mutate.AppendLayers(empty.Image, layerOf(t, []entry{{name: "ok", data: "1"}, {name: "a/../../escaped", data: "x"}}))
		mk(t, "append", err)
		return dockerSave(t, img)
	}
	outside := t.TempDir()
	symlinkLayer := func(t *testing.T) string {
		img, err := mutate.AppendLayers(empty.Image, layerOf(t, []entry{
			{name: "a", typ: tar.TypeSymlink, link: outside},
			{name: "a/planted", data: "x"},
		}))
		mk(t, "append", err)
		return dockerSave(t, img)
	}
	wrongDigest := func(t *testing.T) string {
		content := layerTar(t, []entry{{name: "x", data: "real"}})
		fake := sha256.Sum256([]byte("something else"))
		cfg, _ := json.Marshal(map[string]any{"os": "linux", "architecture": "amd64",
			"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + hex.EncodeToString(fake[:])}}})
		man, _ := json.Marshal([]map[string]any{{"Config": "config.json", "RepoTags": []string{}, "Layers": []string{"layer.tar"}}})
		var entries []entry
		entries = append(entries, entry{name: "manifest.json", data: string(man)}, entry{name: "config.json", data: string(cfg)}, entry{name: "layer.tar", data: string(content)})
		p := filepath.Join(t.TempDir(), "img.tar")
		mk(t, "write", os.WriteFile(p, layerTar(t, entries), 0o644))
		return p
	}
	tests := []struct {
		name  string
		make  func(t *testing.T) string
		class error
		want  string
	}{
		{"not-a-tar", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "x")
			os.WriteFile(p, bytes.Repeat([]byte("garbage!"), 200), 0o644)
			return p
		}, ErrNotAnImage, "not a tar archive"},
		{"empty-file", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "x")
			os.WriteFile(p, nil, 0o644)
			return p
		}, ErrNotAnImage, "empty"},
		{"tar-without-manifest", func(t *testing.T) string { return rawTar(t, map[string]string{"hello.txt": "hi"}) }, ErrNotAnImage, "neither manifest.json"},
		{"broken-manifest", func(t *testing.T) string { return rawTar(t, map[string]string{"manifest.json": "{"}) }, ErrNotAnImage, "manifest.json"},
		{"outer-entry-escapes", func(t *testing.T) string { return rawTar(t, map[string]string{"../evil": "x"}) }, errdefs.ErrInvalidArgument, "escapes"},
		{"layer-entry-escapes", escapingLayer, errdefs.ErrInvalidArgument, "escapes"},
		{"write-through-symlink", symlinkLayer, errdefs.ErrInvalidArgument, "symlink"},
		{"wrong-digest", wrongDigest, errdefs.ErrInvalidArgument, "does not match its digest"},
		{"random-image-ok-control", func(t *testing.T) string {
			img, err := random.Image(512, 1)
			mk(t, "random", err)
			return dockerSave(t, img)
		}, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newLayerStore(t)
			_, err := s.ImportImage(context.Background(), tc.make(t), ImportOptions{})
			if tc.class == nil {
				if err != nil {
					t.Fatalf("control import failed: %v", err)
				}
				return
			}
			if !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %v containing %q", err, tc.class, tc.want)
			}
			// Nothing half-written stays in the store.
			left, _ := filepath.Glob(filepath.Join(s.Dir(), layersDir, tmpPrefix+"*"))
			if len(left) > 0 {
				t.Errorf("unfinished layers left: %v", left)
			}
			if ents, _ := os.ReadDir(outside); len(ents) > 0 {
				t.Errorf("the archive wrote outside the layer: %v", ents)
			}
		})
	}
}
