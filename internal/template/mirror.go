package template

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// MirrorEnv overrides the Debian mirror that templates are built from.
const MirrorEnv = "AIRLOCK_DEBIAN_MIRROR"

// Mirror returns the Debian mirror to build templates from: $AIRLOCK_DEBIAN_MIRROR
// if set, else the first main-archive source of the host's apt configuration
// (/etc/apt/sources.list, then /etc/apt/sources.list.d/*.list and *.sources),
// so that airlock uses whatever mirror, proxy or snapshot the host is set up for.
func Mirror() (string, error) {
	if m := strings.TrimSpace(os.Getenv(MirrorEnv)); m != "" {
		return m, nil
	}
	return mirrorFromApt("/etc/apt")
}

// mirrorFromApt reads the apt configuration under aptDir.
func mirrorFromApt(aptDir string) (string, error) {
	files := []string{filepath.Join(aptDir, "sources.list")}
	ents, err := os.ReadDir(filepath.Join(aptDir, "sources.list.d"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("reading apt sources: %w", err)
	}
	var names []string
	for _, e := range ents {
		if n := e.Name(); strings.HasSuffix(n, ".list") || strings.HasSuffix(n, ".sources") {
			names = append(names, n)
		}
	}
	sort.Strings(names) // apt reads them in this order too
	for _, n := range names {
		files = append(files, filepath.Join(aptDir, "sources.list.d", n))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("reading apt sources: %w", err)
		}
		var srcs []aptSource
		if strings.HasSuffix(f, ".sources") {
			srcs = parseDeb822(string(b))
		} else {
			srcs = parseList(string(b))
		}
		for _, s := range srcs {
			if m, ok := s.mainArchive(); ok {
				return m, nil
			}
		}
	}
	return "", errdefs.Wrap(errdefs.ErrNotFound, "no Debian mirror in the host's apt sources; set %s", MirrorEnv)
}

// aptSource is one source entry, from either format.
type aptSource struct {
	types, uris, suites []string
	enabled             bool
}

// mainArchive returns the entry's URI when it is an enabled binary source of
// a release suite: not -security, -updates or -backports, which live on
// other archives or only carry a subset of packages.
func (s aptSource) mainArchive() (string, bool) {
	if !s.enabled || !contains(s.types, "deb") || len(s.uris) == 0 {
		return "", false
	}
	uri := strings.TrimRight(s.uris[0], "/")
	if !strings.HasPrefix(uri, "http://") && !strings.HasPrefix(uri, "https://") {
		return "", false // cdrom:, file:, mirror+… are not something debootstrap fetches from
	}
	for _, suite := range s.suites {
		if !strings.Contains(suite, "-") && !strings.Contains(suite, "/") {
			return uri, true
		}
	}
	return "", false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// parseList parses one-line-style sources: "deb [opts] uri suite comp…".
func parseList(text string) []aptSource {
	var out []aptSource
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		fields := strings.Fields(line)
		if len(fields) < 3 {
			continue
		}
		typ, rest := fields[0], fields[1:]
		if strings.HasPrefix(rest[0], "[") {
			// Options may contain spaces: skip to the field that closes them.
			for len(rest) > 0 && !strings.HasSuffix(rest[0], "]") {
				rest = rest[1:]
			}
			if len(rest) > 0 {
				rest = rest[1:]
			}
		}
		if len(rest) < 2 {
			continue
		}
		out = append(out, aptSource{types: []string{typ}, uris: rest[:1], suites: rest[1:2], enabled: true})
	}
	return out
}

// parseDeb822 parses deb822-style sources: stanzas of "Field: value"
// separated by blank lines, with continuation lines starting with space.
func parseDeb822(text string) []aptSource {
	var out []aptSource
	fields := map[string]string{}
	last := ""
	flush := func() {
		if len(fields) > 0 {
			out = append(out, aptSource{
				types:   strings.Fields(fields["types"]),
				uris:    strings.Fields(fields["uris"]),
				suites:  strings.Fields(fields["suites"]),
				enabled: !strings.EqualFold(strings.TrimSpace(fields["enabled"]), "no"),
			})
		}
		fields = map[string]string{}
		last = ""
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "#"):
			continue
		case strings.TrimSpace(line) == "":
			flush()
		case line[0] == ' ' || line[0] == '\t':
			if last != "" {
				fields[last] += " " + strings.TrimSpace(line)
			}
		default:
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			last = strings.ToLower(strings.TrimSpace(k))
			fields[last] = strings.TrimSpace(v)
		}
	}
	flush()
	return out
}
