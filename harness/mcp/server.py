"""`forge mcp`: the harness as an MCP server (the official SDK's `MCPServer`), so a coding
agent (Claude Code, Codex CLI, any MCP client) drives a task's loop under its contract.

Contract:
- Tools: every agent tool (`loop_tools.TOOLS`: the task tools, the loop's steps, the
  approval request, the skills; then this session's tools of session_tools.py), each
  with its pydantic parameters' JSON schema as `inputSchema`. Every call goes through
  `tool_registry.call`: a refusal (a candidate outside the scope, a write to the task
  definition or its gates, a path or cwd outside the task's directories, an unknown tool,
  arguments that do not validate) is recorded as AgentStepFailed and answered as a tool
  error (`isError`, the one-line reason as its text); a result is its JSON as text. Bound
  to a task (`--task`), a tool's `task_id` is optional in its schema and defaults to it
  (`tool_registry.call`).
- The actor of every event a call records: `Actor(kind="agent", name="<client>/<version>"`
  from the client's `initialize` clientInfo, `model=` the call's `_meta.model` when the
  client says it, else `FORGE_AGENT_MODEL` in the server's environment (set it in the
  client's server configuration), else none).
- Calls run one at a time, in order, on one worker thread: the ledger holds the agent's
  steps as it took them, and the event loop keeps answering while an engine starts.
- Resources: `forge://tasks/{task_id}/definition` (the definition with its contract and
  hashes), `forge://tasks/{task_id}/memory` (Task Memory in brief), `forge://skills` (the catalog)
  and `forge://skills/{name}` (one skill with its body). A server bound to a task (`--task`)
  serves that task only, and `resources/list` lists its definition and memory.
- A start-up problem (no workspace, an unreadable one, an unknown bound task) does not end
  the server: `start` serves `problem_server`, whose instructions say the problem first and
  whose every tool call and resource read answers it (`isError`, the same one line); it is
  said on stderr too. Stdio starts on front.py, which answers `initialize` before this
  module loads.
- Engines a session started are stopped when the server ends (stdin closed, Ctrl-C,
  SIGTERM); their stops are recorded.
- `serve_http` binds 127.0.0.1 by default and refuses a host that is not loopback unless
  `allow_remote` (the server runs commands and writes files for whoever reaches it).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from functools import cache
from pathlib import Path
from typing import Any

from ...ledger import events as E
from ...ledger.clock import utcnow
from ...ledger.errors import LedgerError, NotFoundError
from ...ledger.home import unknown_task
from ...ledger.secrets.redactor import redact_message
from ...ledger.workspace import Workspace, open_workspace
from ...projections.errors import ProjectionError
from ...projections.memory import read_memory
from ...projections.memory_brief import brief
from ..agents import skills, tool_registry
from ..errors import HarnessError
from .loop_tools import TOOLS
from .session_tools import AgentSession, Ask, Retrieve, session_tools
from .wire import SERVER_NAME, Wire, instructions, server_version

# The journal's retrieve and ask on a workspace (cli.py's: the harness does not import the wiki).
Journal = Callable[[Workspace], tuple[Retrieve | None, Ask | None]]

MODEL_ENV = "FORGE_AGENT_MODEL"
META_MODEL_KEY = "model"  # a call's `_meta.model`: the model the client runs
DEFAULT_CLIENT = "mcp-client"  # a client that did not say who it is

def actor_of(client_info: Any, meta: Any, default_model: str | None) -> E.Actor:
    """The agent behind a call: the client's name/version, the model it says it runs."""
    name = DEFAULT_CLIENT
    if client_info is not None and getattr(client_info, "name", None):
        name = f"{client_info.name}/{getattr(client_info, 'version', '') or '?'}"
    model = meta.get(META_MODEL_KEY) if isinstance(meta, dict) else None
    model = model if isinstance(model, str) and model.strip() else default_model
    return E.Actor(kind="agent", name=name[:200], model=model[:200] if model else None)


