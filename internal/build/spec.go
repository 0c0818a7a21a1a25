package build

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
)

// Instructions of the spec, a Dockerfile subset.
const (
	InstrFrom    = "FROM"
	InstrRun     = "RUN"
	InstrCopy    = "COPY"
	InstrEnv     = "ENV"
	InstrWorkdir = "WORKDIR"
	InstrUser    = "USER"
)

// unsupported explains the Dockerfile instructions the subset leaves out.
var unsupported = map[string]string{
	"ADD":         "ADD is not supported: use COPY (archives are not unpacked, URLs not fetched)",
	"CMD":         "CMD is not supported: give the template a start_cmd",
	"ENTRYPOINT":  "ENTRYPOINT is not supported: give the template a start_cmd",
	"HEALTHCHECK": "HEALTHCHECK is not supported: give the template a ready_cmd",
	"ARG":         "ARG is not supported: use ENV",
	"EXPOSE":      "EXPOSE is not supported: sandbox networking is set per sandbox",
	"VOLUME":      "VOLUME is not supported: volumes are attached per sandbox",
	"LABEL":       "LABEL is not supported",
	"MAINTAINER":  "MAINTAINER is not supported",
	"ONBUILD":     "ONBUILD is not supported",
	"SHELL":       "SHELL is not supported: RUN uses /bin/sh -c",
	"STOPSIGNAL":  "STOPSIGNAL is not supported",
}

// Limits of a spec.
const (
	// MaxInstructions bounds a spec; overlayfs bounds the layers anyway.
	MaxInstructions = 200
	// MaxSpecBytes bounds the spec text.
	MaxSpecBytes = 256 << 10
)

// Instruction is one parsed instruction.
type Instruction struct {
	// Line is the 1-based line the instruction starts on.
	Line int
	// Cmd is the instruction, upper-case.
	Cmd string
	// Raw is the instruction as written, continuation lines joined.
	Raw string
	// From is FROM's reference.
	From string
	// Shell is RUN's shell form; Exec its exec (JSON) form.
	Shell string
	Exec  []string
	// Srcs and Dest are COPY's sources (relative to the build context) and
	// destination; Chown its --chown user (and group).
	Srcs  []string
	Dest  string
	Chown string
	// Env are ENV's pairs, in order.
	Env [][2]string
	// Path is WORKDIR's directory; User is USER's user.
	Path string
	User string
}

// Summary is the instruction as the build log shows it: one line, cut.
func (in Instruction) Summary() string {
	s := strings.Join(strings.Fields(in.Raw), " ")
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}

// Spec is a parsed build spec: its FROM and the steps after it.
type Spec struct {
	From  Instruction
	Steps []Instruction
}

// SpecError is a spec that cannot be built: where and why.
type SpecError struct {
	Line  int
	Instr string
	Msg   string
}

// Error implements error.
func (e *SpecError) Error() string {
	if e.Line == 0 {
		return "spec: " + e.Msg
	}
	if e.Instr == "" {
		return fmt.Sprintf("line %d: %s", e.Line, e.Msg)
	}
	return fmt.Sprintf("line %d: %s: %s", e.Line, e.Instr, e.Msg)
}

// Unwrap classifies a spec error as invalid input.
func (e *SpecError) Unwrap() error { return errdefs.ErrInvalidArgument }

// logicalLine is an instruction with its continuation lines joined.
type logicalLine struct {
	line int
	text string
}

