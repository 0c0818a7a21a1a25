package exec_test

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/service/exec"
)

// TestSlowSecretMasked prints a secret with adversarial timings through the
// real agent and the exec tracker's own timers: whatever the pauses between
// its bytes, no form of it reaches the exec's result, its event stream or
// its stored record, and the record is the whole output masked as one text.
// On the code before the fix, a held prefix went out in plain after 20 ms
// (2 s for four bytes or more), and the rest of the secret after it was no
// longer recognised: every case here printed the secret in plain.
func TestSlowSecretMasked(t *testing.T) {
	e0 := newEnv(t)
	m, x, st := e0.Sandboxes, e0.Execs, e0.Store
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel) // the cases run in parallel, after this function returns
	p := auth.Principal{Tenant: "acme"}
	const (
		long  = "Zq9-sEcReT-77vX"
		short = "Qw3-rT"
	)
	res, err := m.Create(ctx, p, api.CreateSandboxRequest{Secrets: map[string]string{"TOKEN": long, "SHORT": short}}, "")
	if err != nil {
		t.Fatal(err)
	}
	id := res.Sandbox.ID
	t.Cleanup(func() { m.Delete(context.Background(), p, id) })

	// slowly prints the characters of stdin one by one, pause s apart.
	slowly := func(pause string) string {
		return `fold -w1 | while IFS= read -r c; do printf %s "$c"; sleep ` + pause + `; done`
	}
	b64 := base64.StdEncoding.EncodeToString([]byte(long))
	tests := []struct {
		name, shell  string
		stdout       string // after masking
		stderr       string
		pty          bool
		plainForbids []string
	}{
		{name: "OneBytePer30ms", shell: `printf '%s\n' "$TOKEN" | ` + slowly("0.03"),
			stdout: stars(long)},
		{name: "OneBytePerSecond", shell: `printf '%s\n' "$SHORT" | ` + slowly("1"),
			stdout: stars(short)},
		{name: "InterleavedStderr", shell: `printf '%s\n' "$TOKEN" | fold -w1 | while IFS= read -r c; do printf %s "$c"; printf . >&2; sleep 0.03; done`,
			stdout: stars(long), stderr: strings.Repeat(".", len(long))},
		{name: "PauseLongerThanAnyHold", shell: `printf %s "$TOKEN" | head -c 6; sleep 3; printf %s "$TOKEN" | tail -c +7`,
			stdout: stars(long)},
		{name: "Base64Slowly", shell: `printf %s "$TOKEN" | base64 | ` + slowly("0.03"),
			stdout: stars(b64), plainForbids: []string{b64}},
		{name: "PromptIsKeptInTheRecord", shell: `printf 'Zq'; sleep 0.3; printf 'ok\n'`,
			stdout: "Zqok\n"},
		{name: "PTY", shell: `printf '%s\n' "$TOKEN" | ` + slowly("0.03"), pty: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			shell := tc.shell
			e, err := x.Exec(ctx, p, id, api.ExecRequest{Shell: &shell, PTY: tc.pty}, exec.Options{})
			if err != nil {
				t.Fatal(err)
			}
			// The event stream as a client follows it live (SSE, PTY,
			// E2B process streams all read it).
			var live strings.Builder
			sub := e.Subscribe(0)
			for {
				ev, ok, err := sub.Next(ctx, time.Minute)
				if err != nil {
					break
				}
				if ok && ev.Type == agentproto.EventOutput {
					live.Write(ev.Data)
				}
			}
			r, err := e.Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			forbid := append([]string{long, short, long[:4], short[:4]}, tc.plainForbids...)
			check := func(where, got string) {
				t.Helper()
				for _, f := range forbid {
					if strings.Contains(got, f) {
						t.Errorf("%s holds %q in plain: %q", where, f, got)
					}
				}
			}
			check("live stream", live.String())
			if r.Stdout == nil || r.Stderr == nil {
				t.Fatalf("result without output: %+v", r)
			}
			check("result stdout", *r.Stdout)
			check("result stderr", *r.Stderr)
			if tc.pty {
				if !strings.Contains(*r.Stdout, stars(long)) {
					t.Errorf("pty output %q does not hold the masked secret", *r.Stdout)
				}
			} else if *r.Stdout != tc.stdout || *r.Stderr != tc.stderr {
				t.Errorf("result stdout %q stderr %q, want %q and %q", *r.Stdout, *r.Stderr, tc.stdout, tc.stderr)
			}
			// The stored record, once written.
			deadline := time.Now().Add(10 * time.Second)
			for {
				rec, err := st.GetExec(ctx, id, e.ID())
				if err == nil && rec.EndedAt != nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("record never finished: %v", err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			blob, err := st.ExecOutput(ctx, e.ID())
			if err != nil {
				t.Fatal(err)
			}
			stored := storedOutput(t, blob)
			check("stored stdout", stored[agentproto.StreamStdout]+stored[agentproto.StreamPTY])
			check("stored stderr", stored[agentproto.StreamStderr])
			if !tc.pty && (stored[agentproto.StreamStdout] != tc.stdout || stored[agentproto.StreamStderr] != tc.stderr) {
				t.Errorf("stored record %q, want stdout %q and stderr %q", stored, tc.stdout, tc.stderr)
			}
		})
	}
}

func stars(s string) string { return strings.Repeat("*", len(s)) }

// storedOutput decodes an exec's stored output (per event: a stream byte,
// a uvarint offset, a uvarint length and the bytes) into each stream's
// text, checking that the events are contiguous.
func storedOutput(t *testing.T, b []byte) map[string]string {
	t.Helper()
	names := map[byte]string{1: agentproto.StreamStdout, 2: agentproto.StreamStderr, 3: agentproto.StreamPTY}
	out := map[string]string{}
	next := uint64(0)
	for len(b) > 0 {
		name, ok := names[b[0]]
		off, k := binary.Uvarint(b[1:])
		if !ok || k <= 0 {
			t.Fatalf("bad stored output at %q", b)
		}
		b = b[1+k:]
		l, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < l || off != next {
			t.Fatalf("bad stored event at offset %d (want %d)", off, next)
		}
		out[name] += string(b[k : k+int(l)])
		b, next = b[k+int(l):], off+l
	}
	return out
}
