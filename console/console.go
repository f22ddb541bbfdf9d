package console

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/nats-io/nats.go"
)

//go:embed assets
var assets embed.FS

// Config configures a Console. Zero values are the defaults.
type Config struct {
	// Open makes sign-in a form that only names the approver: every session
	// shares Conn. Use it for `capstan dev` on loopback, never for a server
	// with authentication.
	Open bool
	// Conn is the connection sessions share in open mode. Required with Open;
	// unused otherwise.
	Conn *nats.Conn
	// NATS says where a signed-in principal's own connection goes (URL, TLS).
	// Its Creds field is ignored: credentials come from the sign-in form.
	NATS broker.ConnectOptions
	// Broker says how resources are named.
	Broker broker.Config
	// Admins are principals (as kind:id) who may cancel any execution; an
	// execution's owner may always cancel it. In open mode the sign-in form
	// may also claim it.
	Admins []string
	// AllowedHosts are the names, beyond loopback's, by which browsers reach
	// the console: the host (without port) of the address they open, e.g.
	// "console.example.com", or "*.example.com" for any one label in front.
	// A request whose Host header names anything else is refused with 421
	// Misdirected Request, so that a site whose DNS name is made to point at
	// the console (DNS rebinding) cannot read or act through it. Always
	// allowed: the IP address the request came in on and, when that is
	// loopback, "localhost" and any loopback address.
	AllowedHosts []string
	// AuditKeys are the audit log's public keys (the deployment's audit.pub,
	// one a line): an execution's page shows that its trail verifies
	// against the latest signed checkpoint, for the sessions that read the
	// streams. Empty: the keys the deployment states, and the page says so.
	AuditKeys string
	// SessionTTL is how long a session lasts without a request. Default 12 h.
	SessionTTL time.Duration
	// Logger receives the console's logs. Default: discarded.
	Logger *slog.Logger
}

// Console is the web console: an http.Handler over capstan's JetStream
// resources.
type Console struct {
	cfg      Config
	log      *slog.Logger
	pages    map[string]*template.Template
	mux      *http.ServeMux
	handler  http.Handler // mux behind the cross-origin check
	sessions *sessions
}

// New returns a console. It opens no connection of its own: reads, decisions
// and cancels go through each signed-in session's connection.
func New(cfg Config) (*Console, error) {
	if cfg.Open && cfg.Conn == nil {
		return nil, errors.New("capstan: console: open mode needs Config.Conn")
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 12 * time.Hour
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Console{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux()}
	c.sessions = newSessions(cfg)
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	c.pages = pages
	c.routes()
	// Forms posted by pages of other sites (a sign-in among them, which
	// needs no form token) are refused by what browsers say of their origin.
	c.handler = http.NewCrossOriginProtection().Handler(c.mux)
	return c, nil
}

func (c *Console) routes() {
	static, _ := fs.Sub(assets, "assets/static")
	c.mux.Handle("GET /static/", http.StripPrefix("/static/", cacheFor(time.Hour, http.FileServerFS(static))))
	c.mux.Handle("GET /favicon.ico", cacheFor(24*time.Hour, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeFileFS(w, r, assets, "assets/static/favicon.ico")
	})))
	c.mux.HandleFunc("GET /signin", c.signInPage)
	c.mux.HandleFunc("POST /signin", c.signIn)
	c.mux.HandleFunc("POST /signout", c.signedIn(c.signOut))
	c.mux.HandleFunc("GET /{$}", c.signedIn(c.home))
	c.mux.HandleFunc("GET /approvals", c.signedIn(c.inbox))
	c.mux.HandleFunc("GET /approvals/{id}", c.signedIn(c.approval))
	c.mux.HandleFunc("POST /approvals/{id}/decide", c.signedIn(c.decide))
	c.mux.HandleFunc("POST /approvals/{id}/resume", c.signedIn(c.resume))
	c.mux.HandleFunc("GET /executions", c.signedIn(c.executions))
	c.mux.HandleFunc("GET /executions/{id}", c.signedIn(c.execution))
	c.mux.HandleFunc("POST /executions/{id}/cancel", c.signedIn(c.cancel))
	c.mux.HandleFunc("GET /capabilities", c.signedIn(c.capabilities))
	c.mux.HandleFunc("POST /pauses", c.signedIn(c.pause))
	c.mux.HandleFunc("POST /pauses/unpause", c.signedIn(c.unpause))
	c.mux.HandleFunc("GET /live/approvals", c.signedIn(c.liveApprovals))
	c.mux.HandleFunc("GET /live/executions", c.signedIn(c.liveExecutions))
	c.mux.HandleFunc("GET /live/executions/{id}", c.signedIn(c.liveExecution))
}

