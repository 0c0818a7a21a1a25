package httpapi_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/api"
)

// TestSecretsAsFiles: with secrets_as_files the secrets are files of mode
// 0400 holding the values under /run/secrets, on a memory file system the
// driver was asked for, and no exec environment carries them.
func TestSecretsAsFiles(t *testing.T) {
	h := newHarness(t)
	secrets := map[string]string{"API_TOKEN": "file-secret-42", "db_pass": "p@ss\nword"}
	sb := h.create("acme", api.CreateSandboxRequest{Secrets: secrets, SecretsAsFiles: true})
	spec, ok := h.drv.Spec(sb.ID)
	if !ok || !spec.SecretsTmpfs {
		t.Fatalf("driver spec %+v: want SecretsTmpfs", spec)
	}
	for name, want := range secrets {
		t.Run(name, func(t *testing.T) {
			// The fake driver's execs run on the host: look at its root.
			st, err := os.Stat(filepath.Join(h.drv.Root(sb.ID), "run", "secrets", name))
			if err != nil {
				t.Fatalf("secret file: %v", err)
			}
			if st.Mode() != 0o400 {
				t.Errorf("secret file mode %v, want -r--------", st.Mode())
			}
			// Read as the sandbox user, through the files API: the value is
			// masked like exec output, so it cannot leave that way either.
			r := h.req("GET", "/v1/sandboxes/"+sb.ID+"/files?path=/run/secrets/"+name, h.key("acme"), nil)
			if masked := strings.Repeat("*", len(want)); r.StatusCode != http.StatusOK || string(r.body) != masked {
				t.Errorf("download %d %q, want %q", r.StatusCode, r.body, masked)
			}
		})
	}
	t.Run("copied_file_and_tar", func(t *testing.T) {
		// A file with a secret in it, and the directory
		// as a tar, come out masked too.
		r := h.req("PUT", "/v1/sandboxes/"+sb.ID+"/files?path=/home/user/out/copy", h.key("acme"), []byte(secrets["API_TOKEN"]))
		h.expect(r, http.StatusCreated, "")
		r = h.req("GET", "/v1/sandboxes/"+sb.ID+"/files?path=/home/user/out/copy", h.key("acme"), nil)
		if r.StatusCode != http.StatusOK || strings.Contains(string(r.body), secrets["API_TOKEN"]) || len(r.body) != len(secrets["API_TOKEN"]) {
			t.Errorf("copy download %d %q: want the value masked, length kept", r.StatusCode, r.body)
		}
		r = h.req("GET", "/v1/sandboxes/"+sb.ID+"/files?path=/home/user/out", h.key("acme"), nil)
		if r.StatusCode != http.StatusOK || strings.Contains(string(r.body), secrets["API_TOKEN"]) || !strings.Contains(string(r.body), "copy") {
			t.Errorf("tar download %d: want the entry with the value masked", r.StatusCode)
		}
	})
	res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`printf '%s|%s' "$API_TOKEN" "$db_pass"`)})
	if strp(res.Stdout) != "|" {
		t.Errorf("env carries the secrets: %q", strp(res.Stdout))
	}
	t.Run("env_default", func(t *testing.T) {
		sb := h.create("acme", api.CreateSandboxRequest{Secrets: map[string]string{"K": "v"}})
		if spec, _ := h.drv.Spec(sb.ID); spec.SecretsTmpfs {
			t.Errorf("tmpfs asked for without secrets_as_files")
		}
		if res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`echo "$K"`)}); strp(res.Stdout) != "*\n" {
			t.Errorf("stdout %q, want the env secret redacted", strp(res.Stdout))
		}
	})
	t.Run("bad_name", func(t *testing.T) {
		r := h.req("POST", "/v1/sandboxes", h.key("acme"), api.CreateSandboxRequest{Secrets: map[string]string{"a-b": "v"}, SecretsAsFiles: true})
		h.expect(r, http.StatusBadRequest, "")
	})
}

// TestE2ERuncSecretsAsFiles: with a real runc sandbox the secret is a 0400
// file of the sandbox user on a tmpfs (never on disk), readable by that
// user, absent from the environment, and masked in output.
func TestE2ERuncSecretsAsFiles(t *testing.T) {
	e := newE2E(t)
	const value = "e2e-secret-value-7f3a"
	sb := e.h.create("acme", api.CreateSandboxRequest{
		Secrets:        map[string]string{"API_TOKEN": value},
		SecretsAsFiles: true,
	})
	script := `stat -c '%a %U' /run/secrets/API_TOKEN; ` +
		`awk '$2 == "/run/secrets" {print $3}' /proc/mounts; ` +
		`env | grep -c API_TOKEN; ` +
		`[ "$(cat /run/secrets/API_TOKEN)" = "` + value + `" ] && echo readable`
	res := e.h.exec("acme", sb.ID, api.ExecRequest{Shell: &script})
	if res.Stdout == nil {
		t.Fatalf("exec: %+v", res)
	}
	if want := "400 user\ntmpfs\n0\nreadable\n"; *res.Stdout != want {
		t.Errorf("stdout %q, want %q", *res.Stdout, want)
	}
	leak := "cat /run/secrets/API_TOKEN"
	res = e.h.exec("acme", sb.ID, api.ExecRequest{Shell: &leak})
	if res.Stdout == nil || strings.Contains(*res.Stdout, value) {
		t.Errorf("the secret's value reached exec output: %+v", res)
	}
	r := e.h.req("GET", "/v1/sandboxes/"+sb.ID+"/files?path=/run/secrets/API_TOKEN", e.h.key("acme"), nil)
	if r.StatusCode != http.StatusOK || string(r.body) != strings.Repeat("*", len(value)) {
		t.Errorf("download of the secret file: %d %q, want it masked", r.StatusCode, r.body)
	}
}
