// Package envelope holds capstan's wire types: the execution request a producer
// publishes, the one result envelope a worker finalizes, the error model and the
// actor. Everything on the wire is msgpack whose field names are the types' json
// tags, so a record written by Go, by the CLI as JSON or by another language reads
// the same.
//
// The smallest useful program encodes a request and reads it back:
//
//	req := envelope.Request{
//		V:            envelope.Version,
//		ExecutionID:  envelope.NewExecutionID(),
//		CapabilityID: "demo.echo",
//		Input:        envelope.MustRaw(map[string]any{"hello": "world"}),
//		Actor:        envelope.Actor{Kind: "user", ID: "alice"},
//	}
//	b, err := envelope.Marshal(&req)
//	if err != nil { ... }
//	got, err := envelope.DecodeRequest(b) // never panics on bad bytes
//
// This package depends on nothing else of capstan's.
package envelope
