package broker

import "strings"

// Names derives every stream, bucket, consumer and subject name from one prefix.
type Names struct {
	prefix  string // CAPSTAN
	subject string // capstan
}

// Prefix returns the prefix the names are under ("CAPSTAN" by default).
func (n Names) Prefix() string { return n.prefix }

// NewNames returns the names under prefix (default "CAPSTAN"); subjects use the
// prefix in lower case.
func NewNames(prefix string) Names {
	if prefix == "" {
		prefix = "CAPSTAN"
	}
	return Names{prefix: strings.ToUpper(prefix), subject: strings.ToLower(prefix)}
}

// Reserved capability-subject token for requests no pool serves.
const Unrouted = "_unrouted"

// ExecStream is the deployment's shared exec stream: the anonymous
// principal's queue, and every principal's on a deployment without queues of
// their own (DESIGN §3).
func (n Names) ExecStream() string { return n.prefix + "_EXEC" }

// QueueStream is principal's queue: the exec stream of its requests alone
// (DESIGN §3), ExecStream for the anonymous principal.
func (n Names) QueueStream(principal string) string {
	if principal == Anonymous {
		return n.ExecStream()
	}
	return n.prefix + "_EXEC_" + principal
}

// QueueSubjects is the subject space of principal's queue.
func (n Names) QueueSubjects(principal string) string {
	return n.subject + ".exec." + principal + ".>"
}

// PrincipalOfQueue returns the principal whose queue stream is named stream
// (see QueueStream), or "" when stream is the shared one or none of capstan's.
func (n Names) PrincipalOfQueue(stream string) string {
	p, ok := strings.CutPrefix(stream, n.prefix+"_EXEC_")
	if !ok || p == Anonymous || !ValidPrincipal(p) {
		return ""
	}
	return p
}

// AuditStream is the stream of audit events.
func (n Names) AuditStream() string { return n.prefix + "_AUDIT" }

// ExecutionsBucket is the key-value bucket of execution records.
func (n Names) ExecutionsBucket() string { return n.prefix + "_EXECUTIONS" }

// EnvelopesBucket is the key-value bucket of result envelopes.
func (n Names) EnvelopesBucket() string { return n.prefix + "_ENVELOPES" }

// ApprovalsBucket is the key-value bucket of approvals.
func (n Names) ApprovalsBucket() string { return n.prefix + "_APPROVALS" }

// CatalogBucket is the key-value bucket of the capability catalog.
func (n Names) CatalogBucket() string { return n.prefix + "_CATALOG" }

// PoolsBucket is the key-value bucket of worker pools' routing.
func (n Names) PoolsBucket() string { return n.prefix + "_POOLS" }

// LimitsBucket is the key-value bucket of the limits' counters.
func (n Names) LimitsBucket() string { return n.prefix + "_LIMITS" }

// PoolConsumer is the durable consumer a worker pool pulls requests from.
func (n Names) PoolConsumer(pool string) string { return "pool-" + pool }

// UnroutedConsumer is the consumer of requests no pool serves.
func (n Names) UnroutedConsumer() string { return Unrouted }

// ExecSubject is where principal publishes requests for capabilityID.
func (n Names) ExecSubject(principal, capabilityID string) string {
	return n.subject + ".exec." + principal + "." + capabilityID
}

// ExecFilter matches every principal's requests for capabilityID: the filter
// of a pool's consumer of the shared exec stream.
func (n Names) ExecFilter(capabilityID string) string {
	return n.subject + ".exec.*." + capabilityID
}

// QueueFilter matches principal's requests for capabilityID: the filter of a
// pool's consumer of principal's queue; ExecFilter for "" (the shared
// stream, whose consumers take every principal's requests it holds).
func (n Names) QueueFilter(principal, capabilityID string) string {
	if principal == "" {
		return n.ExecFilter(capabilityID)
	}
	return n.subject + ".exec." + principal + "." + capabilityID
}

