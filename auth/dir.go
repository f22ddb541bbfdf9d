package auth

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/capstan-dev/capstan/broker"
)

// Files of a setup directory. Seeds and credentials are written 0600.
const (
	StateFile        = "capstan-auth.json" // principals and grants, public keys and JWTs
	ServerConfigFile = "nats-server.conf"  // an official nats-server's configuration
	operatorSeedFile = "operator.nk"
	accountSeedFile  = "account.nk"
)

// Principals init creates.
const (
	AdminPrincipal  = "admin"
	WorkerPrincipal = "worker"
)

// ErrExists is returned by Init over an existing setup and by Add for a
// principal that exists.
var ErrExists = errors.New("capstan auth: already exists")

// Setup is a directory of generated credentials: an operator, the system
// account, one account holding capstan's streams and buckets, and a user per
// principal whose permissions are signed into its credentials. Adding a
// principal does not change the server's configuration: the server trusts the
// operator, and the account signs users.
type Setup struct {
	Dir string `json:"-"`
	V   int    `json:"v"`
	// Prefix names capstan's resources (default CAPSTAN).
	Prefix        string  `json:"prefix"`
	OperatorJWT   string  `json:"operatorJwt"`
	SystemAccount string  `json:"systemAccount"`
	SystemJWT     string  `json:"systemJwt"`
	Account       string  `json:"account"`
	AccountJWT    string  `json:"accountJwt"`
	Principals    []Grant `json:"principals"`
}

// Names returns the resource names of the setup.
func (s *Setup) Names() broker.Names { return broker.NewNames(s.Prefix) }

// CredsPath returns where principal's credentials are.
func (s *Setup) CredsPath(principal string) string {
	return filepath.Join(s.Dir, principal+".creds")
}

// ServerConfigPath returns the nats-server configuration's path.
func (s *Setup) ServerConfigPath() string { return filepath.Join(s.Dir, ServerConfigFile) }

// Grant returns principal's grant.
func (s *Setup) Grant(principal string) (Grant, bool) {
	for _, g := range s.Principals {
		if g.Principal == principal {
			return g, true
		}
	}
	return Grant{}, false
}

