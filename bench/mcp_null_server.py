"""A do-nothing MCP server on stdio, standard library only: the floor `forge mcp`'s start is
measured against (bench/mcp_initialize.py). It answers `initialize` (the version asked for),
`tools/list` (no tools) and `ping`; any other request is "method not found"; notifications
are read and ignored. It ends at EOF.

    python bench/mcp_null_server.py
"""

from __future__ import annotations

import json
import sys


def answer(msg: dict) -> dict | None:
    method, mid = msg.get("method"), msg.get("id")
    if mid is None:
        return None  # a notification
    if method == "initialize":
        version = (msg.get("params") or {}).get("protocolVersion", "2025-06-18")
        result: dict = {"protocolVersion": version, "capabilities": {"tools": {}},
                        "serverInfo": {"name": "null", "version": "0"}}
    elif method == "tools/list":
        result = {"tools": []}
    elif method == "ping":
        result = {}
    else:
        return {"jsonrpc": "2.0", "id": mid,
                "error": {"code": -32601, "message": f"method not found: {method}"}}
    return {"jsonrpc": "2.0", "id": mid, "result": result}


def main() -> None:
    for line in sys.stdin:
        reply = answer(json.loads(line))
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
