package broker

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
)

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
