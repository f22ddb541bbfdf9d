// Package demo is the demo catalog that `capstan dev` and `capstan worker`
// serve: six capabilities with which every rule of the design can be seen —
// demo.echo (no side effect), demo.flaky (fails retryably a chosen number of
// times), demo.sleep (times out after a second), demo.report (reports its
// progress page by page), email.send (an effect that is never retried) and
// orders.refund (idempotent, and above 500 it needs an approval). It is also
// the workload of capstan's own tests, and an example of capabilities written
// against the executor's API.
//
// Every handler but demo.echo first appends one message to the calls stream
// (CallsStream), before it does anything else, under a message id of its own
// call: a second call, whatever its attempt, shows as a second message there.
// Crash tests count the calls stream, which outlives the workers they kill.
// demo.echo records nothing: it is the no-op that benchmarks call; nor does
// demo.report, whose pages only report their progress.
//
// email.send and orders.refund recover a lost attempt (DESIGN §5): email.send
// records a receipt as soon as its email is in the outbox, and both reconcile
// by the execution's idempotency key, where their effect lives — the outbox
// holds at most one email per key (OutboxSubject.<key>, create-only), the
// refunds bucket one refund per key. The key is the principal's and the
// execution id's together: two principals calling with the same execution id
// send two emails and record two refunds.
//
// Serving the catalog from a worker of your own:
//
//	js, err := demo.Provision(ctx, nc, 0) // the outbox, calls stream and refunds bucket
//	if err != nil {
//		return err
//	}
//	reg, err := executor.NewRegistry(demo.Catalog(js)...)
//	if err != nil {
//		return err
//	}
//	w, err := executor.NewWorker(nc, reg, executor.WorkerConfig{})
//	if err != nil {
//		return err
//	}
//	return w.Run(ctx)
package demo
