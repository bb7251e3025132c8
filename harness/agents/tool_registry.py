"""The agent tool registry: what a tool is, and the one way an agent's call runs. Below the
loop; the tools themselves live with what they call (task_tools.py, skills.py,
approval_tool.py here; the loop's steps in harness/mcp/loop_tools.py), and each user assembles
its own list (`registry(...)`): the MCP server all of them (harness/mcp/loop_tools.py `TOOLS`),
the agent executor the ones it offers (harness/loop/agent_executor.py).

- A tool (`AgentTool`) is a name, a description, a pydantic model of its arguments (its JSON
  schema is what the agent sees) and a handler `(ToolContext, args) -> JSON-able result`.
  Handlers call the same package functions the CLI calls, with the agent as the actor of
  every event they record.
- `ToolContext.tools` is the list a call may name (plus `extra`, one session's own).
- A tool whose arguments require `task_id` gets the bound task's (`ToolContext.task_id`)
  when the call leaves it out; unbound, leaving it out is refused with one line.
- `call(ctx, name, arguments)` never raises for what an agent sends: malformed JSON, an
  unknown tool, arguments that do not validate, a step the harness refuses (a candidate
  outside the task's scope, an edit to the contract, a write outside the task's directories,
  a block that is not open) come back as `ToolResult(ok=False, error=...)` and are recorded as
  `AgentStepFailed` on the task's stream (the `agents` stream when no task is named).
- The contract is enforced by the tools and below: candidates are checked against the scope
  by the loop's own rule (`decision.out_of_scope`); no tool edits a task definition or its
  gates; files are written only under the task's worktrees or its scratch directory, and
  commands run only there (harness/guard/task_dirs.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ...ledger import events as E
from ...ledger.errors import LedgerError, NotFoundError
from ...ledger.sizes import capped, capped_json
from ...ledger.streams import AGENTS_STREAM
from ...ledger.workspace import Workspace
from ...projections.errors import ProjectionError
from ...projections.memory import read_memory
from ...repos.errors import RepoError
from ..errors import HarnessError
from ..record import append_to_task

MAX_RESULT_CHARS = 60_000  # what one tool result may put in an agent's context
# What a failed step records of the agent's own text (record_failure).
ARGS_BYTES = 16 << 10  # its arguments, as JSON
RAW_BYTES = 2000  # arguments that were not a JSON object
REASON_BYTES = 4000  # the reason (it may quote the arguments)


@dataclass
class ToolContext:
    """Who calls (the actor of every event), on which workspace, bound to which task (the
    agent executor's; None: each call names its task)."""

    ws: Workspace
    actor: E.Actor
    task_id: str | None = None
    progress: Callable[[str], None] = lambda _s: None
    # Tools a caller adds for one session (the MCP server's engine up/down, the journal's
    # retrieval, which lives in wiki/): name -> AgentTool.
    extra: dict[str, AgentTool] = field(default_factory=dict)
    # Given a list, failed steps are collected in it instead of appended (the agent
    # executor's decision: no block is open yet; they are saved with the block it starts).
    collect: list[E.Event] | None = None
    # The tools a call may name, as the caller assembled them (`registry(...)`).
    tools: Mapping[str, AgentTool] = field(default_factory=dict)


@dataclass(frozen=True)
class AgentTool:
    name: str
    description: str
    params: type[BaseModel]
    run: Callable[[ToolContext, Any], Any]
    writes: bool = False  # records events or changes files


@dataclass
class ToolResult:
    ok: bool
    result: Any = None
    error: str | None = None

    def text(self) -> str:
        """The result as the agent reads it: JSON, bounded."""
        body = self.result if self.ok else {"error": self.error}
        out = json.dumps(body, sort_keys=True, default=str)
        if len(out) > MAX_RESULT_CHARS:
            out = out[:MAX_RESULT_CHARS] + f"… [cut at {MAX_RESULT_CHARS} characters]"
        return out


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


def registry(*groups: Iterable[AgentTool]) -> dict[str, AgentTool]:
    """The tools of `groups`, by name, in order; a name given twice is a TypeError."""
    out: dict[str, AgentTool] = {}
    for group in groups:
        for t in group:
            if t.name in out:
                raise TypeError(f"agent tool {t.name!r} registered twice")
            out[t.name] = t
    return out


def available(ctx: ToolContext) -> dict[str, AgentTool]:
    """The tools a call in `ctx` may name: its list, then its session's own."""
    return {**ctx.tools, **ctx.extra}


def openai_schemas(ctx: ToolContext, names: list[str] | None = None
                   ) -> list[dict[str, Any]]:
    """The tools in the OpenAI chat `tools` format (the agent executor's request)."""
    out = []
    for t in available(ctx).values():
        if names is not None and t.name not in names:
            continue
        out.append({"type": "function", "function": {
            "name": t.name, "description": t.description,
            "parameters": t.params.model_json_schema()}})
    return out


def _task_of(ctx: ToolContext, args: Any) -> str | None:
    return getattr(args, "task_id", None) or ctx.task_id


def capped_arguments(arguments: Any) -> dict[str, Any]:
    """An agent's arguments as a failed step records them: a mapping (its JSON capped at
    ARGS_BYTES), anything else as text (`raw`, capped at RAW_BYTES)."""
    if isinstance(arguments, dict):
        return capped_json(arguments, ARGS_BYTES)
    return {"raw": capped(str(arguments), RAW_BYTES)}


def record_failure(ctx: ToolContext, tool_name: str | None, reason: str,
                   arguments: Any, task_id: str | None) -> None:
    """Record a failed agent step as data (never raises: a step that cannot even be
    recorded is still answered). The arguments and the reason come from the agent: each is
    capped (`ARGS_BYTES`, `REASON_BYTES`; ledger/sizes.py: the head and the size and digest
    of the whole), so a refused call's 200 MB arguments are not stored."""
    args = capped_arguments(arguments)
    reason = capped(reason, REASON_BYTES)
    if ctx.collect is not None:
        ctx.collect.append(E.AgentStepFailed(tool=tool_name, reason=reason, arguments=args,
                                             task_id=task_id, actor=ctx.actor))
        return
    try:
        if task_id:
            try:
                mem: Any = read_memory(ctx.ws.ledger, task_id)[0]
            except NotFoundError:  # an unknown task: the step goes to the agents stream
                mem = None
            if mem is not None and mem.status not in ("undefined", "exited"):
                blk = mem.current_block.block_id if mem.current_block else None
                ev = E.AgentStepFailed(tool=tool_name, reason=reason, arguments=args,
                                       task_id=task_id, block_id=blk, actor=ctx.actor)
                append_to_task(ctx.ws, task_id, [ev])
                return
        ctx.ws.ledger.append(AGENTS_STREAM, [E.AgentStepFailed(
            tool=tool_name, reason=reason, arguments=args, task_id=None, actor=ctx.actor)])
    except (LedgerError, HarnessError, ProjectionError):
        pass


def call(ctx: ToolContext, name: str, arguments: str | dict[str, Any] | None) -> ToolResult:
    """Run one tool call from an agent (module contract)."""
    tools = available(ctx)
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            why = f"{name}: arguments are not valid JSON ({e.msg} at {e.pos})"
            record_failure(ctx, name, why, arguments, ctx.task_id)
            return ToolResult(False, error=why)
    else:
        parsed = arguments or {}
    if not isinstance(parsed, dict):
        why = f"{name}: arguments must be a JSON object, not {type(parsed).__name__}"
        record_failure(ctx, name, why, parsed, ctx.task_id)
        return ToolResult(False, error=why)
    t = tools.get(name)
    if t is None:
        why = f"unknown tool {name!r} (tools: {', '.join(sorted(tools))})"
        record_failure(ctx, name, why, parsed, ctx.task_id)
        return ToolResult(False, error=why)
    if ctx.task_id is not None and parsed.get("task_id") not in (None, ctx.task_id):
        why = (f"{name}: this agent works on task {ctx.task_id}, not "
               f"{str(parsed.get('task_id'))[:80]!r}")
        record_failure(ctx, name, why, parsed, ctx.task_id)
        return ToolResult(False, error=why)
    field = t.params.model_fields.get("task_id")
    if field is not None and field.is_required() and parsed.get("task_id") is None:
        if ctx.task_id is None:
            why = (f"{name}: task_id: give the task's id (this session is not bound to a "
                   "task; `forge task list` shows them)")
            record_failure(ctx, name, why, parsed, None)
            return ToolResult(False, error=why)
        parsed = {**parsed, "task_id": ctx.task_id}  # a bound session's task
    try:
        args = t.params.model_validate(parsed)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "(arguments)"
        why = f"{name}: {where}: {err['msg']}"
        record_failure(ctx, name, why, parsed, _task_of(ctx, None) or parsed.get("task_id"))
        return ToolResult(False, error=why)
    try:
        return ToolResult(True, result=t.run(ctx, args))
    except (HarnessError, LedgerError, ProjectionError, RepoError) as e:
        why = f"{name}: {' '.join(str(e).split())}"
        record_failure(ctx, name, why, parsed, _task_of(ctx, args))
        return ToolResult(False, error=why)