// Parse parses a build spec.
func Parse(text string) (*Spec, error) {
	if len(text) > MaxSpecBytes {
		return nil, &SpecError{Msg: fmt.Sprintf("the spec exceeds %d bytes", MaxSpecBytes)}
	}
	if strings.IndexByte(text, 0) >= 0 {
		return nil, &SpecError{Msg: "the spec contains a NUL byte"}
	}
	lines, err := joinLines(text)
	if err != nil {
		return nil, err
	}
	if len(lines) == 0 {
		return nil, &SpecError{Msg: "the spec is empty: it needs a FROM"}
	}
	if len(lines) > MaxInstructions {
		return nil, &SpecError{Msg: fmt.Sprintf("the spec has %d instructions, more than %d", len(lines), MaxInstructions)}
	}
	spec := &Spec{}
	env := map[string]string{}
	for i, l := range lines {
		word, rest := strings.TrimSpace(l.text), ""
		if t := strings.IndexAny(word, " \t"); t >= 0 {
			word, rest = word[:t], word[t+1:]
		}
		cmd := strings.ToUpper(word)
		rest = strings.TrimSpace(rest)
		in := Instruction{Line: l.line, Cmd: cmd, Raw: strings.TrimSpace(l.text)}
		fail := func(format string, args ...any) error {
			return &SpecError{Line: l.line, Instr: cmd, Msg: fmt.Sprintf(format, args...)}
		}
		if i == 0 && cmd != InstrFrom {
			if _, ok := unsupported[cmd]; !ok && !known(cmd) {
				return nil, &SpecError{Line: l.line, Instr: word, Msg: unknownMsg()}
			}
			return nil, fail("the spec must start with FROM")
		}
		switch cmd {
		case InstrFrom:
			if i > 0 {
				return nil, fail("only one FROM is allowed (multi-stage builds are not supported)")
			}
			f := strings.Fields(rest)
			switch {
			case len(f) == 0:
				return nil, fail("FROM needs a template, debian:bookworm or image")
			case strings.HasPrefix(f[0], "--"):
				return nil, fail("FROM takes no flags")
			case len(f) > 1:
				return nil, fail("FROM takes one reference (multi-stage builds are not supported)")
			}
			in.From = f[0]
			spec.From = in
			continue
		case InstrRun:
			if rest == "" {
				return nil, fail("RUN needs a command")
			}
			if strings.HasPrefix(rest, "--") {
				return nil, fail("RUN takes no flags")
			}
			if strings.HasPrefix(rest, "[") {
				argv, err := jsonArgs(rest)
				if err != nil {
					return nil, fail("%v", err)
				}
				in.Exec = argv
			} else {
				in.Shell = rest
			}
		case InstrCopy:
			args, err := copyArgs(rest, env)
			if err != nil {
				return nil, fail("%v", err)
			}
			for len(args) > 0 && strings.HasPrefix(args[0], "--") {
				flag := args[0]
				args = args[1:]
				switch {
				case strings.HasPrefix(flag, "--chown="):
					in.Chown = strings.TrimPrefix(flag, "--chown=")
					if !ownerRE.MatchString(in.Chown) {
						return nil, fail("--chown takes user or user:group names, not %q", in.Chown)
					}
				case strings.HasPrefix(flag, "--from="):
					return nil, fail("--from is not supported (multi-stage builds are not supported)")
				default:
					return nil, fail("flag %s is not supported (only --chown)", flag)
				}
			}
			if len(args) < 2 {
				return nil, fail("COPY needs at least one source and a destination")
			}
			in.Srcs, in.Dest = args[:len(args)-1], args[len(args)-1]
			for _, s := range in.Srcs {
				if s == "" {
					return nil, fail("empty source")
				}
			}
		case InstrEnv:
			pairs, err := envPairs(rest, env)
			if err != nil {
				return nil, fail("%v", err)
			}
			for _, p := range pairs {
				env[p[0]] = p[1]
			}
			in.Env = pairs
		case InstrWorkdir:
			if rest == "" {
				return nil, fail("WORKDIR needs a directory")
			}
			in.Path = expand(rest, env)
			if strings.IndexByte(in.Path, 0) >= 0 || strings.ContainsAny(in.Path, "\n") {
				return nil, fail("bad directory")
			}
		case InstrUser:
			u := expand(rest, env)
			switch {
			case u == "":
				return nil, fail("USER needs a user name")
			case strings.Contains(u, ":"):
				return nil, fail("USER takes a user name; a group is not supported")
			case !userRE.MatchString(u):
				return nil, fail("USER takes a user name from the template's /etc/passwd, not %q", u)
			}
			in.User = u
		default:
			if msg, ok := unsupported[cmd]; ok {
				return nil, fail("%s", msg)
			}
			return nil, &SpecError{Line: l.line, Instr: word, Msg: unknownMsg()}
		}
		spec.Steps = append(spec.Steps, in)
	}
	return spec, nil
}

