package sandbox

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/redact"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestTransitions(t *testing.T) {
	states := []string{api.StateStarting, api.StateRunning, api.StatePaused, api.StateStopping, api.StateStopped, api.StateError}
	legal := map[string]bool{
		"starting→running": true, "starting→stopping": true, "starting→error": true,
		"running→paused": true, "running→stopping": true, "running→error": true,
		"paused→running": true, "paused→stopping": true, "paused→error": true,
		"stopping→stopped": true, "stopping→error": true,
		"error→stopping": true, "error→stopped": true,
	}
	for _, from := range states {
		for _, to := range states {
			if from == to {
				continue
			}
			name := from + "→" + to
			t.Run(strings.ReplaceAll(name, "→", "_to_"), func(t *testing.T) {
				err := checkTransition(from, to)
				if legal[name] && err != nil {
					t.Fatalf("legal move refused: %v", err)
				}
				if !legal[name] && (!errors.Is(err, errIllegalTransition) || !errors.Is(err, errdefs.ErrInternal)) {
					t.Fatalf("illegal move allowed or misclassified: %v", err)
				}
			})
		}
	}
	if err := checkTransition("bogus", api.StateRunning); err == nil {
		t.Fatal("unknown state allowed")
	}
}

func TestSealer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "d", "secrets.key")
	s, err := loadSealer(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 || st.Size() != 32 {
		t.Fatalf("key file %v %v", st, err)
	}
	sealed, err := s.seal("sbx_1", map[string]string{"K": "v4lue"})
	if err != nil || bytes.Contains(sealed, []byte("v4lue")) {
		t.Fatalf("sealed %q, %v", sealed, err)
	}
	s2, err := loadSealer(path) // a restarted daemon
	if err != nil {
		t.Fatal(err)
	}
	got, err := s2.open("sbx_1", sealed)
	if err != nil || got["K"] != "v4lue" {
		t.Fatalf("open: %v, %v", got, err)
	}
	if _, err := s2.open("sbx_2", sealed); err == nil {
		t.Fatal("sealed secrets opened for another sandbox")
	}
	if none, err := s.seal("sbx_1", nil); none != nil || err != nil {
		t.Fatal("no secrets must seal to nil")
	}
}

func TestEventsEncoding(t *testing.T) {
	in := []redact.Chunk{{Stream: "stdout", Off: 0, Data: []byte("abc")}, {Stream: "stderr", Off: 3, Data: []byte{0xff, 0}}, {Stream: "pty", Off: 5, Data: []byte(strings.Repeat("x", 300))}}
	out, err := decodeEvents(encodeEvents(in))
	if err != nil || len(out) != 3 {
		t.Fatalf("decode: %v %v", out, err)
	}
	for i := range in {
		if out[i].Stream != in[i].Stream || out[i].Off != in[i].Off || !bytes.Equal(out[i].Data, in[i].Data) {
			t.Fatalf("event %d: %+v != %+v", i, out[i], in[i])
		}
	}
	for _, bad := range [][]byte{{9}, {1, 0x80}, {1, 0, 5, 'a'}} {
		if _, err := decodeEvents(bad); err == nil {
			t.Errorf("decoded corrupt %v", bad)
		}
	}
}

func testManager(t *testing.T) *Service {
	t.Helper()
	s := config.Default()
	s.DataDir = t.TempDir()
	sl, err := loadSealer(filepath.Join(s.DataDir, "k"))
	if err != nil {
		t.Fatal(err)
	}
	return &Service{settings: s, sealer: sl}
}

