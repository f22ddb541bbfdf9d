package auth_test

// Spike: accounts per principal. These tests do not exercise the auth
// package's code; they build an operator-mode layout by hand (an account
// "capstan" holding every stream and bucket, and one account per principal
// importing only its own subjects from it) on a real embedded server, provision
// capstan's real streams and buckets in it, and attack it with the principal's
// real user credentials. docs/design.md §12 "Accounts per principal" is the
// design they support. A control runs the same attack on today's one-account
// layout and shows that the attack is detected there, so that its absence in
// the accounts layout means something.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/capstan-dev/capstan/broker"
)

// spikeLayout is an operator, its system account, the capstan account and,
// unless oneAccount, an account for the principal "alice".
type spikeLayout struct {
	n          broker.Names
	operator   nkeys.KeyPair
	sysKP      nkeys.KeyPair
	url        string
	capstanKP  nkeys.KeyPair
	capstanPub string
	aliceKP    nkeys.KeyPair // the account alice's user is signed by
	alicePub   string
	aliceUser  jwt.Permissions
	srv        *server.Server
	opts       func() *server.Options // the configuration file's, and the spike's listener and store
	conf       string                 // the server's configuration file
	confHead   string                 // its operator, system account and resolver
	accounts   map[string]string      // preloaded: public key to JWT
}

