package files

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/redact"
	"github.com/airlockhq/airlock/internal/service/sandbox"
	"github.com/airlockhq/airlock/internal/tracing"
)

// maxPathLen is PATH_MAX: longer paths cannot name a file anyway.
const maxPathLen = 4096

// cleanPath checks a path given by a client. Paths name files inside the
// sandbox (the agent resolves them in the sandbox's own root, where `..`
// cannot climb out), but a path that tries to climb at all is refused
// outright: it is a mistake or an attack, never something to guess at.
func cleanPath(p, field string) (string, error) {
	switch {
	case p == "":
		return "", public(errInvalid, "%s is required", field)
	case len(p) > maxPathLen:
		return "", public(errInvalid, "%s is longer than %d bytes", field, maxPathLen)
	case strings.IndexByte(p, 0) >= 0:
		return "", public(errInvalid, "%s contains a NUL byte", field)
	case !utf8.ValidString(p):
		// The agent protocol is JSON, whose encoder would make each invalid
		// byte U+FFFD: "a\xff" and "a\xfe" would name the same file.
		return "", public(errInvalid, "%s is not valid UTF-8 (file names in the API are UTF-8; a tar upload or download carries other bytes as they are)", field)
	case !strings.HasPrefix(p, "/"):
		return "", public(errInvalid, "%s must be an absolute path", field)
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return "", public(errInvalid, "%s must not contain '..': paths outside the sandbox are not reachable", field)
		}
	}
	return path.Clean(p), nil
}

func checkUser(user string) error {
	if user != "" && !sandbox.ValidUser(user) {
		return public(errInvalid, "user %q is not a valid user name", truncate(user, 32))
	}
	return nil
}

// fileSandbox validates the path and user and returns the running sandbox.
func (m *Service) fileSandbox(ctx context.Context, p auth.Principal, id, user string, paths ...*string) (*sandbox.Live, error) {
	if err := checkUser(user); err != nil {
		return nil, err
	}
	for i, ptr := range paths {
		field := "path"
		if len(paths) == 2 {
			field = [2]string{"from", "to"}[i]
		}
		c, err := cleanPath(*ptr, field)
		if err != nil {
			return nil, err
		}
		*ptr = c
	}
	return m.sandboxes.Running(ctx, p, id)
}

// fileInfo turns the agent's file info into the API's.
func fileInfo(fi agentproto.FileInfo) api.FileInfo {
	return api.FileInfo{
		Name: fi.Name, Path: fi.Path, Type: fi.Type, Size: fi.Size, Mode: fmt.Sprintf("%04o", fi.Mode&0o7777),
		Owner: fi.Uid, Group: fi.Gid, ModifiedAt: fi.ModTime, LinkTarget: fi.LinkTarget, Metadata: fi.Metadata,
	}
}

// StatFile describes path in sandbox id.
func (m *Service) StatFile(ctx context.Context, p auth.Principal, id, pth, user string) (api.FileInfo, error) {
	ctx, span := tracing.StartSpan(ctx, "manager.files.stat", id)
	defer span.End()
	sb, err := m.fileSandbox(ctx, p, id, user, &pth)
	if err != nil {
		return api.FileInfo{}, err
	}
	var fi agentproto.FileInfo
	err = sb.WithAgent(ctx, func(c *agentclient.Client) error {
		fi, err = c.Stat(ctx, pth, user)
		return err
	})
	return fileInfo(fi), err
}

// ListFiles lists directory pth down to depth levels.
func (m *Service) ListFiles(ctx context.Context, p auth.Principal, id, pth, user string, depth int) (api.FileList, error) {
	ctx, span := tracing.StartSpan(ctx, "manager.files.list", id)
	defer span.End()
	if depth < 1 || depth > 32 {
		return api.FileList{}, public(errInvalid, "depth must be between 1 and 32")
	}
	sb, err := m.fileSandbox(ctx, p, id, user, &pth)
	if err != nil {
		return api.FileList{}, err
	}
	var fis []agentproto.FileInfo
	err = sb.WithAgent(ctx, func(c *agentclient.Client) error {
		fis, err = c.List(ctx, pth, user, depth)
		return err
	})
	if err != nil {
		return api.FileList{}, err
	}
	out := api.FileList{Entries: make([]api.FileInfo, 0, len(fis))}
	for _, fi := range fis {
		out.Entries = append(out.Entries, fileInfo(fi))
	}
	return out, nil
}

// Mkdir creates directory pth (and its parents when parents).
func (m *Service) Mkdir(ctx context.Context, p auth.Principal, id, pth, user string, parents bool) (api.FileInfo, error) {
	ctx, span := tracing.StartSpan(ctx, "manager.files.mkdir", id)
	defer span.End()
	sb, err := m.fileSandbox(ctx, p, id, user, &pth)
	if err != nil {
		return api.FileInfo{}, err
	}
	var fi agentproto.FileInfo
	err = sb.WithAgent(ctx, func(c *agentclient.Client) error {
		if err := c.Mkdir(ctx, pth, user, parents); err != nil {
			return err
		}
		fi, err = c.Stat(ctx, pth, user)
		return err
	})
	return fileInfo(fi), err
}