// ServeHTTP serves the console.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "same-origin")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; form-action 'self'; frame-ancestors 'none'")
	if !c.allowedHost(r) {
		http.Error(w, "this console is not served under the name "+strconv.Quote(r.Host), http.StatusMisdirectedRequest)
		return
	}
	c.handler.ServeHTTP(w, r)
}

// allowedHost reports whether r names the console by one of its names: a
// name in AllowedHosts, the address the request came in on, or on loopback
// localhost and loopback addresses. Any other name may be one an attacker's
// DNS turned into the console's address, under which the attacker's pages
// would be same-origin with the console.
func (c *Console) allowedHost(r *http.Request) bool {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if host == "" {
		return false
	}
	var local net.IP
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok {
		local = a.IP
	}
	if ip := net.ParseIP(host); ip != nil {
		if local != nil && (ip.Equal(local) || ip.IsLoopback() && local.IsLoopback()) {
			return true
		}
	} else if strings.EqualFold(host, "localhost") && local != nil && local.IsLoopback() {
		return true
	}
	for _, a := range c.cfg.AllowedHosts {
		a = strings.TrimSuffix(strings.Trim(a, "[]"), ".")
		if ip := net.ParseIP(a); ip != nil {
			if ip.Equal(net.ParseIP(host)) {
				return true
			}
			continue
		}
		if strings.EqualFold(a, host) {
			return true
		}
		// *.example.com: one label, not none and not several.
		if rest, ok := strings.CutPrefix(a, "*."); ok {
			if label, domain, ok := strings.Cut(host, "."); ok && label != "" && strings.EqualFold(domain, rest) {
				return true
			}
		}
	}
	return false
}

// Serve serves the console on l until ctx ends, then shuts the server down
// and closes every session.
func (c *Console) Serve(ctx context.Context, l net.Listener) error {
	srv := &http.Server{Handler: c, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(c.log.Handler(), slog.LevelWarn),
		// Requests end with ctx: live streams never end on their own.
		BaseContext: func(net.Listener) context.Context { return ctx }}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	err := srv.Serve(l)
	<-done
	c.Close()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close ends every session and closes their connections.
func (c *Console) Close() { c.sessions.closeAll() }

// ListenAddr checks where a console may listen. On loopback, anywhere. Beyond
// it, only with sign-in credentials (not open) and over HTTPS, since a
// principal's credentials cross the network at sign-in; insecure lifts both.
func ListenAddr(addr string, open, https, insecure bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("capstan: console address %q: %w", addr, err)
	}
	switch {
	case insecure || isLoopback(host):
		return nil
	case open:
		return fmt.Errorf("capstan: console address %q: an open console (no sign-in credentials) listens only on loopback", addr)
	case !https:
		return fmt.Errorf("capstan: console address %q: beyond loopback the console serves HTTPS only, since credentials cross the network at sign-in", addr)
	}
	return nil
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func cacheFor(d time.Duration, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", fmt.Sprintf("public, max-age=%d", int(d.Seconds())))
		h.ServeHTTP(w, r)
	})
}
