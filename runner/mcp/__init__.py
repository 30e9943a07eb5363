"""`runner mcp`: the commands as MCP tools over stdio (mcp_server) and what an agent may ask of them, the
server's trust model (mcp_policy).

May import: the primitives, state/, spec/, remote/, results/, commands/ and fleet/ (a fleet run's id: the CLI's
fleet/targets answers). Not cli/.
"""