// ExecSubjects is the exec stream's subject space.
func (n Names) ExecSubjects() string { return n.subject + ".exec.>" }

// UnroutedSubject receives principal's requests for capabilities no pool lists.
func (n Names) UnroutedSubject(principal string) string { return n.ExecSubject(principal, Unrouted) }

// UnroutedFilter matches every principal's unrouted requests.
func (n Names) UnroutedFilter() string { return n.ExecFilter(Unrouted) }

// CapabilityFromSubject returns the capability id of an exec subject.
func (n Names) CapabilityFromSubject(subject string) string {
	_, id, _ := n.ParseExecSubject(subject)
	return id
}

// AuditShards is how many subjects the audit stream spreads executions over.
const AuditShards = 1024

// AuditShard returns the shard of an execution's audit events: three
// lower-case hex digits, 000 to 3ff, of FNV-1a-32(key) mod AuditShards, where
// key is the execution's Key (its principal and id). A fixed set of subjects
// keeps the server's per-subject index the same size however many executions
// the stream retains. Stores of earlier versions sharded by the execution id
// alone: AuditShard(executionID) is that shard.
func AuditShard(key string) string {
	s := fnv1a32(key) % AuditShards
	return string([]byte{hexDigits[s>>8], hexDigits[s>>4&0xf], hexDigits[s&0xf]})
}

// AuditSubject carries the audit events of the execution whose Key is key,
// among those of every other execution of its shard (see AuditShard); each
// message names its execution in the AuditExecutionHeader header. Given a
// bare execution id, it is the shard stores of earlier versions used.
func (n Names) AuditSubject(key string) string {
	return n.subject + ".audit." + AuditShard(key)
}

// AuditExecutionHeader names the execution of an audit message: its Key,
// principal and id, so that another principal's events under the same id are
// never taken for its own.
const AuditExecutionHeader = "Capstan-Execution"

// LegacyAuditExecutionHeader named the execution of an audit message, by id
// alone, in stores of versions before executions were scoped by principal.
const LegacyAuditExecutionHeader = "Capstan-Execution-Id"

// LegacyAuditSubject is where versions before the sharded layout stored
// executionID's events, one subject per execution; such stores are still read.
func (n Names) LegacyAuditSubject(executionID string) string {
	return n.subject + ".audit." + executionID
}

// AuditSubjects is the audit stream's subject space.
func (n Names) AuditSubjects() string { return n.subject + ".audit.>" }

// TrailBucket is the key-value bucket of the audit log's tree: the hashes
// of its tiles and the checkpointer's lease (DESIGN §8, "The trail as a
// log"). Only admins write it.
func (n Names) TrailBucket() string { return n.prefix + "_TRAIL" }

// CheckpointStream is the stream of the audit log's signed checkpoints, in
// the order they were signed; CheckpointSubject is its one subject.
func (n Names) CheckpointStream() string { return n.prefix + "_CHECKPOINTS" }

// CheckpointSubject is where the checkpointer files each signed checkpoint.
func (n Names) CheckpointSubject() string { return n.subject + ".checkpoint" }

// IndexStream is the executions index (DESIGN §3, "Listing executions"): one
// small entry per execution's request and end, on subjects that carry what a
// listing filters by.
func (n Names) IndexStream() string { return n.prefix + "_INDEX" }

// IndexSubjects is the executions index's subject space.
func (n Names) IndexSubjects() string { return n.subject + ".index.>" }

// IndexActorShards is how many subject tokens the actors of the index are
// spread over: an actor filter reads one in 64 of its principal's entries,
// and a principal's subjects stay bounded whatever the number of its actors.
const IndexActorShards = 64

// IndexActorShard returns the shard of an actor id in the index: two
// lower-case hex digits, 00 to 3f, of FNV-1a-32(actorID) mod
// IndexActorShards. The id alone, not its kind, so that a filter by id finds
// it under any kind.
func IndexActorShard(actorID string) string {
	return indexActorShards[fnv1a32(actorID)%IndexActorShards]
}

