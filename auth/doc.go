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
//     through requests the workers serve (executor.Client.ListApprovals and
//     Decide); they record decisions with the approver's authenticated
//     identity. It reads catalog entries by key and no bucket else.
//   - worker: serves pools; the only role that writes records, envelopes,
//     approvals, the catalog and the audit trail. It cannot touch grants,
//     delete streams or remove audit events.
//   - admin: provisions resources and publishes grants.
//   - notifier: pulls the approvals' changes from the notify consumers and
//     acknowledges them (package notify); it writes nothing, creates no
//     consumer and reads no other bucket.
//
// The mechanism is NATS's decentralized authentication, with an account per
// principal (DESIGN §12): Init creates an operator, the system account and its
// push user, and the capstan account that holds every stream and bucket and
// whose users are the admins and workers; Add gives each producer and approver
// an account of its own that imports from the capstan account only its own
// subjects (crossings, the one table of them), so that whatever answer it
// provokes stays in its account. The server trusts the operator and learns a
// principal's account when PushAccounts sends it, with no restart; its grant
// reaches workers through the grants bucket (PublishGrants), which only admins
// write. Remove revokes a principal, and the next push disconnects it.
// Migrate moves a setup of the earlier one-account layout.
//
// From zero:
//
//	setup, err := auth.Init("secrets", "")            // admin, worker and push credentials, nats-server.conf
//	err = setup.Add(auth.Grant{Principal: "agent", Role: auth.RoleProducer,
//		Actors: []string{"user:*"}, Surfaces: []string{"mcp"}, Capabilities: []string{"orders.*"}})
//	// nats-server -c secrets/nats-server.conf -p 4222 -js -sd /var/lib/capstan
//	// or: capstan server --auth secrets
//	_, err = auth.PushAccounts(ctx, pushConn, setup)  // a connection of secrets/push.creds
//	err = auth.PublishGrants(ctx, adminJetStream, setup, 0)
//	nc, err := executor.Connect(executor.ConnectOptions{Creds: setup.CredsPath("agent")})
//
// The capstan auth command does the same from a shell (capstan auth push).
package auth