// Move renames from to to.
func (m *Service) Move(ctx context.Context, p auth.Principal, id, from, to, user string) (api.FileInfo, error) {
	ctx, span := tracing.StartSpan(ctx, "manager.files.move", id)
	defer span.End()
	sb, err := m.fileSandbox(ctx, p, id, user, &from, &to)
	if err != nil {
		return api.FileInfo{}, err
	}
	c, err := sb.Agent(ctx)
	if err != nil {
		return api.FileInfo{}, err
	}
	// Not retried on a dropped connection: a move that got through would
	// fail the second time with not found.
	if err := c.Move(ctx, from, to, user); err != nil {
		return api.FileInfo{}, err
	}
	fi, err := c.Stat(ctx, to, user)
	return fileInfo(fi), err
}

// RemoveFile deletes pth (a non-empty directory needs recursive).
func (m *Service) RemoveFile(ctx context.Context, p auth.Principal, id, pth, user string, recursive bool) error {
	ctx, span := tracing.StartSpan(ctx, "manager.files.remove", id)
	defer span.End()
	sb, err := m.fileSandbox(ctx, p, id, user, &pth)
	if err != nil {
		return err
	}
	if pth == "/" {
		return public(errInvalid, "refusing to remove /")
	}
	c, err := sb.Agent(ctx)
	if err != nil {
		return err
	}
	return c.Remove(ctx, pth, user, recursive)
}

// WriteFile stores r at pth with mode (0: default), at most maxBytes.
func (m *Service) WriteFile(ctx context.Context, p auth.Principal, id, pth, user string, mode os.FileMode, r io.Reader, maxBytes int64) (api.FileWritten, error) {
	return m.WriteFileWithMetadata(ctx, p, id, pth, user, mode, nil, r, maxBytes)
}

// WriteFileWithMetadata is WriteFile that also gives the file metadata
// (its user.e2b.* extended attributes), in place of any it had.
func (m *Service) WriteFileWithMetadata(ctx context.Context, p auth.Principal, id, pth, user string, mode os.FileMode, md map[string]string, r io.Reader, maxBytes int64) (api.FileWritten, error) {
	ctx, span := tracing.StartSpan(ctx, "manager.files.write", id)
	defer span.End()
	sb, err := m.fileSandbox(ctx, p, id, user, &pth)
	if err != nil {
		return api.FileWritten{}, err
	}
	// A transfer is activity for as long as it lasts, not only at its start.
	defer sb.Active()()
	if maxBytes <= 0 || maxBytes > m.maxUploadBytes {
		maxBytes = m.maxUploadBytes
	}
	c, err := sb.Agent(ctx)
	if err != nil {
		return api.FileWritten{}, err
	}
	n, err := c.WriteFileWithMetadata(ctx, pth, user, mode, md, r, maxBytes)
	if err != nil {
		return api.FileWritten{}, err
	}
	return api.FileWritten{Path: pth, Size: n}, nil
}

// TarIn unpacks the tar stream r into directory dir. It returns the bytes
// of the archive read.
func (m *Service) TarIn(ctx context.Context, p auth.Principal, id, dir, user string, r io.Reader) (api.FileWritten, error) {
	ctx, span := tracing.StartSpan(ctx, "manager.files.tar_in", id)
	defer span.End()
	sb, err := m.fileSandbox(ctx, p, id, user, &dir)
	if err != nil {
		return api.FileWritten{}, err
	}
	defer sb.Active()()
	c, err := sb.Agent(ctx)
	if err != nil {
		return api.FileWritten{}, err
	}
	cr := &countingReader{r: r}
	if err := c.TarIn(ctx, dir, user, cr); err != nil {
		return api.FileWritten{}, err
	}
	return api.FileWritten{Path: dir, Size: cr.n}, nil
}

// ReadFile opens pth. For a directory, isDir is set and rc is a tar stream
// of it. The caller closes rc.
func (m *Service) ReadFile(ctx context.Context, p auth.Principal, id, pth, user string) (rc io.ReadCloser, fi api.FileInfo, err error) {
	ctx, span := tracing.StartSpan(ctx, "manager.files.read", id)
	defer func() { tracing.EndSpan(span, err) }()
	sb, err := m.fileSandbox(ctx, p, id, user, &pth)
	if err != nil {
		return nil, api.FileInfo{}, err
	}
	err = sb.WithAgent(ctx, func(c *agentclient.Client) error {
		// One agent call: a directory comes as a tar stream (fi.Type).
		var afi agentproto.FileInfo
		rc, afi, err = c.Download(ctx, pth, user)
		fi = fileInfo(afi)
		return err
	})
	if rc != nil {
		// The download is activity until its reader is closed.
		rc = &activeReader{ReadCloser: redact.NewReader(sb.Redactor(), rc), done: sb.Active()}
	}
	return rc, fi, err
}

// activeReader ends a transfer's activity when it is closed.
type activeReader struct {
	io.ReadCloser
	once sync.Once
	done func()
}

// WriteTo keeps the reader beneath's own (a download's splice to the
// client's socket) for io.Copy.
func (r *activeReader) WriteTo(w io.Writer) (int64, error) { return io.Copy(w, r.ReadCloser) }

func (r *activeReader) Close() error {
	r.once.Do(r.done)
	return r.ReadCloser.Close()
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
