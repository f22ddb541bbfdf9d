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

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/credfile"
)

// Files of a setup directory beside credfile's. Seeds and credentials are
// written 0600.
const (
	operatorSeedFile = "operator.nk"
	accountSeedFile  = "account.nk" // the capstan account's
	systemSeedFile   = "sys.nk"
	accountSeedExt   = ".account.nk" // a principal's own account: NAME.account.nk
)

// Principals init creates.
const (
	AdminPrincipal  = "admin"
	WorkerPrincipal = "worker"
	// PushUser is the system account's user that pushes account JWTs to a
	// running server (DIR/push.creds); it is no principal of capstan's.
	PushUser = "push"
)

// setupVersion is the layout Init writes: an account per producer and
// approver (DESIGN §12 "Accounts per principal"). Version 1, every principal
// a user of the capstan account, is moved by Migrate.
const setupVersion = 2

// ErrExists is returned by Init over an existing setup and by Add for a
// principal that exists.
var ErrExists = errors.New("capstan auth: already exists")

// ErrNeedsMigration is returned for a setup of an earlier layout by what
// needs the current one.
var ErrNeedsMigration = errors.New("capstan auth: setup of an earlier layout")

// Setup is a directory of generated credentials: an operator; the system
// account and its push user; the capstan account, which holds every stream
// and bucket and whose users are the admins and workers; and an account of
// its own for every producer and approver, which imports from the capstan
// account only its own subjects (see crossings). The server trusts the
// operator and learns a principal's account when it is pushed (Push), with
// no restart.
type Setup struct {
	// Dir is the directory the setup lives in (not stored).
	Dir string `json:"-"`
	// V is the setup file's schema version.
	V int `json:"v"`
	// Prefix names capstan's resources (default CAPSTAN).
	Prefix string `json:"prefix"`
	// OperatorJWT is the operator the servers trust.
	OperatorJWT string `json:"operatorJwt"`
	// SystemAccount and SystemJWT are the system account's key and JWT.
	SystemAccount string `json:"systemAccount"`
	SystemJWT     string `json:"systemJwt"` // see SystemAccount
	// Account is the capstan account's public key; JetStream keeps its
	// streams under it.
	Account string `json:"account"`
	// AccountJWT is the capstan account's JWT.
	AccountJWT string `json:"accountJwt"`
	// ResolverDir is where an official nats-server keeps pushed account
	// JWTs (its full resolver's directory).
	ResolverDir string `json:"resolverDir,omitempty"`
	// Principals are the grants of every principal added.
	Principals []Grant `json:"principals"`
	// Removed are accounts of principals removed since: each revokes its
	// user, and every push sends it again so that no server keeps an older
	// version.
	Removed []RemovedAccount `json:"removed,omitempty"`
}

// RemovedAccount is the last version of a removed principal's account.
type RemovedAccount struct {
	// Principal is the removed principal's name.
	Principal string `json:"principal"`
	// Account and AccountJWT are its account's key and last JWT.
	Account    string `json:"account"`
	AccountJWT string `json:"accountJwt"` // the JWT that revokes the removed user, pushed again with every push
	// RemovedAt is when it was removed.
	RemovedAt time.Time `json:"removedAt"`
}

// names returns the resource names of the setup.
func (s *Setup) names() broker.Names { return broker.NewNames(s.Prefix) }

// CredsPath returns where principal's credentials are.
func (s *Setup) CredsPath(principal string) string {
	return filepath.Join(s.Dir, principal+".creds")
}

// PushCredsPath returns where the push user's credentials are.
func (s *Setup) PushCredsPath() string { return s.CredsPath(PushUser) }

// ServerConfigPath returns the nats-server configuration's path.
func (s *Setup) ServerConfigPath() string { return filepath.Join(s.Dir, credfile.ServerConfigFile) }

// Grant returns principal's grant.
func (s *Setup) Grant(principal string) (Grant, bool) {
	for _, g := range s.Principals {
		if g.Principal == principal {
			return g, true
		}
	}
	return Grant{}, false
}

// Current returns nil for a setup of the current layout, and otherwise an
// error wrapping ErrNeedsMigration that says what to run.
func (s *Setup) Current() error {
	if s.V == setupVersion {
		return nil
	}
	if s.V < setupVersion {
		return fmt.Errorf("%w (v%d, every principal in one account): run 'capstan auth migrate %s' first, "+
			"which gives producers and approvers accounts of their own and new credentials", ErrNeedsMigration, s.V, s.Dir)
	}
	return fmt.Errorf("capstan auth: %s holds a setup of layout v%d, newer than this capstan knows (v%d)", s.Dir, s.V, setupVersion)
}

