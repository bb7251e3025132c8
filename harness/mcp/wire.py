"""The stdio wire of `forge mcp` and the first answer on it (standard library only: front.py
writes it before anything else loads; server.py serves the rest of the conversation on it).

- `instructions(task_id, problem)`: the server's instructions (a start-up problem first).
- `initialize_result(params, task_id, problem)`: the `initialize` result the SDK server
  gives: the protocol version it picks (`HANDSHAKE_VERSIONS`), its `CAPABILITIES`, name and
  version.
- `answerable(line)`: the first message, when it is an `initialize` request whose params
  the SDK server accepts (else that server answers it itself).
- `Wire`: the client's side (see its docstring); `claim_stdio()` holds it on private
  descriptors.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import sys
import threading
from typing import Any

INSTRUCTIONS = """\
infer-forge: every call here is recorded in the task's ledger with you as its actor.
Read the task first (task_show, task_memory). A loop block: block_start (a sub-goal and a
candidate inside the task's scope; {} measures the baseline) -> evaluate (or engine_up,
bench, engine_down) -> block_verify (the contract's gates) -> block_handoff (state reached,
findings, next sub-goal). run_command answers its output's tail; artifact_read reads a whole
output or any artifact of the task by its digest. The contract is fixed: candidates outside
the scope, edits to the task definition or its gates and writes outside the task's
directories are refused and recorded."""

# The SDK's (mcp_types.version.HANDSHAKE_PROTOCOL_VERSIONS) and what its MCPServer declares
# (`create_initialization_options`): the test compares both with the SDK's own.
HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
CAPABILITIES = {"prompts": {"listChanged": False},
                "resources": {"subscribe": False, "listChanged": False},
                "tools": {"listChanged": False}}
SERVER_NAME = "forge"


def instructions(task_id: str | None, problem: str | None) -> str:
    """The server's instructions: a start-up problem first (one line), the bound task."""
    head = f"forge mcp cannot serve: {problem}\n" if problem else ""
    bound = (f"\nThis server is bound to task {task_id}: every tool's task_id defaults to it."
             if task_id else "")
    return head + INSTRUCTIONS + bound


def server_version() -> str:
    from importlib.metadata import version

    return version("infer-forge")


def initialize_result(params: dict[str, Any], task_id: str | None, problem: str | None
                      ) -> dict[str, Any]:
    """The `initialize` result the server gives (module contract)."""
    requested = params.get("protocolVersion")
    return {"protocolVersion": requested if requested in HANDSHAKE_VERSIONS
            else HANDSHAKE_VERSIONS[-1],
            "capabilities": CAPABILITIES,
            "serverInfo": {"name": SERVER_NAME, "version": server_version()},
            "instructions": instructions(task_id, problem)}


def answerable(line: str) -> dict[str, Any] | None:
    """The first message, when it is an `initialize` request the front can answer."""
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    if not isinstance(msg, dict) or msg.get("method") != "initialize" or "id" not in msg:
        return None
    p = msg.get("params")
    info = p.get("clientInfo") if isinstance(p, dict) else None
    if not (isinstance(p, dict) and isinstance(p.get("protocolVersion"), str)
            and isinstance(p.get("capabilities"), dict) and isinstance(info, dict)
            and isinstance(info.get("name"), str) and isinstance(info.get("version"), str)):
        return None  # the server's own validation answers it
    return msg


class Wire:
    """The client's side of stdio: lines read on a thread (the server reads them as a file,
    `readline`), messages written whole under a lock (`write`); the front's answer to the
    first `initialize` and the server's duplicate of it."""

    def __init__(self, fd_in: int, fd_out: int) -> None:
        self._in = os.fdopen(fd_in, "rb", closefd=False)
        self._out = fd_out
        self._lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._pending: list[str] = []
        self._eof = False
        self._lock = threading.Lock()
        self._answered: dict[str, Any] | None = None  # the front's answer, until dropped
        threading.Thread(target=self._read, name="forge-mcp-wire", daemon=True).start()

    def _read(self) -> None:
        for line in self._in:
            self._lines.put(line.decode("utf-8", "replace"))
        self._lines.put("")

    def readline(self) -> str:
        if self._pending:
            return self._pending.pop(0)
        if self._eof:
            return ""
        line = self._lines.get()
        self._eof = line == ""
        return line

    def close(self) -> None:
        """End of input for whoever reads next (a reader still waiting when the server
        ends on a signal would otherwise hold the process)."""
        self._lines.put("")

    def unread(self, line: str) -> None:
        self._pending.append(line)

    def send(self, message: dict[str, Any]) -> None:
        self._write(json.dumps(message, separators=(",", ":")) + "\n")

    def answer_first(self, request: dict[str, Any], result: dict[str, Any]) -> None:
        self._answered = {"id": request["id"], "result": result}
        self.send({"jsonrpc": "2.0", "id": request["id"], "result": result})

    def write(self, text: str) -> int:
        """The server's output (one message a call)."""
        if self._answered is not None and self._duplicate(text):
            return len(text)
        self._write(text)
        return len(text)

    def flush(self) -> None:
        pass

    def _duplicate(self, text: str) -> bool:
        try:
            msg = json.loads(text)
        except ValueError:
            return False
        ours = self._answered
        if not isinstance(msg, dict) or ours is None or msg.get("id") != ours["id"] \
                or "method" in msg:
            return False
        self._answered = None
        theirs = msg.get("result") or {"error": msg.get("error")}
        for key in ("protocolVersion", "capabilities", "serverInfo"):
            if theirs.get(key) != ours["result"].get(key):
                print(f"forge mcp: the first answer's {key} was {ours['result'].get(key)!r}, "
                      f"the server's is {theirs.get(key)!r}", file=sys.stderr, flush=True)
        return True

    def _write(self, text: str) -> None:
        data = memoryview(text.encode("utf-8"))
        with self._lock:
            while data:
                data = data[os.write(self._out, data):]


def claim_stdio() -> tuple[int, int]:
    """The wire on private descriptors; fd 0 then reads /dev/null, fd 1 writes to stderr."""
    wire_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    wire_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return wire_in, wire_out
