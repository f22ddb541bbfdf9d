package mcpbridge

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capstan-dev/capstan/envelope"
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
// Actors returns every actor a token names, each once.
func (t *Tokens) Actors() []envelope.Actor {
	var out []envelope.Actor
	seen := map[string]bool{}
	for _, a := range t.actors {
		if !seen[a.String()] {
			seen[a.String()] = true
			out = append(out, a)
		}
	}
	return out
}

// Actor is the actor a bearer token stands for; false for a token not
// listed.
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

// closeCancelsKey marks the context of a request whose end, however it
// comes, is its client giving up: a stateless HTTP request.
type closeCancelsKey struct{}

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
	var h http.Handler = mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
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
	}, &mcp.StreamableHTTPOptions{Logger: b.log, Stateless: opts.Stateless, EventStore: replayStore(opts.Stateless),
		PropagateRequestCancellation: opts.Stateless, SessionTimeout: opts.SessionTimeout})
	if opts.Stateless {
		h = &cancelRouter{next: h, inflight: map[string][]*callHandle{}}
	}
	h = httpTasks(h) // the core tasks' "task" parameter (tasks_core.go)
	h = b.actorGate(h)
	if tokens == nil {
		tokens = &Tokens{actors: map[[sha256.Size]byte]envelope.Actor{}}
	}
	return refuseForeignOrigin(auth.RequireBearerToken(tokens.verify, &auth.RequireBearerTokenOptions{
		AllowMissingExpiration: true, ResourceMetadataURL: opts.ResourceMetadataURL,
	})(h))
}

// replayBytes bounds what the sessions of one handler keep of their
// response streams for replay (the oldest events go first).
const replayBytes = 16 << 20

// replayStore keeps a session's response streams, so that a client whose
// stream broke resumes it (Last-Event-ID) and still reads its call's result,
// instead of calling again and running the capability a second time. A
// stateless request is its own stream: nothing to resume.
func replayStore(stateless bool) mcp.EventStore {
	if stateless {
		return nil
	}
	es := mcp.NewMemoryEventStore(nil)
	es.SetMaxBytes(replayBytes)
	return es
}