// indexActorShards are the shards' tokens, made once: a shard is taken for
// every execution's index entry.
var indexActorShards = func() (t [IndexActorShards]string) {
	for s := range t {
		t[s] = string([]byte{hexDigits[s>>4], hexDigits[s&0xf]})
	}
	return t
}()

const hexDigits = "0123456789abcdef"

// fnv1a32 is the 32-bit FNV-1a hash of s, which shards subjects.
func fnv1a32(s string) uint32 {
	const (
		offset32 = 2166136261
		prime32  = 16777619
	)
	h := uint32(offset32)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= prime32
	}
	return h
}

// IndexSubject is where the index entry of principal's execution of
// capabilityID, in status, for actorID, is stored:
// capstan.index.<principal>.<status>.<actorShard>.<capabilityId>. Its subjects
// are bounded by principals × statuses × 64 × capabilities, never one per
// execution (DESIGN §16).
func (n Names) IndexSubject(principal, status, actorID, capabilityID string) string {
	return n.IndexSubjectOfShard(principal, status, IndexActorShard(actorID), capabilityID)
}

// IndexSubjectOfShard is IndexSubject with the actor's shard
// (IndexActorShard) in place of the actor.
func (n Names) IndexSubjectOfShard(principal, status, actorShard, capabilityID string) string {
	return n.subject + ".index." + principal + "." + status + "." + actorShard + "." + capabilityID
}

// IndexFilter is the subject filter of a listing: principal, status and
// actor id exact, or "" for any; capability exact, a prefix ending in "."
// (orders.), or "" for any.
func (n Names) IndexFilter(principal, status, actorID, capability string) string {
	star := func(s string) string {
		if s == "" {
			return "*"
		}
		return s
	}
	shard := "*"
	if actorID != "" {
		shard = IndexActorShard(actorID)
	}
	tail := capability
	switch {
	case capability == "":
		tail = ">"
	case strings.HasSuffix(capability, "."):
		tail = capability + ">"
	}
	return n.subject + ".index." + star(principal) + "." + star(status) + "." + shard + "." + tail
}

// CancelSubject is the core NATS request subject where principal cancels one
// of its executions.
func (n Names) CancelSubject(principal, executionID string) string {
	return n.subject + ".cancel." + principal + "." + executionID
}

// CancelSubjects matches every cancel request.
func (n Names) CancelSubjects() string { return n.subject + ".cancel.*.*" }

// CancelNoticeSubject announces to every worker that a cancel of principal's
// execution was recorded.
func (n Names) CancelNoticeSubject(principal, executionID string) string {
	return n.subject + ".cancelled." + principal + "." + executionID
}

// CancelNoticeSubjects matches every cancel notice.
func (n Names) CancelNoticeSubjects() string { return n.subject + ".cancelled.*.*" }

// DescribeSubject is where principal asks what it may call.
func (n Names) DescribeSubject(principal string) string { return n.subject + ".describe." + principal }

// DescribeSubjects matches every principal's describes.
func (n Names) DescribeSubjects() string { return n.subject + ".describe.*" }

// PrincipalOfSubject returns the principal token of a cancel, cancel notice,
// describe, approvals or executions subject: the token after the subject's
// kind.
func (n Names) PrincipalOfSubject(subject string) string {
	rest, ok := strings.CutPrefix(subject, n.subject+".")
	if !ok {
		return ""
	}
	kind, rest, _ := strings.Cut(rest, ".") // cancel, cancelled, describe, approvals, executions
	if kind == "approvals" || kind == "executions" {
		// approvals.decide.<principal>, approvals.list.<principal>,
		// executions.list.<principal>, executions.get.<principal>
		_, rest, _ = strings.Cut(rest, ".")
	}
	p, _, _ := strings.Cut(rest, ".")
	if !ValidPrincipal(p) {
		return ""
	}
	return p
}

// WorkersQueue is the queue group workers serve cancel and describe in.
func (n Names) WorkersQueue() string { return n.subject + "-workers" }

