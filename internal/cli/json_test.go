package cli

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/api"
)

// jsonCase is how the -o json walk runs one command against the fake API.
type jsonCase struct {
	args  []string // after the command's path
	stdin string
	// fails says the command is expected to fail with a JSON error (on
	// stderr, nothing on stdout) rather than print JSON on stdout.
	fails bool
}

// jsonCases holds every command of the tree. A command missing here fails
// TestEveryCommandHonoursJSONOutput: a new command must say how it
// honours -o json.
func jsonCases(t *testing.T) map[string]jsonCase {
	dir := t.TempDir()
	local := filepath.Join(dir, "local.txt")
	if err := os.WriteFile(local, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	return map[string]jsonCase{
		"airlock":                       {},
		"airlock audit":                 {},
		"airlock code":                  {args: []string{"sbx_1", "1+1"}},
		"airlock completion":            {}, // a group: its help
		"airlock completion bash":       {fails: true},
		"airlock completion fish":       {fails: true},
		"airlock completion zsh":        {fails: true},
		"airlock completion powershell": {fails: true},
		"airlock cp":                    {args: []string{local, "sbx_1:/tmp/x.txt"}},
		"airlock doctor":                {args: []string{"--no-server"}},
		"airlock exec":                  {args: []string{"sbx_1", "--", "echo", "hi"}},
		"airlock fork":                  {args: []string{"sbx_1"}, fails: true}, // the fake API has no snapshots
		"airlock reset":                 {args: []string{"sbx_1"}, fails: true},
		"airlock snapshot":              {},
		"airlock snapshot create":       {args: []string{"sbx_1"}, fails: true},
		"airlock snapshot info":         {args: []string{"snap_1"}, fails: true},
		"airlock snapshot ls":           {fails: true},
		"airlock snapshot rm":           {args: []string{"snap_1"}, fails: true},
		"airlock help":                  {args: []string{"sandbox", "create"}},
		"airlock keys":                  {},
		"airlock keys create":           {args: []string{"--tenant", "acme"}},
		"airlock keys ls":               {},
		"airlock keys rm":               {args: []string{"key_1"}},
		"airlock pool":                  {},
		"airlock pool delete":           {args: []string{"warm"}, fails: true}, // the fake API has no pools: pool_test.go
		"airlock pool get":              {args: []string{"warm"}, fails: true},
		"airlock pool list":             {fails: true},
		"airlock pool put":              {args: []string{"warm", "--template", "base"}, fails: true},
		"airlock preview":               {},
		"airlock preview close":         {args: []string{"sbx_1", "8080"}},
		"airlock preview ls":            {args: []string{"sbx_1"}},
		"airlock preview open":          {args: []string{"sbx_1", "8080"}},
		"airlock quota":                 {},
		"airlock quota get":             {args: []string{"acme"}},
		"airlock quota reset":           {args: []string{"acme"}},
		"airlock quota set":             {args: []string{"acme", "--sandboxes", "3"}},
		"airlock run":                   {args: []string{"--", "echo", "hi"}},
		"airlock sandbox":               {},
		"airlock sandbox create":        {args: []string{"--ttl", "10m", "--secret", "K=V"}},
		"airlock sandbox info":          {args: []string{"sbx_1"}},
		"airlock sandbox keepalive":     {args: []string{"sbx_1"}},
		"airlock sandbox ls":            {},
		"airlock sandbox metrics":       {args: []string{"sbx_1"}},
		"airlock sandbox network":       {args: []string{"sbx_1", "--network", "none"}},
		"airlock sandbox pause":         {args: []string{"sbx_1"}},
		"airlock sandbox resume":        {args: []string{"sbx_1"}},
		"airlock sandbox rm":            {args: []string{"sbx_1"}},
		"airlock sandbox timeout":       {args: []string{"sbx_1", "10m"}},
		"airlock shell":                 {args: []string{"sbx_1"}, fails: true}, // a terminal
		"airlock template":              {},
		"airlock template build":        {args: []string{"-f", "-", "--name", "mine"}, stdin: "FROM base\n"},
		"airlock template import":       {args: []string{"mine", local}},
		"airlock template info":         {args: []string{"base"}},
		"airlock template logs":         {args: []string{"bld_1"}},
		"airlock template ls":           {},
		"airlock template rm":           {args: []string{"base"}},
		"airlock top":                   {},
		"airlock usage":                 {},
		"airlock version":               {},
		"airlock whoami":                {},
		"airlock mcp":                   {stdin: `{"jsonrpc":"2.0","id":1,"method":"ping"}` + "\n"}, // MCP's JSON-RPC on stdout
	}
}

// jsonValues decodes s as one or more JSON values (JSON lines count), and
// fails on anything else, or nothing.
func jsonValues(s string) ([]any, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	var out []any
	for {
		var v any
		err := dec.Decode(&v)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, errors.New("no JSON at all")
	}
	return out, nil
}

// checkJSONError asserts that stderr is exactly one JSON error object.
func checkJSONError(t *testing.T, stderr string) jsonError {
	t.Helper()
	var e jsonError
	dec := json.NewDecoder(strings.NewReader(stderr))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
		t.Errorf("stderr is not a JSON error: %v: %q", err, stderr)
	}
	if dec.More() || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Errorf("stderr has more than one JSON line: %q", stderr)
	}
	return e
}

