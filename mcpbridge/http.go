package mcpbridge

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Tokens maps bearer tokens to the actors they authenticate. It keeps only
// the tokens' SHA-256, so a lookup costs the same whatever the token.
type Tokens struct {
	actors map[[sha256.Size]byte]envelope.Actor
}

// NewTokens returns the tokens of m (token → actor). Every token must be at
// least 16 characters and every actor kind:id.
func NewTokens(m map[string]envelope.Actor) (*Tokens, error) {
	t := &Tokens{actors: map[[sha256.Size]byte]envelope.Actor{}}
	for tok, a := range m {
		if err := t.add(tok, a); err != nil {
			return nil, err
		}
	}
	return t, nil
}

func (t *Tokens) add(token string, a envelope.Actor) error {
	if len(token) < 16 {
		return errors.New("capstan: a bearer token must have at least 16 characters")
	}
	if err := checkActor(a); err != nil {
		return err
	}
	t.actors[sha256.Sum256([]byte(token))] = envelope.Actor{Kind: a.Kind, ID: a.ID}
	return nil
}

// ParseTokens reads one token per line, "TOKEN kind:id"; blank lines and
// lines starting with # are skipped.
func ParseTokens(r io.Reader) (*Tokens, error) {
	t := &Tokens{actors: map[[sha256.Size]byte]envelope.Actor{}}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("capstan: tokens line %d: want \"TOKEN kind:id\"", n)
		}
		kind, id, _ := strings.Cut(f[1], ":")
		if err := t.add(f[0], envelope.Actor{Kind: kind, ID: id}); err != nil {
			return nil, fmt.Errorf("tokens line %d: %w", n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(t.actors) == 0 {
		return nil, errors.New("capstan: no bearer token: without one, no tools")
	}
	return t, nil
}

// Actor returns the actor a token authenticates.
func (t *Tokens) Actor(token string) (envelope.Actor, bool) {
	a, ok := t.actors[sha256.Sum256([]byte(token))]
	return a, ok
}

// verify is the bearer-token check of the SDK's auth middleware.
func (t *Tokens) verify(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	a, ok := t.Actor(token)
	if !ok {
		return nil, auth.ErrInvalidToken
	}
	// UserID binds a session to its actor: another token cannot use it.
	return &auth.TokenInfo{UserID: a.String(), Extra: map[string]any{"actor": a}}, nil
}

// HTTPOptions configures Handler.
type HTTPOptions struct {
	// ResourceMetadataURL is sent in WWW-Authenticate on a refusal, for OAuth
	// clients (RFC 9728). Optional.
	ResourceMetadataURL string
	// Stateless serves protocol 2026-07-28 and later, where every request
	// stands alone (no Mcp-Session-Id), so that any bridge behind a load
	// balancer answers any request; tasks make long calls independent of
	// one connection. A request's context then ends with its HTTP request:
	// a client that closes it cancels the call. Default: sessions, for
	// clients of the initialize handshake (2025-11-25 and earlier).
	Stateless bool
	// SessionTimeout closes a session that sent no request for this long.
	// Default 1 h.
	SessionTimeout time.Duration
}

// Handler serves MCP over streamable HTTP. Every request must carry a bearer
// token of tokens (401 otherwise): its actor chooses the MCP server, hence
// the tools listed and the actor every call runs for.
func (b *Bridge) Handler(tokens *Tokens, opts *HTTPOptions) http.Handler {
	o := HTTPOptions{}
	if opts != nil {
		o = *opts
	}
	if o.SessionTimeout <= 0 {
		o.SessionTimeout = time.Hour
	}
	opts = &o
	h := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		ti := auth.TokenInfoFromContext(r.Context())
		if ti == nil {
			return nil
		}
		a, ok := ti.Extra["actor"].(envelope.Actor)
		if !ok {
			return nil
		}
		s, err := b.Server(r.Context(), a)
		if err != nil {
			b.log.Warn("no MCP server for an authenticated actor", "actor", a.String(), "err", err)
			return nil
		}
		return s
	}, &mcp.StreamableHTTPOptions{Logger: b.log, Stateless: opts.Stateless,
		PropagateRequestCancellation: opts.Stateless, SessionTimeout: opts.SessionTimeout})
	if tokens == nil {
		tokens = &Tokens{actors: map[[sha256.Size]byte]envelope.Actor{}}
	}
	return auth.RequireBearerToken(tokens.verify, &auth.RequireBearerTokenOptions{
		AllowMissingExpiration: true, ResourceMetadataURL: opts.ResourceMetadataURL,
	})(h)
}
