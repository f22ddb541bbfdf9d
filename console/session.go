package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// This file is the console's one seam with identity: how a principal signs
// in, and the three things it does as itself (decide, resume, cancel). Every
// read and every action of a session goes through its own connection, opened
// with the principal's credentials, so the NATS server's permissions apply to
// the console exactly as they apply to the CLI.

// Principal is who a session acts as.
type Principal struct {
	// Name is the authenticated NATS user (or, in open mode, the name given).
	Name string
	// Actor is who decisions and cancels are made as.
	Actor envelope.Actor
	// Types are the approval types the principal may decide; nil: any.
	Types []string
	// Admin may cancel any execution, not only its own.
	Admin bool
}

// MayDecide reports whether the principal may decide an approval of r's
// types.
func (p Principal) MayDecide(r *approvals.Record) bool {
	if p.Types == nil {
		return true
	}
	for _, t := range r.Types {
		if slices.Contains(p.Types, t) {
			return true
		}
	}
	return false
}

// actorOf reads a principal name as an actor: kind:id, or a user's id.
func actorOf(name string) envelope.Actor {
	if kind, id, ok := strings.Cut(name, ":"); ok && kind != "" && id != "" {
		return envelope.Actor{Kind: kind, ID: id}
	}
	return envelope.Actor{Kind: envelope.ActorUser, ID: name}
}

// session is one signed-in browser.
type session struct {
	id, csrf string
	p        Principal
	client   *executor.Client
	feeds    *feeds     // the live pages' sources, on the same connection
	nc       *nats.Conn // the principal's own; nil in open mode (shared)

	mu    sync.Mutex
	last  time.Time
	flash *flash
}

type flash struct {
	Kind, Text string
}

func (s *session) broker() *broker.Broker { return s.client.Broker() }

func (s *session) decide(ctx context.Context, approvalID string, approve bool, comment string) (*approvals.Record, error) {
	return s.client.Approvals().Decide(ctx, approvalID, approvals.Verdict{Approve: approve, Approver: s.p.Actor, Comment: comment})
}

func (s *session) resume(ctx context.Context, approvalID string) (string, error) {
	return s.client.SubmitResume(ctx, approvalID)
}

func (s *session) cancel(ctx context.Context, executionID string) (*executor.CancelReply, error) {
	return s.client.Cancel(ctx, executionID)
}

func (s *session) setFlash(kind, format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flash = &flash{Kind: kind, Text: fmt.Sprintf(format, args...)}
}

func (s *session) takeFlash() *flash {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.flash
	s.flash = nil
	return f
}

func (s *session) close() {
	if s.nc != nil {
		s.feeds.close()
		_ = s.client.Close()
		s.nc.Close()
	}
}

const cookieName = "capstan_console"

type sessions struct {
	cfg Config

	mu          sync.Mutex
	byID        map[string]*session
	shared      *executor.Client // open mode
	sharedFeeds *feeds
}

func newSessions(cfg Config) *sessions {
	return &sessions{cfg: cfg, byID: map[string]*session{}}
}

// credentials are what a sign-in form carried.
type credentials struct {
	name     string // open mode
	types    []string
	admin    bool
	creds    []byte // a .creds file's content
	user     string
	password string
}

var errSignIn = errors.New("sign-in refused")

// open signs a principal in and returns its session.
func (ss *sessions) open(cr credentials) (*session, error) {
	var (
		p  Principal
		nc *nats.Conn
		cl *executor.Client
		fs *feeds
	)
	if ss.cfg.Open {
		a := actorOf(strings.TrimSpace(cr.name))
		switch {
		case a.Kind != envelope.ActorUser && a.Kind != envelope.ActorService && a.Kind != envelope.ActorAgent,
			a.ID == "", strings.ContainsAny(a.ID, ": \t\r\n"):
			return nil, fmt.Errorf("%w: name yourself as user:ID, service:ID or agent:ID, e.g. user:bob", errSignIn)
		}
		p = Principal{Name: a.String(), Actor: a, Types: cr.types, Admin: cr.admin || slices.Contains(ss.cfg.Admins, a.String())}
		var err error
		if cl, fs, err = ss.sharedClient(); err != nil {
			return nil, err
		}
	} else {
		opts, name, err := ss.connectOptions(cr)
		if err != nil {
			return nil, err
		}
		nc, err = nats.Connect(ss.cfg.NATS.ResolveURL(), opts...)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errSignIn, err)
		}
		if !nc.AuthRequired() {
			// Such a server admits any name: the credentials prove nothing.
			nc.Close()
			return nil, fmt.Errorf("%w: the NATS server does not authenticate its clients; on loopback, run the console open (--open)", errSignIn)
		}
		cl, err = executor.NewClient(nc, executor.ClientConfig{Broker: ss.cfg.Broker})
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("%w: %v", errSignIn, err)
		}
		p = Principal{Name: name, Actor: actorOf(name)}
		p.Admin = slices.Contains(ss.cfg.Admins, p.Actor.String())
		fs = newFeeds(cl.Broker())
	}
	s := &session{id: randomToken(), csrf: randomToken(), p: p, client: cl, feeds: fs, nc: nc, last: time.Now()}
	ss.mu.Lock()
	ss.byID[s.id] = s
	ss.mu.Unlock()
	return s, nil
}

