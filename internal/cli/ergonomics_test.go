package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWhoami(t *testing.T) {
	_, srv := newFakeAPI(t)
	r := runCLI(t, srv.URL, "whoami")
	for _, want := range []string{"server:", srv.URL, "tenant:", "t1", "key:", "key_1", "name:", "ci", "admin:", "no", "key from:", "$AIRLOCK_API_KEY"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("whoami lacks %q:\n%s", want, r.stdout)
		}
	}
	if r.code != 0 || strings.Contains(r.stdout, "ak_good") {
		t.Errorf("exit %d; the key's secret must never be printed:\n%s", r.code, r.stdout)
	}
	home := t.TempDir()
	os.MkdirAll(filepath.Join(home, ".config", "airlock"), 0o700)
	os.WriteFile(filepath.Join(home, ".config", "airlock", "key"), []byte("ak_good\n"), 0o600)
	r = (&cliRun{env: map[string]string{"AIRLOCK_API_KEY": ""}, home: home}).run(t, srv.URL, "-o", "json", "whoami")
	var got map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || r.code != 0 {
		t.Fatalf("json: %v %q %q", err, r.stdout, r.stderr)
	}
	if got["tenant"] != "t1" || got["key_id"] != "key_1" || got["admin"] != false || got["url"] != srv.URL ||
		got["key_source"] != filepath.Join(home, ".config", "airlock", "key") {
		t.Errorf("whoami json %v", got)
	}
	r = (&cliRun{env: map[string]string{"AIRLOCK_API_KEY": "ak_bad"}}).run(t, srv.URL, "whoami")
	if r.code != 1 || !strings.Contains(r.stderr, "(unauthenticated)") {
		t.Errorf("a bad key: %d %q", r.code, r.stderr)
	}
}

func TestCreateSecretsEnvAndTTL(t *testing.T) {
	f, srv := newFakeAPI(t)
	r := (&cliRun{env: map[string]string{"OPENAI_API_KEY": "sk-from-env"}}).run(t, srv.URL,
		"sandbox", "create", "--ttl", "10m", "--secret", "TOKEN=t=1", "--secret", "OPENAI_API_KEY", "-e", "MODE=test", "--env", "B=2")
	if r.code != 0 {
		t.Fatalf("create: %d %q", r.code, r.stderr)
	}
	f.mu.Lock()
	c := f.created[0]
	f.mu.Unlock()
	if c.TimeoutS == nil || *c.TimeoutS != 600 || c.Secrets["TOKEN"] != "t=1" || c.Secrets["OPENAI_API_KEY"] != "sk-from-env" ||
		c.Env["MODE"] != "test" || c.Env["B"] != "2" || len(c.Env) != 2 {
		t.Errorf("create request %+v", c)
	}
	if r.stderr != "" {
		t.Errorf("stderr %q", r.stderr)
	}

	// run takes the same sandbox flags; its --timeout is the command's.
	r = (&cliRun{env: map[string]string{"GH_TOKEN": "ghp"}}).run(t, srv.URL,
		"run", "--secret", "GH_TOKEN", "-e", "K=V", "--ttl", "90", "--timeout", "5", "--", "echo", "x")
	if r.code != 0 || r.stdout != "x\n" {
		t.Fatalf("run: %d %q %q", r.code, r.stdout, r.stderr)
	}
	f.mu.Lock()
	c, e := f.created[1], f.execs[len(f.execs)-1]
	f.mu.Unlock()
	if c.Secrets["GH_TOKEN"] != "ghp" || c.Env["K"] != "V" || c.TimeoutS == nil || *c.TimeoutS != 90 || e.TimeoutS == nil || *e.TimeoutS != 5 {
		t.Errorf("run: create %+v exec timeout %v", c, e.TimeoutS)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sandbox", "create", "--secret", "UNSET_SECRET"}, "--secret UNSET_SECRET: $UNSET_SECRET is not set"},
		{[]string{"sandbox", "create", "--secret", "=v"}, `--secret "=v": want NAME=VALUE or NAME`},
		{[]string{"run", "--secret", "UNSET_SECRET", "--", "echo"}, "$UNSET_SECRET is not set"},
		{[]string{"sandbox", "create", "--ttl", "soon"}, "--ttl"},
		{[]string{"sandbox", "create", "--ttl", "1m", "--timeout", "2m"}, "--timeout is the old name of --ttl"},
	} {
		r := runCLI(t, srv.URL, tc.args...)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) || !strings.Contains(r.stderr, "(usage)") {
			t.Errorf("%v: %d %q, want a usage error with %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	f.mu.Lock()
	n := len(f.created)
	f.mu.Unlock()
	if n != 2 {
		t.Errorf("a refused flag still created a sandbox (%d creates)", n)
	}
}

// TestCreateTimeoutIsDeprecated: sandbox create's old --timeout still sets
// the TTL, with a warning naming --ttl.
func TestCreateTimeoutIsDeprecated(t *testing.T) {
	f, srv := newFakeAPI(t)
	r := runCLI(t, srv.URL, "sandbox", "create", "--timeout", "5m")
	if r.code != 0 || r.stdout != "sbx_new1\n" || !strings.Contains(r.stderr, "--timeout is deprecated: use --ttl") {
		t.Errorf("exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	f.mu.Lock()
	c := f.created[0]
	f.mu.Unlock()
	if c.TimeoutS == nil || *c.TimeoutS != 300 {
		t.Errorf("ttl %v, want 300", c.TimeoutS)
	}
	// The same value under both names is not a conflict.
	if r := runCLI(t, srv.URL, "sandbox", "create", "--timeout", "5m", "--ttl", "5m"); r.code != 0 {
		t.Errorf("same value: %d %q", r.code, r.stderr)
	}
	r = runCLI(t, srv.URL, "sandbox", "create", "--help")
	if strings.Contains(r.stdout, "--timeout") || !strings.Contains(r.stdout, "--ttl") || !strings.Contains(r.stdout, "--secret") {
		t.Errorf("help should show --ttl and --secret, not the deprecated --timeout:\n%s", r.stdout)
	}
}
