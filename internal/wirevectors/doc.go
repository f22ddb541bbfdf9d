// Package wirevectors holds the golden vectors of capstan's wire contract
// (docs/wire.md): the bytes Go's codec writes for every record a client in
// another language reads or writes, each with a JSON description of what it
// holds, and the requests such a client wrote, which Go must read.
//
//   - testdata/go: written by TestVectors_Go with -update; checked on every
//     run: Go writes these bytes today, and each record decodes and encodes
//     again to the same bytes (or, for a record with a field no reader knows,
//     to the canonical record it names). The vectors a client must refuse
//     are refused.
//   - testdata/ts: written by the TypeScript client's tests
//     (clients/typescript, UPDATE_VECTORS=1); TestVectors_TypeScript decodes
//     each with Go's decoders, compares it with its description and encodes
//     it again to the same bytes.
//
// The package has no code beyond its tests.
package wirevectors
