package template

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
)

// ImageConfig is what a template keeps of an image's config.
type ImageConfig struct {
	Env     map[string]string
	Workdir string
	User    string
	Cmd     []string
}

// ImportOptions bound and observe an image import.
type ImportOptions struct {
	// MaxBytes bounds the unpacked size of all layers together (a gzip
	// bomb must not fill the disk); 0 means 32 GiB.
	MaxBytes int64
	// Hold is called with each layer's ref before the layer is looked up
	// or written, so that a garbage collector leaves it alone.
	Hold func(ref string)
	// Progress receives one line per layer.
	Progress func(format string, args ...any)
}

// ImportedImage is the result of ImportImage.
type ImportedImage struct {
	// Layers are layer refs, lowest first.
	Layers []string
	Config ImageConfig
	// Reused counts layers that were in the store already.
	Reused int
}

// ErrNotAnImage is returned (wrapped, with errdefs.ErrInvalidArgument) when
// an archive is neither `docker save` output nor an OCI layout.
var ErrNotAnImage = errors.New("not an image")

// defaultMaxImageBytes bounds an import when the caller does not.
const defaultMaxImageBytes = 32 << 30

// ImportImage unpacks the OCI image tarball at archive (`docker save`
// output, or an OCI image layout as a tar) into content layers, one per
// image layer, converting whiteouts (.wh.<name>) to overlay whiteouts and
// opaque markers (.wh..wh..opq) to opaque directories. A layer is keyed by
// its verified uncompressed digest, so images share the layers they share.
// On error no layer of the image is half-written.
func (s *Store) ImportImage(ctx context.Context, archive string, opts ImportOptions) (ImportedImage, error) {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = defaultMaxImageBytes
	}
	if opts.Hold == nil {
		opts.Hold = func(string) {}
	}
	if opts.Progress == nil {
		opts.Progress = func(string, ...any) {}
	}
	img, cleanup, err := s.openImage(archive)
	if err != nil {
		return ImportedImage{}, err
	}
	defer cleanup()
	cf, err := img.ConfigFile()
	if err != nil {
		return ImportedImage{}, notImage("reading the image config: %v", err)
	}
	if cf.OS != "" && cf.OS != "linux" {
		return ImportedImage{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "image is for %s, not linux", cf.OS)
	}
	layers, err := img.Layers()
	if err != nil {
		return ImportedImage{}, notImage("reading the image layers: %v", err)
	}
	if len(layers) == 0 {
		return ImportedImage{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "image has no layers")
	}
	out := ImportedImage{Config: imageConfig(cf)}
	budget := opts.MaxBytes
	parent := ""
	for i, l := range layers {
		diffID, err := l.DiffID()
		if err != nil {
			return ImportedImage{}, notImage("layer %d: %v", i+1, err)
		}
		key := ociLayerKey(diffID)
		ref := LayerRef(key)
		opts.Hold(ref)
		if s.HasLayer(key) {
			opts.Progress("layer %d/%d %s: in the store already", i+1, len(layers), short(diffID.Hex))
			out.Layers = append(out.Layers, ref)
			out.Reused++
			parent = ref
			continue
		}
		opts.Progress("layer %d/%d %s: unpacking", i+1, len(layers), short(diffID.Hex))
		n, err := s.importLayer(ctx, l, diffID, key, parent, budget)
		if err != nil {
			return ImportedImage{}, fmt.Errorf("layer %d of %d: %w", i+1, len(layers), err)
		}
		budget -= n
		out.Layers = append(out.Layers, ref)
		parent = ref
	}
	return out, nil
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

func notImage(format string, args ...any) error {
	return fmt.Errorf("%w: %w: %s", errdefs.ErrInvalidArgument, ErrNotAnImage, fmt.Sprintf(format, args...))
}

// ociLayerKey is the store key of an image layer: derived from its
// uncompressed digest, which importLayer verifies.
func ociLayerKey(diffID v1.Hash) string {
	sum := sha256.Sum256([]byte("oci-layer\n" + diffID.String()))
	return hex.EncodeToString(sum[:])
}

func imageConfig(cf *v1.ConfigFile) ImageConfig {
	c := ImageConfig{Env: map[string]string{}, Workdir: cf.Config.WorkingDir, User: cf.Config.User}
	for _, kv := range cf.Config.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			c.Env[k] = v
		}
	}
	c.Cmd = append(append(c.Cmd, cf.Config.Entrypoint...), cf.Config.Cmd...)
	return c
}

