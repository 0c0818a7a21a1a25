package template

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// FuzzImportImage: an uploaded image archive (docker save or OCI layout),
// whatever it holds, imports or fails; what it unpacks stays inside the
// template store, within the size bound, and nothing unfinished is left.
func FuzzImportImage(f *testing.F) {
	img, err := random.Image(256, 2)
	if err != nil {
		f.Fatal(err)
	}
	tag, err := name.NewTag("fuzz/image:1")
	if err != nil {
		f.Fatal(err)
	}
	var b bytes.Buffer
	if err := tarball.Write(tag, img, &b); err != nil {
		f.Fatal(err)
	}
	f.Add(b.Bytes())
	f.Add([]byte("not an image"))
	f.Add(b.Bytes()[:len(b.Bytes())/2])
	f.Fuzz(func(t *testing.T, archive []byte) {
		base := t.TempDir()
		p := filepath.Join(base, "image.tar")
		if err := os.WriteFile(p, archive, 0o600); err != nil {
			t.Fatal(err)
		}
		s := NewStore(filepath.Join(base, "store"))
		res, err := s.ImportImage(context.Background(), p, ImportOptions{MaxBytes: 64 << 20})
		ents, _ := os.ReadDir(base)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if !slices.Equal(names, []string{"image.tar", "store"}) && !slices.Equal(names, []string{"image.tar"}) {
			t.Fatalf("beside the store: %v", names)
		}
		left, _ := filepath.Glob(filepath.Join(base, "store", layersDir, tmpPrefix+"*"))
		left2, _ := filepath.Glob(filepath.Join(base, "store", layersDir, newPrefix+"*"))
		if len(left)+len(left2) > 0 {
			t.Fatalf("unfinished writes left: %v %v", left, left2)
		}
		if err != nil {
			return
		}
		for _, ref := range res.Layers {
			if !ValidLayerRef(ref) || !strings.HasPrefix(ref, layersDir+"/") {
				t.Fatalf("layer ref %q", ref)
			}
		}
	})
}
