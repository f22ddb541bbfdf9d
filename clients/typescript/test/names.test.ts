// A tool's default name is one every model provider takes
// (^[a-zA-Z0-9_-]{1,64}$) and the one the MCP bridge lists for the same
// capability (mcpbridge.ToolName, ToolNamesPortable): a capability id may
// have 128 bytes, a tool name at most 64.

import assert from "node:assert/strict";
import { test } from "node:test";
import { toolName } from "../src/ai.js";

const hostNames = /^[a-zA-Z0-9_-]{1,64}$/;
const long = "a" + ".abcdefghij".repeat(12); // 121 bytes, a valid capability id

test("tool names: every provider takes them, and they are the MCP bridge's", () => {
  // What mcpbridge.ToolName answers for each id.
  const bridge: Record<string, string> = {
    "demo.echo": "demo_echo",
    "crm.contact.get-by_email": "crm_contact_get-by_email",
    ["b".repeat(64)]: "b".repeat(64),
    ["b".repeat(65)]: "b".repeat(55) + "_94e555e5",
    [long]: "a_abcdefghij_abcdefghij_abcdefghij_abcdefghij_abcdefghi_a9711d50",
    [long + "x"]: "a_abcdefghij_abcdefghij_abcdefghij_abcdefghij_abcdefghi_e510e5f8",
  };
  for (const [id, want] of Object.entries(bridge)) {
    const got = toolName(id);
    assert.match(got, hostNames, `${id} is named ${got}, which providers refuse`);
    assert.equal(got, want, `${id}: the MCP bridge names it ${want}`);
  }
});
