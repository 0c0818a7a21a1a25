package e2b

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// tokenKeyLen is the size of a token key: 256 bits, like the HMAC's hash.
const tokenKeyLen = 32

// LoadOrCreateKey returns the token key stored at path, creating it (mode
// 0600, 32 random bytes) on first use, so that the access tokens issued to
// sandboxes stay valid across daemon restarts.
func LoadOrCreateKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	switch {
	case err == nil && len(b) >= tokenKeyLen:
		return b, nil
	case err == nil:
		return nil, fmt.Errorf("e2b token key %s is shorter than %d bytes", path, tokenKeyLen)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("reading e2b token key: %w", err)
	}
	b = make([]byte, tokenKeyLen)
	rand.Read(b)
	// Written aside and linked into place: two daemons racing (or a crash
	// half-way) never leave a short key, and the loser reads the winner's.
	tmp, err := os.CreateTemp(filepath.Dir(path), ".e2b-token-key-")
	if err != nil {
		return nil, fmt.Errorf("creating e2b token key: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("writing e2b token key: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("writing e2b token key: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return LoadOrCreateKey(path)
		}
		return nil, fmt.Errorf("storing e2b token key: %w", err)
	}
	return b, nil
}