// openImage opens archive as a docker-save tarball or an OCI layout tar.
func (s *Store) openImage(archive string) (v1.Image, func(), error) {
	kind, err := archiveKind(archive)
	if err != nil {
		return nil, nil, err
	}
	nop := func() {}
	switch kind {
	case "docker":
		img, err := tarball.ImageFromPath(archive, nil)
		if err != nil {
			return nil, nil, notImage("reading manifest.json: %v", err)
		}
		return img, nop, nil
	case "oci":
		lt, err := newLockedTemp(filepath.Join(s.dir, layersDir), tmpPrefix+"oci-")
		if err != nil {
			return nil, nil, fmt.Errorf("unpacking image layout: %w", err)
		}
		dir := lt.path
		cleanup := lt.remove
		if err := unpackLayout(archive, dir); err != nil {
			cleanup()
			return nil, nil, err
		}
		img, err := layoutImage(dir)
		if err != nil {
			cleanup()
			return nil, nil, err
		}
		return img, cleanup, nil
	}
	return nil, nil, notImage("the archive has neither manifest.json (docker save) nor index.json (OCI layout)")
}

// archiveKind scans the tar's names: "docker" with a manifest.json (docker
// save, which newer docker versions write beside an OCI layout), "oci" with
// index.json and oci-layout, "" otherwise.
func archiveKind(archive string) (string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return "", fmt.Errorf("opening image archive: %w", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var manifest, index, ociLayout bool
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if n == 0 {
				return "", notImage("the archive is empty")
			}
			break
		}
		if err != nil {
			return "", notImage("not a tar archive (%v)", err)
		}
		if err := checkArchiveName(hdr.Name); err != nil {
			return "", err
		}
		switch path.Clean(hdr.Name) {
		case "manifest.json":
			manifest = true
		case "index.json":
			index = true
		case "oci-layout":
			ociLayout = true
		}
	}
	switch {
	case manifest:
		return "docker", nil
	case index && ociLayout:
		return "oci", nil
	}
	return "", nil
}

// checkArchiveName refuses names that climb out of the archive's root. An
// absolute name is taken relative to the root, as docker does.
func checkArchiveName(name string) error {
	rel := path.Clean(strings.TrimLeft(name, "/"))
	if rel == ".." || strings.HasPrefix(rel, "../") {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "archive entry %q escapes the archive's root", truncName(name))
	}
	return nil
}

func truncName(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

var layoutBlobRE = lazyregexp.New(`^blobs/[a-z0-9]+/[a-f0-9]{32,128}$`)

// unpackLayout writes the files of an OCI layout tar that the layout reader
// needs (index.json, oci-layout, blobs) into dir; anything else, and any
// entry that is not a regular file, is ignored.
func unpackLayout(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return notImage("not a tar archive (%v)", err)
		}
		name := path.Clean(hdr.Name)
		if hdr.Typeflag != tar.TypeReg || (name != "index.json" && name != "oci-layout" && !layoutBlobRE.MatchString(name)) {
			continue
		}
		dst := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return err
		}
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(out, tr)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("unpacking image layout: %w", err)
		}
	}
}

// layoutImage picks the image of an OCI layout: the only one, or the
// linux/amd64 one of an index.
func layoutImage(dir string) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, notImage("reading index.json: %v", err)
	}
	for depth := 0; depth < 4; depth++ {
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, notImage("reading index.json: %v", err)
		}
		var pick *v1.Descriptor
		for i := range im.Manifests {
			d := &im.Manifests[i]
			if d.Platform != nil && (d.Platform.OS != "linux" || d.Platform.Architecture != "amd64") {
				continue
			}
			pick = d
			break
		}
		if pick == nil {
			return nil, notImage("no linux/amd64 image in the layout")
		}
		if pick.MediaType.IsIndex() {
			if idx, err = idx.ImageIndex(pick.Digest); err != nil {
				return nil, notImage("reading nested index: %v", err)
			}
			continue
		}
		img, err := idx.Image(pick.Digest)
		if err != nil {
			return nil, notImage("reading image manifest: %v", err)
		}
		return img, nil
	}
	return nil, notImage("image indexes nested too deep")
}

