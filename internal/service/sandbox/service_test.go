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
	"github.com/airlockhq/airlock/internal/errdefs"
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