// connectOptions turns credentials into a NATS connection's options and the
// principal's name.
func (ss *sessions) connectOptions(cr credentials) ([]nats.Option, string, error) {
	o := ss.cfg.NATS
	opts := []nats.Option{nats.Timeout(5 * time.Second), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second)}
	if o.TLSCA != "" {
		opts = append(opts, nats.RootCAs(o.TLSCA))
	}
	if o.TLSCert != "" || o.TLSKey != "" {
		opts = append(opts, nats.ClientCert(o.TLSCert, o.TLSKey))
	}
	var name string
	switch {
	case len(strings.TrimSpace(string(cr.creds))) > 0:
		token, err := nkeys.ParseDecoratedJWT(cr.creds)
		if err != nil {
			return nil, "", fmt.Errorf("%w: not a credentials file: %v", errSignIn, err)
		}
		token = strings.TrimSpace(token)
		claims, err := jwt.DecodeUserClaims(token)
		if err != nil {
			return nil, "", fmt.Errorf("%w: neither a credentials file nor a user token: %v", errSignIn, err)
		}
		name = claims.Name
		if name == "" {
			name = claims.Subject
		}
		if kp, kerr := nkeys.ParseDecoratedUserNKey(cr.creds); kerr == nil {
			seed, err := kp.Seed()
			if err != nil {
				return nil, "", fmt.Errorf("%w: %v", errSignIn, err)
			}
			opts = append(opts, nats.UserJWTAndSeed(token, string(seed)))
		} else if claims.BearerToken {
			// A bearer token: the server asks for no signature of its nonce.
			opts = append(opts, nats.UserJWT(func() (string, error) { return token, nil }, func([]byte) ([]byte, error) { return nil, nil }))
		} else {
			return nil, "", fmt.Errorf("%w: the credentials hold no user key, and the token is not a bearer token", errSignIn)
		}
	case cr.user != "":
		name = cr.user
		opts = append(opts, nats.UserInfo(cr.user, cr.password))
	default:
		return nil, "", fmt.Errorf("%w: paste or upload a .creds file, or give a user and password", errSignIn)
	}
	return append(opts, nats.Name("capstan console "+name)), name, nil
}

func (ss *sessions) sharedClient() (*executor.Client, *feeds, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.shared == nil {
		cl, err := executor.NewClient(ss.cfg.Conn, executor.ClientConfig{Broker: ss.cfg.Broker})
		if err != nil {
			return nil, nil, err
		}
		ss.shared, ss.sharedFeeds = cl, newFeeds(cl.Broker())
	}
	return ss.shared, ss.sharedFeeds, nil
}

// get returns the request's live session, or nil.
func (ss *sessions) get(r *http.Request) *session {
	ck, err := r.Cookie(cookieName)
	if err != nil {
		return nil
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	now := time.Now()
	for id, s := range ss.byID { // expire idle sessions as we go
		s.mu.Lock()
		idle := now.Sub(s.last) > ss.cfg.SessionTTL
		s.mu.Unlock()
		if idle {
			delete(ss.byID, id)
			go s.close()
		}
	}
	s := ss.byID[ck.Value]
	if s != nil {
		s.mu.Lock()
		s.last = now
		s.mu.Unlock()
	}
	return s
}

func (ss *sessions) end(s *session) {
	ss.mu.Lock()
	delete(ss.byID, s.id)
	ss.mu.Unlock()
	s.close()
}

func (ss *sessions) closeAll() {
	ss.mu.Lock()
	all := ss.byID
	ss.byID = map[string]*session{}
	shared, sharedFeeds := ss.shared, ss.sharedFeeds
	ss.shared, ss.sharedFeeds = nil, nil
	ss.mu.Unlock()
	for _, s := range all {
		s.close()
	}
	if shared != nil {
		sharedFeeds.close()
		_ = shared.Close()
	}
}

func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

type sessionHandler func(w http.ResponseWriter, r *http.Request, s *session)

// signedIn serves h only to a signed-in session: a page asks for sign-in
// first, anything else is refused. A form must carry the session's token.
func (c *Console) signedIn(h sessionHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s := c.sessions.get(r)
		if s == nil {
			if r.Method == http.MethodGet && !strings.HasPrefix(r.URL.Path, "/live/") && r.URL.Query().Get("part") == "" {
				http.Redirect(w, r, "/signin?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			http.Error(w, "sign in first", http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodPost {
			if subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(s.csrf)) != 1 {
				http.Error(w, "this form has expired; reload the page", http.StatusForbidden)
				return
			}
		}
		h(w, r, s)
	}
}

func (c *Console) signInPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, nil, "signin", map[string]any{"Open": c.cfg.Open, "Next": safeNext(r.URL.Query().Get("next"))})
}

func (c *Console) signIn(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseMultipartForm(64 << 10); err != nil && !errors.Is(err, http.ErrNotMultipart) {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	cr := credentials{
		name: r.FormValue("name"), admin: r.FormValue("admin") != "",
		creds: []byte(r.FormValue("creds")), user: r.FormValue("user"), password: r.FormValue("password"),
	}
	for t := range strings.SplitSeq(r.FormValue("types"), ",") {
		if t = strings.TrimSpace(t); t != "" {
			cr.types = append(cr.types, t)
		}
	}
	if f, _, err := r.FormFile("credsfile"); err == nil {
		b, _ := io.ReadAll(io.LimitReader(f, 64<<10))
		_ = f.Close()
		if len(b) > 0 {
			cr.creds = b
		}
	}
	s, err := c.sessions.open(cr)
	if err != nil {
		c.log.Info("console sign-in refused", "err", err)
		c.renderStatus(w, r, nil, http.StatusUnauthorized, "signin", map[string]any{"Open": c.cfg.Open, "Next": safeNext(r.FormValue("next")), "Error": err.Error()})
		return
	}
	c.log.Info("console sign-in", "principal", s.p.Name)
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: s.id, Path: "/", HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, safeNext(r.FormValue("next")), http.StatusSeeOther)
}

func (c *Console) signOut(w http.ResponseWriter, r *http.Request, s *session) {
	c.sessions.end(s)
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/signin", http.StatusSeeOther)
}

// safeNext keeps a redirect inside the console.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") {
		return "/"
	}
	return next
}
