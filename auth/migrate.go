package auth

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/capstan-dev/capstan/internal/credfile"
)

// backupDirName is where Migrate keeps what it rewrites: the setup's state,
// the server's configuration and the credentials it replaces, as they were.
const backupDirName = "backup-v1"

// MigrateReport says what Migrate did.
type MigrateReport struct {
	// Current: the setup was of the current layout already; nothing changed.
	Current bool
	// Backup is the directory holding what was rewritten, as it was.
	Backup string
	// Reissued are the principals whose credentials are new: their old ones
	// stop working once the servers run the new configuration.
	Reissued []string
}

// migrateStep, in tests, fails a migration at a named step, as a crash
// there would.
var migrateStep = func(string) error { return nil }

// Migrate moves a setup of the one-account layout (v1: every principal a
// user of the capstan account) to accounts per principal (DESIGN §12): it
// keeps the operator and the capstan account with their keys, so that every
// stream, bucket and message stays where JetStream keeps it (under the
// account's public key); gives the capstan account its exports; gives every
// producer and approver an account of its own (limits, or DefaultLimits),
// a new user in it and new credentials, and revokes its old user in the
// capstan account; creates a system account whose key is kept and its push
// user; and rewrites nats-server.conf for the full resolver. Admins and
// workers, their credentials and grants do not change.
//
// It backs up first (DIR/backup-v1), writes the new state last, and is
// resumable: a migration interrupted anywhere is finished by running it
// again, which reuses the keys and credentials already made. Run on a setup
// of the current layout it changes nothing and says so. Afterwards every
// server restarts once on the new nats-server.conf, then Push.
func Migrate(dir string, limits *Limits) (*MigrateReport, error) {
	s, err := Load(dir)
	if err != nil {
		return nil, err
	}
	if s.V == setupVersion {
		return &MigrateReport{Current: true}, nil
	}
	if s.V != 1 {
		return nil, s.Current()
	}
	if limits != nil {
		if err := limits.validate(); err != nil {
			return nil, fmt.Errorf("capstan auth migrate: %w", err)
		}
	}
	rep := &MigrateReport{Backup: filepath.Join(dir, backupDirName)}
	if err := s.backupV1(rep.Backup); err != nil {
		return nil, err
	}
	if err := migrateStep("backed up"); err != nil {
		return nil, err
	}
	k, err := s.loadKeys()
	if err != nil {
		return nil, err
	}
	// v1 threw the system account's key away: a new system account, kept
	// (an interrupted migration's is reused). It holds no stream.
	if k.system == nil {
		if err := s.newSystemAccount(k); err != nil {
			return nil, err
		}
	} else if err := s.signSystemAccount(k); err != nil {
		return nil, err
	}
	if err := s.writePushCreds(k); err != nil {
		return nil, err
	}
	at := time.Now().Add(time.Second)
	var oldUsers []string
	for i := range s.Principals {
		g := &s.Principals[i]
		if !HasOwnAccount(g.Role) || g.Account != "" {
			continue
		}
		akp, err := s.principalAccountKey(g.Principal, true)
		if err != nil {
			return nil, err
		}
		l := limits.OrDefault()
		g.Limits = &l
		if err := s.signPrincipalAccount(k, akp, g); err != nil {
			return nil, err
		}
		oldUsers = append(oldUsers, g.PublicKey)
		upub, err := s.reissuedUser(akp, *g)
		if err != nil {
			return nil, err
		}
		g.PublicKey = upub
		rep.Reissued = append(rep.Reissued, g.Principal)
		if err := migrateStep("reissued " + g.Principal); err != nil {
			return nil, err
		}
	}
	err = s.signCapstanAccount(k, func(c *jwt.AccountClaims) {
		for _, u := range oldUsers {
			c.RevokeAt(u, at)
		}
	})
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	s.ResolverDir = filepath.Join(abs, credfile.ResolverDirName)
	s.V = setupVersion
	if err := s.writeServerConfig(); err != nil {
		return nil, err
	}
	if err := migrateStep("configured"); err != nil {
		return nil, err
	}
	if err := s.save(); err != nil {
		return nil, err
	}
	return rep, nil
}

// reissuedUser returns the user of g's new account: the one an interrupted
// migration already wrote to DIR/NAME.creds (signed by that account), else a
// new one.
func (s *Setup) reissuedUser(akp nkeys.KeyPair, g Grant) (string, error) {
	if b, err := os.ReadFile(s.CredsPath(g.Principal)); err == nil {
		if tok, err := jwt.ParseDecoratedJWT(b); err == nil {
			if uc, err := jwt.DecodeUserClaims(tok); err == nil && uc.Issuer == g.Account && uc.Name == g.Principal {
				return uc.Subject, nil
			}
		}
	}
	return s.writeUser(akp, g)
}

// backupV1 copies what Migrate rewrites into backup, unless an interrupted
// migration completed the backup already: the state file, copied last, marks
// a complete one, which is never overwritten.
func (s *Setup) backupV1(backup string) error {
	if _, err := os.Stat(filepath.Join(backup, credfile.StateFile)); err == nil {
		return nil
	}
	if err := os.MkdirAll(backup, 0o700); err != nil {
		return fmt.Errorf("capstan auth migrate: backup: %w", err)
	}
	files := []string{credfile.ServerConfigFile}
	for _, g := range s.Principals {
		if HasOwnAccount(g.Role) {
			files = append(files, g.Principal+".creds")
		}
	}
	for _, f := range append(files, credfile.StateFile) {
		b, err := os.ReadFile(filepath.Join(s.Dir, f))
		if errors.Is(err, fs.ErrNotExist) && f != credfile.StateFile {
			continue // a principal whose credentials were handed out and deleted
		}
		if err != nil {
			return fmt.Errorf("capstan auth migrate: backup: %w", err)
		}
		if err := writeSecret(filepath.Join(backup, f), b); err != nil {
			return fmt.Errorf("capstan auth migrate: backup: %w", err)
		}
	}
	return nil
}

// String says what a migration did, for a person.
func (r *MigrateReport) String() string {
	if r.Current {
		return "the setup has accounts per principal already: nothing to migrate, nothing changed"
	}
	return fmt.Sprintf("migrated; the old state, configuration and credentials are in %s; new credentials for: %s",
		r.Backup, strings.Join(r.Reissued, ", "))
}
