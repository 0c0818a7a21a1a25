package exec

import (
	"bytes"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/redact"
)

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

func testEngine(t *testing.T) *Engine {
	t.Helper()
	return NewEngine(EngineConfig{Settings: config.Default()})
}

func TestValidateExec(t *testing.T) {
	m := testEngine(t)
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
			a, err := m.validate(tt.req)
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

func ptr(s string) *string { return &s }
