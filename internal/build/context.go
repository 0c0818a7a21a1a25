package build

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// maxContextEntries bounds the files of a build context: the index is kept
// in memory.
const maxContextEntries = 200_000

// buildContext is an uploaded build context: a tar file on disk, indexed.
// Nothing of it is unpacked on the host; COPY streams the selected entries
// into the build sandbox.
type buildContext struct {
	path    string
	entries map[string]*ctxEntry // by clean relative path; "" is the root
	names   []string             // sorted, without the root
}

type ctxEntry struct {
	name     string // clean, relative
	typ      byte   // tar.TypeDir, TypeReg, TypeSymlink, TypeLink
	mode     int64
	size     int64
	linkname string // symlink target, or the clean name a hard link points to
	sum      string // sha256 of a regular file's content
	implicit bool   // a parent directory the archive did not list
	// mtime is the entry's modification time, which COPY keeps (as
	// Docker's does); it is not part of the step's cache key (neither is
	// it Docker's): an unchanged content is a cache hit.
	mtime time.Time
}

// emptyContext has nothing but its root.
func emptyContext() *buildContext {
	return &buildContext{entries: map[string]*ctxEntry{"": {typ: tar.TypeDir, mode: 0o755}}}
}

// openContext reads and indexes the tar at p, refusing entries that climb
// out of its root.
func openContext(p string) (*buildContext, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("opening build context: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("opening build context: %w", err)
	}
	c := emptyContext()
	c.path = p
	tr := tar.NewReader(f)
	// The files' bytes are in the archive, so they sum to less than its
	// size; only sparse entries claim more (a few bytes can announce an
	// exabyte of zeros, which hashing here and COPY in the sandbox would
	// spend forever on): those are refused.
	var content int64
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "build context is not a valid tar archive: %v", err)
		}
		name, err := contextName(hdr.Name)
		if err != nil {
			return nil, err
		}
		e := &ctxEntry{name: name, mode: hdr.Mode & 0o7777, size: hdr.Size, mtime: hdr.ModTime}
		switch hdr.Typeflag {
		case tar.TypeDir:
			e.typ = tar.TypeDir
		case tar.TypeReg:
			e.typ = tar.TypeReg
			if content += hdr.Size; hdr.Size < 0 || content > fi.Size() {
				return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "build context entry %q is sparse or larger than the archive: sparse files are not supported", name)
			}
			h := sha256.New()
			if _, err := io.Copy(h, tr); err != nil {
				return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "build context is truncated: %v", err)
			}
			e.sum = hex.EncodeToString(h.Sum(nil))
		case tar.TypeSymlink:
			e.typ, e.linkname = tar.TypeSymlink, hdr.Linkname
		case tar.TypeLink:
			target, err := contextName(hdr.Linkname)
			if err != nil {
				return nil, err
			}
			t, ok := c.entries[target]
			if !ok || t.typ != tar.TypeReg {
				return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "build context: hard link %q points to %q, which is not a file before it", name, hdr.Linkname)
			}
			e.typ, e.linkname, e.sum, e.size, e.mode, e.mtime = tar.TypeLink, target, t.sum, t.size, t.mode, t.mtime
		default:
			continue // devices, fifos: nothing COPY would take
		}
		if name == "" {
			if e.typ == tar.TypeDir {
				c.entries[""].mode = e.mode
			}
			continue
		}
		if _, dup := c.entries[name]; !dup {
			c.names = append(c.names, name)
		}
		c.entries[name] = e
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			if _, ok := c.entries[d]; ok {
				break
			}
			c.entries[d] = &ctxEntry{name: d, typ: tar.TypeDir, mode: 0o755, implicit: true}
			c.names = append(c.names, d)
		}
		if len(c.names) > maxContextEntries {
			return nil, errdefs.Wrap(errdefs.ErrTooLarge, "build context has more than %d entries", maxContextEntries)
		}
	}
	sort.Strings(c.names)
	return c, nil
}

// contextName cleans an archive entry name; "" is the root. A name that
// climbs out of the root is refused.
func contextName(name string) (string, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return "", errdefs.Wrap(errdefs.ErrInvalidArgument, "build context entry name contains a NUL byte")
	}
	rel := path.Clean(strings.TrimLeft(name, "/"))
	if rel == ".." || strings.HasPrefix(rel, "../") {
		return "", errdefs.Wrap(errdefs.ErrInvalidArgument, "build context entry %q escapes the archive's root", name)
	}
	if rel == "." {
		return "", nil
	}
	return rel, nil
}

// copyItem is one entry COPY writes, named relative to the destination.
type copyItem struct {
	e   *ctxEntry
	rel string
}

// selection is what one COPY takes from the context.
type selection struct {
	items []copyItem
	// single is set when the only source is one file (or link): it may be
	// renamed to the destination.
	single bool
	// tops are the names at the top of the destination (for --chown).
	tops []string
}

