// Package audit is capstan's durable trail: every execution's events, in
// pipeline order, on one JetStream stream (subject capstan.audit.<executionId>),
// as msgpack records that never carry an input or an output, only their hash.
//
// A runtime retry and a model calling the tool again look different here: a
// retry is a capability.retried event inside one execution id; a re-invocation
// is a new execution id with its own capability.requested.
package audit