var (
	userRE  = lazyregexp.New(`^[a-z_][a-z0-9_.-]{0,31}$`)
	ownerRE = lazyregexp.New(`^[a-z_][a-z0-9_.-]{0,31}(:[a-z_][a-z0-9_.-]{0,31})?$`)
	envKey  = lazyregexp.New(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

func known(cmd string) bool {
	switch cmd {
	case InstrFrom, InstrRun, InstrCopy, InstrEnv, InstrWorkdir, InstrUser:
		return true
	}
	return false
}

func unknownMsg() string {
	return "unknown instruction (the spec supports FROM, RUN, COPY, ENV, WORKDIR and USER)"
}

// joinLines splits text into instructions: comments and blank lines are
// dropped, a line ending in a backslash continues on the next one.
func joinLines(text string) ([]logicalLine, error) {
	var (
		out   []logicalLine
		cur   strings.Builder
		start int
	)
	phys := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	for i, l := range phys {
		trimmed := strings.TrimSpace(l)
		if strings.HasPrefix(trimmed, "#") {
			continue // comments end nothing, even inside a continuation
		}
		if trimmed == "" && cur.Len() == 0 {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		body := strings.TrimRight(l, " \t")
		if strings.HasSuffix(body, "\\") {
			cur.WriteString(strings.TrimSuffix(body, "\\"))
			cur.WriteByte(' ')
			continue
		}
		cur.WriteString(body)
		out = append(out, logicalLine{line: start, text: cur.String()})
		cur.Reset()
	}
	if cur.Len() > 0 {
		if strings.TrimSpace(cur.String()) == "" {
			return out, nil
		}
		out = append(out, logicalLine{line: start, text: cur.String()})
	}
	return out, nil
}

// jsonArgs parses an exec-form argument list: a JSON array of strings.
func jsonArgs(s string) ([]string, error) {
	var argv []string
	if err := json.Unmarshal([]byte(s), &argv); err != nil {
		return nil, fmt.Errorf("exec form must be a JSON array of strings: %v", err)
	}
	if len(argv) == 0 || argv[0] == "" {
		return nil, fmt.Errorf("exec form needs a command")
	}
	for _, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, fmt.Errorf("exec form contains a NUL byte")
		}
	}
	return argv, nil
}

// copyArgs splits COPY's arguments: the JSON form, or words separated by
// white space, with ENV variables expanded.
func copyArgs(rest string, env map[string]string) ([]string, error) {
	var args []string
	if strings.HasPrefix(rest, "[") {
		a, err := jsonArgs(rest)
		if err != nil {
			return nil, err
		}
		args = a
	} else {
		args = strings.Fields(rest)
	}
	for i := range args {
		args[i] = expand(args[i], env)
	}
	return args, nil
}

// envPairs parses ENV: "K=V K2='V 2'" (quotes and backslash escapes as a
// shell reads them), or the old "K some value" form.
func envPairs(rest string, env map[string]string) ([][2]string, error) {
	if rest == "" {
		return nil, fmt.Errorf("ENV needs a name and a value")
	}
	first, _, _ := strings.Cut(rest, " ")
	if !strings.Contains(first, "=") {
		k, v, ok := strings.Cut(rest, " ")
		if !ok {
			return nil, fmt.Errorf("ENV %s needs a value", k)
		}
		if !envKey.MatchString(k) {
			return nil, fmt.Errorf("%q is not a variable name", k)
		}
		return [][2]string{{k, expand(strings.TrimSpace(v), env)}}, nil
	}
	words, err := shellWords(rest, env)
	if err != nil {
		return nil, err
	}
	// Like docker, every value sees the variables as they were before this
	// instruction.
	var out [][2]string
	for _, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if !ok {
			return nil, fmt.Errorf("%q is not NAME=value", w)
		}
		if !envKey.MatchString(k) {
			return nil, fmt.Errorf("%q is not a variable name", k)
		}
		out = append(out, [2]string{k, v})
	}
	return out, nil
}

// shellWords splits s into words, honouring quotes and backslashes and
// expanding $VAR and ${VAR} outside single quotes.
func shellWords(s string, env map[string]string) ([]string, error) {
	var (
		words []string
		cur   strings.Builder
		in    bool // inside a word
	)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		case c == '\\':
			in = true
			if i+1 < len(s) {
				i++
				cur.WriteByte(s[i])
			}
		case c == '\'':
			in = true
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unterminated single quote")
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
		case c == '"':
			in = true
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				switch {
				case s[i] == '\\' && i+1 < len(s) && strings.IndexByte(`"\$`, s[i+1]) >= 0:
					i++
					cur.WriteByte(s[i])
				case s[i] == '$':
					v, n := expandAt(s, i, env)
					cur.WriteString(v)
					i += n - 1
				default:
					cur.WriteByte(s[i])
				}
			}
			if i >= len(s) {
				return nil, fmt.Errorf("unterminated double quote")
			}
		case c == '$':
			in = true
			v, n := expandAt(s, i, env)
			cur.WriteString(v)
			i += n - 1
		default:
			in = true
			cur.WriteByte(c)
		}
	}
	if in {
		words = append(words, cur.String())
	}
	return words, nil
}

// expand replaces $VAR and ${VAR} in s; \$ is a literal dollar.
func expand(s string, env map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && i+1 < len(s) && s[i+1] == '$':
			b.WriteByte('$')
			i++
		case s[i] == '$':
			v, n := expandAt(s, i, env)
			b.WriteString(v)
			i += n - 1
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

// expandAt expands the variable reference at s[i] ('$') and returns its
// value and the length of the reference.
func expandAt(s string, i int, env map[string]string) (string, int) {
	if i+1 >= len(s) {
		return "$", 1
	}
	if s[i+1] == '{' {
		j := strings.IndexByte(s[i+2:], '}')
		if j < 0 {
			return "$", 1
		}
		name := s[i+2 : i+2+j]
		if n, def, ok := strings.Cut(name, ":-"); ok {
			if v := env[n]; v != "" {
				return v, j + 3
			}
			return def, j + 3
		}
		return env[name], j + 3
	}
	j := i + 1
	for j < len(s) && (s[j] == '_' || s[j] >= 'A' && s[j] <= 'Z' || s[j] >= 'a' && s[j] <= 'z' || j > i+1 && s[j] >= '0' && s[j] <= '9') {
		j++
	}
	if j == i+1 {
		return "$", 1
	}
	return env[s[i+1:j]], j - i
}

// sortedEnv renders env as sorted K=V lines (for hashing).
func sortedEnv(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
