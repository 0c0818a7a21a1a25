package sandbox

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// sealer encrypts sandbox secrets at rest (AES-256-GCM) with a key kept in a
// file of the data dir, readable by root only. The store holds only sealed
// secrets, so a copy of the database alone reveals none; a restarted daemon
// unseals them to keep injecting them into the execs of re-adopted sandboxes.
// Each sealed value is bound to its sandbox id (GCM additional data), so it
// cannot be moved to another sandbox's row.
type sealer struct {
	aead cipher.AEAD
}

// loadSealer reads the key at path, creating it (0600) on first use.
func loadSealer(path string) (*sealer, error) {
	key, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key = make([]byte, 32)
		rand.Read(key)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("secrets key: %w", err)
		}
		// O_EXCL: two daemons starting on one data dir must not both write
		// a key; the loser reads the winner's.
		f, ferr := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if ferr == nil {
			_, werr := f.Write(key)
			cerr := f.Close()
			if werr != nil || cerr != nil {
				os.Remove(path)
				return nil, fmt.Errorf("writing secrets key: %w", errors.Join(werr, cerr))
			}
		} else if errors.Is(ferr, fs.ErrExist) {
			return loadSealer(path)
		} else {
			return nil, fmt.Errorf("creating secrets key: %w", ferr)
		}
	} else if err != nil {
		return nil, fmt.Errorf("reading secrets key: %w", err)
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("secrets key %s: want 32 bytes, have %d", path, len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	return &sealer{aead: aead}, nil
}

// seal encrypts secrets for sandbox id; nil when there are none.
func (s *sealer) seal(id string, secrets map[string]string) ([]byte, error) {
	if len(secrets) == 0 {
		return nil, nil
	}
	plain, err := json.Marshal(secrets)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, s.aead.NonceSize())
	rand.Read(nonce)
	out := s.aead.Seal(nonce, nonce, plain, []byte(id))
	clear(plain)
	return out, nil
}

// open decrypts what seal produced for sandbox id.
func (s *sealer) open(id string, sealed []byte) (map[string]string, error) {
	if len(sealed) == 0 {
		return nil, nil
	}
	n := s.aead.NonceSize()
	if len(sealed) < n {
		return nil, errors.New("sealed secrets too short")
	}
	plain, err := s.aead.Open(nil, sealed[:n], sealed[n:], []byte(id))
	if err != nil {
		return nil, fmt.Errorf("unsealing secrets: %w", err)
	}
	var m map[string]string
	err = json.Unmarshal(plain, &m)
	clear(plain)
	return m, err
}