class _Worker:
    """One daemon thread that runs the tool calls in order (a daemon: a call still running
    when the server ends does not hold the process; its engines are stopped at exit)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future] | None] = \
            queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="forge-mcp-tools", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, fut = job
            if not fut.set_running_or_notify_cancel():
                continue  # the client gave up on it before it started
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting request
                fut.set_exception(e)

    async def run(self, fn: Callable[[], Any]) -> Any:
        import asyncio

        fut: Future = Future()
        self._jobs.put((fn, fut))
        return await asyncio.wrap_future(fut)

    def close(self) -> None:
        self._jobs.put(None)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


@cache
def _server_class() -> type:
    """The MCPServer subclass (built on first use: `forge --help` does not import mcp)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ResourceError
    from mcp_types import CallToolResult, TextContent, ToolAnnotations
    from mcp_types import Tool as MCPTool

    class ForgeMCPServer(MCPServer):
        """Lists and calls the agent tool registry instead of decorated functions."""

        def __init__(self, ws: Workspace | None, *, task_id: str | None,
                     retrieve: Retrieve | None, model: str | None,
                     progress: Callable[[str], None], ask: Ask | None = None,
                     problem: str | None = None, owns_ws: bool = False) -> None:
            super().__init__(name=SERVER_NAME, version=server_version(),
                             instructions=instructions(task_id, problem), log_level="WARNING")
            self.ws = ws
            self.task_id = task_id
            self.problem = problem  # a start-up problem: every call answers it
            self.owns_ws = owns_ws
            self.default_model = model
            self.progress = progress
            self.session = AgentSession(ws)  # type: ignore[arg-type]  # None: never called
            self.extra = session_tools(self.session, retrieve, ask)
            self.worker = _Worker()
            self._resources()

        # --- tools ---------------------------------------------------------------------

        def tool_context(self, context: Any = None) -> tool_registry.ToolContext:
            info = meta = None
            if context is not None:
                with contextlib.suppress(ValueError):  # no request: an in-process call
                    rc = context.request_context
                    params = rc.session.client_params
                    info = params.client_info if params is not None else None
                    meta = rc.meta
            assert self.ws is not None  # a server with a problem calls nothing
            return tool_registry.ToolContext(self.ws, actor_of(info, meta, self.default_model),
                                     self.task_id, self.progress, dict(self.extra),
                                     tools=TOOLS)

        def input_schema(self, t: tool_registry.AgentTool) -> dict[str, Any]:
            """A tool's parameters; bound to a task, its `task_id` is optional (the task)."""
            schema = t.params.model_json_schema()
            if self.task_id is not None and "task_id" in schema.get("required", []):
                schema["properties"]["task_id"]["description"] = (
                    f"the task (default: {self.task_id}, the task this server is bound to)")
                schema["required"].remove("task_id")
                if not schema["required"]:
                    del schema["required"]
            return schema  # (a task_id that was optional already says its default)

        async def list_tools(self) -> list[MCPTool]:
            return [MCPTool(name=t.name, description=t.description,
                            input_schema=self.input_schema(t),
                            annotations=ToolAnnotations(read_only_hint=not t.writes))
                    for t in {**TOOLS, **self.extra}.values()]

        async def call_tool(self, name: str, arguments: dict[str, Any],
                            context: Any = None) -> CallToolResult:
            if self.problem is not None:
                return CallToolResult(content=[TextContent(type="text", text=self.problem)],
                                      is_error=True)
            ctx = self.tool_context(context)
            res = await self.worker.run(lambda: _call(ctx, name, arguments))
            text = res.text() if res.ok else str(res.error)
            return CallToolResult(content=[TextContent(type="text", text=text)],
                                  is_error=not res.ok)

        def close(self) -> list[str]:
            self.worker.close()
            stopped = self.session.close()
            if self.owns_ws and self.ws is not None:
                self.ws.close()
            return stopped

        async def run_wire(self, wire: Wire) -> None:
            """Serve the front's wire (front.py): the SDK's stdio transport on its lines."""
            import anyio
            from mcp.server.stdio import stdio_server

            async with stdio_server(stdin=anyio.wrap_file(wire),  # type: ignore[arg-type]
                                    stdout=anyio.wrap_file(wire)) as (read, write):  # type: ignore[arg-type]
                await self._lowlevel_server.run(
                    read, write, self._lowlevel_server.create_initialization_options())

        # --- resources -----------------------------------------------------------------

        def _read(self, task_id: str | None, what: Callable[[], Any]) -> str:
            if self.problem is not None:
                raise ResourceError(self.problem)
            if self.task_id is not None and task_id not in (None, self.task_id):
                raise ResourceError(f"this server works on task {self.task_id}, not "
                                    f"{task_id[:80]!r}")
            try:
                return json.dumps(what(), sort_keys=True, default=str)
            except (HarnessError, LedgerError, ProjectionError) as e:
                raise ResourceError(_one_line(e)) from None

        def _task_definition(self, task_id: str) -> str:
            return self._read(task_id, lambda: _definition(self.ws, task_id))  # type: ignore[arg-type]

        def _task_memory(self, task_id: str) -> str:
            # The brief, as task_memory answers by default (the whole is the tool's `detail`).
            return self._read(task_id, lambda: brief(
                read_memory(self.ws.ledger, task_id)[0], utcnow()))  # type: ignore[union-attr]

        def _resources(self) -> None:
            mime = "application/json"
            what = {"definition": "The task's definition (goal, scope, contract with its "
                    "gates, exit criteria, executor) and its hashes.",
                    "memory": "The task's memory in brief (as task_memory answers by default): "
                    "current block, baseline, best so far, rejections, the last handoff, "
                    "the budget left."}

            @self.resource("forge://tasks/{task_id}/definition", name="task-definition",
                           mime_type=mime, description=what["definition"])
            def definition(task_id: str) -> str:
                return self._task_definition(task_id)

            @self.resource("forge://tasks/{task_id}/memory", name="task-memory",
                           mime_type=mime, description=what["memory"])
            def memory(task_id: str) -> str:
                return self._task_memory(task_id)

            if self.task_id is not None and self.problem is None:  # listed: the bound task's
                tid = self.task_id
                self.resource(f"forge://tasks/{tid}/definition", name=f"{tid}-definition",
                              mime_type=mime, description=what["definition"])(
                    lambda: self._task_definition(tid))
                self.resource(f"forge://tasks/{tid}/memory", name=f"{tid}-memory",
                              mime_type=mime, description=what["memory"])(
                    lambda: self._task_memory(tid))

            @self.resource("forge://skills", name="skills", mime_type=mime,
                           description="The skills (name, category, task types, summary).")
            def skills_list() -> str:
                return self._read(None, lambda: [x.entry() for x in skills.find(self.ws)])  # type: ignore[arg-type]

            @self.resource("forge://skills/{name}", name="skill", mime_type=mime,
                           description="One skill: its catalog entry and markdown body.")
            def skill(name: str) -> str:
                return self._read(None, lambda: skills.get(self.ws, name).as_dict())  # type: ignore[arg-type]

    return ForgeMCPServer