// writeConf writes the server's configuration with the accounts preloaded.
func (l *spikeLayout) writeConf(t *testing.T) {
	t.Helper()
	var preload strings.Builder
	for pub, j := range l.accounts {
		fmt.Fprintf(&preload, "  %s: %q\n", pub, j)
	}
	if err := os.WriteFile(l.conf, []byte(l.confHead+"resolver_preload: {\n"+preload.String()+"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// spikeExports are the capstan account's exports a producer needs: each a
// wildcard over every principal, private (an activation token, signed by the
// capstan account, lets one account import its own part).
func spikeExports(n broker.Names) jwt.Exports {
	svc := func(subject string) *jwt.Export {
		return &jwt.Export{Subject: jwt.Subject(subject), Type: jwt.Service, TokenReq: true, ResponseType: jwt.ResponseTypeSingleton}
	}
	direct := func(bucket string) string { return "$JS.API.DIRECT.GET.KV_" + bucket + ".$KV." + bucket + ".*.>" }
	return jwt.Exports{
		svc(n.ExecSubject("*", ">")),
		svc(n.CancelSubject("*", "*")),
		svc(n.DescribeSubject("*")),
		svc(n.ListApprovalsSubject("*")),
		svc(n.DecideSubject("*")),
		svc(direct(n.EnvelopesBucket())),
		svc(direct(n.ExecutionsBucket())),
		// The catalog is everyone's: public, read by key and its stream
		// information (which the client's KeyValue binding asks for).
		{Subject: jwt.Subject("$JS.API.DIRECT.GET.KV_" + n.CatalogBucket() + ".>"), Type: jwt.Service, ResponseType: jwt.ResponseTypeSingleton},
		{Subject: jwt.Subject("$JS.API.STREAM.INFO.KV_" + n.CatalogBucket()), Type: jwt.Service, ResponseType: jwt.ResponseTypeSingleton},
		{Subject: jwt.Subject(n.EnvelopeSubjectsOf("*")), Type: jwt.Stream, TokenReq: true},
	}
}

// spikeImports are principal p's imports from the capstan account, under the
// same names: a client needs no change.
func spikeImports(t *testing.T, n broker.Names, capstanKP nkeys.KeyPair, capstanPub, importer, p string) jwt.Imports {
	t.Helper()
	token := func(subject string, typ jwt.ExportType) string {
		ac := jwt.NewActivationClaims(importer)
		ac.ImportSubject = jwt.Subject(subject)
		ac.ImportType = typ
		tok, err := ac.Encode(capstanKP)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	svc := func(subject string) *jwt.Import {
		return &jwt.Import{Account: capstanPub, Subject: jwt.Subject(subject), Type: jwt.Service, Token: token(subject, jwt.Service)}
	}
	direct := func(bucket string) string {
		return "$JS.API.DIRECT.GET.KV_" + bucket + ".$KV." + bucket + "." + p + ".>"
	}
	return jwt.Imports{
		svc(n.ExecSubject(p, ">")),
		svc(n.CancelSubject(p, "*")),
		svc(n.DescribeSubject(p)),
		svc(n.ListApprovalsSubject(p)),
		svc(direct(n.EnvelopesBucket())),
		svc(direct(n.ExecutionsBucket())),
		{Account: capstanPub, Subject: jwt.Subject("$JS.API.DIRECT.GET.KV_" + n.CatalogBucket() + ".>"), Type: jwt.Service},
		{Account: capstanPub, Subject: jwt.Subject("$JS.API.STREAM.INFO.KV_" + n.CatalogBucket()), Type: jwt.Service},
		{Account: capstanPub, Subject: jwt.Subject(n.EnvelopeSubjectsOf(p)), Type: jwt.Stream, Token: token(n.EnvelopeSubjectsOf(p), jwt.Stream)},
	}
}

// startSpikeServer writes a nats-server configuration with a memory resolver
// preloaded with the accounts and starts an embedded JetStream server on it.
func startSpikeServer(t *testing.T, oneAccount, fullResolver bool) *spikeLayout {
	t.Helper()
	l := &spikeLayout{n: broker.NewNames("")}
	okp, err := nkeys.CreateOperator()
	if err != nil {
		t.Fatal(err)
	}
	opub, _ := okp.PublicKey()
	newAccount := func() (nkeys.KeyPair, string) {
		kp, err := nkeys.CreateAccount()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		return kp, pub
	}
	encode := func(c *jwt.AccountClaims) string {
		s, err := c.Encode(okp)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	l.operator = okp
	var sysPub string
	l.sysKP, sysPub = newAccount()
	l.capstanKP, l.capstanPub = newAccount()
	sys := jwt.NewAccountClaims(sysPub)
	sys.Name = "SYS"
	capstan := jwt.NewAccountClaims(l.capstanPub)
	capstan.Name = "CAPSTAN"
	capstan.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: jwt.NoLimit, DiskStorage: jwt.NoLimit,
		Streams: jwt.NoLimit, Consumer: jwt.NoLimit, MaxAckPending: jwt.NoLimit}
	accounts := map[string]string{}
	l.accounts = accounts
	if oneAccount {
		l.aliceKP, l.alicePub = l.capstanKP, l.capstanPub
	} else {
		capstan.Exports = spikeExports(l.n)
		l.aliceKP, l.alicePub = newAccount()
		alice := jwt.NewAccountClaims(l.alicePub)
		alice.Name = "alice" // no JetStream of its own
		alice.Imports = spikeImports(t, l.n, l.capstanKP, l.capstanPub, l.alicePub, "alice")
		accounts[l.alicePub] = encode(alice)
	}
	accounts[sysPub], accounts[l.capstanPub] = encode(sys), encode(capstan)
	oc := jwt.NewOperatorClaims(opub)
	oc.SystemAccount = sysPub
	l.conf = filepath.Join(t.TempDir(), "nats-server.conf")
	resolver := "MEMORY"
	if fullResolver {
		// The server keeps the account JWTs in a directory and takes new
		// ones pushed by a user of the system account.
		resolver = fmt.Sprintf("{ type: full, dir: %q, allow_delete: true }", filepath.Join(t.TempDir(), "jwt"))
	}
	l.confHead = fmt.Sprintf("operator: %q\nsystem_account: %s\nresolver: %s\n", encode2(t, oc, okp), sysPub, resolver)
	l.writeConf(t)
	// The server's options: the configuration file's, read again at every
	// reload, and the same listener and store each time.
	store := t.TempDir()
	l.opts = func() *server.Options {
		o, err := server.ProcessConfigFile(l.conf)
		if err != nil {
			t.Fatal(err)
		}
		o.ServerName, o.Host, o.Port, o.NoSigs = "spike", "127.0.0.1", -1, true
		o.JetStream, o.StoreDir = true, store
		return o
	}
	s, err := server.NewServer(l.opts())
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("the server never accepted clients")
	}
	l.srv, l.url = s, s.ClientURL()
	// alice's user: today's producer permissions (own subjects, own inbox
	// and envelopes), in either layout.
	var perms jwt.Permissions
	perms.Pub.Allow.Add(l.n.ExecSubject("alice", ">"), l.n.CancelSubject("alice", "*"), l.n.DescribeSubject("alice"),
		l.n.ListApprovalsSubject("alice"),
		"$JS.API.DIRECT.GET.KV_"+l.n.EnvelopesBucket()+".$KV."+l.n.EnvelopesBucket()+".alice.>",
		"$JS.API.DIRECT.GET.KV_"+l.n.ExecutionsBucket()+".$KV."+l.n.ExecutionsBucket()+".alice.>",
		"$JS.API.STREAM.INFO.KV_"+l.n.CatalogBucket(),
		"$JS.API.DIRECT.GET.KV_"+l.n.CatalogBucket()+".$KV."+l.n.CatalogBucket()+".>")
	perms.Sub.Allow.Add(l.n.InboxPrefix("alice")+".>", l.n.EnvelopeSubjectsOf("alice"))
	l.aliceUser = perms
	return l
}

func encode2(t *testing.T, oc *jwt.OperatorClaims, okp nkeys.KeyPair) string {
	t.Helper()
	s, err := oc.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// connect connects a user named name, signed by akp, with perms.
func (l *spikeLayout) connect(t *testing.T, akp nkeys.KeyPair, name string, perms *jwt.Permissions) *nats.Conn {
	t.Helper()
	ukp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	upub, _ := ukp.PublicKey()
	useed, _ := ukp.Seed()
	uc := jwt.NewUserClaims(upub)
	uc.Name = name
	if perms != nil {
		uc.Permissions = *perms
	}
	ujwt, err := uc.Encode(akp)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(l.url, nats.UserJWTAndSeed(ujwt, string(useed)),
		nats.CustomInboxPrefix(l.n.InboxPrefix(name)), nats.MaxReconnects(0),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { t.Logf("%s: async error: %v", name, err) }))
	if err != nil {
		t.Fatalf("connect %s: %v", name, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// spikeRig is the layout with capstan's resources provisioned by an admin of
// the capstan account, one envelope of alice's stored, and alice connected.
type spikeRig struct {
	*spikeLayout
	admin    *broker.Broker
	adminNC  *nats.Conn
	grants   jetstream.KeyValue
	aliceNC  *nats.Conn
	envKey   string // alice's envelope, in the envelopes bucket
	envValue []byte
	notified chan *nats.Msg // alice's envelope notifications
	streams  []string
}

func newSpikeRig(t *testing.T, ctx context.Context, oneAccount bool) *spikeRig {
	t.Helper()
	r := &spikeRig{spikeLayout: startSpikeServer(t, oneAccount, false), notified: make(chan *nats.Msg, 64)}
	n := r.n
	r.adminNC = r.connect(t, r.capstanKP, "admin", nil)
	var err error
	if r.admin, err = broker.Provision(ctx, r.adminNC, broker.Config{}); err != nil {
		t.Fatal(err)
	}
	if r.grants, err = r.admin.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: n.GrantsBucket()}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.grants.Put(ctx, "carol", []byte(`{"principal":"carol","role":"approver"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.admin.Catalog.Put(ctx, "t.echo", []byte(`{"id":"t.echo"}`)); err != nil {
		t.Fatal(err)
	}
	r.aliceNC = r.connect(t, r.aliceKP, "alice", &r.aliceUser)
	if _, err := r.aliceNC.ChanSubscribe(n.EnvelopeSubjectsOf("alice"), r.notified); err != nil {
		t.Fatal(err)
	}
	if err := r.aliceNC.Flush(); err != nil {
		t.Fatal(err)
	}
	r.envKey = broker.Key("alice", "01JSPIKE0000000000000000")
	r.envValue = []byte(`{"executionId":"01JSPIKE0000000000000000","status":"completed"}`)
	if _, err := r.admin.Envelopes.Put(ctx, r.envKey, r.envValue); err != nil {
		t.Fatal(err)
	}
	r.streams = []string{n.ExecStream(), n.AuditStream()}
	for _, b := range []string{n.EnvelopesBucket(), n.ExecutionsBucket(), n.ApprovalsBucket(), n.GrantsBucket(), n.CatalogBucket(), n.PoolsBucket()} {
		r.streams = append(r.streams, "KV_"+b)
	}
	return r
}

func (r *spikeRig) directGet(bucket, key string) string {
	return "$JS.API.DIRECT.GET.KV_" + bucket + ".$KV." + bucket + "." + key
}

// lastSeqs reads every stream's last sequence, as the admin sees it.
func (r *spikeRig) lastSeqs(t *testing.T, ctx context.Context) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, name := range r.streams {
		s, err := r.admin.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = info.State.LastSeq
	}
	return out
}

// barrier returns once every answer alice asked for before it was sent and
// every message sent to the admin before it arrived: a stream answers its
// direct gets and acknowledges its publishes in order, and the admin's
// flush returns after whatever the server queued to it before.
func (r *spikeRig) barrier(t *testing.T, ctx context.Context) {
	t.Helper()
	n := r.n
	if _, err := r.aliceNC.RequestWithContext(ctx, r.directGet(n.EnvelopesBucket(), r.envKey), nil); err != nil {
		t.Fatalf("alice's own direct get: %v", err)
	}
	if _, err := r.aliceNC.RequestWithContext(ctx, r.directGet(n.CatalogBucket(), "t.echo"), nil); err != nil {
		t.Fatalf("alice's own catalog get: %v", err)
	}
	// An acknowledged write of the admin's to every stream, after which
	// whatever was queued to a stream before it is stored.
	for _, name := range r.streams {
		var subject string
		switch name {
		case n.ExecStream():
			subject = n.ExecSubject("admin", "zz-sentinel")
		case n.AuditStream():
			subject = n.AuditSubject("zz-sentinel")
		default:
			b := strings.TrimPrefix(name, "KV_")
			subject = "$KV." + b + ".zz-sentinel"
		}
		if _, err := r.admin.JS.Publish(ctx, subject, []byte("sentinel")); err != nil {
			t.Fatalf("sentinel on %s: %v", subject, err)
		}
	}
	if err := r.adminNC.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
}

// forgeTargets are subjects of the capstan account that alice must never get
// the server to publish to.
func (r *spikeRig) forgeTargets() []string {
	n := r.n
	return []string{
		"$KV." + n.EnvelopesBucket() + "." + broker.Key("bob", "01JVICTIM000000000000000"),
		"$KV." + n.ExecutionsBucket() + "." + broker.Key("bob", "01JVICTIM000000000000000"),
		"$KV." + n.ApprovalsBucket() + ".01JAPPROVAL0000000000000",
		"$KV." + n.GrantsBucket() + ".carol",
		"$KV." + n.CatalogBucket() + ".t.refund",
		n.AuditSubject("01JVICTIM000000000000000"),
		n.ExecSubject("bob", "t.echo"),
		n.CancelNoticeSubject("bob", "01JVICTIM000000000000000"),
	}
}

// attack has alice name every forge target as the reply of each request she
// may make, and returns which targets got a message in the capstan account:
// a stream stored one (its last sequence grew by more than the barrier's
// sentinel), or an admin subscribed there received one.
func (r *spikeRig) attack(t *testing.T, ctx context.Context) []string {
	t.Helper()
	n := r.n
	targets := r.forgeTargets()
	var mu sync.Mutex
	seen := map[string]bool{}
	sub, err := r.adminNC.Subscribe(">", func(m *nats.Msg) {
		if slices.Contains(targets, m.Subject) {
			mu.Lock()
			seen[m.Subject] = true
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := r.adminNC.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	before := r.lastSeqs(t, ctx)
	requests := []struct {
		subject string
		body    []byte
	}{
		{r.directGet(n.EnvelopesBucket(), r.envKey), nil},
		{r.directGet(n.CatalogBucket(), "t.echo"), nil},
		{"$JS.API.STREAM.INFO.KV_" + n.CatalogBucket(), nil},
		// The stream's acknowledgement of alice's own request subject (a
		// body that is no request: a worker would terminate it).
		{n.ExecSubject("alice", "t.echo"), []byte{0xc1}},
	}
	for _, req := range requests {
		for _, reply := range targets {
			if err := r.aliceNC.PublishRequest(req.subject, reply, req.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	r.barrier(t, ctx)
	after := r.lastSeqs(t, ctx)
	mu.Lock()
	defer mu.Unlock()
	var landed []string
	for _, name := range r.streams {
		// The sentinel, and on the exec stream alice's own requests.
		want := before[name] + 1
		if name == n.ExecStream() {
			want += uint64(len(targets))
		}
		if after[name] != want {
			landed = append(landed, fmt.Sprintf("%s (+%d)", name, after[name]-want))
		}
	}
	for _, target := range targets {
		if seen[target] {
			landed = append(landed, target)
		}
	}
	slices.Sort(landed)
	return landed
}

// TestSpikeAccounts_ControlOneAccountRepliesLand is the control: in today's
// layout (alice's user in the capstan account), the answers alice aims at
// capstan's subjects are stored there. The attack and its measure are the
// ones the accounts layout must survive.
func TestSpikeAccounts_ControlOneAccountRepliesLand(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	r := newSpikeRig(t, ctx, true)
	landed := r.attack(t, ctx)
	t.Logf("one account: answers landed on %v", landed)
	for _, want := range []string{"KV_" + r.n.GrantsBucket(), r.n.AuditStream(), r.n.CancelNoticeSubject("bob", "01JVICTIM000000000000000")} {
		if !slices.ContainsFunc(landed, func(s string) bool { return strings.HasPrefix(s, want) }) {
			t.Errorf("the control did not see %s written: the attack or its measure is broken", want)
		}
	}
}

// TestSpikeAccounts_RepliesAimedAtCapstanSubjectsStayInThePrincipalsAccount
// is point (a): in its own account, alice names every bucket, audit, exec and
// cancel-notice subject of the capstan account as the reply of every request
// she may make; nothing reaches the capstan account.
func TestSpikeAccounts_RepliesAimedAtCapstanSubjectsStayInThePrincipalsAccount(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	r := newSpikeRig(t, ctx, false)
	if landed := r.attack(t, ctx); len(landed) > 0 {
		t.Errorf("alice's answers reached the capstan account: %v", landed)
	}
}

// requestInfo is the part of the server's Nats-Request-Info header the
// spike reads: the account a message entered the exporting account from.
type requestInfo struct {
	Account string `json:"acc"`
}

func requestInfoOf(m *nats.Msg) requestInfo {
	var ri requestInfo
	_ = json.Unmarshal([]byte(m.Header.Get("Nats-Request-Info")), &ri)
	return ri
}

// TestSpikeAccounts_NormalOperationsWorkAcrossImports is point (c): alice
// receives her envelope's notification, publishes a request and gets its
// acknowledgement, reads her own envelope and a catalog entry by key (direct
// gets, as the broker's by-key binding sends them), and cancels through a
// responder of the capstan account; she cannot read another principal's
// envelope. It also records that a JetStream API request other than a
// direct get (the catalog's stream information, which the KeyValue binding
// asks for) is not served across an import.
func TestSpikeAccounts_NormalOperationsWorkAcrossImports(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	r := newSpikeRig(t, ctx, false)
	n := r.n

	select {
	case m := <-r.notified:
		if m.Subject != n.SubjectPrefix()+".envelope."+r.envKey || string(m.Data) != string(r.envValue) {
			t.Errorf("notification %s %q", m.Subject, m.Data)
		}
		// The republish's header, by which a client knows the message
		// for the bucket's, crosses the import.
		if got, want := m.Header.Get(jetstream.SubjectHeader), "$KV."+n.EnvelopesBucket()+"."+r.envKey; got != want {
			t.Errorf("notification's %s header %q, want %q", jetstream.SubjectHeader, got, want)
		}
	case <-ctx.Done():
		t.Fatal("alice never received her envelope's notification")
	}

	// A request, acknowledged by the exec stream; a worker's subscription
	// in the capstan account sees it come from alice's account.
	seen, err := r.adminNC.SubscribeSync(n.ExecSubjects())
	if err != nil {
		t.Fatal(err)
	}
	if err := r.adminNC.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(r.aliceNC)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(ctx, n.ExecSubject("alice", "t.echo"), []byte(`{"v":1}`))
	if err != nil {
		t.Fatalf("alice's request: %v", err)
	}
	if ack.Stream != n.ExecStream() {
		t.Errorf("acknowledged by %q", ack.Stream)
	}
	stream, err := r.admin.JS.Stream(ctx, n.ExecStream())
	if err != nil {
		t.Fatal(err)
	}
	if m, err := stream.GetMsg(ctx, ack.Sequence); err != nil || m.Subject != n.ExecSubject("alice", "t.echo") || string(m.Data) != `{"v":1}` {
		t.Fatalf("stored request: %v %+v", err, m)
	}
	m, err := seen.NextMsg(time.Until(deadline(ctx)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(m.Reply, "_R_.") {
		t.Errorf("request's reply in the capstan account %q: not the server's response import", m.Reply)
	}
	if ri := requestInfoOf(m); ri.Account != r.alicePub {
		t.Errorf("request info names account %q, not alice's %q", ri.Account, r.alicePub)
	}

	// Her envelope and a catalog entry by key.
	for _, get := range []struct{ subject, want string }{
		{r.directGet(n.EnvelopesBucket(), r.envKey), string(r.envValue)},
		{r.directGet(n.CatalogBucket(), "t.echo"), `{"id":"t.echo"}`},
	} {
		m, err := r.aliceNC.RequestWithContext(ctx, get.subject, nil)
		if err != nil || string(m.Data) != get.want || m.Header.Get(jetstream.SequenceHeader) == "" {
			t.Errorf("%s: %v %+v", get.subject, err, m)
		}
	}
	// bob's envelope: her user may not ask; and even a user of her account
	// that may publish anything finds nobody to answer, since no import of
	// the account names it.
	all := ">"
	wide := r.connect(t, r.aliceKP, "wide", &jwt.Permissions{Pub: jwt.Permission{Allow: jwt.StringList{all}}, Sub: jwt.Permission{Allow: jwt.StringList{all}}})
	if _, err := wide.RequestWithContext(ctx, r.directGet(n.EnvelopesBucket(), broker.Key("bob", "x")), nil); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("bob's envelope asked for in alice's account: %v, want no responders", err)
	}
	// The catalog's stream information: her account, without JetStream,
	// gets the server's own import of the JetStream API too, which answers
	// first. (Direct gets are the exception the server makes.)
	if _, err := js.KeyValue(ctx, n.CatalogBucket()); err == nil || !strings.Contains(err.Error(), "not enabled for account") {
		t.Errorf("the catalog's KeyValue binding across an import: %v (the spike saw JetStream not enabled for account)", err)
	}

	// A cancel, served in the capstan account, answered to alice.
	sub, err := r.adminNC.Subscribe(n.CancelSubjects(), func(m *nats.Msg) {
		_ = m.Respond([]byte("ok " + m.Subject + " " + requestInfoOf(m).Account))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := r.adminNC.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	reply, err := r.aliceNC.RequestWithContext(ctx, n.CancelSubject("alice", "x1"), nil)
	if err != nil || string(reply.Data) != "ok "+n.CancelSubject("alice", "x1")+" "+r.alicePub {
		t.Fatalf("cancel: %v %v", err, reply)
	}
}

func deadline(ctx context.Context) time.Time {
	d, ok := ctx.Deadline()
	if !ok {
		return time.Now().Add(time.Minute)
	}
	return d
}

// TestSpikeAccounts_AnswerAimedAtAnotherImportOfThePrincipal is point (b):
// alice names one of her own imported subjects as the reply of a request
// through another import. The answer is delivered in alice's account, where
// that import's subscription matches it. What the server does next depends
// on the import: through an import with a wildcard the answer goes on under
// its response subject and reaches nothing; through a literal import it is
// forwarded into the capstan account on the import's subject, without a
// reply and with a request-info header naming the capstan account itself.
// Either way nothing reaches a subject outside alice's own imports, and no
// stream stores it.
func TestSpikeAccounts_AnswerAimedAtAnotherImportOfThePrincipal(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	r := newSpikeRig(t, ctx, false)
	n := r.n
	exec := n.ExecSubject("alice", "t.echo")
	stream, err := r.admin.JS.Stream(ctx, n.ExecStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := info.State.LastSeq

	// An observer in alice's account (a user that may subscribe to
	// anything there; a principal's own user may not) sees where the
	// answers arrive.
	all := ">"
	observer := r.connect(t, r.aliceKP, "observer", &jwt.Permissions{Sub: jwt.Permission{Allow: jwt.StringList{all}}, Pub: jwt.Permission{Deny: jwt.StringList{all}}})
	arrived, err := observer.SubscribeSync(all)
	if err != nil {
		t.Fatal(err)
	}
	if err := observer.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	// Everything under capstan's subjects in the capstan account.
	inCapstan, err := r.adminNC.SubscribeSync(n.SubjectPrefix() + ".>")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.adminNC.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}

	ownGet := r.directGet(n.EnvelopesBucket(), r.envKey)
	catalogGet := r.directGet(n.CatalogBucket(), "t.echo")
	wildcard := []string{exec, n.CancelSubject("alice", "x2"), ownGet, catalogGet}
	literal := []string{n.DescribeSubject("alice"), n.ListApprovalsSubject("alice")}
	requests := []struct {
		subject string
		body    []byte
	}{{ownGet, nil}, {catalogGet, nil}, {exec, []byte{0xc1}}}
	aimed := 0
	for _, req := range requests {
		for _, reply := range append(slices.Clone(wildcard), literal...) {
			if reply == req.subject {
				continue
			}
			if err := r.aliceNC.PublishRequest(req.subject, reply, req.body); err != nil {
				t.Fatal(err)
			}
			if req.subject == exec {
				aimed++
			}
		}
	}
	r.barrier(t, ctx)
	if err := observer.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}

	// The answers arrived in alice's account on the subjects she named.
	got := map[string]int{}
	for {
		m, err := arrived.NextMsg(0)
		if err != nil {
			break
		}
		got[m.Subject]++
	}
	for _, reply := range append(slices.Clone(wildcard), literal...) {
		if got[reply] == 0 {
			t.Errorf("no answer arrived in alice's account on %s", reply)
		}
	}

	// The exec stream stored alice's own requests and the sentinel only.
	info, err = stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for seq := before + 1; seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		own := m.Subject == exec && string(m.Data) == "\xc1"
		if !own && m.Subject != n.ExecSubject("admin", "zz-sentinel") {
			t.Errorf("the exec stream stored an answer as a request: #%d %s %q", seq, m.Subject, m.Data)
		}
	}
	if stored := info.State.LastSeq - before; stored != uint64(aimed)+1 {
		t.Errorf("exec stream: %d messages more, want alice's %d and the sentinel", stored, aimed)
	}

	// In the capstan account: alice's own requests (from her account, each
	// with a reply), the sentinels, and the answers she aimed at her
	// literal imports, forwarded without a reply and under the capstan
	// account's own name.
	forwarded := map[string]int{}
	for {
		m, err := inCapstan.NextMsg(0)
		if err != nil {
			break
		}
		ri := requestInfoOf(m)
		switch {
		case m.Subject == exec && string(m.Data) == "\xc1":
			if ri.Account != r.alicePub || m.Reply == "" {
				t.Errorf("alice's request arrived as %q with reply %q", ri.Account, m.Reply)
			}
		case strings.Contains(m.Subject, "zz-sentinel") || strings.HasPrefix(m.Subject, n.SubjectPrefix()+".audit."):
		case slices.Contains(literal, m.Subject):
			forwarded[m.Subject]++
			if m.Reply != "" {
				t.Errorf("an answer forwarded on %s has a reply %q", m.Subject, m.Reply)
			}
			if ri.Account != r.capstanPub {
				t.Errorf("forwarded on %s with request info of account %q, the spike saw the capstan account's", m.Subject, ri.Account)
			}
		default:
			t.Errorf("in the capstan account: %s %q (reply %q, from %q)", m.Subject, m.Data, m.Reply, ri.Account)
		}
	}
	t.Logf("answers forwarded into the capstan account: %v", forwarded)
	for _, s := range literal {
		if forwarded[s] == 0 {
			t.Errorf("no answer forwarded on the literal import %s: the server changed, revisit design §12", s)
		}
	}
}

// spikeBob is a principal added after the server started: its account, its
// user (allowed to read its own envelopes only) and the key it reads.
type spikeBob struct {
	account    *jwt.AccountClaims
	user       string // public key
	jwt, seed  string
	key        string
	closed     chan struct{}
	envelopeGS string
}

func newSpikeBob(t *testing.T, ctx context.Context, l *spikeLayout) *spikeBob {
	t.Helper()
	n := l.n
	adminNC := l.connect(t, l.capstanKP, "admin", nil)
	admin, err := broker.Provision(ctx, adminNC, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b := &spikeBob{key: broker.Key("bob", "01JSPIKEBOB0000000000000"), closed: make(chan struct{})}
	if _, err := admin.Envelopes.Put(ctx, b.key, []byte("bob's")); err != nil {
		t.Fatal(err)
	}
	b.envelopeGS = "$JS.API.DIRECT.GET.KV_" + n.EnvelopesBucket() + ".$KV." + n.EnvelopesBucket() + "." + b.key
	bobKP, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	bobPub, _ := bobKP.PublicKey()
	b.account = jwt.NewAccountClaims(bobPub)
	b.account.Name = "bob"
	b.account.Imports = spikeImports(t, n, l.capstanKP, l.capstanPub, bobPub, "bob")
	var perms jwt.Permissions
	perms.Pub.Allow.Add("$JS.API.DIRECT.GET.KV_" + n.EnvelopesBucket() + ".$KV." + n.EnvelopesBucket() + ".bob.>")
	perms.Sub.Allow.Add(n.InboxPrefix("bob") + ".>")
	ukp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	b.user, _ = ukp.PublicKey()
	useed, _ := ukp.Seed()
	b.seed = string(useed)
	uc := jwt.NewUserClaims(b.user)
	uc.Name = "bob"
	uc.Permissions = perms
	if b.jwt, err = uc.Encode(bobKP); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *spikeBob) accountJWT(t *testing.T, l *spikeLayout) string {
	t.Helper()
	j, err := b.account.Encode(l.operator)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// connectAndRead connects as bob, reads his envelope through his imports,
// and keeps the connection open until the server closes it.
func (b *spikeBob) connectAndRead(t *testing.T, ctx context.Context, l *spikeLayout) {
	t.Helper()
	nc, err := nats.Connect(l.url, nats.UserJWTAndSeed(b.jwt, b.seed), nats.CustomInboxPrefix(l.n.InboxPrefix("bob")),
		nats.NoReconnect(), nats.ClosedHandler(func(*nats.Conn) { close(b.closed) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { t.Logf("bob: %v", err) }))
	if err != nil {
		t.Fatalf("bob, added without a restart, cannot connect: %v", err)
	}
	t.Cleanup(nc.Close)
	m, err := nc.RequestWithContext(ctx, b.envelopeGS, nil)
	if err != nil || string(m.Data) != "bob's" {
		t.Fatalf("bob's envelope through his new account: %v %v", err, m)
	}
}

// revoke revokes every user of bob's issued up to now, in a new version of
// his account.
func (b *spikeBob) revoke() { b.account.RevokeAt(b.user, time.Now().Add(time.Second)) }

// refused waits until the server closed bob's connection, then checks that
// he cannot connect again.
func (b *spikeBob) refused(t *testing.T, ctx context.Context, l *spikeLayout) {
	t.Helper()
	select {
	case <-b.closed:
	case <-ctx.Done():
		t.Fatal("bob's connection outlived his revocation")
	}
	if nc, err := nats.Connect(l.url, nats.UserJWTAndSeed(b.jwt, b.seed), nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("bob's revoked user connected")
	}
}

// TestSpikeAccounts_PrincipalAddedAndRevokedByPushWithoutRestart: with the
// server's full account resolver, a principal's new account is pushed by a
// user of the system account and works at once (its imports included); its
// user, revoked in a new version of the account pushed the same way, is
// disconnected and refused. Neither the server nor the capstan account
// changes.
func TestSpikeAccounts_PrincipalAddedAndRevokedByPushWithoutRestart(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	l := startSpikeServer(t, false, true)
	bob := newSpikeBob(t, ctx, l)
	push := l.connect(t, l.sysKP, "push", nil)
	pushAccount := func() {
		t.Helper()
		m, err := push.RequestWithContext(ctx, "$SYS.REQ.CLAIMS.UPDATE", []byte(bob.accountJWT(t, l)))
		if err != nil {
			t.Fatal(err)
		}
		var reply struct {
			Data  struct{ Code int } `json:"data"`
			Error *struct {
				Description string `json:"description"`
			} `json:"error"`
		}
		if err := json.Unmarshal(m.Data, &reply); err != nil || reply.Error != nil || reply.Data.Code != 200 {
			t.Fatalf("push bob's account: %v %s", err, m.Data)
		}
	}
	pushAccount()
	bob.connectAndRead(t, ctx, l)
	bob.revoke()
	pushAccount()
	bob.refused(t, ctx, l)
}
