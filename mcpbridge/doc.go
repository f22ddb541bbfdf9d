// Package mcpbridge serves a capstan deployment's capabilities as Model
// Context Protocol tools.
package mcpbridge
