// Package auth is capstan's trust boundary: principals, their roles and
// grants, the credentials that carry them, and the NATS server configuration
// that enforces them.
//
// The process that talks to a model is the least trusted part of an agent
// system. capstan therefore never believes what a request body says about who
// sent it. A principal is an authenticated NATS user; its name is a token of
// every subject it publishes to (capstan.exec.<principal>.<capability>,
// capstan.cancel.<principal>.<id>, capstan.describe.<principal>,
// capstan.approvals.decide.<principal>), and the permissions signed into its
// credentials let it publish under its own token only. Workers read the
// principal from the subject the server accepted and check the request's
// actor, surface and capability against the principal's grant before anything
// runs.
//
// Roles:
//
//   - producer: submits requests within its grant (actors it may assert, such
//     as user:alice or user:* for a gateway; surfaces; capabilities), receives
//     and reads only its own envelopes and records, cancels only its own
//     executions, lists (through the workers) only the approvals its own
//     requests asked for. It writes no key-value bucket and no audit event.
//   - approver: lists and decides the approvals of the types it holds,
//     through requests the workers serve; they record decisions with the
//     approver's authenticated identity.
//   - worker: serves pools; the only role that writes records, envelopes,
//     approvals, the catalog and the audit trail. It cannot touch grants,
//     delete streams or remove audit events.
//   - admin: provisions resources and publishes grants.
//   - notifier: pulls the approvals' changes from the notify consumers and
//     acknowledges them (package notify); it writes nothing, creates no
//     consumer and reads no other bucket.
//
// The mechanism is NATS's decentralized authentication: Init creates an
// operator, a system account and one account holding capstan's streams and
// buckets; every principal is a user signed by that account, with its
// permissions inside its signed credentials. The server trusts the operator,
// so adding a principal changes nothing on the server: only the grant must
// reach the grants bucket (PublishGrants), which only admins write and
// workers watch.
//
// From zero:
//
//	setup, err := auth.Init("secrets", "")            // admin.creds, worker.creds, nats-server.conf
//	err = setup.Add(auth.Grant{Principal: "agent", Role: auth.Producer,
//		Actors: []string{"user:*"}, Surfaces: []string{"mcp"}, Capabilities: []string{"orders.*"}})
//	// nats-server -c secrets/nats-server.conf -p 4222 -js -sd /var/lib/capstan
//	// or: capstan server --auth secrets
//	err = auth.PublishGrants(ctx, adminJetStream, setup, 0)
//	nc, err := broker.Connect(broker.ConnectOptions{Creds: setup.CredsPath("agent")})
//
// The capstan auth command does the same from a shell.
package auth
