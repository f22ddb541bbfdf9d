package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/capstan-dev/capstan/approvals"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/approvalsrpc"
	"github.com/capstan-dev/capstan/internal/approvalstore"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/credfile"
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
	// Role is the principal's role as its credentials name it (producer,
	// approver, worker, admin), when they do.
	Role string
	// Admin may cancel any execution, not only its own.
	Admin bool
	open  bool // named at an open sign-in, not authenticated
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
	// conn is what the session reads and acts through: the principal's own
	// connection, or in open mode the one every session shares.
	*conn
	own bool // conn is the session's own, closed with it
	// done is closed when the session ends (sign-out, idle expiry, the
	// console's close): its live streams end with it.
	done      chan struct{}
	closeOnce sync.Once

	mu    sync.Mutex
	last  time.Time
	flash *flash
}

// conn is one NATS connection and what the console reads through it.
type conn struct {
	nc    *nats.Conn
	names broker.Names
	// approvals reads the approvals bucket, which approvers may read; nil
	// when the principal may not.
	approvals    approvalsReader
	approvalsKV  jetstream.KeyValue // nil when read through the workers
	approvalsErr error
	// reads reads executions as the principal may see them; nil when its
	// credentials do not let it ask (clientErr says why).
	reads *execReader
	// client cancels and resumes; nil when the principal's role may not (an
	// approver).
	client    *executor.Client
	clientErr error
	// b is every stream and bucket, when the principal may read them all (an
	// admin, an open server): live updates from the trail, the catalog.
	b     *broker.Broker
	feeds *feeds
}

// openConn binds what nc may read. Nothing is provisioned: servers,
// workers and admins create the resources.
//
// may says whether the credentials let the principal publish to a subject
// (nil: unknown, try): what they forbid is not even asked, since a refused
// request is answered only by its timeout.
func openConn(nc *nats.Conn, dep executor.Deployment, principal string, may func(subject string) bool, log *slog.Logger) (*conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	names := broker.NewNames(dep.Prefix)
	c := &conn{nc: nc, names: names}
	info := func(stream string) bool { return may == nil || may("$JS.API.STREAM.INFO."+stream) }
	// Admins and open servers read the approvals bucket; an approver asks
	// the workers, who keep to its types; producers get no inbox.
	switch {
	case info("KV_" + names.ApprovalsBucket()):
		var store *approvalstore.Store
		if store, c.approvalsErr = approvalstore.Open(ctx, js, names.Prefix()); c.approvalsErr == nil {
			// One approval that does not decode hides only itself.
			store.OnSkipped(func(key string, err error) {
				log.Warn("approval does not decode: skipped", "bucket", names.ApprovalsBucket(), "key", key, "err", err)
			})
			if c.approvalsKV, c.approvalsErr = js.KeyValue(ctx, names.ApprovalsBucket()); c.approvalsErr == nil {
				c.approvals = bucketApprovals{store}
			}
		}
	case may != nil && may(names.ListApprovalsSubject(principal)) && may(names.DecideSubject(principal)):
		// An approver. A producer may list the approvals it asked for, but
		// decides none: the inbox is not for it.
		c.approvals = workerApprovals{nc: nc, names: names}
	default:
		c.approvalsErr = errors.New("its credentials let it read no approvals")
	}
	// Executions: every role reads them through the workers, who keep to
	// what it may see (admins everything, producers their own, approvers
	// those behind their approvals); admins and open servers may also read
	// the streams, for live updates.
	if may == nil || may(names.ListExecutionsSubject(principal)) && may(names.ExecutionSubject(principal)) {
		c.reads = &execReader{nc: nc, names: names, principal: principal}
	} else {
		c.clientErr = errors.New("its credentials do not let it ask the workers for executions (issued before this version? add the principal again)")
	}
	// A client cancels and resumes: producers (who submit on their own
	// subjects; from an account of their own, they read the catalog by key
	// only) and admins.
	if may == nil || may(names.UnroutedSubject(principal)) {
		if cl, err := executor.NewClient(nc, executor.ClientConfig{Deployment: dep}); err == nil {
			c.client = cl
		} else if c.reads == nil {
			c.clientErr = err
		}
	}
	if info(names.AuditStream()) && info("KV_"+names.ExecutionsBucket()) {
		if b, err := broker.OpenAll(ctx, nc, broker.Config(dep)); err == nil {
			c.b = b
		}
	}
	if c.approvals == nil && c.reads == nil {
		return nil, fmt.Errorf("this principal may read neither approvals (%v) nor executions (%v)", c.approvalsErr, c.clientErr)
	}
	c.feeds = newFeeds(c.approvalsKV, c.approvals, c.b)
	return c, nil
}

func (c *conn) close() {
	c.feeds.close()
	if c.client != nil {
		_ = c.client.Close()
	}
}

