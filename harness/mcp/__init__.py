"""The harness as an MCP server (`forge mcp`), above the loop: the server (server.py), the
loop's steps as agent tools and the whole tool list it offers (loop_tools.py), and one session's
own tools: engines, bench, evaluation, weights, queries (session_tools.py)."""