// importLayer unpacks one image layer into a new content layer, verifying
// its digest, and returns the bytes written.
func (s *Store) importLayer(ctx context.Context, l v1.Layer, diffID v1.Hash, key, parent string, budget int64) (int64, error) {
	rc, err := l.Uncompressed()
	if err != nil {
		return 0, notImage("opening layer: %v", err)
	}
	defer rc.Close()
	w, err := s.NewLayer()
	if err != nil {
		return 0, err
	}
	h := sha256.New()
	n, err := UnpackLayerTar(ctx, io.TeeReader(rc, h), w.Root(), budget)
	if err == nil {
		// Read what the tar reader left (padding), or the digest is wrong.
		_, err = io.Copy(h, rc)
	}
	if err != nil {
		w.Discard()
		return 0, err
	}
	if diffID.Algorithm != "sha256" || hex.EncodeToString(h.Sum(nil)) != diffID.Hex {
		w.Discard()
		return 0, errdefs.Wrap(errdefs.ErrInvalidArgument, "layer content does not match its digest %s", diffID)
	}
	if _, err := w.Commit(key, LayerMeta{Parent: parent, CreatedBy: "image layer " + diffID.String()}); err != nil {
		return 0, err
	}
	return n, nil
}

// Whiteout names of the OCI image spec.
const (
	whPrefix = ".wh."
	whOpaque = ".wh..wh..opq"
)

// UnpackLayerTar writes the image layer tar r into root (an empty layer
// directory) and returns the bytes of file content written, at most max.
// Whiteouts become overlay whiteouts and opaque directories; owners, modes,
// times and user.* and capability xattrs are kept; device nodes are
// dropped (a sandbox gets its own /dev). An entry that climbs out of the
// root, or that would be written through a symlink, fails the unpack.
func UnpackLayerTar(ctx context.Context, r io.Reader, root string, max int64) (int64, error) {
	tr := tar.NewReader(r)
	var (
		written int64
		dirs    []*tar.Header // directory attributes, applied at the end
	)
	for {
		if err := ctx.Err(); err != nil {
			return written, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return written, errdefs.Wrap(errdefs.ErrInvalidArgument, "reading layer archive: %v", err)
		}
		if err := checkArchiveName(hdr.Name); err != nil {
			return written, err
		}
		rel := strings.TrimPrefix(path.Clean("/"+hdr.Name), "/")
		if rel == "" {
			if hdr.Typeflag == tar.TypeDir {
				dirs = append(dirs, hdr)
			}
			continue
		}
		dir, base := path.Split(rel)
		parent, err := ensureParent(root, strings.TrimSuffix(dir, "/"))
		if err != nil {
			return written, fmt.Errorf("entry %q: %w", truncName(hdr.Name), err)
		}
		switch {
		case base == whOpaque:
			if err := unix.Setxattr(parent, opaqueXattr, []byte("y"), 0); err != nil {
				return written, fmt.Errorf("marking %s opaque: %w", dir, err)
			}
			continue
		case strings.HasPrefix(base, whPrefix):
			target := filepath.Join(parent, strings.TrimPrefix(base, whPrefix))
			if err := removeEntry(target); err != nil {
				return written, err
			}
			if err := unix.Mknod(target, unix.S_IFCHR, 0); err != nil {
				return written, fmt.Errorf("creating whiteout: %w", err)
			}
			continue
		}
		dst := filepath.Join(parent, base)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if fi, err := os.Lstat(dst); err == nil && !fi.IsDir() {
				if err := removeEntry(dst); err != nil {
					return written, err
				}
			}
			if err := os.Mkdir(dst, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return written, fmt.Errorf("creating directory: %w", err)
			}
			h := *hdr
			h.Name = rel
			dirs = append(dirs, &h)
			continue
		case tar.TypeReg:
			if hdr.Size > max-written {
				return written, errdefs.Wrap(errdefs.ErrTooLarge, "image unpacks to more than %d bytes", max)
			}
			if err := removeEntry(dst); err != nil {
				return written, err
			}
			f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
			if err != nil {
				return written, fmt.Errorf("creating file: %w", err)
			}
			n, err := io.Copy(f, tr)
			written += n
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return written, fmt.Errorf("writing %s: %w", truncName(rel), err)
			}
		case tar.TypeSymlink:
			if err := removeEntry(dst); err != nil {
				return written, err
			}
			if err := os.Symlink(hdr.Linkname, dst); err != nil {
				return written, fmt.Errorf("creating symlink: %w", err)
			}
		case tar.TypeLink:
			if err := checkArchiveName(hdr.Linkname); err != nil {
				return written, err
			}
			target := filepath.Join(root, filepath.FromSlash(strings.TrimPrefix(path.Clean("/"+hdr.Linkname), "/")))
			if err := noSymlinkBelow(root, target); err != nil {
				return written, fmt.Errorf("hard link %q: %w", truncName(hdr.Name), err)
			}
			if err := removeEntry(dst); err != nil {
				return written, err
			}
			if err := os.Link(target, dst); err != nil {
				return written, errdefs.Wrap(errdefs.ErrInvalidArgument, "hard link %q to %q: %v", truncName(hdr.Name), truncName(hdr.Linkname), err)
			}
			continue // a link shares its target's attributes
		case tar.TypeFifo:
			if err := removeEntry(dst); err != nil {
				return written, err
			}
			if err := unix.Mkfifo(dst, 0o600); err != nil {
				return written, fmt.Errorf("creating fifo: %w", err)
			}
		default: // devices, sockets, GNU and Solaris extensions
			continue
		}
		if err := applyHeader(dst, hdr); err != nil {
			return written, err
		}
	}
	// Deepest first: a directory's times change when its children are made.
	for i := len(dirs) - 1; i >= 0; i-- {
		dst := root
		if dirs[i].Name != "" && path.Clean("/"+dirs[i].Name) != "/" {
			dst = filepath.Join(root, filepath.FromSlash(dirs[i].Name))
		}
		if err := applyHeader(dst, dirs[i]); err != nil {
			return written, err
		}
	}
	return written, nil
}

