// Package telemetry makes capstan operable in production: Prometheus metrics
// and OpenTelemetry traces of what workers and clients do.
//
// A [Telemetry] is an observe.Worker and an observe.Client. Set it on the
// workers and clients of a process, serve its [Telemetry.Handler] on
// /metrics, and, in one process per deployment, [Telemetry.Watch] the deployment
// for the queues and the pending approvals:
//
//	tel := telemetry.New(telemetry.Options{TracerProvider: tp}) // tp: yours, or nil for metrics only
//	tel.Watch(nc, "", 0)
//	w, err := executor.NewWorker(nc, reg, executor.WorkerConfig{Pool: "payments", Observer: tel.Worker()})
//	c, err := executor.NewClient(nc, executor.ClientConfig{Observer: tel.Client()})
//	http.Handle("/metrics", tel.Handler())
//
// As OpenTelemetry asks of a library, the package takes a
// trace.TracerProvider and never chooses an exporter: it links the
// OpenTelemetry API, not its SDK, OTLP or gRPC. The program builds the
// provider with the exporter it wants; package telemetry/otlp builds one from the
// OTEL_* variables, as the capstan command does, and is the only part of
// capstan that links the OTLP exporters. Metrics go to a Prometheus registry
// (Options.Registry, or one of its own).
//
// # Metrics
//
// Workers: capstan_executions_finalized_total{capability,pool,status,code},
// capstan_attempts_total, capstan_retries_total{previous_code},
// capstan_takeovers_total{from_state}, capstan_outcome_unknown_total,
// capstan_limited_total{kind,action}, capstan_limit_slots_held (DESIGN §17),
// capstan_audit_publish_failures_total, capstan_records_skipped_total{bucket}
// (records a listing skipped because they do not decode, each also logged
// with its key), capstan_executions_in_flight, and the
// histograms capstan_handler_duration_seconds (one attempt),
// capstan_execution_duration_seconds (submission to envelope),
// capstan_queue_wait_seconds (submission to first delivery) and
// capstan_stage_duration_seconds{stage} (claim, policies, approval, start,
// audit, finalize: the stages that wait on I/O).
// Clients: capstan_client_requests_total{capability,outcome} and
// capstan_client_call_duration_seconds{capability,status}. Read from the
// broker on a scrape (Watch): capstan_pool_pending_requests,
// capstan_pool_unacknowledged_requests and
// capstan_pool_oldest_request_age_seconds per pool, and
// capstan_approvals_pending per capability. A notifier's counts (capstan
// notify --metrics, or a worker's --notify), read on a scrape from the same
// Registry: capstan_notifications_sent_total,
// capstan_notifications_failed_total and capstan_notification_retries_total
// per channel and kind, and capstan_notifications_in_flight.
//
// Labels are bounded: capability ids (a capability no worker serves counts as
// "_unknown", ids past Options.MaxCapabilities as "_other"), pools, statuses,
// error codes, stage names and the configured channels' names; never
// execution or actor ids. Which worker is
// slow is the scrape's own instance label.
//
// # Traces
//
// A client starts a span per request ("call <capability>") and sends its W3C
// trace context in the request's traceparent. The worker continues it: a
// "queue wait" span from submission to first delivery, "process
// <capability>" for its work on the delivery, and under it "claim" (the
// record's create, or a takeover), "policies" (when there are any),
// "approval" (when one is asked for or used), "start" (the record's
// running{n} write) and "audit" (strict mode) before each attempt, one
// "attempt N" per attempt (the handler's context carries it, so the
// handler's own spans join the trace) and "finalize". The audit events of the execution carry the trace id.
//
// With no TracerProvider (otlp.TracingFromEnv returns none when no OTEL_*
// variable asks for an exporter), no span is started, nothing is exported,
// and an execution costs its observer the metrics' updates only (a few µs and
// 7 allocations; see BenchmarkObserver_PerExecution and the README).
package telemetry
