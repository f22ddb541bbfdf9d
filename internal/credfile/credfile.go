// Package credfile reads a principal's credentials file once, for the
// commands and the console: the connection's credentials, and the role and
// publish permissions signed into the user JWT, which let a command refuse at
// once, naming the role, what the server would refuse silently.
package credfile

import (
	"errors"
	"strings"

	"github.com/nats-io/jwt/v2"

	"github.com/capstan-dev/capstan/internal/broker"
)

// Files of a setup directory (auth.Init) that the commands and the test
// servers name too.
const (
	StateFile        = "capstan-auth.json" // principals and grants, public keys and JWTs
	ServerConfigFile = "nats-server.conf"  // an official nats-server's configuration
	// ResolverDirName is where, by default, an official nats-server keeps
	// the account JWTs pushed to it: a directory beside the configuration.
	ResolverDirName = "jwt"
)

// Credentials are a principal's credentials file read once
// (Read): what a connection needs (broker.Credentials: the path,
// the principal, the authentication) and, from the user JWT's claims, the
// role and the permissions signed into it, which let a command refuse at
// once, naming the role, what the server would refuse silently.
type Credentials struct {
	// Credentials is what a connection takes (broker.ConnectOptions.Credentials).
	*broker.Credentials
	// Role is the role signed into the credentials' tags, "" for credentials
	// capstan did not make.
	Role string

	claims *jwt.UserClaims // nil unless the JWT decodes and names a principal
}

// Read reads a credentials file once, as broker.ReadCredentials
// does, and decodes its user JWT's claims. Claims that do not decode, or name
// no capstan principal, are not an error: Known is then false, and the
// server decides.
func Read(path string) (*Credentials, error) {
	bc, err := broker.ReadCredentials(path)
	if err != nil {
		return nil, err
	}
	c := &Credentials{Credentials: bc}
	if bc.Principal == "" || bc.JWT == "" {
		return c, nil
	}
	if uc, err := jwt.DecodeUserClaims(bc.JWT); err == nil && uc.Name == bc.Principal {
		c.claims, c.Role = uc, RoleOf(uc)
	}
	return c, nil
}

// Known reports whether the credentials name a capstan principal whose
// claims decode.
func (c *Credentials) Known() bool { return c != nil && c.claims != nil }

// MayPublish reports whether the credentials let their principal publish to
// subject; true when they are not Known (the server decides).
func (c *Credentials) MayPublish(subject string) bool {
	return !c.Known() || MayPublish(c.claims, subject)
}

// RoleOf returns the role signed into a user JWT's tags, or "" for a user
// capstan did not make.
func RoleOf(uc *jwt.UserClaims) string {
	var role string
	for _, tag := range uc.Tags {
		if r, ok := strings.CutPrefix(tag, RoleTag); ok {
			role = r
		}
	}
	return role
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

// RoleTag prefixes the tag that names a principal's role in its
// credentials (package auth signs it in).
const RoleTag = "capstan-role:"

// ErrNotPermitted: the credentials do not allow what was asked.
var ErrNotPermitted = errors.New("capstan: not permitted")