// EnvelopeSubjects matches the republished copy of every envelope the envelope
// bucket stored; a client's one subscription listens here.
func (n Names) EnvelopeSubjects() string { return n.subject + ".envelope.>" }

// EnvelopeSubjectsOf matches the envelopes of principal's executions.
func (n Names) EnvelopeSubjectsOf(principal string) string {
	return n.subject + ".envelope." + principal + ".>"
}

// EnvelopeKeyFromSubject returns the envelope-bucket key (see Key) of a
// republished envelope.
func (n Names) EnvelopeKeyFromSubject(subject string) string {
	return strings.TrimPrefix(subject, n.subject+".envelope.")
}

// ProgressSubject is where workers publish what a handler reports of the
// progress of principal's execution (core NATS, coalesced; DESIGN §5
// "Progress").
func (n Names) ProgressSubject(principal, executionID string) string {
	return n.subject + ".progress." + principal + "." + executionID
}

// ProgressSubjectsOf matches the progress of principal's executions: what
// its users may subscribe to.
func (n Names) ProgressSubjectsOf(principal string) string {
	return n.subject + ".progress." + principal + ".>"
}

// Anonymous is the principal token of every subject in open mode (a server
// without authentication). A server with authentication never lets a client
// publish under it.
const Anonymous = "_anon"

