package auth

import (
	"strings"

	"github.com/nats-io/jwt/v2"

	"github.com/capstan-dev/capstan/broker"
)

// Permissions are the subjects a principal may publish and subscribe to. The
// NATS server enforces them: they are signed into the principal's credentials.
type Permissions struct {
	PublishAllow, PublishDeny     []string
	SubscribeAllow, SubscribeDeny []string
}

// PermissionsFor returns what the server lets g's principal do, under names.
//
// A producer publishes only under its own principal token (requests within its
// capability grants, cancels, describes, listings of the approvals it
// requested), receives only its own replies and
// envelopes, and reads only its own records and envelopes (by key, without
// their buckets' stream information), the catalog and nothing else: no
// key-value write, no stream or consumer administration, no audit event. An approver sends decisions to workers and reads approvals. A
// worker may do what the runtime needs except touch grants or remove audit
// events; an admin may do anything.
func PermissionsFor(g Grant, n broker.Names) Permissions {
	p := g.Principal
	js := func(s string) string { return "$JS.API." + s }
	kvStream := func(bucket string) string { return "KV_" + bucket }
	inbox := n.InboxPrefix(p) + ".>"
	switch g.Role {
	case Producer:
		pub := []string{
			n.ExecSubject(p, broker.Unrouted),
			n.CancelSubject(p, "*"),
			n.DescribeSubject(p),
			// The approvals it requested itself, listed by the workers.
			n.ListApprovalsSubject(p),
		}
		for _, c := range g.Capabilities {
			switch {
			case c == "*":
				pub = append(pub, n.ExecSubject(p, ">"))
			case strings.HasSuffix(c, ".*"):
				pub = append(pub, n.ExecSubject(p, strings.TrimSuffix(c, "*")+">"))
			default:
				pub = append(pub, n.ExecSubject(p, c))
			}
		}
		// Its own envelopes and records by key, and no stream information
		// of their buckets: with a subjects filter it lists every key,
		// another principal's execution ids among them.
		for _, b := range []string{n.EnvelopesBucket(), n.ExecutionsBucket()} {
			pub = append(pub, js("DIRECT.GET."+kvStream(b)+".$KV."+b+"."+p+".>"))
		}
		// The catalog by key only: no consumer, whose push deliveries could
		// be aimed at another principal's subjects, and no stream
		// information (its own account has no JetStream to answer it).
		pub = append(pub, js("DIRECT.GET."+kvStream(n.CatalogBucket())+".$KV."+n.CatalogBucket()+".>"))
		return Permissions{
			PublishAllow:   pub,
			SubscribeAllow: []string{inbox, n.EnvelopeSubjectsOf(p)},
		}
	case Approver:
		// Approvals are listed and decided through the workers, which keep to
		// the approver's types: an approver reads no bucket itself.
		return Permissions{PublishAllow: []string{n.DecideSubject(p), n.ListApprovalsSubject(p)}, SubscribeAllow: []string{inbox}}
	case Worker:
		grants := n.GrantsBucket()
		deny := []string{
			"$KV." + grants + ".>",
			js("STREAM.CREATE." + kvStream(grants)),
			js("STREAM.UPDATE.>"),
			js("STREAM.DELETE.>"),
			js("STREAM.PURGE.>"),
		}
		// A worker removes single messages from the exec stream only: the
		// sweeper deletes the requests it ended NOT_STARTED. Deny wins over
		// allow in NATS, so every other stream of capstan's is named.
		for _, stream := range []string{n.AuditStream(), kvStream(grants), kvStream(n.ExecutionsBucket()),
			kvStream(n.EnvelopesBucket()), kvStream(n.ApprovalsBucket()), kvStream(n.CatalogBucket()), kvStream(n.PoolsBucket())} {
			deny = append(deny, js("STREAM.MSG.DELETE."+stream))
		}
		return Permissions{
			PublishAllow:   []string{">"},
			PublishDeny:    deny,
			SubscribeAllow: []string{">"},
		}
	default: // Admin
		return Permissions{PublishAllow: []string{">"}, SubscribeAllow: []string{">"}}
	}
}

func (p Permissions) jwt() jwt.Permissions {
	var j jwt.Permissions
	j.Pub.Allow.Add(p.PublishAllow...)
	j.Pub.Deny.Add(p.PublishDeny...)
	j.Sub.Allow.Add(p.SubscribeAllow...)
	j.Sub.Deny.Add(p.SubscribeDeny...)
	return j
}
