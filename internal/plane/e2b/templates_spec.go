package e2b

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"github.com/airlockhq/airlock/internal/lazyregexp"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// buildStart is E2B's TemplateBuildStartV2: what the SDK's builder made.
type buildStart struct {
	Force             bool            `json:"force"`
	FromImage         string          `json:"fromImage"`
	FromImageRegistry json.RawMessage `json:"fromImageRegistry"`
	FromTemplate      string          `json:"fromTemplate"`
	StartCmd          string          `json:"startCmd"`
	ReadyCmd          string          `json:"readyCmd"`
	Steps             []buildStep     `json:"steps"`
}

// buildStep is E2B's TemplateStep.
type buildStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash"`
	Force     bool     `json:"force"`
}

// e2bDefaultUser and e2bDefaultWorkdir are where E2B's builds run their
// steps (and its sandboxes their commands) unless the template says
// otherwise.
const (
	e2bDefaultUser    = "user"
	e2bDefaultWorkdir = "/home/user"
	// maxSteps bounds the steps of a build (airlock's spec takes 200
	// instructions; a RUN as another user takes three).
	maxSteps = 60
)

var (
	userNameRE = lazyregexp.New(`^[a-z_][a-z0-9_.-]{0,31}$`)
	ownerRE    = lazyregexp.New(`^[a-z_][a-z0-9_.-]{0,31}(:[a-z_][a-z0-9_.-]{0,31})?$`)
	envKeyRE   = lazyregexp.New(`^[A-Za-z_][A-Za-z0-9_]*$`)
	modeRE     = lazyregexp.New(`^[0-7]{3,4}$`)
)

// translated is a build's spec and the uploads its context holds.
type translated struct {
	dockerfile string
	hashes     []string
	// steps names, for each line of the spec (from 1), the SDK's step it
	// came from: "base" (FROM and the defaults after it) or the step's
	// number from 1, which the SDK maps to the call that made it.
	steps []string
}

// translate turns the SDK's steps into airlock's spec (docs/templates.md):
// FROM the parent, then one instruction (or a few) per step. files maps
// the hash of each uploaded COPY source to its upload; the context holds
// each under a directory named by its hash. A forced step (skipCache)
// is made to miss airlock's layer cache by a no-op naming buildID at the
// head of its RUN: its layer and every one after it are made again.
func translate(from string, parent api.Template, body buildStart, files map[string]string, buildID string) (translated, error) {
	if len(body.Steps) > maxSteps {
		return translated{}, errf(errdefs.ErrInvalidArgument, "a template has at most %d steps", maxSteps)
	}
	var out, steps []string
	step := "base"
	emit := func(format string, args ...any) {
		out = append(out, fmt.Sprintf(format, args...))
		steps = append(steps, step)
	}
	emit("FROM %s", from)
	user, workdir := parent.User, parent.Workdir
	if user == "" {
		user = e2bDefaultUser
		emit("USER %s", user)
	}
	if workdir == "" {
		workdir = e2bDefaultWorkdir
		emit("WORKDIR %s", workdir)
	}
	// asUser runs lines as u, then returns to the step's user.
	asUser := func(u string, lines func()) {
		if u == user {
			lines()
			return
		}
		emit("USER %s", u)
		lines()
		emit("USER %s", user)
	}
	var hashes []string
	seen := map[string]bool{}
	forced := false
	for i, s := range body.Steps {
		step = strconv.Itoa(i + 1)
		fail := func(format string, args ...any) error {
			return errf(errdefs.ErrInvalidArgument, "step %d (%s): %s", i+1, s.Type, fmt.Sprintf(format, args...))
		}
		for _, a := range s.Args {
			if strings.IndexByte(a, 0) >= 0 {
				return translated{}, fail("an argument contains a NUL byte")
			}
		}
		switch strings.ToUpper(s.Type) {
		case "RUN":
			if len(s.Args) == 0 || strings.TrimSpace(s.Args[0]) == "" {
				return translated{}, fail("a command is required")
			}
			u := user
			if len(s.Args) > 1 && s.Args[1] != "" {
				if u = s.Args[1]; !userNameRE.MatchString(u) {
					return translated{}, fail("invalid username: %q", u)
				}
			}
			cmd := s.Args[0]
			if s.Force || (body.Force && !forced) {
				// The rest of the build is made again anyway.
				forced = true
				cmd = ": skip-cache " + buildID + "; " + cmd
			}
			argv, _ := json.Marshal([]string{"/bin/bash", "-c", cmd})
			asUser(u, func() { emit("RUN %s", argv) })
		case "COPY":
			if len(s.Args) < 2 || s.Args[0] == "" || s.Args[1] == "" {
				return translated{}, fail("a source and a destination are required")
			}
			if !filesHashRE.MatchString(s.FilesHash) {
				return translated{}, fail("filesHash is required")
			}
			upload, ok := files[s.FilesHash]
			if !ok {
				return translated{}, fail("the files (hash %s) were not uploaded", s.FilesHash)
			}
			src, dest := copySource(s.Args[0]), s.Args[1]
			if src == "" {
				return translated{}, fail("the source %q leaves the context", s.Args[0])
			}
			if strings.ContainsAny(dest, "\n\r") {
				return translated{}, fail("bad destination")
			}
			owner := user + ":" + user
			if len(s.Args) > 2 && s.Args[2] != "" {
				if owner = s.Args[2]; !strings.Contains(owner, ":") {
					owner += ":" + owner
				}
				if !ownerRE.MatchString(owner) {
					return translated{}, fail("invalid owner %q", s.Args[2])
				}
			}
			mode := ""
			if len(s.Args) > 3 && s.Args[3] != "" {
				if mode = s.Args[3]; !modeRE.MatchString(mode) {
					return translated{}, fail("invalid mode %q (octal)", mode)
				}
			}
			if !seen[s.FilesHash] {
				seen[s.FilesHash] = true
				hashes = append(hashes, s.FilesHash)
			}
			ctxSrc := s.FilesHash
			if src != "." {
				ctxSrc += "/" + src
			}
			args, _ := json.Marshal([]string{"--chown=" + owner, escapeDollar(ctxSrc), escapeDollar(dest)})
			emit("COPY %s", args)
			if mode != "" {
				targets, err := copyTargets(upload, src, dest)
				if err != nil {
					return translated{}, fail("%v", err)
				}
				if len(targets) > 0 {
					argv, _ := json.Marshal(append([]string{"chmod", "-R", mode, "--"}, targets...))
					asUser("root", func() { emit("RUN %s", argv) })
				}
			}
		case "ENV":
			if len(s.Args) == 0 || len(s.Args)%2 != 0 {
				return translated{}, fail("names and values come in pairs")
			}
			var pairs []string
			for j := 0; j < len(s.Args); j += 2 {
				k, v := s.Args[j], s.Args[j+1]
				if !envKeyRE.MatchString(k) {
					return translated{}, fail("%q is not a variable name", k)
				}
				if strings.ContainsAny(v, "\n\r") {
					return translated{}, fail("the value of %s has a line break", k)
				}
				pairs = append(pairs, k+"="+quoteEnv(v))
			}
			emit("ENV %s", strings.Join(pairs, " "))
		case "WORKDIR":
			if len(s.Args) == 0 || s.Args[0] == "" || strings.ContainsAny(s.Args[0], "\n\r") {
				return translated{}, fail("a directory is required")
			}
			workdir = s.Args[0]
			emit("WORKDIR %s", escapeDollar(workdir))
		case "USER":
			if len(s.Args) == 0 || !userNameRE.MatchString(s.Args[0]) {
				return translated{}, fail("invalid username")
			}
			user = s.Args[0]
			emit("USER %s", user)
		default:
			return translated{}, fail("step type %q is not supported (RUN, COPY, ENV, WORKDIR, USER)", s.Type)
		}
	}
	return translated{dockerfile: strings.Join(out, "\n") + "\n", hashes: hashes, steps: steps}, nil
}

