package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path"

	"github.com/airlockhq/airlock/api"
)

// UserHome is the home of the sandbox's default user, where the handle's
// relative paths point (Sandbox.Files, WithCwd).
const UserHome = "/home/user"

// resolvePath makes p absolute: a relative path is taken from UserHome.
func resolvePath(p string) string {
	if path.IsAbs(p) {
		return p
	}
	return path.Join(UserHome, p)
}

// Files is a sandbox's filesystem (Sandbox.Files). Every path may be
// relative, to the sandbox user's home (/home/user), or absolute; the
// server keeps each inside the sandbox's own filesystem. Entries and events
// name absolute paths.
type Files struct{ sb *Sandbox }

// Files returns the sandbox's filesystem.
func (s *Sandbox) Files() *Files { return &Files{sb: s} }

// Read returns the file's bytes (the sandbox's secrets masked).
func (f *Files) Read(ctx context.Context, p string) ([]byte, error) {
	rc, err := f.Open(ctx, p)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	var buf bytes.Buffer
	if _, err := io.Copy(&buf, rc); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Open streams the file; the caller closes it. A directory comes as a tar
// stream.
func (f *Files) Open(ctx context.Context, p string) (io.ReadCloser, error) {
	return f.sb.c.ReadFile(ctx, f.sb.id, resolvePath(p))
}

// Write writes data to the file, making its parent directories; WithMode
// sets its permission bits (default 0644).
func (f *Files) Write(ctx context.Context, p string, data []byte, opts ...FileOption) (*api.FileWritten, error) {
	return f.sb.c.WriteFile(ctx, f.sb.id, resolvePath(p), bytes.NewReader(data), opts...)
}

// WriteFrom writes r's bytes to the file (see Write), streaming them.
func (f *Files) WriteFrom(ctx context.Context, p string, r io.Reader, opts ...FileOption) (*api.FileWritten, error) {
	return f.sb.c.WriteFile(ctx, f.sb.id, resolvePath(p), r, opts...)
}

// List returns the entries of the directory.
func (f *Files) List(ctx context.Context, dir string) ([]api.FileInfo, error) {
	return f.sb.c.List(ctx, f.sb.id, resolvePath(dir), 1)
}

// Stat describes the file (a symlink itself, not its target).
func (f *Files) Stat(ctx context.Context, p string) (*api.FileInfo, error) {
	return f.sb.c.Stat(ctx, f.sb.id, resolvePath(p))
}

// Exists reports whether the path exists.
func (f *Files) Exists(ctx context.Context, p string) (bool, error) {
	_, err := f.Stat(ctx, p)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, ErrNotFound) && !errors.Is(err, ErrSandboxNotFound):
		return false, nil
	}
	return false, err
}

// Remove deletes the file, or the directory with everything under it.
func (f *Files) Remove(ctx context.Context, p string) error {
	return f.sb.c.Remove(ctx, f.sb.id, resolvePath(p), true)
}

// MakeDir makes the directory and its parents.
func (f *Files) MakeDir(ctx context.Context, dir string) (*api.FileInfo, error) {
	return f.sb.c.Mkdir(ctx, f.sb.id, resolvePath(dir))
}

// Rename moves from to to.
func (f *Files) Rename(ctx context.Context, from, to string) (*api.FileInfo, error) {
	return f.sb.c.Move(ctx, f.sb.id, resolvePath(from), resolvePath(to))
}

// Watch reports the changes under the directory (opts.Recursive: the whole
// tree) from the moment it returns; Next yields them, Close ends it.
func (f *Files) Watch(ctx context.Context, dir string, opts WatchOptions) (*DirWatch, error) {
	return f.sb.c.WatchDir(ctx, f.sb.id, resolvePath(dir), opts)
}
