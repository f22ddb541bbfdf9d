package auth

import (
	"slices"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/capstan-dev/capstan/internal/broker"
)

// subjectCrossing is one subject pattern that crosses from the capstan account
// (streams, buckets, workers) into a principal's own account: an export of
// the capstan account and the import of it each role gets. It is the one
// table of the layout (DESIGN §12 "Accounts per principal"): adding a
// request the workers serve, or a subject the server sends principals, is
// one line of crossings.
type subjectCrossing struct {
	// Subject returns the pattern for principal p; for "*" it is the
	// export's pattern, which must hold p as exactly that one token.
	Subject func(n broker.Names, p string) string
	// Stream is a message flow into the principal's account (the server or
	// the workers publish, the principal subscribes); otherwise a service:
	// the principal sends requests, the capstan account answers once.
	Stream bool
	// Public exports need no activation token: every principal may import
	// them whole (what they carry is everyone's to read). A private export
	// is imported only with a token signed by the capstan account naming
	// the importing account and the principal's own part of the subject.
	Public bool
	// Roles import it.
	Roles []Role
}

// responseThreshold bounds how long the server keeps the route back to a
// principal's account for one request the capstan account received but has
// not answered yet. Every responder of a crossing answers at once (JetStream)
// or within its own bounded time (workers answer within 10 to 15 s); the
// threshold only bounds the state a principal's requests leave in the
// capstan account if a responder never answers.
const responseThreshold = 30 * time.Second

// crossings is every subject that crosses between the capstan account and a
// principal's account, with the roles that import it.
var crossings = []subjectCrossing{
	// A request; its answer is the exec stream's acknowledgement. Always the
	// wildcard: the grant's capabilities stay in the user's permissions, and
	// an answer aimed at a wildcard import never re-enters the capstan
	// account as a message (DESIGN §12 "the forwarding rule").
	{Subject: func(n broker.Names, p string) string { return n.ExecSubject(p, ">") }, Roles: []Role{RoleProducer}},
	{Subject: func(n broker.Names, p string) string { return n.CancelSubject(p, "*") }, Roles: []Role{RoleProducer}},
	{Subject: func(n broker.Names, p string) string { return n.DescribeSubject(p) }, Roles: []Role{RoleProducer}},
	{Subject: func(n broker.Names, p string) string { return n.ListApprovalsSubject(p) }, Roles: []Role{RoleProducer, RoleApprover}},
	{Subject: func(n broker.Names, p string) string { return n.DecideSubject(p) }, Roles: []Role{RoleApprover}},
	// Executions, their trails and results, as the role may see them
	// (workers answer).
	{Subject: func(n broker.Names, p string) string { return n.ListExecutionsSubject(p) }, Roles: []Role{RoleProducer, RoleApprover}},
	{Subject: func(n broker.Names, p string) string { return n.ExecutionSubject(p) }, Roles: []Role{RoleProducer, RoleApprover}},
	// Its own envelopes and records by key: the direct get whose subject
	// names the key, never the form whose body does.
	{Subject: func(n broker.Names, p string) string { return directGet(n.EnvelopesBucket(), p+".>") }, Roles: []Role{RoleProducer}},
	{Subject: func(n broker.Names, p string) string { return directGet(n.ExecutionsBucket(), p+".>") }, Roles: []Role{RoleProducer}},
	// Catalog entries by key, everyone's.
	{Subject: func(n broker.Names, _ string) string { return directGet(n.CatalogBucket(), ">") }, Public: true, Roles: []Role{RoleProducer, RoleApprover}},
	// Its envelopes' notifications, the envelopes bucket's republish.
	{Subject: func(n broker.Names, p string) string { return n.EnvelopeSubjectsOf(p) }, Stream: true, Roles: []Role{RoleProducer}},
	// Its executions' progress, as workers publish it.
	{Subject: func(n broker.Names, p string) string { return n.ProgressSubjectsOf(p) }, Stream: true, Roles: []Role{RoleProducer}},
}

// directGet is the direct get of one key (or a pattern of keys) of bucket.
func directGet(bucket, key string) string {
	return "$JS.API.DIRECT.GET.KV_" + bucket + ".$KV." + bucket + "." + key
}

// HasOwnAccount reports whether a principal of role lives in an account of
// its own: the roles whose credentials may sit next to a model. Admins and
// workers are trusted with the capstan account's subjects and live there.
func HasOwnAccount(r Role) bool { return r == RoleProducer || r == RoleApprover }

// exports are the capstan account's exports: one per crossing.
func exports(n broker.Names) jwt.Exports {
	var out jwt.Exports
	for _, c := range crossings {
		e := &jwt.Export{Subject: jwt.Subject(c.Subject(n, "*")), TokenReq: !c.Public}
		if c.Stream {
			e.Type = jwt.Stream
		} else {
			e.Type, e.ResponseType, e.ResponseThreshold = jwt.Service, jwt.ResponseTypeSingleton, responseThreshold
		}
		out = append(out, e)
	}
	return out
}

// importsFor are the imports of principal p's account (public key account)
// for role, each under the subject's own name (no client changes a subject),
// private ones with an activation token signed by the capstan account.
func importsFor(n broker.Names, role Role, p, account, capstanAccount string, sign func(*jwt.ActivationClaims) (string, error)) (jwt.Imports, error) {
	var out jwt.Imports
	for _, c := range crossings {
		if !slices.Contains(c.Roles, role) {
			continue
		}
		subject := c.Subject(n, p)
		im := &jwt.Import{Account: capstanAccount, Subject: jwt.Subject(subject), Type: jwt.Service}
		if c.Stream {
			im.Type = jwt.Stream
		}
		if !c.Public {
			ac := jwt.NewActivationClaims(account)
			ac.Name = p
			ac.ImportSubject = jwt.Subject(subject)
			ac.ImportType = im.Type
			tok, err := sign(ac)
			if err != nil {
				return nil, err
			}
			im.Token = tok
		}
		out = append(out, im)
	}
	return out, nil
}
