// Package limits keeps the counters behind capabilities' limits (DESIGN
// §17): concurrency slots, rates and budgets, in the deployment's limits
// bucket, changed by compare-and-swap only.
//
// The rules are pure functions of a counter's value, the limit and the time
// (rules.go), tested table-driven without a server: a slot list and who may
// join it, a rate as the generic cell rate algorithm (one timestamp per
// counter), a budget as sums over a rolling window cut into granules, with
// the executions it charged kept for a while so that no execution is charged
// twice. The Store (store.go) reads and swaps the counters: it takes every
// limit an execution needs, or none of them (what it took before a limit
// said no is given back), and it releases a slot when the execution's
// attempts end. A slot is held under the execution's own lease: a holder
// whose lease has run out is checked against the execution's record before
// anyone counts it as gone, so a slot held by a worker that died frees
// itself when that worker's lease lapses, and never earlier: when a taker
// finds the slots full, or at the sweep (Store.Sweep) when no one asks.
//
// The engine (executor/internal/engine) takes and releases; the executor
// reads usage to bind it in an approval; `capstan limits`, the metrics and
// the console read it to show usage against each limit.
package limits
