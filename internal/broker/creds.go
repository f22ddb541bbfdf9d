package broker

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Credentials are a NATS credentials file read once: a command reads its
// file with ReadCredentials and every use takes this value (the inbox
// prefix, the connection's authentication, the principal a message names)
// instead of reading the file again.
type Credentials struct {
	// Path is the file read.
	Path string
	// Principal is the capstan principal the file's user JWT names, or ""
	// when it names none (a file capstan did not make, or one that does not
	// decode): the server then decides what the connection may do.
	Principal string
	// JWT is the file's user JWT, or "" when the file holds none that
	// decodes as a user's.
	JWT string

	mu      sync.Mutex
	content []byte // as last read
}

// ReadCredentials reads a credentials file once, refusing one that others may
// read (CheckPrivate). A content that names no capstan principal is not an
// error here: the server judges the credentials when a connection presents
// them, and says what it refuses.
func ReadCredentials(path string) (*Credentials, error) {
	if err := CheckPrivate(path); err != nil {
		return nil, fmt.Errorf("capstan: credentials file: %w", err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("capstan: credentials file: %w", err)
	}
	c := &Credentials{Path: path, content: b}
	if name, err := credsName(b); err == nil {
		c.JWT = userJWT(string(b))
		if ValidPrincipal(name) && name != Anonymous {
			c.Principal = name
		}
	}
	return c, nil
}

// option authenticates a connection with the credentials. Until connected
// is called, it uses the content already read; after, each reconnect reads
// the file again, as nats.UserCredentials does, so that credentials
// rewritten in place are taken up. The content last read stays in memory
// while the connection lives: what signs the server's nonce also derives the
// connection's message id key (NewMsgIDs), with the same seed. Errors read
// as nats.UserCredentials's.
func (c *Credentials) option() (opt nats.Option, connected func()) {
	var reread atomic.Bool
	user := func() (string, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if reread.Load() {
			b, err := os.ReadFile(c.Path)
			if err != nil {
				return "", fmt.Errorf("nats: %w", err)
			}
			c.content = b
		}
		return nkeys.ParseDecoratedJWT(c.content)
	}
	sign := func(nonce []byte) ([]byte, error) {
		c.mu.Lock()
		kp, err := nkeys.ParseDecoratedNKey(c.content)
		c.mu.Unlock()
		if err != nil {
			return nil, fmt.Errorf("unable to extract key pair from file %q: %w", c.Path, err)
		}
		defer kp.Wipe()
		return kp.Sign(nonce)
	}
	return nats.UserJWT(user, sign), func() { reread.Store(true) }
}

// credsName reads the user's name from the user JWT of a NATS credentials
// file (the first armored block, or the whole file when it holds the bare
// JWT), in a few lines rather than with a JWT library, whose weight every
// program that connects would carry. The signature is not checked here: the
// server checks it when the connection presents the JWT, and the name only
// chooses the inbox prefix of a connection the server confines to that
// principal's subjects anyway.
func credsName(creds []byte) (string, error) {
	tok := userJWT(string(creds))
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return "", errors.New("no user JWT in it")
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return "", errors.New("its JWT's claims do not decode")
	}
	var claims struct {
		Name string `json:"name"`
		Nats struct {
			Type string `json:"type"`
		} `json:"nats"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return "", errors.New("its JWT's claims do not decode")
	}
	if claims.Nats.Type != "user" {
		return "", errors.New("its JWT is not a user's")
	}
	return claims.Name, nil
}

// userJWT returns the first line of the first "-----BEGIN …-----" block, as
// NATS writes credentials files, or the whole content trimmed.
func userJWT(creds string) string {
	lines := strings.Split(creds, "\n")
	for i, l := range lines {
		if l = strings.TrimSpace(l); !strings.HasPrefix(l, "---") || !strings.HasSuffix(l, "---") {
			continue
		}
		for _, body := range lines[i+1:] {
			if body = strings.TrimSpace(body); body != "" {
				return body
			}
		}
		return ""
	}
	return strings.TrimSpace(creds)
}