// ValidPrincipal reports whether p can be a principal: one subject token,
// [a-z][a-z0-9_-]*, at most 64 bytes. Anonymous is valid; other names starting
// with "_" are reserved.
func ValidPrincipal(p string) bool {
	if p == Anonymous {
		return true
	}
	if len(p) == 0 || len(p) > 64 || p[0] < 'a' || p[0] > 'z' {
		return false
	}
	for i := 1; i < len(p); i++ {
		c := p[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// GrantsBucket keeps each principal's grants; only admins write it.
func (n Names) GrantsBucket() string { return n.prefix + "_GRANTS" }

// PausesBucket keeps the operators' pauses (DESIGN §18): only admins write
// it, every worker watches it.
func (n Names) PausesBucket() string { return n.prefix + "_PAUSES" }

// PoliciesBucket keeps the deployment's Cedar policy sets, one key per
// version, and which one is in force (DESIGN §18): only admins write it,
// every worker watches it.
func (n Names) PoliciesBucket() string { return n.prefix + "_POLICIES" }

// AppliedSubject is where an operator's command asks every worker to
// confirm that its copy of the pauses or policies bucket has a revision
// (and that it cancelled what a pause asked it to); every worker answers,
// none in a queue group.
func (n Names) AppliedSubject() string { return n.subject + ".operators.applied" }

// SubjectPrefix is the lower-case prefix every subject starts with.
func (n Names) SubjectPrefix() string { return n.subject }

// DecideSubject is where an approver principal sends its decisions; workers
// serve it and take the approver's identity from the subject.
func (n Names) DecideSubject(principal string) string {
	return n.subject + ".approvals.decide." + principal
}

// DecideSubjects matches every approver's decisions.
func (n Names) DecideSubjects() string { return n.subject + ".approvals.decide.*" }

// ListApprovalsSubject is where a principal asks for the approvals it may
// decide, or requested itself; workers serve it.
func (n Names) ListApprovalsSubject(principal string) string {
	return n.subject + ".approvals.list." + principal
}

// ListApprovalsSubjects matches every principal's listings.
func (n Names) ListApprovalsSubjects() string { return n.subject + ".approvals.list.*" }

// ListExecutionsSubject is where a principal asks for the executions it may
// see (DESIGN §12): an admin every one, a producer its own, an approver those
// behind the approvals it may decide. Workers serve it.
func (n Names) ListExecutionsSubject(principal string) string {
	return n.subject + ".executions.list." + principal
}

// ListExecutionsSubjects matches every principal's listings of executions.
func (n Names) ListExecutionsSubjects() string { return n.subject + ".executions.list.*" }

// ExecutionSubject is where a principal asks for one execution it may see:
// its record, envelope, trail and the approvals behind it. Workers serve it.
func (n Names) ExecutionSubject(principal string) string {
	return n.subject + ".executions.get." + principal
}

// ExecutionSubjects matches every principal's requests for one execution.
func (n Names) ExecutionSubjects() string { return n.subject + ".executions.get.*" }

// ServedRequestSubjects are the core NATS requests workers serve for
// principal, each with the principal as a token and answered only on the
// principal's reply (ReplyAllowed): what a principal's account imports from
// capstan's. Cancel takes the execution id as one more token.
func (n Names) ServedRequestSubjects(principal string) []string {
	return []string{
		n.CancelSubject(principal, "*"),
		n.DescribeSubject(principal),
		n.DecideSubject(principal),
		n.ListApprovalsSubject(principal),
		n.ListExecutionsSubject(principal),
		n.ExecutionSubject(principal),
	}
}

// NotifyConsumer is the durable consumer on the approvals bucket's stream
// from which every notifier of a deployment reads the changes a channel
// notifies (DESIGN §7).
func (n Names) NotifyConsumer(channel string) string { return NotifyConsumerPrefix + channel }

// NotifyConsumerPrefix begins the name of every notify consumer.
const NotifyConsumerPrefix = "notify-"

// NotifyStatusSubject is where running notifiers answer who they are and
// what they delivered.
func (n Names) NotifyStatusSubject() string { return n.subject + ".notify.status" }

// InboxPrefix is principal's reply-subject prefix: the server lets a principal
// subscribe to its own replies only.
func (n Names) InboxPrefix(principal string) string { return "_INBOX_" + n.subject + "." + principal }

// ReplyAllowed reports whether a request of principal may be answered on
// reply. A principal in an account of its own (DESIGN §12 "Accounts per
// principal") reaches the capstan account through a service import, and the
// server gives its request a reply under ResponseImportPrefix, which routes
// the answer back into that account only, whatever subject the principal
// named there: accepted. A principal inside the capstan account (an admin, a
// worker, a principal of a one-account setup) is answered only on its own
// inbox prefix, since the server sends replies to whatever subject a
// requester names, another principal's included. The anonymous principal of
// an open server may name any. No reply: nobody to answer (an answer the
// server forwarded through an import arrives so), never served.
func (n Names) ReplyAllowed(principal, reply string) bool {
	if reply == "" {
		return false
	}
	if principal == Anonymous || strings.HasPrefix(reply, ResponseImportPrefix) {
		return true
	}
	return strings.HasPrefix(reply, n.InboxPrefix(principal)+".")
}

// ResponseImportPrefix begins the reply the server gives a request that
// entered an account through a service import: its answer goes back to the
// importing account alone.
const ResponseImportPrefix = "_R_."

// Key is the key of principal's execution in the executions and envelopes
// buckets: the principal is part of it, so that the server can let a principal
// read its own records and envelopes only.
func Key(principal, executionID string) string { return principal + "." + executionID }

// ParseExecSubject returns the principal and capability id of an exec
// subject (capstan.exec.<principal>.<capabilityId>); ok is false for a
// subject outside that layout.
func (n Names) ParseExecSubject(subject string) (principal, capabilityID string, ok bool) {
	rest, found := strings.CutPrefix(subject, n.subject) // in place: no prefix made for each delivery
	if found {
		rest, found = strings.CutPrefix(rest, ".exec.")
	}
	if !found {
		return "", "", false
	}
	principal, capabilityID, found = strings.Cut(rest, ".")
	if !found || !ValidPrincipal(principal) || capabilityID == "" {
		return "", "", false
	}
	return principal, capabilityID, true
}

// ParseKey splits a key of the executions or envelopes bucket (see Key).
func ParseKey(key string) (principal, executionID string, ok bool) {
	principal, executionID, ok = strings.Cut(key, ".")
	return principal, executionID, ok && ValidPrincipal(principal) && executionID != ""
}