func TestValidateExec(t *testing.T) {
	m := testManager(t)
	neg, big, zero, frac := -1.0, 1e12, int64(0), 0.0004
	huge := int64(1 << 40)
	tests := []struct {
		name string
		req  api.ExecRequest
		ok   bool
	}{
		{"argv", api.ExecRequest{Cmd: []string{"ls", "-l"}}, true},
		{"shell", api.ExecRequest{Shell: ptr("ls | wc")}, true},
		{"both", api.ExecRequest{Cmd: []string{"ls"}, Shell: ptr("ls")}, false},
		{"neither", api.ExecRequest{}, false},
		{"empty-shell", api.ExecRequest{Shell: ptr("  ")}, false},
		{"empty-argv0", api.ExecRequest{Cmd: []string{""}}, false},
		{"nul-arg", api.ExecRequest{Cmd: []string{"a\x00b"}}, false},
		{"relative-cwd", api.ExecRequest{Cmd: []string{"ls"}, Cwd: "x"}, false},
		{"bad-user", api.ExecRequest{Cmd: []string{"ls"}, User: "Root"}, false},
		{"root-user", api.ExecRequest{Cmd: []string{"ls"}, User: "root"}, true},
		{"bad-env", api.ExecRequest{Cmd: []string{"ls"}, Env: map[string]string{"A=B": "x"}}, false},
		{"reserved-env", api.ExecRequest{Cmd: []string{"ls"}, Env: map[string]string{agentproto.ExecIDEnv: "x"}}, false},
		{"negative-timeout", api.ExecRequest{Cmd: []string{"ls"}, TimeoutS: &neg}, false},
		{"huge-timeout", api.ExecRequest{Cmd: []string{"ls"}, TimeoutS: &big}, false},
		{"tiny-timeout", api.ExecRequest{Cmd: []string{"ls"}, TimeoutS: &frac}, true},
		{"zero-output", api.ExecRequest{Cmd: []string{"ls"}, MaxOutputBytes: &zero}, false},
		{"huge-output", api.ExecRequest{Cmd: []string{"ls"}, MaxOutputBytes: &huge}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := m.validateExec(tt.req)
			if tt.ok != (err == nil) {
				t.Fatalf("err = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !errdefs.IsInvalidArgument(err) {
				t.Fatalf("err %v is not invalid argument", err)
			}
			if err == nil && (a.User != tt.req.User || a.MaxOutputBytes != agentproto.DefaultMaxOutputBytes) {
				// An empty user stays empty: Exec fills in the sandbox's
				// default (its template's USER).
				t.Fatalf("defaults not applied: %+v", a)
			}
			if tt.name == "tiny-timeout" && a.TimeoutMS != 1 {
				t.Fatalf("a positive timeout rounded to %d ms", a.TimeoutMS)
			}
		})
	}
}

func TestParseTemplateRef(t *testing.T) {
	tests := []struct {
		in      string
		name    string
		version int
		ok      bool
	}{
		{"base", "base", 0, true}, {"python@2", "python", 2, true}, {"my-env.v1", "my-env.v1", 0, true},
		{"base@0", "", 0, false}, {"Base", "", 0, false}, {"../x", "", 0, false}, {"a@b", "", 0, false}, {"", "", 0, false},
	}
	for _, tt := range tests {
		t.Run(strings.NewReplacer("/", "_", "@", "_at_").Replace(tt.in)+"_", func(t *testing.T) {
			n, v, err := parseTemplateRef(tt.in)
			if tt.ok != (err == nil) || n != tt.name || v != tt.version {
				t.Fatalf("got %q %d %v", n, v, err)
			}
		})
	}
}

func TestRequestHashIgnoresSecretValues(t *testing.T) {
	a := api.CreateSandboxRequest{Secrets: map[string]string{"K": "one"}}
	b := api.CreateSandboxRequest{Secrets: map[string]string{"K": "two"}}
	c := api.CreateSandboxRequest{Secrets: map[string]string{"L": "one"}}
	if requestHash(a) != requestHash(b) || requestHash(a) == requestHash(c) {
		t.Fatal("hash must depend on secret names only")
	}
	if strings.Contains(requestHash(a), "one") {
		t.Fatal("hash holds a secret")
	}
}

func ptr(s string) *string { return &s }
