// Package auditemit writes capstan's trail (package audit reads it): workers,
// the approvals store and the operators' commands publish their audit events
// through an Emitter, in pipeline order, asynchronously in JetStream fast
// batches or strictly (EmitSync: stored before it returns, or
// audit.ErrUnavailable), and file each execution's beginning and end in the
// executions index, the ends that come close together coalesced into one
// message (indexgroups.go).
//
//	em := auditemit.New(b.NC, auditemit.Options{Prefix: b.Names.Prefix(), Audit: b.Audit, Index: b.Index, Logger: log})
//	em.EmitAll(requested, started, completed) // one message, stored whole or not at all
//	err := em.EmitSync(ctx, &audit.Event{Type: audit.EventStarted, ...})
//	...
//	err = em.Flush(ctx) // every asynchronous event acknowledged
package auditemit
