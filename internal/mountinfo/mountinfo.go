// Package mountinfo is the daemon's one parser of the kernel's mount table, /proc/<pid>/mountinfo (proc(5)): storage teardown, the drivers, cgroup discovery and the tests' leak checks all read it here.
package mountinfo

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Mount is one line of mountinfo:
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//	(1)(2)(3)   (4)   (5)      (6)      (7)   (8) (9)     (10)         (11)
type Mount struct {
	ID       int    // (1) unique id of the mount
	ParentID int    // (2)
	Root     string // (4) the directory of its file system mounted here
	Target   string // (5) mount point
	Options  string // (6) per-mount options
	FSType   string // (9)
	Source   string // (10)
	// SuperOptions are the file system's own options (11).
	SuperOptions string
}

// Read parses /proc/self/mountinfo: the mounts of the calling thread's
// mount namespace.
func Read() ([]Mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Parse(f)
}

// Parse parses a mountinfo listing, in the kernel's order (a mount stacked
// on a mount point comes after the one it covers). Paths are unescaped. A
// line that is not of the format is an error: the kernel writes none.
func Parse(r io.Reader) ([]Mount, error) {
	var out []Mount
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		m, err := parseLine(sc.Text())
		if err != nil {
			return nil, fmt.Errorf("mountinfo line %d: %w", n, err)
		}
		out = append(out, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading mountinfo: %w", err)
	}
	return out, nil
}

func parseLine(line string) (Mount, error) {
	f := strings.Fields(line)
	// Optional fields (7) end at the first "-" from field 7 on.
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if sep < 0 || len(f) < sep+3 {
		return Mount{}, fmt.Errorf("malformed: %q", clip(line))
	}
	id, err := strconv.Atoi(f[0])
	if err != nil {
		return Mount{}, fmt.Errorf("malformed mount id: %q", clip(line))
	}
	parent, err := strconv.Atoi(f[1])
	if err != nil {
		return Mount{}, fmt.Errorf("malformed parent id: %q", clip(line))
	}
	m := Mount{
		ID: id, ParentID: parent, Root: Unescape(f[3]), Target: Unescape(f[4]), Options: f[5],
		FSType: f[sep+1], Source: Unescape(f[sep+2]),
	}
	if len(f) > sep+3 {
		m.SuperOptions = f[sep+3]
	}
	return m, nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// Unescape undoes the \ooo escapes the kernel writes for space, tab,
// newline and backslash in mountinfo's paths.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			v, _ := strconv.ParseUint(s[i+1:i+4], 8, 8)
			b.WriteByte(byte(v))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// Under reports whether path is root or inside it (by path, not by
// following anything).
func Under(path, root string) bool {
	return path == root || strings.HasPrefix(path, strings.TrimSuffix(root, "/")+"/")
}

// MountedUnder returns the first mount in ms whose mount point is dir or
// below it, and whether there is one.
func MountedUnder(ms []Mount, dir string) (Mount, bool) {
	for _, m := range ms {
		if Under(m.Target, dir) {
			return m, true
		}
	}
	return Mount{}, false
}
