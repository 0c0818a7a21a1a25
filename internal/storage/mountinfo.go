package storage

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
)

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	ID     int
	Target string // mount point
	FSType string
	Source string
	order  int // line number: later lines are newer mounts on a shared target
}

// readMountinfo parses /proc/self/mountinfo.
func readMountinfo() ([]mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseMountinfo(f)
}

// parseMountinfo parses the mountinfo format of proc(5):
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
func parseMountinfo(r io.Reader) ([]mountEntry, error) {
	var out []mountEntry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 0; sc.Scan(); n++ {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" && i >= 6 {
				sep = i
				break
			}
		}
		if len(fields) < 7 || sep < 0 || len(fields) < sep+3 {
			return nil, fmt.Errorf("malformed mountinfo line %d", n+1)
		}
		id, err := strconv.Atoi(fields[0])
		if err != nil {
			return nil, fmt.Errorf("malformed mountinfo line %d: %w", n+1, err)
		}
		out = append(out, mountEntry{
			ID:     id,
			Target: unescapeOctal(fields[4]),
			FSType: fields[sep+1],
			Source: unescapeOctal(fields[sep+2]),
			order:  n,
		})
	}
	return out, sc.Err()
}

// unescapeOctal undoes the \ooo escapes the kernel writes for space, tab,
// newline and backslash in mountinfo paths.
func unescapeOctal(s string) string {
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

// under reports whether path is root or inside it.
func under(path, root string) bool {
	return path == root || strings.HasPrefix(path, strings.TrimSuffix(root, "/")+"/")
}

// mountsUnder returns the mounts at or under any of roots in an order that
// can be unmounted: deepest first, and newest first on a shared mount point.
func mountsUnder(all []mountEntry, roots []string) []mountEntry {
	var sel []mountEntry
	for _, m := range all {
		for _, r := range roots {
			if under(m.Target, r) {
				sel = append(sel, m)
				break
			}
		}
	}
	sort.SliceStable(sel, func(i, j int) bool {
		di, dj := strings.Count(sel[i].Target, "/"), strings.Count(sel[j].Target, "/")
		if di != dj {
			return di > dj
		}
		return sel[i].order > sel[j].order
	})
	return sel
}
