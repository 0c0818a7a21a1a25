package build

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestParse(t *testing.T) {
	spec := `# syntax is ignored
FROM python@2

ENV A=1 B="two words" C='$A literal' D=$A
ENV OLD form value
WORKDIR /srv/$B_x
WORKDIR app
run apt-get update && \
    # a comment inside a continuation
    apt-get install -y curl
RUN ["/bin/echo", "exec form"]
COPY --chown=user:user src/ lib/*.py /opt/
COPY ["a b", "/dst/"]
COPY $A /one
USER user
`
	s, err := Parse(spec)
	if err != nil {
		t.Fatal(err)
	}
	if s.From.From != "python@2" || s.From.Line != 2 {
		t.Errorf("FROM = %+v", s.From)
	}
	want := []Instruction{
		{Line: 4, Cmd: InstrEnv, Env: [][2]string{{"A", "1"}, {"B", "two words"}, {"C", "$A literal"}, {"D", ""}}},
		{Line: 5, Cmd: InstrEnv, Env: [][2]string{{"OLD", "form value"}}},
		{Line: 6, Cmd: InstrWorkdir, Path: "/srv/"},
		{Line: 7, Cmd: InstrWorkdir, Path: "app"},
		{Line: 8, Cmd: InstrRun, Shell: "apt-get update &&      apt-get install -y curl"},
		{Line: 11, Cmd: InstrRun, Exec: []string{"/bin/echo", "exec form"}},
		{Line: 12, Cmd: InstrCopy, Srcs: []string{"src/", "lib/*.py"}, Dest: "/opt/", Chown: "user:user"},
		{Line: 13, Cmd: InstrCopy, Srcs: []string{"a b"}, Dest: "/dst/"},
		{Line: 14, Cmd: InstrCopy, Srcs: []string{"1"}, Dest: "/one"},
		{Line: 15, Cmd: InstrUser, User: "user"},
	}
	if len(s.Steps) != len(want) {
		t.Fatalf("%d steps, want %d: %+v", len(s.Steps), len(want), s.Steps)
	}
	for i, w := range want {
		got := s.Steps[i]
		got.Raw = ""
		if !reflect.DeepEqual(got, w) {
			t.Errorf("step %d:\n got %+v\nwant %+v", i, got, w)
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, spec string
		line       int
		want       string
	}{
		{"empty", "# only a comment\n\n", 0, "the spec is empty"},
		{"unknown-instruction", "FROM base\nRUN true\nFETCH http://x\n", 3, "FETCH: unknown instruction"},
		{"unknown-first", "BOGUS x\n", 1, "BOGUS: unknown instruction"},
		{"no-from-first", "RUN true\nFROM base\n", 1, "must start with FROM"},
		{"two-froms", "FROM base\nFROM node\n", 2, "only one FROM"},
		{"multi-stage", "FROM base AS build\n", 1, "multi-stage"},
		{"add", "FROM base\nADD x /x\n", 2, "use COPY"},
		{"cmd", "FROM base\nCMD [\"sleep\"]\n", 2, "start_cmd"},
		{"healthcheck", "FROM base\nHEALTHCHECK CMD true\n", 2, "ready_cmd"},
		{"run-empty", "FROM base\nRUN\n", 2, "RUN needs a command"},
		{"run-bad-json", "FROM base\nRUN [\"a\",\n", 2, "JSON array"},
		{"run-flag", "FROM base\nRUN --mount=type=cache true\n", 2, "no flags"},
		{"copy-one-arg", "FROM base\nCOPY x\n", 2, "source and a destination"},
		{"copy-from", "FROM base\nCOPY --from=build /a /b\n", 2, "--from"},
		{"copy-chmod", "FROM base\nCOPY --chmod=755 a /b\n", 2, "--chmod"},
		{"copy-bad-chown", "FROM base\nCOPY --chown=1000 a /b\n", 2, "--chown"},
		{"env-no-value", "FROM base\nENV A\n", 2, "needs a value"},
		{"env-bad-name", "FROM base\nENV 1A=x\n", 2, "not a variable name"},
		{"env-open-quote", "FROM base\nENV A=\"x\n", 2, "unterminated"},
		{"user-group", "FROM base\nUSER user:staff\n", 2, "group is not supported"},
		{"user-number", "FROM base\nUSER 1000\n", 2, "user name"},
		{"workdir-empty", "FROM base\nWORKDIR\n", 2, "needs a directory"},
		{"nul", "FROM base\x00\n", 0, "NUL"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.spec)
			var se *SpecError
			if !errors.As(err, &se) {
				t.Fatalf("got %v, want a SpecError", err)
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%v is not invalid_argument", err)
			}
			if se.Line != tc.line || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %q (line %d), want line %d containing %q", err, se.Line, tc.line, tc.want)
			}
		})
	}
}

func TestExpand(t *testing.T) {
	env := map[string]string{"A": "x", "HOME": "/root"}
	tests := []struct{ in, want string }{
		{"$A", "x"},
		{"${A}y", "xy"},
		{"$Ay", ""},
		{"${B:-dflt}", "dflt"},
		{`\$A`, "$A"},
		{"$HOME/bin", "/root/bin"},
		{"$", "$"},
		{"a$1", "a$1"},
	}
	for _, tc := range tests {
		if got := expand(tc.in, env); got != tc.want {
			t.Errorf("expand(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestParseRef(t *testing.T) {
	tests := []struct {
		ref     string
		name    string
		version int
		ok      bool
	}{
		{"python", "python", 0, true},
		{"python@2", "python", 2, true},
		{"my-env.v2_x@10", "my-env.v2_x", 10, true},
		{"python@0", "", 0, false},
		{"Python", "", 0, false},
		{"../etc", "", 0, false},
		{"a@b", "", 0, false},
	}
	for _, tc := range tests {
		name, v, err := ParseRef(tc.ref)
		if (err == nil) != tc.ok || name != tc.name || v != tc.version {
			t.Errorf("ParseRef(%q) = %q, %d, %v", tc.ref, name, v, err)
		}
	}
}
