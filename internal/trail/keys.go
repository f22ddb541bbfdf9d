package trail

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/capstan-dev/capstan/internal/broker"
	"golang.org/x/mod/sumdb/note"
)

// The files of a signing key, beside each other: the private key (0600,
// read by the checkpointer only) and the verifier keys of every key that
// ever signed the log, one a line, the newest last (public: what an auditor
// verifies with).
const (
	KeyFile       = "audit.key"
	PublicKeyFile = "audit.pub"
)

// ErrNoKey is returned when a key file does not exist.
var ErrNoKey = errors.New("no audit signing key")

// DefaultOrigin is a log name for a deployment under prefix that names
// none: unique, since two logs must not share one.
func DefaultOrigin(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	if prefix == "" {
		prefix = "CAPSTAN"
	}
	return "capstan/" + strings.ToLower(prefix) + "/" + hex.EncodeToString(b[:])
}

// ValidOrigin reports whether origin can name a log and its key: not empty,
// no spaces, no '+'.
func ValidOrigin(origin string) error {
	if origin == "" || strings.ContainsAny(origin, "+ \t\r\n") || strings.ContainsFunc(origin, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return fmt.Errorf("log name %q: want no spaces or '+', such as audit.example.com/payments", origin)
	}
	return nil
}

// Keygen writes a new signing key named origin to dir/audit.key (0600, never
// over an existing one) and adds its verifier key to dir/audit.pub. It
// returns the verifier key.
func Keygen(dir, origin string) (string, error) {
	if err := ValidOrigin(origin); err != nil {
		return "", err
	}
	path := filepath.Join(dir, KeyFile)
	if _, err := os.Stat(path); err == nil {
		return "", fmt.Errorf("%s exists: rotate it instead", path)
	}
	return writeKey(dir, origin)
}

// Rotate replaces dir/audit.key with a new key of the same log name and
// adds the new verifier key to dir/audit.pub, which keeps the old ones: the
// checkpoints the old key signed still verify. The old private key is
// removed. It returns the new verifier key.
func Rotate(dir string) (string, error) {
	s, _, err := LoadSigner(filepath.Join(dir, KeyFile))
	if err != nil {
		return "", err
	}
	return writeKey(dir, s.Name())
}

func writeKey(dir, origin string) (string, error) {
	skey, vkey, err := note.GenerateKey(rand.Reader, origin)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// The public key first: a signing key whose verifier is not listed would
	// sign checkpoints nobody can check.
	pub := filepath.Join(dir, PublicKeyFile)
	f, err := os.OpenFile(pub, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return "", err
	}
	if err := writeLine(f, vkey); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, ".audit.key-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return "", err
	}
	if err := writeLine(tmp, skey); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, KeyFile)); err != nil {
		return "", err
	}
	return vkey, nil
}

// writeLine writes line and a newline to f and closes it: the first error.
func writeLine(f *os.File, line string) error {
	_, err := f.WriteString(line + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// LoadSigner reads a signing key file. It refuses a file others may read,
// as ssh does, and never puts the key in an error.
func LoadSigner(path string) (note.Signer, string, error) {
	if err := broker.CheckPrivate(path); errors.Is(err, fs.ErrNotExist) {
		return nil, "", fmt.Errorf("%w: %s", ErrNoKey, path)
	} else if err != nil {
		return nil, "", err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, "", err
	}
	s, err := note.NewSigner(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, "", fmt.Errorf("%s: not a signing key (made by 'capstan audit keygen')", path)
	}
	vkey, err := verifierOf(path, s)
	if err != nil {
		return nil, "", err
	}
	return s, vkey, nil
}

// verifierOf finds s's verifier key in the public key file beside its key
// file.
func verifierOf(keyPath string, s note.Signer) (string, error) {
	pub := filepath.Join(filepath.Dir(keyPath), PublicKeyFile)
	keys, err := os.ReadFile(pub)
	if err != nil {
		return "", fmt.Errorf("the signing key's public key file: %w", err)
	}
	for _, line := range strings.Split(string(keys), "\n") {
		v, err := note.NewVerifier(strings.TrimSpace(line))
		if err == nil && v.Name() == s.Name() && v.KeyHash() == s.KeyHash() {
			return strings.TrimSpace(line), nil
		}
	}
	return "", fmt.Errorf("%s does not list the key of %s: checkpoints it signs could not be verified", pub, keyPath)
}

// ParseVerifiers reads verifier keys, one a line ('#' begins a comment).
func ParseVerifiers(text string) (note.Verifiers, []note.Verifier, error) {
	var list []note.Verifier
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		v, err := note.NewVerifier(line)
		if err != nil {
			return nil, nil, fmt.Errorf("line %d: not a verifier key (NAME+HASH+KEY)", i+1)
		}
		list = append(list, v)
	}
	if len(list) == 0 {
		return nil, nil, errors.New("no verifier key")
	}
	return note.VerifierList(list...), list, nil
}

// LoadVerifiers reads a public key file.
func LoadVerifiers(path string) (note.Verifiers, []note.Verifier, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	vs, list, err := ParseVerifiers(string(b))
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return vs, list, nil
}
