package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Formatting an image with mkfs.ext4 costs a fork+exec and ~3 ms, a third of
// Setup. An empty scratch filesystem of a given size is the same bytes every
// time (the root directory's owner is fixed up after mount; nothing else
// depends on the sandbox), and mkfs writes well under a MB of metadata into a
// sparse image. So the first image of each size is made by mkfs and its data
// extents are kept in memory; later images of that size are those extents
// written into a fresh sparse file.
const (
	// maxImageCache bounds the number of sizes kept: a server uses a handful.
	maxImageCache = 8
	// maxImageBytes skips caching an image whose metadata is unusually large.
	maxImageBytes = 16 << 20
)

// extent is a run of non-hole bytes of an image.
type extent struct {
	off  int64
	data []byte
}

var imageCache = struct {
	sync.Mutex
	bySize map[int64][]extent
}{bySize: map[int64][]extent{}}

// makeImage creates image as an empty ext4 filesystem of sizeMB.
func makeImage(ctx context.Context, image string, sizeMB int64) error {
	imageCache.Lock()
	exts, ok := imageCache.bySize[sizeMB]
	imageCache.Unlock()

	f, err := os.OpenFile(image, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("creating image: %w", err)
	}
	err = f.Truncate(sizeMB << 20)
	if err == nil && ok {
		for _, e := range exts {
			if _, err = f.WriteAt(e.data, e.off); err != nil {
				break
			}
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing image: %w", classify(err))
	}
	if ok {
		return nil
	}
	if err := mkfs(ctx, image); err != nil {
		return err
	}
	exts, err = readExtents(image)
	if err != nil {
		return nil // the image is fine; only the cache is skipped
	}
	imageCache.Lock()
	if len(imageCache.bySize) < maxImageCache {
		imageCache.bySize[sizeMB] = exts
	}
	imageCache.Unlock()
	return nil
}

// readExtents reads the data (non-hole) parts of a sparse file.
func readExtents(path string) ([]extent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	var out []extent
	var total int64
	fd := int(f.Fd())
	for off := int64(0); off < fi.Size(); {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole remains
		}
		if err != nil {
			return nil, err
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			return nil, err
		}
		if total += end - start; total > maxImageBytes {
			return nil, errors.New("image metadata too large to cache")
		}
		buf := make([]byte, end-start)
		if _, err := f.ReadAt(buf, start); err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		out = append(out, extent{off: start, data: buf})
		off = end
	}
	return out, nil
}