// Init creates a setup in dir (created if missing, 0700): the operator, the
// system account and its push user, the capstan account, the admin and
// worker principals, their credentials and nats-server.conf.
func Init(dir, prefix string) (*Setup, error) {
	if _, err := os.Stat(filepath.Join(dir, credfile.StateFile)); err == nil {
		return nil, fmt.Errorf("%w: %s holds a setup", ErrExists, dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("capstan auth: %w", err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("capstan auth: %w", err)
	}
	s := &Setup{Dir: dir, V: setupVersion, Prefix: broker.NewNames(prefix).SubjectPrefix(),
		ResolverDir: filepath.Join(abs, credfile.ResolverDirName)}
	okp, err := nkeys.CreateOperator()
	if err != nil {
		return nil, err
	}
	akp, err := nkeys.CreateAccount()
	if err != nil {
		return nil, err
	}
	s.Account, _ = akp.PublicKey()
	k := &keys{operator: okp, account: akp}
	if err := s.newSystemAccount(k); err != nil {
		return nil, err
	}
	if err := s.signCapstanAccount(k, nil); err != nil {
		return nil, err
	}
	oseed, _ := okp.Seed()
	aseed, _ := akp.Seed()
	for name, seed := range map[string][]byte{operatorSeedFile: oseed, accountSeedFile: aseed} {
		if err := writeSecret(filepath.Join(dir, name), seed); err != nil {
			return nil, err
		}
	}
	if err := s.writePushCreds(k); err != nil {
		return nil, err
	}
	if err := s.writeServerConfig(); err != nil {
		return nil, err
	}
	for _, g := range []Grant{
		{Principal: AdminPrincipal, Role: RoleAdmin},
		{Principal: WorkerPrincipal, Role: RoleWorker},
	} {
		if err := s.add(k, g); err != nil {
			return nil, err
		}
	}
	return s, s.save()
}

// keys are the signing keys a change of the setup needs.
type keys struct {
	operator, account, system nkeys.KeyPair
}

// loadKeys reads the operator's, the capstan account's and (when kept) the
// system account's seeds.
func (s *Setup) loadKeys() (*keys, error) {
	k := &keys{}
	var err error
	if k.operator, err = readSeed(filepath.Join(s.Dir, operatorSeedFile)); err != nil {
		return nil, fmt.Errorf("capstan auth: operator key: %w", err)
	}
	if k.account, err = readSeed(filepath.Join(s.Dir, accountSeedFile)); err != nil {
		return nil, fmt.Errorf("capstan auth: account key: %w", err)
	}
	if k.system, err = readSeed(filepath.Join(s.Dir, systemSeedFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("capstan auth: system account key: %w", err)
	}
	return k, nil
}

func readSeed(path string) (nkeys.KeyPair, error) {
	if err := broker.CheckPrivate(path); err != nil {
		return nil, err
	}
	seed, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return nkeys.FromSeed(seed)
}

// writeSecret writes a seed or credentials file, readable by its owner only,
// through a temporary file so that a crash never leaves half of one.
func writeSecret(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("capstan auth: %w", err)
	}
	if err := os.Chmod(tmp, 0o600); err != nil { // an existing .tmp keeps its mode through WriteFile
		return fmt.Errorf("capstan auth: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("capstan auth: %w", err)
	}
	return nil
}

// newSystemAccount creates the system account, keeps its seed and re-signs
// the operator naming it.
func (s *Setup) newSystemAccount(k *keys) error {
	skp, err := nkeys.CreateAccount()
	if err != nil {
		return err
	}
	seed, _ := skp.Seed()
	if err := writeSecret(filepath.Join(s.Dir, systemSeedFile), seed); err != nil {
		return err
	}
	k.system = skp
	return s.signSystemAccount(k)
}

// signSystemAccount signs the system account (k.system) and the operator
// naming it.
func (s *Setup) signSystemAccount(k *keys) error {
	var err error
	s.SystemAccount, _ = k.system.PublicKey()
	sys := jwt.NewAccountClaims(s.SystemAccount)
	sys.Name = "SYS"
	if s.SystemJWT, err = sys.Encode(k.operator); err != nil {
		return fmt.Errorf("capstan auth: sign system account: %w", err)
	}
	opub, _ := k.operator.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "capstan"
	oc.SystemAccount = s.SystemAccount
	if s.OperatorJWT, err = oc.Encode(k.operator); err != nil {
		return fmt.Errorf("capstan auth: sign operator: %w", err)
	}
	return nil
}

// signCapstanAccount signs the capstan account: JetStream without limits,
// the exports of crossings, and edit's changes to the claims as they are
// (revocations), or from scratch when the setup has none yet.
func (s *Setup) signCapstanAccount(k *keys, edit func(*jwt.AccountClaims)) error {
	ac := jwt.NewAccountClaims(s.Account)
	if s.AccountJWT != "" {
		var err error
		if ac, err = jwt.DecodeAccountClaims(s.AccountJWT); err != nil {
			return fmt.Errorf("capstan auth: capstan account: %w", err)
		}
	}
	ac.Name = strings.ToUpper(s.Prefix)
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{
		MemoryStorage: jwt.NoLimit, DiskStorage: jwt.NoLimit,
		Streams: jwt.NoLimit, Consumer: jwt.NoLimit, MaxAckPending: jwt.NoLimit,
	}
	// The exports of this version, keeping what was revoked under earlier ones.
	revoked := map[string]jwt.RevocationList{}
	for _, e := range ac.Exports {
		revoked[string(e.Subject)] = e.Revocations
	}
	ac.Exports = exports(s.names())
	for _, e := range ac.Exports {
		e.Revocations = revoked[string(e.Subject)]
	}
	if edit != nil {
		edit(ac)
	}
	var err error
	if s.AccountJWT, err = ac.Encode(k.operator); err != nil {
		return fmt.Errorf("capstan auth: sign capstan account: %w", err)
	}
	return nil
}

// writePushCreds writes DIR/push.creds: a user of the system account that
// may send account JWTs to the servers' resolvers and nothing else.
func (s *Setup) writePushCreds(k *keys) error {
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return err
	}
	upub, _ := ukp.PublicKey()
	useed, _ := ukp.Seed()
	uc := jwt.NewUserClaims(upub)
	uc.Name = PushUser
	uc.Permissions.Pub.Allow.Add(claimsUpdateSubject)
	uc.Permissions.Sub.Allow.Add(s.names().InboxPrefix(PushUser) + ".>")
	ujwt, err := uc.Encode(k.system)
	if err != nil {
		return fmt.Errorf("capstan auth: sign push user: %w", err)
	}
	creds, err := jwt.FormatUserConfig(ujwt, useed)
	if err != nil {
		return err
	}
	return writeSecret(s.PushCredsPath(), creds)
}

// Load reads the setup in dir. A setup of an earlier layout loads (Current
// says so); only Migrate changes it.
func Load(dir string) (*Setup, error) {
	b, err := os.ReadFile(filepath.Join(dir, credfile.StateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("capstan auth: %s holds no setup (run capstan auth init %s)", dir, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("capstan auth: %w", err)
	}
	s := &Setup{}
	if err := json.Unmarshal(b, s); err != nil {
		return nil, fmt.Errorf("capstan auth: %s: %w", credfile.StateFile, err)
	}
	s.Dir = dir
	return s, nil
}

// Add creates a principal. A producer or approver gets an account of its
// own, importing only its own subjects (see crossings), with g.Limits
// (DefaultLimits when nil), its key kept as DIR/NAME.account.nk; an admin or
// worker is a user of the capstan account. Either way DIR/NAME.creds holds
// its user, with the permissions of its grant. A running server learns the
// account, and workers the grant, with Push.
func (s *Setup) Add(g Grant) error {
	if err := s.Current(); err != nil {
		return err
	}
	k, err := s.loadKeys()
	if err != nil {
		return err
	}
	if err := s.add(k, g); err != nil {
		return err
	}
	return s.save()
}

func (s *Setup) add(k *keys, g Grant) error {
	g.V = 1
	if err := g.Validate(); err != nil {
		return fmt.Errorf("capstan auth: principal %q: %w", g.Principal, err)
	}
	if g.Principal == PushUser {
		return fmt.Errorf("capstan auth: principal %q: the name is the setup's own (%s)", g.Principal, s.PushCredsPath())
	}
	if _, ok := s.Grant(g.Principal); ok {
		return fmt.Errorf("%w: principal %q", ErrExists, g.Principal)
	}
	signer := k.account
	limits := g.Limits
	g.Account, g.AccountJWT, g.Limits = "", "", nil
	if HasOwnAccount(g.Role) {
		akp, err := s.principalAccountKey(g.Principal, true)
		if err != nil {
			return err
		}
		l := limits.OrDefault()
		g.Limits = &l
		q := g.Quotas.OrDefault()
		g.Quotas = &q
		if err := s.signPrincipalAccount(k, akp, &g); err != nil {
			return err
		}
		signer = akp
	}
	upub, err := s.writeUser(signer, g)
	if err != nil {
		return err
	}
	g.PublicKey = upub
	s.Principals = append(s.Principals, g)
	slices.SortFunc(s.Principals, func(a, b Grant) int { return strings.Compare(a.Principal, b.Principal) })
	return nil
}

// Set changes a producer's or approver's account limits and quotas: a nil
// argument leaves that part as it is. New limits re-sign its account (its
// credentials stay valid); a running server learns them, and workers the
// quotas, with Push.
func (s *Setup) Set(principal string, limits *Limits, quotas *Quotas) error {
	if err := s.Current(); err != nil {
		return err
	}
	i := slices.IndexFunc(s.Principals, func(g Grant) bool { return g.Principal == principal })
	if i < 0 {
		return fmt.Errorf("capstan auth: no principal %q", principal)
	}
	g := s.Principals[i]
	if !HasOwnAccount(g.Role) {
		return fmt.Errorf("capstan auth: principal %q is a %s, in the capstan account: it has no limits or quotas of its own", principal, g.Role)
	}
	if limits != nil {
		l := *limits
		g.Limits = &l
	}
	if quotas != nil {
		q := *quotas
		g.Quotas = &q
	}
	if err := g.Validate(); err != nil {
		return fmt.Errorf("capstan auth: principal %q: %w", principal, err)
	}
	if limits != nil {
		k, err := s.loadKeys()
		if err != nil {
			return err
		}
		akp, err := s.principalAccountKey(principal, false)
		if err != nil {
			return err
		}
		if err := s.signPrincipalAccount(k, akp, &g); err != nil {
			return err
		}
	}
	s.Principals[i] = g
	return s.save()
}

// principalAccountKey reads DIR/NAME.account.nk, or creates it when create
// and it does not exist (an interrupted migration's is reused).
func (s *Setup) principalAccountKey(principal string, create bool) (nkeys.KeyPair, error) {
	path := filepath.Join(s.Dir, principal+accountSeedExt)
	kp, err := readSeed(path)
	if err == nil || !create || !errors.Is(err, fs.ErrNotExist) {
		if err != nil {
			return nil, fmt.Errorf("capstan auth: account key of %q: %w", principal, err)
		}
		return kp, nil
	}
	if kp, err = nkeys.CreateAccount(); err != nil {
		return nil, err
	}
	seed, _ := kp.Seed()
	return kp, writeSecret(path, seed)
}

// signPrincipalAccount signs g's own account: no JetStream, the imports of
// its role with their activation tokens, its limits, and the revocations its
// existing version holds.
func (s *Setup) signPrincipalAccount(k *keys, akp nkeys.KeyPair, g *Grant) error {
	pub, _ := akp.PublicKey()
	ac := jwt.NewAccountClaims(pub)
	if g.AccountJWT != "" {
		old, err := jwt.DecodeAccountClaims(g.AccountJWT)
		if err != nil {
			return fmt.Errorf("capstan auth: account of %q: %w", g.Principal, err)
		}
		ac.Revocations = old.Revocations
	}
	ac.Name = g.Principal
	imports, err := importsFor(s.names(), g.Role, g.Principal, pub, s.Account, func(c *jwt.ActivationClaims) (string, error) {
		return c.Encode(k.account)
	})
	if err != nil {
		return fmt.Errorf("capstan auth: activation tokens of %q: %w", g.Principal, err)
	}
	ac.Imports = imports
	g.Limits.apply(ac)
	if g.AccountJWT, err = ac.Encode(k.operator); err != nil {
		return fmt.Errorf("capstan auth: sign account of %q: %w", g.Principal, err)
	}
	g.Account = pub
	return nil
}

// writeUser signs g's user with signer (its account's key) and writes
// DIR/NAME.creds; it returns the user's public key.
func (s *Setup) writeUser(signer nkeys.KeyPair, g Grant) (string, error) {
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return "", err
	}
	upub, _ := ukp.PublicKey()
	useed, _ := ukp.Seed()
	uc := jwt.NewUserClaims(upub)
	uc.Name = g.Principal
	uc.Tags.Add(credfile.RoleTag + string(g.Role))
	uc.Permissions = s.Permissions(g).jwt()
	ujwt, err := uc.Encode(signer)
	if err != nil {
		return "", fmt.Errorf("capstan auth: sign principal %q: %w", g.Principal, err)
	}
	creds, err := jwt.FormatUserConfig(ujwt, useed)
	if err != nil {
		return "", err
	}
	return upub, writeSecret(s.CredsPath(g.Principal), creds)
}

func (s *Setup) save() error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return writeSecret(filepath.Join(s.Dir, credfile.StateFile), append(b, '\n'))
}

// claimsUpdateSubject is where a user of the system account sends an
// account JWT to every server's resolver.
const claimsUpdateSubject = "$SYS.REQ.CLAIMS.UPDATE"

// writeServerConfig writes nats-server.conf: the operator, the system
// account, the full resolver (which keeps pushed accounts in ResolverDir and
// shares them between the nodes of a cluster) preloaded with the system and
// capstan accounts. Ports, JetStream and its store directory are left to the
// command line (nats-server -c nats-server.conf -p 4222 -js -sd DIR).
func (s *Setup) writeServerConfig() error {
	conf := fmt.Sprintf(`# Generated by capstan auth: regenerate rather than edit.
# nats-server -c nats-server.conf -p 4222 -js -sd /var/lib/capstan
# then: capstan auth push DIR (principals' accounts and grants)
operator: %q
system_account: %s
resolver: {
  type: full
  dir: %q
  allow_delete: false
  interval: "2m"
}
resolver_preload: {
  %s: %q
  %s: %q
}
`, s.OperatorJWT, s.SystemAccount, s.ResolverDir, s.SystemAccount, s.SystemJWT, s.Account, s.AccountJWT)
	if err := os.MkdirAll(s.ResolverDir, 0o700); err != nil {
		return fmt.Errorf("capstan auth: resolver directory: %w", err)
	}
	tmp := s.ServerConfigPath() + ".tmp"
	if err := os.WriteFile(tmp, []byte(conf), 0o644); err != nil {
		return fmt.Errorf("capstan auth: %w", err)
	}
	return os.Rename(tmp, s.ServerConfigPath())
}

// SetResolverDir changes where an official nats-server keeps pushed
// accounts, and rewrites nats-server.conf.
func (s *Setup) SetResolverDir(dir string) error {
	if err := s.Current(); err != nil {
		return err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("capstan auth: %w", err)
	}
	s.ResolverDir = abs
	if err := s.writeServerConfig(); err != nil {
		return err
	}
	return s.save()
}

// Remove revokes a principal and deletes its credentials. A producer or
// approver: its user is revoked in its own account, the account's activation
// tokens are revoked in the capstan account's exports (so that even its
// account's key could sign no working user), and its account key is deleted;
// an admin or worker: its user is revoked in the capstan account. Push then
// disconnects it from every server at once, and removes its grant from the
// bucket. The setup's own admin and worker principals stay.
func (s *Setup) Remove(principal string) error {
	if err := s.Current(); err != nil {
		return err
	}
	g, ok := s.Grant(principal)
	if !ok {
		return fmt.Errorf("capstan auth: no principal %q", principal)
	}
	if principal == AdminPrincipal || principal == WorkerPrincipal {
		return fmt.Errorf("capstan auth: principal %q is the setup's own", principal)
	}
	k, err := s.loadKeys()
	if err != nil {
		return err
	}
	// Revoked from the next second: credentials issued up to now are refused.
	at := time.Now().Add(time.Second)
	if g.Account != "" {
		ac, err := jwt.DecodeAccountClaims(g.AccountJWT)
		if err != nil {
			return fmt.Errorf("capstan auth: account of %q: %w", principal, err)
		}
		ac.RevokeAt(g.PublicKey, at)
		ac.RevokeAt(jwt.All, at)
		revoked, err := ac.Encode(k.operator)
		if err != nil {
			return fmt.Errorf("capstan auth: sign account of %q: %w", principal, err)
		}
		s.Removed = append(s.Removed, RemovedAccount{Principal: principal, Account: g.Account, AccountJWT: revoked, RemovedAt: time.Now().UTC()})
		err = s.signCapstanAccount(k, func(c *jwt.AccountClaims) {
			for _, e := range c.Exports {
				if e.TokenReq {
					e.RevokeAt(g.Account, at)
				}
			}
		})
		if err != nil {
			return err
		}
	} else {
		if err := s.signCapstanAccount(k, func(c *jwt.AccountClaims) { c.RevokeAt(g.PublicKey, at) }); err != nil {
			return err
		}
	}
	s.Principals = slices.DeleteFunc(s.Principals, func(x Grant) bool { return x.Principal == principal })
	if err := s.writeServerConfig(); err != nil {
		return err
	}
	if err := s.save(); err != nil {
		return err
	}
	for _, f := range []string{s.CredsPath(principal), filepath.Join(s.Dir, principal+accountSeedExt)} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("capstan auth: %w", err)
		}
	}
	return nil
}