// broker is every stream and bucket, or nil when the principal may not read
// them all.
func (c *conn) broker() *broker.Broker { return c.b }

type flash struct {
	Kind, Text string
}

// decide asks the workers to record the decision, as the CLI does: they
// take the approver from the principal the server authenticated (in open
// mode, from the name given at sign-in) and check its grant.
func (s *session) decide(ctx context.Context, approvalID string, approve bool, comment string) (*approvals.Record, error) {
	req := approvalsrpc.DecideRequest{ApprovalID: approvalID, Approve: approve, Comment: comment}
	if s.p.open {
		req.Approver = s.p.Actor
	}
	return approvalsrpc.Decide(ctx, s.nc, s.names, req)
}

func (s *session) resume(ctx context.Context, approvalID string) (string, error) {
	if s.client == nil {
		return "", fmt.Errorf("%w: %v", errNotPermitted, s.clientErr)
	}
	return s.client.SubmitResume(ctx, approvalID)
}

func (s *session) cancel(ctx context.Context, executionID, owner string) (*executor.CancelReply, error) {
	if s.client == nil {
		return nil, fmt.Errorf("%w: %v", errNotPermitted, s.clientErr)
	}
	var opts []executor.CancelOption
	if owner != "" && owner != s.p.Name && !s.p.open {
		opts = append(opts, executor.OwnedBy(owner))
	}
	return s.client.Cancel(ctx, executionID, opts...)
}

// owner is the principal whose execution a request names (executions are
// scoped by principal, DESIGN §2): its owner parameter; on an open server the
// anonymous one; otherwise "", and the workers take the one the principal may
// see.
func (s *session) owner(r *http.Request) string {
	if o := r.URL.Query().Get("owner"); broker.ValidPrincipal(o) {
		return o
	}
	if s.p.open {
		return broker.Anonymous
	}
	return ""
}

// mine reports whether the principal requested r.
func (s *session) mine(r *approvals.Record) bool {
	if s.p.open {
		return sameActor(r.Actor, s.p.Actor)
	}
	return r.Principal == s.p.Name
}

// errNotPermitted: the principal's role may not read or do this.
var errNotPermitted = errors.New("your principal may not do this")

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
	s.closeOnce.Do(func() {
		close(s.done)
		if s.own {
			s.conn.close()
			s.nc.Close()
		}
	})
}

const cookieName = "capstan_console"

type sessions struct {
	cfg Config

	mu     sync.Mutex
	byID   map[string]*session
	shared *conn // open mode
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
	var p Principal
	var c *conn
	own := false
	if ss.cfg.Open {
		a := actorOf(strings.TrimSpace(cr.name))
		switch {
		case a.Kind != envelope.ActorUser && a.Kind != envelope.ActorService && a.Kind != envelope.ActorAgent,
			a.ID == "", strings.ContainsAny(a.ID, ": \t\r\n"):
			return nil, fmt.Errorf("%w: name yourself as user:ID, service:ID or agent:ID, e.g. user:bob", errSignIn)
		}
		p = Principal{Name: a.String(), Actor: a, Types: cr.types, Admin: cr.admin || slices.Contains(ss.cfg.Admins, a.String()), open: true}
		var err error
		if c, err = ss.sharedConn(); err != nil {
			return nil, err
		}
	} else {
		opts, name, role, may, err := ss.connectOptions(cr)
		if err != nil {
			return nil, err
		}
		nc, err := nats.Connect(broker.ConnectOptions{URL: ss.cfg.NATS.URL}.ResolveURL(), opts...)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errSignIn, err)
		}
		if !nc.AuthRequired() {
			// Such a server admits any name: the credentials prove nothing.
			nc.Close()
			return nil, fmt.Errorf("%w: the NATS server does not authenticate its clients; on loopback, run the console open (--open)", errSignIn)
		}
		if c, err = openConn(nc, ss.cfg.Deployment, name, may, ss.cfg.Logger); err != nil {
			nc.Close()
			return nil, fmt.Errorf("%w: %v", errSignIn, err)
		}
		own = true
		p = Principal{Name: name, Actor: actorOf(name), Role: role}
		p.Admin = role == "admin" || slices.Contains(ss.cfg.Admins, name) || slices.Contains(ss.cfg.Admins, p.Actor.String())
	}
	s := &session{id: randomToken(), csrf: randomToken(), p: p, conn: c, own: own, done: make(chan struct{}), last: time.Now()}
	ss.mu.Lock()
	ss.byID[s.id] = s
	ss.mu.Unlock()
	return s, nil
}