// errLineRE finds the spec line a build error names.
var errLineRE = lazyregexp.New(`(?:^line |\(line )(\d+)[:)]`)

// failedStep is the SDK's step a build error names, or "".
func failedStep(msg string, steps []string) string {
	m := errLineRE.FindStringSubmatch(msg)
	if m == nil {
		return ""
	}
	n, err := strconv.Atoi(m[1])
	if err != nil || n < 1 || n > len(steps) {
		return ""
	}
	return steps[n-1]
}

// copySource is the part of a COPY source before its first pattern: the
// SDK uploads what the pattern matches, under the paths it has in the
// context, and E2B copies the directory (or file) the pattern starts from.
// "" when the source climbs out of the context.
func copySource(src string) string {
	var kept []string
	for _, c := range strings.Split(src, "/") {
		if strings.ContainsAny(c, "*?[{") {
			break
		}
		kept = append(kept, c)
	}
	p := path.Clean("/" + strings.Join(kept, "/"))
	if c := path.Clean(src); c == ".." || strings.HasPrefix(c, "../") || strings.HasPrefix(src, "/") {
		return ""
	}
	if p == "/" {
		return "."
	}
	return p[1:]
}

// escapeDollar keeps the spec from expanding $ (E2B's arguments are taken
// as they are).
func escapeDollar(s string) string { return strings.ReplaceAll(s, "$", `\$`) }

// quoteEnv is v as one double-quoted shell word.
func quoteEnv(v string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, `$`, `\$`)
	return `"` + r.Replace(v) + `"`
}

// copyTargets are the paths a COPY of src (in the upload) to dest makes at
// its top: what E2B's mode applies to (recursively).
func copyTargets(upload, src, dest string) ([]string, error) {
	f, err := os.Open(upload)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r, closeFn, err := uploadReader(f)
	if err != nil {
		return nil, err
	}
	defer closeFn()
	tr := tar.NewReader(r)
	isDir := src == "."
	children := map[string]bool{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("the uploaded files are not a tar archive")
		}
		name := path.Clean(strings.TrimLeft(hdr.Name, "/"))
		rest := name
		if src != "." {
			if name == src {
				if hdr.Typeflag == tar.TypeDir {
					isDir = true
				}
				continue
			}
			var ok bool
			if rest, ok = strings.CutPrefix(name, src+"/"); !ok {
				continue
			}
			isDir = true
		}
		if rest == "." || rest == "" {
			continue
		}
		top, _, _ := strings.Cut(rest, "/")
		children[top] = true
	}
	if !isDir {
		if strings.HasSuffix(dest, "/") {
			return []string{path.Join(dest, path.Base(src))}, nil
		}
		return []string{dest}, nil
	}
	var out []string
	for c := range children {
		out = append(out, path.Join(dest, c))
	}
	sort.Strings(out)
	return out, nil
}
