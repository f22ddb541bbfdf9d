// Package trail makes the audit stream a transparency log (DESIGN §8, "The
// trail as a log"): every stored audit message, in the stream's order, is a
// leaf of an RFC 6962 Merkle tree (golang.org/x/mod/sumdb/tlog); a
// checkpointer, one at a time per deployment under a lease, extends the tree
// as messages are stored, keeps its hashes as tiles in the trail bucket, and
// signs checkpoints (C2SP tlog-checkpoint notes, Ed25519,
// golang.org/x/mod/sumdb/note) into the checkpoints stream. A verifier needs
// only the messages, the tiles, the checkpoints and the public key: Verify
// recomputes the tree, checks every checkpoint's signature and their
// consistency, and names the first message that does not match a checkpoint
// it was given (edited, missing, reordered, appended before); Prove returns
// inclusion proofs of chosen messages.
//
// The package holds no API of capstan's: `capstan server`, `capstan dev` and
// `capstan audit checkpointer` run a Checkpointer with the operator's key;
// `capstan audit verify|prove|checkpoint|export` and package audit's Prove
// read what it wrote.
//
//	signer, _, err := trail.LoadSigner(keyFile)
//	if err != nil { ... }
//	cp := trail.NewCheckpointer(nc, names, signer, trail.Config{})
//	go cp.Run(ctx)
//	...
//	report, err := trail.Verify(ctx, trail.FromDeployment(nc, names), verifiers, trail.VerifyOptions{})
package trail