def _call(ctx: tool_registry.ToolContext, name: str, arguments: dict[str, Any]
          ) -> tool_registry.ToolResult:
    """`tool_registry.call`; a fault of forge's own (an exception it does not expect) is still a
    recorded failed step and a tool error, with its traceback on the server's stderr."""
    try:
        return tool_registry.call(ctx, name, arguments)
    except Exception as e:  # noqa: BLE001 - the agent gets an answer, the ledger the fact
        traceback.print_exc(file=sys.stderr)
        why = f"{name}: internal error: {type(e).__name__}: {_one_line(e)}"[:1000]
        tid = arguments.get("task_id")
        tool_registry.record_failure(ctx, name, why, arguments,
                             tid if isinstance(tid, str) else ctx.task_id)
        return tool_registry.ToolResult(False, error=why)


def _definition(ws: Workspace, task_id: str) -> dict[str, Any]:
    mem, _ = read_memory(ws.ledger, task_id)
    if mem.status == "undefined":
        raise HarnessError(f"unknown task {task_id}")
    definition = dict(mem.definition or {})
    return {"task_id": task_id, "status": mem.status, "definition": definition,
            "contract": definition.get("contract"), "definition_hash": mem.definition_hash,
            "contract_hash": mem.contract_hash, "point_hash": mem.point_hash,
            "profile_hash": mem.profile_hash}


def _stderr(line: str) -> None:
    print(f"forge mcp: {line}", file=sys.stderr, flush=True)


