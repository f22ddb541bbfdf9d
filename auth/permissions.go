package auth

import (
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/capstan-dev/capstan/internal/broker"
)

// Permissions are the subjects a principal may publish and subscribe to. The
// NATS server enforces them: they are signed into the principal's credentials.
type Permissions struct {
	// PublishAllow and PublishDeny are the subjects it may and may not
	// publish to (deny wins).
	PublishAllow, PublishDeny []string
	// SubscribeAllow and SubscribeDeny are the subjects it may and may not
	// subscribe to.
	SubscribeAllow, SubscribeDeny []string
	// Responses lets the principal answer, once, a request it received,
	// on the reply subject the request names.
	Responses bool
}

// Permissions returns what the server lets g's principal do, under the
// setup's names.
//
// A producer publishes only under its own principal token (requests within its
// capability grants, cancels, describes, listings of the approvals it
// requested), receives only its own replies,
// envelopes and progress, and reads only its own records and envelopes (by key, without
// their buckets' stream information), the catalog and nothing else: no
// key-value write, no stream or consumer administration, no audit event. An approver sends decisions to workers and reads approvals. A
// worker may do what the runtime needs except write grants, pauses or policy
// sets, or remove audit events; an admin may do anything. A notifier pulls from the notify
// consumer and acknowledges what it pulled, and answers status requests:
// it creates no consumer (a push consumer delivers wherever its creator
// says) and writes no bucket or stream.
func (s *Setup) Permissions(g Grant) Permissions {
	n := s.names()
	p := g.Principal
	js := func(s string) string { return "$JS.API." + s }
	kvStream := func(bucket string) string { return "KV_" + bucket }
	inbox := n.InboxPrefix(p) + ".>"
	switch g.Role {
	case RoleProducer:
		pub := []string{
			n.ExecSubject(p, broker.Unrouted),
			n.CancelSubject(p, "*"),
			n.DescribeSubject(p),
			// The approvals it requested itself, listed by the workers.
			n.ListApprovalsSubject(p),
			// Its own executions, their trails and results, read by the
			// workers.
			n.ListExecutionsSubject(p),
			n.ExecutionSubject(p),
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
			PublishAllow: pub,
			// Its envelopes' notifications, and its executions' progress.
			SubscribeAllow: []string{inbox, n.EnvelopeSubjectsOf(p), n.ProgressSubjectsOf(p)},
		}
	case RoleApprover:
		// Approvals are listed and decided through the workers, which keep to
		// the approver's types: an approver reads no bucket itself but the
		// catalog, by key, as a producer does, which a Client reads when it
		// opens. So are the executions behind them, with their trails and
		// outcomes. Its envelopes' subjects, which a Client subscribes to,
		// carry nothing: no envelope is an approver's.
		return Permissions{PublishAllow: []string{n.DecideSubject(p), n.ListApprovalsSubject(p),
			n.ListExecutionsSubject(p), n.ExecutionSubject(p),
			js("DIRECT.GET." + kvStream(n.CatalogBucket()) + ".$KV." + n.CatalogBucket() + ".>")},
			SubscribeAllow: []string{inbox, n.EnvelopeSubjectsOf(p)}}
	case RoleNotifier:
		// The approvals stream's consumers: a channel's is notify-<channel>,
		// one subject token, which no wildcard can narrow to the prefix.
		stream := kvStream(n.ApprovalsBucket())
		return Permissions{
			PublishAllow: []string{
				js("CONSUMER.INFO." + stream + ".*"),
				js("CONSUMER.MSG.NEXT." + stream + ".*"),
				// Acks, naks and "in progress" of the deliveries it pulled.
				"$JS.ACK." + stream + ".*.>",
				// capstan notify --status: the consumers' queues, the running
				// notifiers.
				js("STREAM.INFO." + stream),
				js("CONSUMER.LIST." + stream),
				n.NotifyStatusSubject(),
			},
			SubscribeAllow: []string{inbox, n.NotifyStatusSubject()},
			Responses:      true,
		}
	case RoleWorker:
		// The buckets only admins write (DESIGN §12): the grants, the
		// operators' pauses and the policy sets. Workers read and watch
		// them; a worker may neither write a key nor create the bucket
		// (whose configuration could source it from elsewhere).
		var deny []string
		adminOnly := []string{n.GrantsBucket(), n.PausesBucket(), n.PoliciesBucket()}
		for _, b := range adminOnly {
			deny = append(deny, "$KV."+b+".>", js("STREAM.CREATE."+kvStream(b)))
		}
		// The audit log's tree, lease and checkpoints are the
		// checkpointer's, which runs with the operator's key and an admin's
		// credentials: a worker may not stall or litter it.
		deny = append(deny, "$KV."+n.TrailBucket()+".>", n.CheckpointSubject())
		deny = append(deny, js("STREAM.UPDATE.>"), js("STREAM.DELETE.>"), js("STREAM.PURGE.>"))
		// A worker removes single messages from the exec stream only: the
		// sweeper deletes the requests it ended NOT_STARTED. Deny wins over
		// allow in NATS, so every other stream of capstan's is named.
		streams := []string{n.AuditStream(), kvStream(n.ExecutionsBucket()),
			kvStream(n.EnvelopesBucket()), kvStream(n.ApprovalsBucket()), kvStream(n.CatalogBucket()), kvStream(n.PoolsBucket()),
			kvStream(n.LimitsBucket()), kvStream(n.TrailBucket()), n.CheckpointStream()}
		for _, b := range adminOnly {
			streams = append(streams, kvStream(b))
		}
		for _, stream := range streams {
			deny = append(deny, js("STREAM.MSG.DELETE."+stream))
		}
		return Permissions{
			PublishAllow:   []string{">"},
			PublishDeny:    deny,
			SubscribeAllow: []string{">"},
		}
	default: // RoleAdmin
		return Permissions{PublishAllow: []string{">"}, SubscribeAllow: []string{">"}}
	}
}

func (p Permissions) jwt() jwt.Permissions {
	var j jwt.Permissions
	j.Pub.Allow.Add(p.PublishAllow...)
	j.Pub.Deny.Add(p.PublishDeny...)
	j.Sub.Allow.Add(p.SubscribeAllow...)
	j.Sub.Deny.Add(p.SubscribeDeny...)
	if p.Responses {
		j.Resp = &jwt.ResponsePermission{MaxMsgs: 1, Expires: time.Minute}
	}
	return j
}
