"""The `forge` console script: `forge [--home H] mcp [--task T]` starts on the MCP server's
front (harness/mcp/front.py), which answers the client's `initialize` before the CLI, the
ledger and the SDK load; every other command line is the CLI's (cli.py `main`)."""

from __future__ import annotations

import sys
from typing import Any


def main() -> None:
    # For start-up time: the front is standard library only; the CLI loads only when needed.
    from .harness.mcp.front import serve, stdio_args

    args = stdio_args(sys.argv[1:])
    if args is None:
        # For start-up time: the CLI loads here, for every other command.
        from .cli import main as cli_main

        cli_main()
        return
    sys.exit(serve(*args, journal=_journal))


def _journal(ws: Any) -> tuple[Any, Any]:
    """The journal's retrieve and ask (cli.py `mcp_journal`), loading the CLI and the wiki at
    their first call, not before `tools/list` is answered."""

    def retrieve(query: str, k: int) -> Any:
        # For start-up time: the CLI and the wiki load at the first journal call.
        from .cli import mcp_journal

        return mcp_journal(ws)[0](query, k)

    def ask(question: str) -> Any:
        # For start-up time: as retrieve.
        from .cli import mcp_journal

        return mcp_journal(ws)[1](question)

    return retrieve, ask
