package agent

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// A file's metadata are its user.e2b.<key> extended attributes (E2B's
// envd keeps an upload's metadata there too, so code in the sandbox sees
// and sets the same ones). Everything here is bounded: a file in the
// sandbox can carry any attributes its processes gave it.

// The kernel's bounds of an attribute's name and of a file's list of them
// (XATTR_NAME_MAX, XATTR_LIST_MAX).
const (
	xattrNameMax = 255
	xattrListMax = 64 << 10
)

// validMetadata checks an upload's metadata against the bounds.
func validMetadata(md map[string]string) error {
	if len(md) > agentproto.MaxMetadataKeys {
		return invalid(fmt.Sprintf("at most %d metadata keys", agentproto.MaxMetadataKeys))
	}
	total := 0
	for k, v := range md {
		name := agentproto.MetadataXattrPrefix + k
		if k == "" || len(name) > xattrNameMax || strings.ContainsRune(k, 0) || !utf8.ValidString(k) || !utf8.ValidString(v) {
			return invalid(fmt.Sprintf("metadata key %q", k))
		}
		total += len(k) + len(v)
	}
	if total > agentproto.MaxMetadataBytes {
		return invalid(fmt.Sprintf("metadata over %d bytes", agentproto.MaxMetadataBytes))
	}
	return nil
}

// setMetadata replaces the metadata of the open file fd with md: its
// earlier user.e2b.* attributes are removed first (an overwrite clears
// stale metadata).
func setMetadata(fd int, md map[string]string) error {
	names, err := xattrNames(func(buf []byte) (int, error) { return unix.Flistxattr(fd, buf) })
	if err != nil && !errors.Is(err, unix.ENOTSUP) {
		return err
	}
	for _, n := range names {
		if strings.HasPrefix(n, agentproto.MetadataXattrPrefix) {
			if err := unix.Fremovexattr(fd, n); err != nil && !errors.Is(err, unix.ENODATA) {
				return err
			}
		}
	}
	for k, v := range md {
		if err := unix.Fsetxattr(fd, agentproto.MetadataXattrPrefix+k, []byte(v), 0); err != nil {
			if errors.Is(err, unix.ENOTSUP) {
				return invalid("this sandbox's file system keeps no file metadata")
			}
			return err
		}
	}
	return nil
}

// readMetadata returns the metadata of name in directory fd (fd itself
// when name is ""), nil when it has none or they cannot be read. It is
// reached through an O_PATH descriptor and its /proc/self/fd link, so that
// no symlink is followed and the file is not opened for reading.
func readMetadata(fd int, name string) map[string]string {
	pfd := fd
	if name != "" {
		var err error
		pfd, err = unix.Openat(fd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil
		}
		defer unix.Close(pfd)
	}
	proc := "/proc/self/fd/" + strconv.Itoa(pfd)
	names, err := xattrNames(func(buf []byte) (int, error) { return unix.Listxattr(proc, buf) })
	if err != nil {
		return nil
	}
	var md map[string]string
	total := 0
	val := make([]byte, 4096)
	for _, n := range names {
		k, ok := strings.CutPrefix(n, agentproto.MetadataXattrPrefix)
		if !ok || k == "" || !utf8.ValidString(k) {
			continue
		}
		if len(md) >= agentproto.MaxMetadataKeys {
			break
		}
		sz, err := unix.Getxattr(proc, n, val)
		if errors.Is(err, unix.ERANGE) {
			continue // over 4 KiB: not shown
		}
		if err != nil || !utf8.Valid(val[:sz]) || total+len(k)+sz > agentproto.MaxMetadataBytes {
			continue
		}
		total += len(k) + sz
		if md == nil {
			md = map[string]string{}
		}
		md[k] = string(val[:sz])
	}
	return md
}

// xattrNames returns the attribute names list gives (a listxattr call),
// at most 64 KiB of them (the kernel's own bound).
func xattrNames(list func([]byte) (int, error)) ([]string, error) {
	buf := make([]byte, 1024)
	n, err := list(buf)
	if errors.Is(err, unix.ERANGE) {
		buf = make([]byte, xattrListMax)
		n, err = list(buf)
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range strings.Split(string(buf[:n]), "\x00") {
		if s != "" {
			out = append(out, s)
		}
	}
	return out, nil
}