// selectSources resolves COPY's sources: paths relative to the context
// root, with * ? [] wildcards. A directory source copies its contents; a
// file source copies the file under its own name.
func (c *buildContext) selectSources(srcs []string) (selection, error) {
	var sel selection
	seen := map[string]bool{}
	add := func(e *ctxEntry, rel string) {
		if seen[rel] {
			return
		}
		seen[rel] = true
		sel.items = append(sel.items, copyItem{e: e, rel: rel})
		if !strings.Contains(rel, "/") {
			sel.tops = append(sel.tops, rel)
		}
	}
	files := 0
	for _, src := range srcs {
		rel := path.Clean(strings.TrimLeft(src, "/"))
		if rel == ".." || strings.HasPrefix(rel, "../") {
			return sel, fmt.Errorf("source %q is outside the build context", src)
		}
		if rel == "." {
			rel = ""
		}
		var matches []string
		if strings.ContainsAny(rel, "*?[") {
			if _, err := path.Match(rel, ""); err != nil {
				return sel, fmt.Errorf("source %q is a malformed pattern", src)
			}
			for _, n := range c.names {
				if ok, _ := path.Match(rel, n); ok {
					matches = append(matches, n)
				}
			}
			if len(matches) == 0 {
				return sel, fmt.Errorf("source %q matches nothing in the build context", src)
			}
		} else {
			if _, ok := c.entries[rel]; !ok {
				return sel, fmt.Errorf("source %q is not in the build context", src)
			}
			matches = []string{rel}
		}
		for _, m := range matches {
			e := c.entries[m]
			if e.typ != tar.TypeDir {
				add(e, path.Base(m))
				files++
				continue
			}
			// A directory: its contents, relative to it.
			prefix := m + "/"
			for _, n := range c.names {
				if m == "" || strings.HasPrefix(n, prefix) {
					add(c.entries[n], strings.TrimPrefix(n, prefix))
				}
			}
		}
	}
	sel.single = len(srcs) == 1 && !strings.ContainsAny(srcs[0], "*?[") && files == 1 && len(sel.items) == 1
	return sel, nil
}

// inputHash identifies what a COPY copies: names, types, modes, contents.
// Its first line is the version of what COPY makes of them: layers made
// before COPY kept mtimes and chowned the directories it created are not
// reused.
func (sel selection) inputHash() string {
	h := sha256.New()
	fmt.Fprintf(h, "copy v2\n")
	for _, it := range sel.items {
		fmt.Fprintf(h, "%s\x00%c\x00%o\x00%s\x00%s\n", it.rel, it.e.typ, it.e.mode, it.e.sum, it.e.linkname)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// writeTar writes the selection as a tar for the agent to unpack in the
// destination, the single file (if any) named rename. Hard links whose
// target is copied too stay links; others become copies.
func (c *buildContext) writeTar(w io.Writer, sel selection, rename string) error {
	want := map[string]*copyItem{} // context name → item, for files
	for i := range sel.items {
		it := &sel.items[i]
		if it.e.typ == tar.TypeReg || it.e.typ == tar.TypeLink {
			want[it.e.name] = it
		}
	}
	tw := tar.NewWriter(w)
	// Directories and symlinks first (they carry no data), then the files
	// in archive order, read in one pass over the context.
	for _, it := range sel.items {
		var hdr *tar.Header
		switch it.e.typ {
		case tar.TypeDir:
			hdr = &tar.Header{Typeflag: tar.TypeDir, Name: it.rel + "/", Mode: it.e.mode, ModTime: it.e.mtime}
		case tar.TypeSymlink:
			name := it.rel
			if sel.single && rename != "" {
				name = rename
			}
			hdr = &tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: it.e.linkname, Mode: 0o777, ModTime: it.e.mtime}
		default:
			continue
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
	}
	if len(want) > 0 {
		if err := c.copyFiles(tw, want, sel.single, rename); err != nil {
			return err
		}
	}
	return tw.Close()
}

// copyFiles streams the wanted regular files (and links) out of the
// context tar.
func (c *buildContext) copyFiles(tw *tar.Writer, want map[string]*copyItem, single bool, rename string) error {
	f, err := os.Open(c.path)
	if err != nil {
		return fmt.Errorf("reading build context: %w", err)
	}
	defer f.Close()
	written := map[string]string{} // context name → name in the output
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading build context: %w", err)
		}
		name, _ := contextName(hdr.Name)
		it, ok := want[name]
		if !ok || (hdr.Typeflag != tar.TypeReg && hdr.Typeflag != tar.TypeLink) {
			continue
		}
		out := it.rel
		if single && rename != "" {
			out = rename
		}
		if it.e.typ == tar.TypeLink {
			if first, ok := written[it.e.linkname]; ok {
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeLink, Name: out, Linkname: first}); err != nil {
					return err
				}
				written[name] = out
				continue
			}
			// The target is not copied: write the content again, from a
			// second pass over the archive.
			if err := c.copyOne(tw, it.e.linkname, out, it.e.mode, it.e.mtime); err != nil {
				return err
			}
			written[name] = out
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: out, Mode: it.e.mode, Size: hdr.Size, ModTime: hdr.ModTime}); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return fmt.Errorf("reading build context: %w", err)
		}
		written[name] = out
	}
}

// copyOne writes the content of context file name as out.
func (c *buildContext) copyOne(tw *tar.Writer, name, out string, mode int64, mtime time.Time) error {
	f, err := os.Open(c.path)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err != nil {
			return fmt.Errorf("reading build context: %w", err)
		}
		if n, _ := contextName(hdr.Name); n == name && hdr.Typeflag == tar.TypeReg {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: out, Mode: mode, Size: hdr.Size, ModTime: mtime}); err != nil {
				return err
			}
			_, err := io.Copy(tw, tr)
			return err
		}
	}
}