def build_server(ws: Workspace, *, task_id: str | None = None,
                 retrieve: Retrieve | None = None, model: str | None = None,
                 progress: Callable[[str], None] = _stderr, ask: Ask | None = None,
                 owns_ws: bool = False) -> Any:
    """The server (an MCPServer; `.session` holds its engines, `.close()` stops them).
    `task_id` binds every call to one task; `retrieve(query, k)` adds journal_retrieve and
    `ask(question)` journal_ask;
    `model` is the agent's model when the client does not say (default: $FORGE_AGENT_MODEL).
    An unknown bound task is a HarnessError (one line, with what to run)."""
    if task_id is not None:
        try:
            mem, _ = read_memory(ws.ledger, task_id)
        except NotFoundError:
            mem = None
        if mem is None or mem.status == "undefined":
            raise HarnessError(unknown_task(task_id, ws.config.home))
    return _server_class()(ws, task_id=task_id, retrieve=retrieve,
                           model=model or os.environ.get(MODEL_ENV) or None, progress=progress,
                           ask=ask, owns_ws=owns_ws)


def problem_server(problem: str, task_id: str | None = None) -> Any:
    """A server that cannot work: its instructions say `problem` first, every tool call and
    resource read answers it (`isError`); its tools are still listed."""
    return _server_class()(None, task_id=task_id, retrieve=lambda _q, _k: None,
                           model=None, progress=_stderr, ask=lambda _q: None,
                           problem=problem)  # the journal's tools listed, never called


def start(home: str | Path | None, task_id: str | None, problem: str | None,
          journal: Journal | None = None) -> Any:
    """The stdio session's server (front.py): the problem server when the front found a
    problem or opening the workspace or its task finds one now (said on stderr), else the
    server on the opened workspace (it closes it), with `journal(ws)`'s retrieve and ask."""
    if problem is None:
        ws = None
        try:
            ws = open_workspace(home)
            retrieve, ask = journal(ws) if journal is not None else (None, None)
            return build_server(ws, task_id=task_id, retrieve=retrieve, ask=ask, owns_ws=True)
        except (HarnessError, LedgerError, ProjectionError) as e:
            if ws is not None:
                ws.close()
            problem = redact_message(_one_line(e))
        _stderr(problem)
    return problem_server(problem, task_id)


def run_on(server: Any, wire: Wire) -> None:
    """Serve `server` on the front's wire until the client closes it."""
    import anyio

    with _serving(server):
        anyio.run(server.run_wire, wire)


@contextlib.contextmanager
def _serving(server: Any) -> Iterator[None]:
    """SIGTERM/SIGHUP end the server like Ctrl-C; on the way out every engine the session
    started is stopped (and its stop recorded)."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        def stop(signum: int, _frame: Any) -> None:
            raise SystemExit(128 + signum)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, stop)
    try:
        yield
    except KeyboardInterrupt:
        pass
    finally:
        for sig in previous:  # a second signal during the cleanup is not an unwind
            signal.signal(sig, signal.SIG_IGN)
        stopped = server.close()
        if stopped:
            _stderr(f"stopped engines {', '.join(stopped)}")
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_address(text: str) -> tuple[str, int]:
    """`HOST:PORT` (`[::1]:PORT` for IPv6; port 0: any free port)."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise HarnessError(f"--http {text!r}: give HOST:PORT, e.g. 127.0.0.1:8765")
    return host, int(port)


def serve_http(ws: Workspace, host: str, port: int, *, allow_remote: bool = False,
               task_id: str | None = None, retrieve: Retrieve | None = None,
               model: str | None = None, announce: Callable[[str], None] = _stderr,
               ask: Ask | None = None) -> None:
    """Serve streamable HTTP at http://HOST:PORT/mcp until Ctrl-C or SIGTERM; the bound URL
    is announced first (on stderr), also for port 0."""
    if not is_loopback(host) and not allow_remote:
        raise HarnessError(f"refusing to serve on {host}: not a loopback address, and this "
                           "server runs commands and writes files for whoever reaches it; "
                           "give --allow-remote to serve it anyway")
    import socket

    import uvicorn

    server = build_server(ws, task_id=task_id, retrieve=retrieve, model=model, ask=ask)
    app = server.streamable_http_app(host=host)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family)
    except OSError as e:
        raise HarnessError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    announce(f"listening on http://{shown}:{bound}/mcp")
    with _serving(server), sock:
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


def serve(ws: Workspace, http: str, *, allow_remote: bool = False,
          task_id: str | None = None, retrieve: Retrieve | None = None,
          ask: Ask | None = None) -> None:
    """`forge mcp --http HOST:PORT` (stdio is front.py's `serve`)."""
    host, port = parse_address(http)
    serve_http(ws, host, port, allow_remote=allow_remote, task_id=task_id, retrieve=retrieve,
               ask=ask)