// ensureParent returns root/dir, creating missing directories (root, 0755)
// and refusing a symlink on the way: the tar could otherwise write through
// a link it made itself to anywhere on the host.
func ensureParent(root, dir string) (string, error) {
	p := root
	if dir == "" {
		return p, nil
	}
	for _, c := range strings.Split(dir, "/") {
		p = filepath.Join(p, c)
		fi, err := os.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := os.Mkdir(p, 0o755); err != nil {
				return "", err
			}
		case err != nil:
			return "", err
		case fi.Mode()&fs.ModeSymlink != 0:
			return "", errdefs.Wrap(errdefs.ErrInvalidArgument, "path goes through a symlink")
		case !fi.IsDir():
			// A file replaced by a directory in the same layer.
			if err := os.Remove(p); err != nil {
				return "", err
			}
			if err := os.Mkdir(p, 0o755); err != nil {
				return "", err
			}
		}
	}
	return p, nil
}

// noSymlinkBelow checks that no component of target below root is a symlink.
func noSymlinkBelow(root, target string) error {
	rel, err := filepath.Rel(root, target)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "target escapes the archive's root")
	}
	p := root
	for _, c := range strings.Split(rel, "/") {
		p = filepath.Join(p, c)
		fi, err := os.Lstat(p)
		if err != nil {
			return errdefs.Wrap(errdefs.ErrInvalidArgument, "target is missing")
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return errdefs.Wrap(errdefs.ErrInvalidArgument, "target goes through a symlink")
		}
	}
	return nil
}

// removeEntry removes what is at p, unless it is a directory.
func removeEntry(p string) error {
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return os.RemoveAll(p)
	}
	return os.Remove(p)
}

// applyHeader sets owner, mode, xattrs and times from a tar header.
func applyHeader(dst string, hdr *tar.Header) error {
	if err := unix.Lchown(dst, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("chown %s: %w", hdr.Name, err)
	}
	if hdr.Typeflag != tar.TypeSymlink {
		mode := uint32(hdr.Mode) & 0o7777
		if err := unix.Chmod(dst, mode); err != nil {
			return fmt.Errorf("chmod %s: %w", hdr.Name, err)
		}
		for k, v := range hdr.PAXRecords {
			name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
			if !ok || !(strings.HasPrefix(name, "user.") || name == capXattr) {
				continue
			}
			if err := unix.Lsetxattr(dst, name, []byte(v), 0); err != nil && !errors.Is(err, unix.ENOTSUP) {
				return fmt.Errorf("setting %s on %s: %w", name, hdr.Name, err)
			}
		}
	}
	mt := hdr.ModTime
	if mt.IsZero() {
		return nil
	}
	at := hdr.AccessTime
	if at.IsZero() {
		at = mt
	}
	ts := []unix.Timespec{unix.NsecToTimespec(at.UnixNano()), unix.NsecToTimespec(mt.UnixNano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("setting times of %s: %w", hdr.Name, err)
	}
	return nil
}
