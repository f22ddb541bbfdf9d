// Package observe names the few points at which capstan's workers and clients
// report what they do, so that metrics and traces can hang on them without the
// executor knowing about either.
//
// A worker given a [Worker] (executor.WorkerConfig.Observer) calls Begin when
// it takes a delivery to work on, and then the returned [Execution] at each
// step of it: the stages that do I/O, each attempt of the handler, a retry, a
// takeover from a lost worker, the envelope it finalized, and End. A client
// given a [Client] (executor.ClientConfig.Observer) calls it once per request
// it submits. The context an observer returns is the one the execution (and
// so the handler) runs in: a tracer puts its span there.
//
// Observers are called on the execution's own goroutine, many executions at
// once, and must not block. A nil observer costs nothing: [NopWorker] and
// [NopClient] stand in for it.
//
// Package telemetry implements both with Prometheus metrics and OpenTelemetry
// traces; a test or an embedder can implement them with a few lines:
//
//	type statuses struct{ observe.NopWorker }
//
//	func (statuses) Begin(ctx context.Context, d observe.Delivery) (context.Context, observe.Execution) {
//		return ctx, finalized{}
//	}
//
//	type finalized struct{ observe.NopExecution }
//
//	func (finalized) Finalized(env *envelope.Envelope) { log.Println(env.CapabilityID, env.Status) }
package observe
