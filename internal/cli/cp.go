package cli

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// sandboxHome is where relative sandbox paths point: the default user's home.
const sandboxHome = "/home/user"

func (a *app) newCpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and directories between this machine and a sandbox",
		Long: `Copy a file or a directory (recursively, as a tar stream) into or out of a
sandbox. A sandbox path is written SANDBOX:PATH; a relative PATH is taken from
/home/user. "-" as SRC reads stdin, as DST writes stdout (a directory then
comes as a tar stream).

As with cp -r: when DST is an existing directory (or ends with /), SRC is
copied into it under its own name; otherwise SRC is copied to DST.`,
		Example: `  airlock cp ./data.csv sbx_…:/home/user/data.csv
  airlock cp ./project sbx_…:/home/user/project
  airlock cp sbx_…:/home/user/out ./out
  airlock cp sbx_…:report.pdf -  > report.pdf`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := parseLocation(args[0]), parseLocation(args[1])
			switch {
			case src.sandbox != "" && dst.sandbox != "":
				return usagef("copy between two sandboxes is not supported: copy through this machine")
			case src.sandbox == "" && dst.sandbox == "":
				return usagef("one of SRC and DST must be a sandbox path (SANDBOX:PATH)")
			}
			if src.sandbox != "" && dst.path == "-" && a.output == "json" {
				return usagef("cp to - writes the copy itself on stdout: -o json does not apply")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if dst.sandbox != "" {
				return a.upload(cmd.Context(), c, src.path, dst)
			}
			return a.download(cmd.Context(), c, src, dst.path)
		},
	}
}

// location is a cp operand: a sandbox path, or a local one (sandbox "").
type location struct {
	sandbox string
	path    string
}

// parseLocation reads "SANDBOX:PATH" or a local path. A colon only makes a
// sandbox path when the part before it has no slash (write ./a:b for a local
// file named a:b).
func parseLocation(s string) location {
	if i := strings.IndexByte(s, ':'); i > 0 && !strings.Contains(s[:i], "/") {
		p := s[i+1:]
		if !path.IsAbs(p) {
			p = path.Join(sandboxHome, p)
		}
		if strings.HasSuffix(s, "/") && !strings.HasSuffix(p, "/") {
			p += "/" // keep "into this directory"
		}
		return location{sandbox: s[:i], path: p}
	}
	return location{path: s}
}

// remoteTarget resolves where src lands under the sandbox path dst.
func remoteTarget(ctx context.Context, c *client.Client, sandbox, dst, srcBase string) (string, error) {
	if strings.HasSuffix(dst, "/") {
		return path.Join(dst, srcBase), nil
	}
	st, err := c.Stat(ctx, sandbox, dst)
	switch {
	case err == nil && st.Type == "dir":
		return path.Join(dst, srcBase), nil
	case err == nil || errors.Is(err, client.ErrNotFound):
		return dst, nil
	default:
		return "", err
	}
}

func (a *app) upload(ctx context.Context, c *client.Client, src string, dst location) error {
	if src == "-" {
		if strings.HasSuffix(dst.path, "/") {
			return usagef("stdin needs a file name in the sandbox, not a directory")
		}
		res, err := c.WriteFile(ctx, dst.sandbox, dst.path, a.stdin)
		return a.reportWritten(res, err)
	}
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	target, err := remoteTarget(ctx, c, dst.sandbox, dst.path, filepath.Base(filepath.Clean(src)))
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		res, err := c.WriteFile(ctx, dst.sandbox, target, f, client.WithMode(fi.Mode().Perm()))
		return a.reportWritten(res, err)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, src, a.stderr)) }()
	defer pr.Close() // unblocks the writer if the upload fails early
	res, err := c.UploadTar(ctx, dst.sandbox, target, pr)
	return a.reportWritten(res, err)
}

func (a *app) reportWritten(res *api.FileWritten, err error) error {
	if err != nil {
		return err
	}
	if a.output == "json" {
		return printJSON(a.stdout, res)
	}
	return nil
}

// writeTar writes the tree under dir as a tar stream with names relative to
// dir. Symlinks are stored as links, never followed; owners are not sent
// (the sandbox owns what it receives). Sockets and devices are skipped.
func writeTar(w io.Writer, dir string, warn io.Writer) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		var link string
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		case fi.Mode().IsDir(), fi.Mode().IsRegular():
		default:
			fmt.Fprintf(warn, "airlock: skipping %s: not a file, directory or symlink\n", p)
			return nil
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			h.Name += "/"
		}
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		h.Format = tar.FormatPAX // long names, large sizes
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.CopyN(tw, f, h.Size)
		return err
	})
	if err != nil {
		return fmt.Errorf("packing %s: %w", dir, err)
	}
	return tw.Close()
}

func (a *app) download(ctx context.Context, c *client.Client, src location, dst string) error {
	st, err := c.Stat(ctx, src.sandbox, strings.TrimSuffix(src.path, "/"))
	if err != nil {
		return err
	}
	base := path.Base(st.Path)
	if st.Path == "" {
		base = path.Base(strings.TrimSuffix(src.path, "/"))
	}
	if st.Type == "dir" {
		rc, err := c.DownloadTar(ctx, src.sandbox, src.path)
		if err != nil {
			return err
		}
		defer rc.Close()
		if dst == "-" {
			_, err = io.Copy(a.stdout, rc)
			return err
		}
		target := dst
		if fi, err := os.Stat(dst); (err == nil && fi.IsDir()) || strings.HasSuffix(dst, "/") {
			target = filepath.Join(dst, base)
		}
		if err := extractTar(rc, target, st.ModifiedAt); err != nil {
			return err
		}
		return a.reportDownloaded(target, st)
	}
	rc, err := c.ReadFile(ctx, src.sandbox, src.path)
	if err != nil {
		return err
	}
	defer rc.Close()
	if dst == "-" {
		_, err = io.Copy(a.stdout, rc)
		return err
	}
	target := dst
	if fi, err := os.Stat(dst); (err == nil && fi.IsDir()) || strings.HasSuffix(dst, "/") {
		target = filepath.Join(dst, base)
	}
	if err := writeFileAtomic(target, rc, parseMode(st.Mode, 0o644), st.ModifiedAt); err != nil {
		return err
	}
	return a.reportDownloaded(target, st)
}