// walk returns every command of the tree, the root first.
func walk(c *cobra.Command) []*cobra.Command {
	out := []*cobra.Command{c}
	for _, sub := range c.Commands() {
		out = append(out, walk(sub)...)
	}
	return out
}

// TestEveryCommandHonoursJSONOutput walks the command tree and runs every
// command with -o json against the fake API: each prints JSON on stdout
// (one value, or JSON lines), or fails with one JSON error on stderr and
// nothing on stdout. Each also fails with a JSON error for a bad flag.
func TestEveryCommandHonoursJSONOutput(t *testing.T) {
	cases := jsonCases(t)
	var paths []string
	for _, c := range walk((&app{}).newRoot()) {
		paths = append(paths, c.CommandPath())
	}
	paths = append(paths, "airlock help") // cobra adds it when it runs
	for _, p := range paths {
		if _, ok := cases[p]; !ok {
			t.Errorf("%q is not in jsonCases: add how it honours -o json", p)
		}
	}
	for p := range cases {
		if !slices.Contains(paths, p) {
			t.Errorf("jsonCases has %q, which is no command", p)
		}
	}
	for _, p := range paths {
		tc := cases[p]
		words := strings.Fields(p)[1:]
		t.Run(strings.Join(append([]string{"airlock"}, words...), "_"), func(t *testing.T) {
			f, srv := newFakeAPI(t)
			f.addSandbox("sbx_1")
			f.builds["tpl"] = &fakeBuild{id: "bld_1", log: "step 1/1\n", done: true}
			args := append(append([]string{"-o", "json"}, words...), tc.args...)
			r := (&cliRun{stdin: tc.stdin, sys: fakeSys{}}).run(t, srv.URL, args...)
			if tc.fails {
				if r.code == 0 {
					t.Errorf("exit 0, want a failure; stdout %q", r.stdout)
				}
				checkJSONError(t, r.stderr)
				if r.stdout != "" {
					t.Errorf("a failed command printed %q on stdout", r.stdout)
				}
				return
			}
			if r.code != 0 {
				t.Fatalf("exit %d; stderr %q", r.code, r.stderr)
			}
			if _, err := jsonValues(r.stdout); err != nil {
				t.Errorf("stdout is not JSON: %v\n%s", err, r.stdout)
			}
			if strings.HasPrefix(r.stderr, "airlock: ") {
				t.Errorf("stderr has a text error line: %q", r.stderr)
			}
		})
		t.Run(strings.Join(append([]string{"airlock"}, words...), "_")+"/bad_flag", func(t *testing.T) {
			_, srv := newFakeAPI(t)
			r := runCLI(t, srv.URL, append(append([]string{"-o", "json"}, words...), "--no-such-flag")...)
			if r.code == 0 || r.stdout != "" {
				t.Errorf("exit %d stdout %q, want a failure and nothing on stdout", r.code, r.stdout)
			}
			if e := checkJSONError(t, r.stderr); e.Error.Code != "usage" {
				t.Errorf("code %q, want usage", e.Error.Code)
			}
		})
	}
}

