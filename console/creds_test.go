package console_test

import (
	"bytes"
	"mime/multipart"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/console"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// operatorServer starts a JetStream server in operator mode with one account
// and returns its URL and a function that issues a user's .creds in it.
func operatorServer(t *testing.T) (string, func(name string, bearer bool) []byte) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	okp, err := nkeys.CreateOperator()
	must(err)
	opub, _ := okp.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "capstan-test"
	ojwt, err := oc.Encode(okp)
	must(err)
	op, err := jwt.DecodeOperatorClaims(ojwt)
	must(err)

	sysKP, _ := nkeys.CreateAccount()
	sysPub, _ := sysKP.PublicKey()
	sc := jwt.NewAccountClaims(sysPub)
	sc.Name = "SYS"
	sysJWT, err := sc.Encode(okp)
	must(err)

	akp, _ := nkeys.CreateAccount()
	apub, _ := akp.PublicKey()
	ac := jwt.NewAccountClaims(apub)
	ac.Name = "capstan"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	ajwt, err := ac.Encode(okp)
	must(err)

	res := &server.MemAccResolver{}
	must(res.Store(sysPub, sysJWT))
	must(res.Store(apub, ajwt))
	opts := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
		TrustedOperators: []*jwt.OperatorClaims{op}, AccountResolver: res, SystemAccount: sysPub}
	s, err := server.NewServer(opts)
	must(err)
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })

	issue := func(name string, bearer bool) []byte {
		ukp, _ := nkeys.CreateUser()
		upub, _ := ukp.PublicKey()
		uc := jwt.NewUserClaims(upub)
		uc.Name = name
		uc.BearerToken = bearer
		ujwt, err := uc.Encode(akp)
		must(err)
		if bearer {
			return []byte(ujwt)
		}
		seed, _ := ukp.Seed()
		creds, err := jwt.FormatUserConfig(ujwt, seed)
		must(err)
		return creds
	}
	return s.ClientURL(), issue
}

// A principal signs in with its .creds file, pasted or uploaded, or with a
// bearer token, and decides
// as the user its credentials name; credentials the server does not trust
// are refused.
func TestSignIn_WithCredentialsFile(t *testing.T) {
	t.Parallel()
	natsURL, issue := operatorServer(t)
	workerCreds := issue("worker", false)
	jwtStr, _ := nkeys.ParseDecoratedJWT(workerCreds)
	kp, _ := nkeys.ParseDecoratedUserNKey(workerCreds)
	seed, _ := kp.Seed()
	r := startRig(t, natsURL, console.Config{}, nats.UserJWTAndSeed(jwtStr, string(seed)))
	env := r.call(t, "orders.refund", refund(900), alice)
	if env.Status != envelope.StatusApprovalRequired {
		t.Fatalf("status %s, want approval-required", env.Status)
	}

	// Credentials signed by a stranger's account.
	_, strangerIssue := operatorServer(t)
	w := newWeb(t, r.base)
	status, _, body := w.post("/signin", url.Values{"creds": {string(strangerIssue("mallory", false))}})
	if status != http.StatusUnauthorized {
		t.Fatalf("foreign credentials: %d, want 401", status)
	}
	contains(t, "the refusal", body, "sign-in refused")
	if _, path, _ := w.get("/approvals"); path != "/signin" {
		t.Fatal("foreign credentials opened a session")
	}

	// Pasted.
	carol := newWeb(t, r.base)
	if _, path, body := carol.post("/signin", url.Values{"creds": {string(issue("carol", false))}, "next": {"/approvals"}}); path != "/approvals" {
		t.Fatalf("pasted credentials ended at %s:\n%s", path, body)
	} else {
		contains(t, "carol's inbox", body, "carol", env.Approval.ID)
	}

	// A bearer token.
	dave := newWeb(t, r.base)
	if _, path, body := dave.post("/signin", url.Values{"creds": {string(issue("dave", true))}, "next": {"/approvals"}}); path != "/approvals" {
		t.Fatalf("a bearer token ended at %s:\n%s", path, body)
	} else {
		contains(t, "dave's inbox", body, "dave", env.Approval.ID)
	}
	// A token that is not a bearer token needs its key.
	notBearer, _ := nkeys.ParseDecoratedJWT(issue("erin", false))
	if status, _, body := newWeb(t, r.base).post("/signin", url.Values{"creds": {notBearer}}); status != http.StatusUnauthorized {
		t.Fatalf("a user JWT without its key: %d, want 401:\n%s", status, body)
	}

	// Uploaded, then decided as the user the credentials name.
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	fw, _ := mw.CreateFormFile("credsfile", "bob.creds")
	_, _ = fw.Write(issue("bob", false))
	_ = mw.WriteField("next", "/approvals")
	_ = mw.Close()
	bobWeb := newWeb(t, r.base)
	resp, err := bobWeb.c.Post(r.base+"/signin", mw.FormDataContentType(), &form)
	if err != nil {
		t.Fatal(err)
	}
	status, path, body := bobWeb.read(resp)
	if status != http.StatusOK || path != "/approvals" {
		t.Fatalf("uploaded credentials: %d at %s:\n%s", status, path, body)
	}
	contains(t, "bob's inbox", body, `id="principal"`, "bob", env.Approval.ID)
}