// reportDownloaded prints, with -o json, where a download went.
func (a *app) reportDownloaded(target string, st *api.FileInfo) error {
	if a.output != "json" {
		return nil
	}
	out := struct {
		Path   string `json:"path"`
		Type   string `json:"type"`
		Size   int64  `json:"size,omitempty"`
		Source string `json:"source"`
	}{Path: target, Type: st.Type, Source: st.Path}
	if fi, err := os.Stat(target); err == nil && fi.Mode().IsRegular() {
		out.Size = fi.Size()
	}
	return printJSON(a.stdout, out)
}

// parseMode reads an octal mode string like "0644".
func parseMode(s string, def fs.FileMode) fs.FileMode {
	var m uint32
	if _, err := fmt.Sscanf(s, "%o", &m); err != nil || m > 0o7777 {
		return def
	}
	return fs.FileMode(m).Perm()
}

// writeFileAtomic writes r to name through a temporary file in the same
// directory, so an interrupted copy never leaves a half file under name.
// A non-zero mtime is kept.
func writeFileAtomic(name string, r io.Reader, mode fs.FileMode, mtime time.Time) error {
	tmp, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".airlock-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := io.Copy(tmp, r); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", name, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if !mtime.IsZero() {
		if err := os.Chtimes(tmp.Name(), time.Time{}, mtime); err != nil {
			return err
		}
	}
	return os.Rename(tmp.Name(), name)
}

// extractTar unpacks r into dir. The archive comes from a sandbox, so it is
// untrusted: every operation goes through an os.Root, which refuses names
// and symlinks that lead out of dir (tar-slip), and an entry never writes
// through a symlink an earlier entry left at its own name. Files and
// directories keep the archive's mtimes (symlinks get the time of the
// copy: setting theirs would follow them); dir itself (not in the archive)
// gets mtime unless it is zero.
func extractTar(r io.Reader, dir string, mtime time.Time) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	// Directories get their mtimes once everything is in them (adding an
	// entry changes its directory's), deepest first.
	type dirTime struct {
		name  string
		mtime time.Time
	}
	var dirs []dirTime
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			sort.SliceStable(dirs, func(i, j int) bool { return strings.Count(dirs[i].name, "/") > strings.Count(dirs[j].name, "/") })
			for _, d := range dirs {
				if err := root.Chtimes(d.name, time.Time{}, d.mtime); err != nil {
					return fmt.Errorf("archive entry %q: %w", d.name, err)
				}
			}
			return root.Chtimes(".", time.Time{}, mtime)
		}
		if err != nil {
			return fmt.Errorf("reading archive: %w", err)
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if name == "." {
			continue
		}
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("archive entry %q: %w", h.Name, errUnsafePath)
		}
		perm := fs.FileMode(h.Mode).Perm()
		switch h.Typeflag {
		case tar.TypeDir:
			// Owner write and search keep the rest of the archive extractable.
			if err := root.MkdirAll(name, perm|0o700); err != nil {
				return fmt.Errorf("archive entry %q: %w", h.Name, err)
			}
			if !h.ModTime.IsZero() {
				dirs = append(dirs, dirTime{name, h.ModTime})
			}
		case tar.TypeReg:
			if err := replaceable(root, name); err != nil {
				return fmt.Errorf("archive entry %q: %w", h.Name, err)
			}
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
			if err != nil {
				return fmt.Errorf("archive entry %q: %w", h.Name, err)
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err == nil && !h.ModTime.IsZero() {
				// The file was just made by this open: not a symlink.
				err = root.Chtimes(name, time.Time{}, h.ModTime)
			}
			if err != nil {
				return fmt.Errorf("archive entry %q: %w", h.Name, err)
			}
		case tar.TypeSymlink:
			if err := replaceable(root, name); err != nil {
				return fmt.Errorf("archive entry %q: %w", h.Name, err)
			}
			if err := root.Symlink(h.Linkname, name); err != nil {
				return fmt.Errorf("archive entry %q: %w", h.Name, err)
			}
		case tar.TypeLink:
			if err := replaceable(root, name); err != nil {
				return fmt.Errorf("archive entry %q: %w", h.Name, err)
			}
			if err := root.Link(path.Clean(strings.TrimPrefix(h.Linkname, "./")), name); err != nil {
				return fmt.Errorf("archive entry %q: %w", h.Name, err)
			}
		default:
			// Devices, fifos: nothing a copy of files needs.
		}
	}
}

var errUnsafePath = errors.New("path leaves the destination")

// replaceable prepares name for a new entry: its parent exists, and a
// non-directory already there (possibly a symlink) is removed so nothing is
// written through it.
func replaceable(root *os.Root, name string) error {
	if dir := path.Dir(name); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	fi, err := root.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case fi.IsDir():
		return fmt.Errorf("a directory is in the way")
	}
	return root.Remove(name)
}