// TestJSONErrorCarriesTheAPIError: with -o json an API error is the API's
// error body (code, message, request id, sandbox), and a usage error found
// before -o json was parsed is JSON too.
func TestJSONErrorCarriesTheAPIError(t *testing.T) {
	_, srv := newFakeAPI(t)
	r := runCLI(t, srv.URL, "sandbox", "info", "sbx_nope", "-o", "json")
	e := checkJSONError(t, r.stderr)
	if r.code != 1 || r.stdout != "" || e.Error.Code != api.CodeSandboxNotFound || e.Error.Status != 404 ||
		e.Error.RequestID != "req_t" || e.Error.SandboxID != "sbx_nope" || e.Error.Message != "sandbox not found" {
		t.Errorf("exit %d stdout %q error %+v", r.code, r.stdout, e)
	}
	r = runCLI(t, srv.URL, "exec", "--bogus", "-o", "json", "sbx_1", "--", "true")
	if e := checkJSONError(t, r.stderr); r.code != exitAirlock || e.Error.Code != "usage" {
		t.Errorf("exec with a bad flag: exit %d %+v", r.code, e)
	}
	// Without -o json, the one text line as before.
	r = runCLI(t, srv.URL, "sandbox", "info", "sbx_nope")
	if r.stderr != "airlock: sandbox not found (sandbox_not_found)\n" {
		t.Errorf("text error %q", r.stderr)
	}
	// A command's own failure in JSON: exec's result is printed, and the
	// exit status is the command's, with no text on stderr.
	f, srv := newFakeAPI(t)
	f.addSandbox("sbx_1")
	r = runCLI(t, srv.URL, "-o", "json", "exec", "sbx_1", "--", "timeout")
	var res api.ExecResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.Status != api.ExecTimeout || r.code != exitTimeout || r.stderr != "" {
		t.Errorf("exec timeout -o json: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestRmJSONReportsEach: rm of several sandboxes or templates says, in
// JSON, which went and which did not (and why), and exits 1 when one did
// not.
func TestRmJSONReportsEach(t *testing.T) {
	f, srv := newFakeAPI(t)
	f.addSandbox("sbx_a")
	r := runCLI(t, srv.URL, "-o", "json", "sandbox", "rm", "sbx_a", "sbx_b")
	var d deleted
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil || r.code != 0 || !slices.Equal(d.Deleted, []string{"sbx_a", "sbx_b"}) {
		t.Errorf("sandbox rm: %d %q %v", r.code, r.stdout, err)
	}
	r = runCLI(t, srv.URL, "-o", "json", "template", "rm", "base", "nope")
	var out struct {
		Deleted []string `json:"deleted"`
		Failed  []struct {
			ID    string `json:"id"`
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		} `json:"failed"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || r.code != 1 || !slices.Equal(out.Deleted, []string{"base"}) ||
		len(out.Failed) != 1 || out.Failed[0].ID != "nope" || out.Failed[0].Error.Code != api.CodeTemplateNotFound || r.stderr != "" {
		t.Errorf("template rm: %d stdout %q stderr %q %v", r.code, r.stdout, r.stderr, err)
	}
}

// TestHelpJSON: help, --help and a group command without a subcommand
// describe the command as JSON under -o json.
func TestHelpJSON(t *testing.T) {
	_, srv := newFakeAPI(t)
	for _, args := range [][]string{
		{"-o", "json", "help", "sandbox"},
		{"-o", "json", "sandbox", "--help"},
		{"-o", "json", "sandbox"},
	} {
		r := runCLI(t, srv.URL, args...)
		var d cmdDoc
		if err := json.Unmarshal([]byte(r.stdout), &d); err != nil || r.code != 0 || d.Command != "airlock sandbox" {
			t.Errorf("%v: exit %d %q %v", args, r.code, r.stdout, err)
			continue
		}
		var subs []string
		for _, s := range d.Subcommands {
			subs = append(subs, s.Name)
		}
		if !slices.Contains(subs, "create") || !slices.Contains(subs, "rm") {
			t.Errorf("%v: subcommands %v", args, subs)
		}
	}
	r := runCLI(t, srv.URL, "-o", "json", "help", "sandbox", "create")
	var d cmdDoc
	json.Unmarshal([]byte(r.stdout), &d)
	var flags []string
	for _, fl := range d.Flags {
		flags = append(flags, fl.Name)
	}
	if !slices.Contains(flags, "ttl") || !slices.Contains(flags, "secret") || slices.Contains(flags, "timeout") || !slices.Contains(flags, "output") {
		t.Errorf("create's flags %v: want ttl, secret, the inherited output, and not the deprecated timeout", flags)
	}
	r = runCLI(t, srv.URL, "-o", "json", "help", "frobnicate")
	if e := checkJSONError(t, r.stderr); r.code != 1 || e.Error.Code != "usage" {
		t.Errorf("help of an unknown command: %d %+v", r.code, e)
	}
	// Text help is unchanged without -o json.
	r = runCLI(t, srv.URL, "help", "sandbox")
	if r.code != 0 || !strings.Contains(r.stdout, "Usage:") {
		t.Errorf("text help: %q", r.stdout)
	}
}

// TestDoctorJSONFailure: a failed doctor prints its checks as JSON and its
// verdict as a JSON error, exit 1; the text verdict is unchanged.
func TestDoctorJSONFailure(t *testing.T) {
	sys := fakeSys{missing: map[string]bool{"runc": true}}
	r := (&cliRun{sys: sys}).run(t, "http://127.0.0.1:1", "-o", "json", "doctor", "--no-server")
	var checks []check
	if err := json.Unmarshal([]byte(r.stdout), &checks); err != nil || r.code != 1 {
		t.Fatalf("exit %d stdout %q: %v", r.code, r.stdout, err)
	}
	if e := checkJSONError(t, r.stderr); e.Error.Code != "doctor" || e.Error.Message != "1 required check(s) failed" {
		t.Errorf("verdict %+v", e)
	}
	r = (&cliRun{sys: sys}).run(t, "http://127.0.0.1:1", "doctor", "--no-server")
	if r.code != 1 || r.stderr != "airlock: 1 required check(s) failed (doctor)\n" {
		t.Errorf("text verdict: exit %d %q", r.code, r.stderr)
	}
}