// Init creates a setup in dir (created if missing, 0700): operator, accounts,
// the admin and worker principals, their credentials and nats-server.conf.
func Init(dir, prefix string) (*Setup, error) {
	if _, err := os.Stat(filepath.Join(dir, StateFile)); err == nil {
		return nil, fmt.Errorf("%w: %s holds a setup", ErrExists, dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("capstan auth: %w", err)
	}
	s := &Setup{Dir: dir, V: 1, Prefix: broker.NewNames(prefix).SubjectPrefix()}
	okp, err := nkeys.CreateOperator()
	if err != nil {
		return nil, err
	}
	opub, _ := okp.PublicKey()
	sys, sysSeed, err := newAccount(okp, "SYS", false)
	if err != nil {
		return nil, err
	}
	acc, accSeed, err := newAccount(okp, strings.ToUpper(s.Prefix), true)
	if err != nil {
		return nil, err
	}
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "capstan"
	oc.SystemAccount = sys.Subject
	if s.OperatorJWT, err = oc.Encode(okp); err != nil {
		return nil, fmt.Errorf("capstan auth: sign operator: %w", err)
	}
	if s.SystemJWT, err = sys.Encode(okp); err != nil {
		return nil, fmt.Errorf("capstan auth: sign system account: %w", err)
	}
	if s.AccountJWT, err = acc.Encode(okp); err != nil {
		return nil, fmt.Errorf("capstan auth: sign account: %w", err)
	}
	s.SystemAccount, s.Account = sys.Subject, acc.Subject
	oseed, _ := okp.Seed()
	for name, seed := range map[string][]byte{operatorSeedFile: oseed, accountSeedFile: accSeed} {
		if err := os.WriteFile(filepath.Join(dir, name), seed, 0o600); err != nil {
			return nil, fmt.Errorf("capstan auth: %w", err)
		}
	}
	_ = sysSeed // the system account signs no users; its key is not kept
	if err := s.writeServerConfig(); err != nil {
		return nil, err
	}
	for _, g := range []Grant{
		{Principal: AdminPrincipal, Role: Admin},
		{Principal: WorkerPrincipal, Role: Worker},
	} {
		if err := s.Add(g); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func newAccount(okp nkeys.KeyPair, name string, jetStream bool) (*jwt.AccountClaims, []byte, error) {
	akp, err := nkeys.CreateAccount()
	if err != nil {
		return nil, nil, err
	}
	pub, _ := akp.PublicKey()
	seed, _ := akp.Seed()
	ac := jwt.NewAccountClaims(pub)
	ac.Name = name
	if jetStream {
		ac.Limits.JetStreamLimits = jwt.JetStreamLimits{
			MemoryStorage: jwt.NoLimit, DiskStorage: jwt.NoLimit,
			Streams: jwt.NoLimit, Consumer: jwt.NoLimit, MaxAckPending: jwt.NoLimit,
		}
	}
	return ac, seed, nil
}

// Load reads the setup in dir.
func Load(dir string) (*Setup, error) {
	b, err := os.ReadFile(filepath.Join(dir, StateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("capstan auth: %s holds no setup (run capstan auth init %s)", dir, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("capstan auth: %w", err)
	}
	s := &Setup{}
	if err := json.Unmarshal(b, s); err != nil {
		return nil, fmt.Errorf("capstan auth: %s: %w", StateFile, err)
	}
	s.Dir = dir
	return s, nil
}

// Add creates a principal: its user, signed by the account with the
// permissions of its grant, and DIR/<principal>.creds. The server needs no
// change; workers learn the grant once it is published (see PublishGrants).
func (s *Setup) Add(g Grant) error {
	g.V = 1
	if err := g.Validate(); err != nil {
		return fmt.Errorf("capstan auth: principal %q: %w", g.Principal, err)
	}
	if _, ok := s.Grant(g.Principal); ok {
		return fmt.Errorf("%w: principal %q", ErrExists, g.Principal)
	}
	seed, err := os.ReadFile(filepath.Join(s.Dir, accountSeedFile))
	if err != nil {
		return fmt.Errorf("capstan auth: account key: %w", err)
	}
	akp, err := nkeys.FromSeed(seed)
	if err != nil {
		return fmt.Errorf("capstan auth: account key: %w", err)
	}
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return err
	}
	upub, _ := ukp.PublicKey()
	useed, _ := ukp.Seed()
	uc := jwt.NewUserClaims(upub)
	uc.Name = g.Principal
	uc.Tags.Add(roleTag + string(g.Role))
	uc.Permissions = PermissionsFor(g, s.Names()).jwt()
	ujwt, err := uc.Encode(akp)
	if err != nil {
		return fmt.Errorf("capstan auth: sign principal %q: %w", g.Principal, err)
	}
	creds, err := jwt.FormatUserConfig(ujwt, useed)
	if err != nil {
		return err
	}
	if err := os.WriteFile(s.CredsPath(g.Principal), creds, 0o600); err != nil {
		return fmt.Errorf("capstan auth: %w", err)
	}
	g.PublicKey = upub
	s.Principals = append(s.Principals, g)
	slices.SortFunc(s.Principals, func(a, b Grant) int { return strings.Compare(a.Principal, b.Principal) })
	return s.save()
}

func (s *Setup) save() error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(s.Dir, StateFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("capstan auth: %w", err)
	}
	return os.Rename(tmp, filepath.Join(s.Dir, StateFile))
}

// writeServerConfig writes nats-server.conf: the operator, both accounts
// preloaded in a memory resolver. Ports, JetStream and its store directory are
// left to the command line (nats-server -c nats-server.conf -p 4222 -js -sd DIR).
func (s *Setup) writeServerConfig() error {
	conf := fmt.Sprintf(`# Generated by capstan auth init: regenerate rather than edit.
# nats-server -c nats-server.conf -p 4222 -js -sd /var/lib/capstan
operator: %q
system_account: %s
resolver: MEMORY
resolver_preload: {
  %s: %q
  %s: %q
}
`, s.OperatorJWT, s.SystemAccount, s.SystemAccount, s.SystemJWT, s.Account, s.AccountJWT)
	return os.WriteFile(s.ServerConfigPath(), []byte(conf), 0o644)
}

// PrincipalFromCreds returns the principal named in a credentials file.
func PrincipalFromCreds(path string) (string, error) { return broker.PrincipalFromCreds(path) }

// CheckPublish reports, from the permissions signed into a credentials file,
// whether its principal may publish to subject: nil, or an error naming the
// principal, its role and the subject. The server enforces the same
// permissions; this only lets a command refuse at once, with a clear message,
// what the server would refuse silently.
func CheckPublish(credsPath, subject string) error {
	b, err := os.ReadFile(credsPath)
	if err != nil {
		return fmt.Errorf("capstan: credentials file: %w", err)
	}
	tok, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return fmt.Errorf("capstan: credentials file %s: %w", credsPath, err)
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return fmt.Errorf("capstan: credentials file %s: %w", credsPath, err)
	}
	allowed := MayPublish(uc, subject)
	if allowed {
		return nil
	}
	role := "principal"
	for _, tag := range uc.Tags {
		if r, ok := strings.CutPrefix(tag, roleTag); ok {
			role = r
		}
	}
	return fmt.Errorf("%w: %s %q may not publish to %s", ErrNotPermitted, role, uc.Name, subject)
}

// RoleFromCreds returns the role signed into a credentials file's tags, or
// "" for credentials capstan did not make.
func RoleFromCreds(credsPath string) (Role, error) {
	b, err := os.ReadFile(credsPath)
	if err != nil {
		return "", fmt.Errorf("capstan: credentials file: %w", err)
	}
	tok, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return "", fmt.Errorf("capstan: credentials file %s: %w", credsPath, err)
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return "", fmt.Errorf("capstan: credentials file %s: %w", credsPath, err)
	}
	for _, tag := range uc.Tags {
		if r, ok := strings.CutPrefix(tag, roleTag); ok {
			return Role(r), nil
		}
	}
	return "", nil
}

// MayPublish reads a user JWT's publish permissions as the server applies
// them: no allow list allows everything, a deny wins.
func MayPublish(c *jwt.UserClaims, subject string) bool {
	ok := len(c.Permissions.Pub.Allow) == 0
	for _, a := range c.Permissions.Pub.Allow {
		if broker.SubjectMatches(subject, a) {
			ok = true
			break
		}
	}
	for _, d := range c.Permissions.Pub.Deny {
		if broker.SubjectMatches(subject, d) {
			ok = false
		}
	}
	return ok
}

// ErrNotPermitted: the credentials do not allow what was asked.
var ErrNotPermitted = errors.New("capstan: not permitted")

// roleTag prefixes the tag that names a principal's role in its credentials.
const roleTag = "capstan-role:"

// Remove revokes a principal: its user is revoked in the account (a server
// started or reloaded with the rewritten nats-server.conf refuses its
// credentials), its credentials file is deleted, and its grant leaves the
// setup (the next PublishGrants removes it from the bucket, after which
// workers refuse anything it sent). The admin and worker principals stay.
func (s *Setup) Remove(principal string) error {
	g, ok := s.Grant(principal)
	if !ok {
		return fmt.Errorf("capstan auth: no principal %q", principal)
	}
	if principal == AdminPrincipal || principal == WorkerPrincipal {
		return fmt.Errorf("capstan auth: principal %q is the setup's own", principal)
	}
	seed, err := os.ReadFile(filepath.Join(s.Dir, operatorSeedFile))
	if err != nil {
		return fmt.Errorf("capstan auth: operator key: %w", err)
	}
	okp, err := nkeys.FromSeed(seed)
	if err != nil {
		return fmt.Errorf("capstan auth: operator key: %w", err)
	}
	ac, err := jwt.DecodeAccountClaims(s.AccountJWT)
	if err != nil {
		return fmt.Errorf("capstan auth: account: %w", err)
	}
	// Revoked from the next second: credentials issued up to now are refused.
	ac.RevokeAt(g.PublicKey, time.Now().Add(time.Second))
	if s.AccountJWT, err = ac.Encode(okp); err != nil {
		return fmt.Errorf("capstan auth: sign account: %w", err)
	}
	s.Principals = slices.DeleteFunc(s.Principals, func(x Grant) bool { return x.Principal == principal })
	if err := s.writeServerConfig(); err != nil {
		return err
	}
	if err := s.save(); err != nil {
		return err
	}
	if err := os.Remove(s.CredsPath(principal)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("capstan auth: %w", err)
	}
	return nil
}