// refuseForeignOrigin answers 403 to a request that arrived on a loopback
// address with an Origin header that is not a loopback origin: a page of
// another site (after DNS rebinding, say) reaching a local bridge. The
// SDK's check of the Host header does the same for Host.
func refuseForeignOrigin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o := r.Header.Get("Origin"); o != "" && onLoopback(r) && !loopbackOrigin(o) {
			http.Error(w, "Forbidden: invalid Origin header", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// onLoopback reports whether r arrived on a loopback address.
func onLoopback(r *http.Request) bool {
	addr, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok || addr == nil {
		return false
	}
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		host = addr.String()
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// loopbackOrigin reports whether origin (scheme://host[:port]) names a
// loopback host.
func loopbackOrigin(origin string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false // "null" (a sandboxed page, a file) among them
	}
	h := u.Hostname()
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// actorGate answers 403 to a caller whose actor the bridge may not assert
// (its principal's grant does not allow it, FORBIDDEN, or the principal has
// no grant at all, UNAUTHENTICATED): no tools and no session for it. Any
// other failure to describe for the actor is 503.
func (b *Bridge) actorGate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ti := auth.TokenInfoFromContext(r.Context())
		a, ok := envelope.Actor{}, false
		if ti != nil {
			a, ok = ti.Extra["actor"].(envelope.Actor)
		}
		if !ok {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		if _, err := b.Server(r.Context(), a); err != nil {
			var ce *envelope.CapabilityError
			if errors.As(err, &ce) && (ce.Code == envelope.CodeForbidden || ce.Code == envelope.CodeUnauthenticated) {
				b.log.Warn("MCP caller refused: the bridge may not act for its actor", "actor", a.String(), "code", ce.Code)
				http.Error(w, string(ce.Code)+": the bridge may not act for this caller", http.StatusForbidden)
				return
			}
			b.log.Warn("no MCP server for an authenticated actor", "actor", a.String(), "err", err)
			http.Error(w, "capstan is not available", http.StatusServiceUnavailable)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// cancelRouter carries a stateless client's notifications/cancelled to the
// call it names. Without sessions each HTTP request is served alone, so the
// SDK cannot route the notification (it arrives in a request of its own):
// the router remembers each tools/call request by actor and JSON-RPC id, and
// cancels its execution (and its request's context) when asked. Ids are
// unique per client only: two clients of one actor may each have a call of
// the same id in flight, so a cancellation cancels every call of its id:
// another client's call of that id ends with it, a lesser harm than missing
// the call meant (whose write would go on).
type cancelRouter struct {
	next http.Handler

	mu       sync.Mutex
	inflight map[string][]*callHandle // by actor and JSON-RPC id
}

// callHandle ties one stateless tools/call request to its execution.
type callHandle struct {
	mu   sync.Mutex
	b    *Bridge
	id   string
	stop context.CancelFunc // the request's context
}

type callHandleKey struct{}

// start records the execution of the call.
func (h *callHandle) start(b *Bridge, id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.b, h.id = b, id
}

// trackCall records the execution of a stateless call, if ctx is one, until
// answered is called: from then on the end of its request cancels nothing
// (the answer may say that the execution goes on, or be a task).
func trackCall(ctx context.Context, b *Bridge, id string) (answered func()) {
	h, ok := ctx.Value(callHandleKey{}).(*callHandle)
	if !ok {
		return func() {}
	}
	h.start(b, id)
	return func() { h.start(b, "") }
}

// cancel ends the request's context, which the call sees unless the SDK
// does not pass it on, and so cancels its execution too, unless the bridge
// is closing: then the request ends because the server does, and the
// execution goes on.
func (h *callHandle) cancel() {
	h.stop()
	h.mu.Lock()
	b, id := h.b, h.id
	h.mu.Unlock()
	if id != "" && b.ctx.Err() == nil {
		b.cancelExecution(id)
	}
}

// rpcHead is what the router reads of a JSON-RPC message.
type rpcHead struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		RequestID json.RawMessage `json:"requestId"`
	} `json:"params"`
}

func (c *cancelRouter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := context.WithValue(r.Context(), closeCancelsKey{}, true)
	ti := auth.TokenInfoFromContext(ctx)
	if r.Method != http.MethodPost || ti == nil || r.Body == nil {
		c.next.ServeHTTP(w, r.WithContext(ctx))
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, mcp.DefaultMaxRequestBodyBytes+1))
	_ = r.Body.Close()
	if err != nil {
		http.Error(w, "the request body could not be read", http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var head rpcHead
	if json.Unmarshal(body, &head) == nil {
		switch {
		case head.Method == "tools/call" && len(head.ID) > 0:
			h := &callHandle{}
			ctx, h.stop = context.WithCancel(context.WithValue(ctx, callHandleKey{}, h))
			key := ti.UserID + "\x00" + string(head.ID)
			c.add(key, h)
			// The SDK ties the call's context to its request for the newest
			// protocol only: a client of an older one closing its request
			// gives up the call too. The request ends after the cancel does.
			cancelled := make(chan struct{})
			stopCancel := context.AfterFunc(r.Context(), func() { defer close(cancelled); h.cancel() })
			defer func() {
				if !stopCancel() {
					<-cancelled
				}
				c.remove(key, h)
				h.stop()
			}()
		case head.Method == "notifications/cancelled":
			for _, h := range c.calls(ti.UserID + "\x00" + string(head.Params.RequestID)) {
				h.cancel()
			}
		}
	}
	c.next.ServeHTTP(w, r.WithContext(ctx))
}

func (c *cancelRouter) add(key string, h *callHandle) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inflight[key] = append(c.inflight[key], h)
}

func (c *cancelRouter) remove(key string, h *callHandle) {
	c.mu.Lock()
	defer c.mu.Unlock()
	hs := slices.DeleteFunc(c.inflight[key], func(x *callHandle) bool { return x == h })
	if len(hs) == 0 {
		delete(c.inflight, key)
		return
	}
	c.inflight[key] = hs
}

func (c *cancelRouter) calls(key string) []*callHandle {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.inflight[key])
}
