package executor

import "context"

// FlushAudit waits until every audit event the worker has emitted is stored.
// A worker emits a delivery's events before it acknowledges the delivery, so
// once the exec stream is empty and its workers have flushed, a trail is
// final: the tests' settled point, without waiting for a quiet moment.
func (w *Worker) FlushAudit(ctx context.Context) error { return w.audit.Flush(ctx) }