// connectOptions turns credentials into a NATS connection's options, the
// principal's name and, from a JWT, its role and what it may publish to.
func (ss *sessions) connectOptions(cr credentials) (opts []nats.Option, name, role string, may func(string) bool, err error) {
	o := ss.cfg.NATS
	opts = []nats.Option{nats.Timeout(5 * time.Second), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second)}
	if o.TLS != nil {
		opts = append(opts, nats.Secure(o.TLS.Clone()))
	}
	if o.TLSCA != "" {
		opts = append(opts, nats.RootCAs(o.TLSCA))
	}
	switch {
	case len(strings.TrimSpace(string(cr.creds))) > 0:
		token, err := nkeys.ParseDecoratedJWT(cr.creds)
		if err != nil {
			return nil, "", "", nil, fmt.Errorf("%w: not a credentials file: %v", errSignIn, err)
		}
		token = strings.TrimSpace(token)
		claims, err := jwt.DecodeUserClaims(token)
		if err != nil {
			return nil, "", "", nil, fmt.Errorf("%w: neither a credentials file nor a user token: %v", errSignIn, err)
		}
		name = claims.Name
		may = func(subject string) bool { return credfile.MayPublish(claims, subject) }
		role = credfile.RoleOf(claims)
		if !broker.ValidPrincipal(name) || name == broker.Anonymous {
			return nil, "", "", nil, fmt.Errorf("%w: the credentials name no capstan principal (%q)", errSignIn, name)
		}
		if kp, kerr := nkeys.ParseDecoratedUserNKey(cr.creds); kerr == nil {
			seed, err := kp.Seed()
			if err != nil {
				return nil, "", "", nil, fmt.Errorf("%w: %v", errSignIn, err)
			}
			opts = append(opts, nats.UserJWTAndSeed(token, string(seed)))
		} else if claims.BearerToken {
			// A bearer token: the server asks for no signature of its nonce.
			opts = append(opts, nats.UserJWT(func() (string, error) { return token, nil }, func([]byte) ([]byte, error) { return nil, nil }))
		} else {
			return nil, "", "", nil, fmt.Errorf("%w: the credentials hold no user key, and the token is not a bearer token", errSignIn)
		}
	case cr.user != "":
		name = cr.user
		if !broker.ValidPrincipal(name) || name == broker.Anonymous {
			return nil, "", "", nil, fmt.Errorf("%w: %q is not a principal's name", errSignIn, name)
		}
		opts = append(opts, nats.UserInfo(cr.user, cr.password))
	default:
		return nil, "", "", nil, fmt.Errorf("%w: paste or upload a .creds file, or give a user and password", errSignIn)
	}
	// Replies come under the principal's inbox prefix, the only one the
	// server lets it receive on.
	opts = append(opts, nats.CustomInboxPrefix(broker.NewNames(ss.cfg.Deployment.Prefix).InboxPrefix(name)))
	return append(opts, nats.Name("capstan console "+name)), name, role, may, nil
}

func (ss *sessions) sharedConn() (*conn, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.shared == nil {
		c, err := openConn(ss.cfg.Conn, ss.cfg.Deployment, broker.Anonymous, nil, ss.cfg.Logger)
		if err != nil {
			return nil, err
		}
		ss.shared = c
	}
	return ss.shared, nil
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
	shared := ss.shared
	ss.shared = nil
	ss.mu.Unlock()
	for _, s := range all {
		s.close()
	}
	if shared != nil {
		shared.close()
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

// maxSignInBody bounds a sign-in form: a credentials file (read up to
// 64 KiB) and a few fields.
const maxSignInBody = 256 << 10

func (c *Console) signInPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, nil, "signin", map[string]any{"Open": c.cfg.Open, "Next": safeNext(r.URL.Query().Get("next"))})
}

func (c *Console) signIn(w http.ResponseWriter, r *http.Request) {
	// A credentials file is a few kilobytes: a larger upload is refused
	// before anything is parsed or spooled to disk.
	r.Body = http.MaxBytesReader(w, r.Body, maxSignInBody)
	// ParseMultipartForm would hide ParseForm's error behind ErrNotMultipart.
	parse := r.ParseForm
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt == "multipart/form-data" {
		parse = func() error { return r.ParseMultipartForm(64 << 10) }
	}
	if err := parse(); err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			http.Error(w, "sign-in form too large", http.StatusRequestEntityTooLarge)
			return
		}
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

// safeNext keeps a redirect inside the console: a path of its own, nothing
// a browser could read as another host. Browsers drop tabs and newlines from
// a URL and read a backslash as a slash, so "/<TAB>/evil.example" or
// "/\evil.example" is "//evil.example"; any such byte sends to "/".
func safeNext(next string) string {
	for i := 0; i < len(next); i++ {
		if b := next[i]; b < 0x20 || b == 0x7f || b == '\\' {
			return "/"
		}
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.Opaque != "" || u.User != nil ||
		!strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") {
		return "/"
	}
	return next
}
