package mcpbridge

import "github.com/modelcontextprotocol/go-sdk/mcp"

// serverCapabilities are what every actor's server declares: tools whose
// list changes.
func serverCapabilities() *mcp.ServerCapabilities {
	return &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}}
}

// routeTasks adds the Tasks extension's methods to a view's server.
func (b *Bridge) routeTasks(v *view) {}
