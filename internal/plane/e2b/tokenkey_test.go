package e2b_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlockhq/airlock/internal/plane/e2b"
)

func TestLoadOrCreateKey(t *testing.T) {
	p := filepath.Join(t.TempDir(), "e2b-token.key")
	k1, err := e2b.LoadOrCreateKey(p)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || len(k1) != 32 {
		t.Fatalf("key file mode %v, key %d bytes; want 0600 and 32", fi.Mode().Perm(), len(k1))
	}
	k2, err := e2b.LoadOrCreateKey(p)
	if err != nil || !bytes.Equal(k1, k2) {
		t.Fatalf("second load gave another key (%v)", err)
	}
	// Tokens made with the stored key survive a "restart".
	h1 := e2b.New(e2b.Config{TokenKey: k1})
	h2 := e2b.New(e2b.Config{TokenKey: k2})
	if h1.AccessToken("sbx_a") != h2.AccessToken("sbx_a") || h1.AccessToken("sbx_a") == h1.AccessToken("sbx_b") {
		t.Fatal("tokens are not a stable function of the key and the sandbox id")
	}
	os.WriteFile(p, []byte("short"), 0o600)
	if _, err := e2b.LoadOrCreateKey(p); err == nil {
		t.Fatal("a short key file was accepted")
	}
}
