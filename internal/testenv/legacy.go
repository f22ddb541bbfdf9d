package testenv

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/credfile"
)

// LegacySetup writes, in dir, a setup of the one-account layout (v1) that
// capstan auth init and add wrote before accounts per principal: an
// operator, a system account whose key is not kept, the capstan account, and
// every principal of grants (besides admin and worker) a user of the
// capstan account; nats-server.conf with both accounts preloaded in a memory
// resolver. It is what auth.Migrate moves; tests start a server on it with
// Auth, as a deployment of that version ran.
func LegacySetup(t testing.TB, dir string, grants ...auth.Grant) *auth.Setup {
	t.Helper()
	fail := func(err error) {
		if err != nil {
			t.Fatalf("testenv: legacy setup: %v", err)
		}
	}
	fail(os.MkdirAll(dir, 0o700))
	s := &auth.Setup{Dir: dir, V: 1, Prefix: broker.NewNames("").SubjectPrefix()}
	okp, err := nkeys.CreateOperator()
	fail(err)
	opub, _ := okp.PublicKey()
	account := func(name string, jetStream bool) (nkeys.KeyPair, string) {
		kp, err := nkeys.CreateAccount()
		fail(err)
		pub, _ := kp.PublicKey()
		ac := jwt.NewAccountClaims(pub)
		ac.Name = name
		if jetStream {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: jwt.NoLimit, DiskStorage: jwt.NoLimit,
				Streams: jwt.NoLimit, Consumer: jwt.NoLimit, MaxAckPending: jwt.NoLimit}
		}
		j, err := ac.Encode(okp)
		fail(err)
		return kp, j
	}
	sysKP, sysJWT := account("SYS", false)
	accKP, accJWT := account(strings.ToUpper(s.Prefix), true)
	s.SystemAccount, _ = sysKP.PublicKey()
	s.Account, _ = accKP.PublicKey()
	s.SystemJWT, s.AccountJWT = sysJWT, accJWT
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "capstan"
	oc.SystemAccount = s.SystemAccount
	s.OperatorJWT, err = oc.Encode(okp)
	fail(err)
	oseed, _ := okp.Seed()
	aseed, _ := accKP.Seed()
	fail(os.WriteFile(filepath.Join(dir, "operator.nk"), oseed, 0o600))
	fail(os.WriteFile(filepath.Join(dir, "account.nk"), aseed, 0o600))
	all := append([]auth.Grant{{Principal: auth.AdminPrincipal, Role: auth.RoleAdmin}, {Principal: auth.WorkerPrincipal, Role: auth.RoleWorker}}, grants...)
	for _, g := range all {
		g.V = 1
		ukp, err := nkeys.CreateUser()
		fail(err)
		upub, _ := ukp.PublicKey()
		useed, _ := ukp.Seed()
		uc := jwt.NewUserClaims(upub)
		uc.Name = g.Principal
		uc.Tags.Add("capstan-role:" + string(g.Role))
		p := s.Permissions(g)
		uc.Permissions.Pub.Allow.Add(p.PublishAllow...)
		uc.Permissions.Pub.Deny.Add(p.PublishDeny...)
		uc.Permissions.Sub.Allow.Add(p.SubscribeAllow...)
		uc.Permissions.Sub.Deny.Add(p.SubscribeDeny...)
		ujwt, err := uc.Encode(accKP)
		fail(err)
		creds, err := jwt.FormatUserConfig(ujwt, useed)
		fail(err)
		fail(os.WriteFile(s.CredsPath(g.Principal), creds, 0o600))
		g.PublicKey = upub
		s.Principals = append(s.Principals, g)
	}
	b, err := json.MarshalIndent(s, "", "  ")
	fail(err)
	fail(os.WriteFile(filepath.Join(dir, credfile.StateFile), append(b, '\n'), 0o600))
	conf := fmt.Sprintf("operator: %q\nsystem_account: %s\nresolver: MEMORY\nresolver_preload: {\n  %s: %q\n  %s: %q\n}\n",
		s.OperatorJWT, s.SystemAccount, s.SystemAccount, s.SystemJWT, s.Account, s.AccountJWT)
	fail(os.WriteFile(s.ServerConfigPath(), []byte(conf), 0o644))
	return s
}
