// Package mcpbridge serves a capstan deployment's capabilities as Model
// Context Protocol tools, so that any MCP host (Claude Desktop, an IDE, an
// agent framework) calls them with every capstan guarantee intact.
//
// A bridge is one executor client on the mcp surface, and one MCP server per
// actor:
//
//	b, err := mcpbridge.New(nc, mcpbridge.Config{})       // nc: the bridge's NATS connection
//	server, err := b.Server(ctx, actor)                   // stdio: one actor per process
//	err = server.Run(ctx, mcpbridge.TasksTransport(&mcp.StdioTransport{}))
//
//	tokens, err := mcpbridge.ParseTokens(file)            // "TOKEN kind:id" per line
//	http.Handle("/mcp", b.Handler(tokens, nil))           // streamable HTTP; no token, no tools
//
// What an MCP client sees and does:
//
//   - Tools are named as every host takes them (Config.ToolNames,
//     ToolNamesPortable by default): ^[a-zA-Z0-9_-]{1,64}$, the capability
//     id's dots become underscores (orders.refund is orders_refund), and
//     the id stays in the description and in _meta ("capstan/capability");
//     a call by the id still runs. Two capabilities one name would fit are
//     refused when the bridge starts (ErrToolNameCollision).
//
//   - tools/list is what Client.Describe shows the actor on the mcp surface:
//     hidden and unexposed capabilities are absent. Each tool carries the
//     input's JSON Schema, the description, and hints derived from the
//     metadata (read-only for none and read, destructive for destructive,
//     idempotent as declared, open-world for external). When a worker starts
//     or stops serving a capability, the bridge describes again and the
//     clients get notifications/tools/list_changed.
//
//   - tools/call is one execution, submitted with the actor asserted and
//     awaited: completed answers the output as structured content (an object
//     as is, anything else as {"result": ...}) and JSON text (and, for an
//     outcome recovered from a lost attempt, what Recovered.ForModel says,
//     with _meta capstan/recovered); failed and
//     cancelled answer isError with ForModel() only, never a private cause;
//     approval-required answers what is pending, why, and the approval id.
//     Once someone else approved it, the same call again (or the tool
//     capstan_resume) runs it, once. Config.ApprovalWait keeps the caller
//     waiting for the decision instead.
//
//   - With a progress token, the caller gets the execution's steps from its
//     audit trail: queued, waiting for approval, started (attempt n),
//     retrying. notifications/cancelled cancels the execution; a lost
//     connection does not, and capstan_status reads the envelope later.
//
//   - A client that declares the Tasks extension (io.modelcontextprotocol/tasks)
//     gets a task instead of a blocking call when the execution outlasts
//     Config.TaskAfter (1 s) or needs an approval: the task id is the
//     execution id, tasks/get reads the record, envelope and approval
//     (input_required while an approval is pending), tasks/cancel cancels.
//     A task is capstan's durable state only, so it survives the bridge's
//     restart and any bridge of a deployment answers for it.
//
//   - A 2025-11-25 client gets the core tasks of that protocol (what the
//     official TypeScript SDK's client.experimental.tasks speaks): the
//     tasks capability, taskSupport "optional" on each capability's tool, a
//     task-augmented tools/call answered {"task": ...} at once, and
//     tasks/get, tasks/result, tasks/list and tasks/cancel, on the same
//     durable execution (tasks_core.go). Serve stdio or in-memory servers
//     over TasksTransport(t) so that the call's "task" parameter reaches the
//     bridge; Handler does it for HTTP.
//
// The bridge names the actor of every request in one place (the bearer
// token's actor over HTTP, the configured actor over stdio). Under capstan's
// trust boundary its NATS identity is a delegating producer, whose grants
// say which actors it may assert on the mcp surface: a caller whose actor
// the grant does not allow is answered 403 over HTTP. Such a bridge reads
// only what a producer may: approvals through the listing the workers serve
// (those it requested), progress from execution records, tools described
// again every 10 s (it cannot watch the catalog), and an execution's owner
// from its id, which carries a tag of the caller's actor.
package mcpbridge
