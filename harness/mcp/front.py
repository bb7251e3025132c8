"""`forge mcp` on stdio: the first answer before the rest of forge loads.

The MCP SDK, the ledger and the harness take about a second to import; a client that starts
its first turn once `initialize` is answered (Codex) would start it without forge's tools.
So the front, standard library only (with ledger/home.py), answers the client's `initialize`
itself, then loads the server (server.py `start`) and hands it the whole conversation.

Contract:
- `stdio_args(argv)`: `(home, task_id)` for a plain `forge [--home H] mcp [--task T]`, what
  the console script (entry.py) serves before the CLI loads; None for anything else (click
  parses that: `--http`, `--help`, a mistake).
- `serve(home, task_id, journal)`: the wire is the process's stdin/stdout, held on private
  descriptors; while it serves, fd 0 reads /dev/null and fd 1 writes to stderr (a command's
  stray output never lands in the protocol). The start-up problem (`ledger.home.glance`) is
  known before the first message is read. A first message that is a valid `initialize`
  request is answered at once (wire.py `initialize_result`): the protocol version,
  capabilities and server info the SDK server answers (tests/harness/mcp/test_mcp_start.py
  holds them equal) and the instructions. The server (server.py `start`) then reads every
  message from the first; its own answer to an `initialize` the front answered is dropped,
  and said on stderr where it differs (the instructions aside: a problem found only by the
  real open, which tool calls then answer).
- The exit status: 0, or 1 when the session had a start-up problem.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ...ledger.home import glance
from .wire import Wire, answerable, claim_stdio, initialize_result

if TYPE_CHECKING:
    from .server import Journal


def stdio_args(argv: list[str]) -> tuple[str | None, str | None] | None:
    """`(home, task_id)` of `[--home H] mcp [--task T]`; None for any other command line."""
    home = task = None
    rest = list(argv)

    def value(option: str) -> str | None:
        arg = rest.pop(0)
        if arg.startswith(option + "="):
            got = arg[len(option) + 1:]
        elif rest:
            got = rest.pop(0)
        else:
            return None
        return got or None  # an empty value: click says what it makes of it

    while rest and (rest[0] == "--home" or rest[0].startswith("--home=")):
        if (home := value("--home")) is None:
            return None
    if not rest or rest.pop(0) != "mcp":
        return None
    while rest and (rest[0] == "--task" or rest[0].startswith("--task=")):
        if (task := value("--task")) is None:
            return None
    return None if rest else (home, task)


def serve(home: str | Path | None, task_id: str | None, journal: Journal | None = None
          ) -> int:
    """Serve one client on stdin/stdout until it closes them (module contract)."""
    wire = Wire(*claim_stdio())
    problem = glance(home, task_id)
    if problem:
        print(f"forge mcp: {problem}", file=sys.stderr, flush=True)
    first = wire.readline()
    request = answerable(first)
    if request is not None:
        wire.answer_first(request, initialize_result(request["params"], task_id, problem))
    wire.unread(first)
    # For start-up time: the SDK, the ledger and the harness load after the first answer.
    from .server import run_on, start

    server = start(home, task_id, problem, journal)
    try:
        run_on(server, wire)
    finally:
        wire.close()
    return 1 if server.problem else 0
