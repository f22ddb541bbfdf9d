package main

import (
	"fmt"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/credfile"
)

// What the command's credentials let it do, read from the credentials
// themselves: a refusal the server would answer with a timeout (a publish
// its permissions forbid is dropped, and the request waits) is said at once,
// naming the role and the right.

// principal is who the credentials name, read once per command (see
// connFlags.credentials); zero without credentials or for credentials of no
// capstan principal (the server decides).
type principal struct {
	name, role string
	cred       *credfile.Credentials
}

func (c *connFlags) principal() principal {
	cr, _ := c.credentials()
	if !cr.Known() {
		return principal{}
	}
	p := principal{name: cr.Principal, role: cr.Role, cred: cr}
	if p.role == "" {
		p.role = "principal"
	}
	return p
}

// known reports whether the credentials name a capstan principal.
func (p principal) known() bool { return p.cred.Known() }

// may reports whether the credentials let the principal publish to subject
// (true when they are not a capstan principal's: the server decides).
func (p principal) may(subject string) bool { return p.cred.MayPublish(subject) }

// need refuses, naming the role and the right, what the credentials do not
// allow: right says it for a person ("list executions"), subject is what the
// server would refuse. hint, when not empty, says what the role does instead.
func (c *connFlags) need(right string, subject func(principal string) string, hint string) error {
	p := c.principal()
	if !p.known() {
		return nil
	}
	s := subject(p.name)
	if p.may(s) {
		return nil
	}
	msg := fmt.Sprintf("%s %q may not %s: its credentials do not allow publishing to %s", p.role, p.name, right, s)
	if hint != "" {
		msg += "; " + hint
	}
	return fmt.Errorf("%w: %s", credfile.ErrNotPermitted, msg)
}

// names are the default deployment's names, as every command uses them.
var names = broker.NewNames("")

// Subjects the commands need, by right.
func directGet(bucket string) func(string) string {
	return func(p string) string {
		return "$JS.API.DIRECT.GET.KV_" + bucket + ".$KV." + bucket + "." + p + ".>"
	}
}

func streamInfo(stream string) func(string) string {
	return func(string) string { return "$JS.API.STREAM.INFO." + stream }
}

// reissue is the hint for a right this version added to a role: credentials
// issued before lack it.
const reissue = "credentials issued by a version before this right existed lack it: remove and add the principal again ('capstan auth remove', 'capstan auth add')"
