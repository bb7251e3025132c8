"""The tools an agent may call: one registry for the MCP server (`forge mcp`) and the agent
executor, so both offer the same steps under the same rules.

- A tool is a name, a description, a pydantic model of its arguments (its JSON schema is what
  the agent sees) and a handler `(ToolContext, args) -> JSON-able result`. Handlers call the
  same package functions the CLI calls (`harness.loop.manual`, `projections.*`), with the
  agent as the actor of every event they record.
- `call(ctx, name, arguments)` never raises for what an agent sends: malformed JSON, an
  unknown tool, arguments that do not validate, a step the harness refuses (a candidate
  outside the task's scope, an edit to the contract, a write outside the task's directories,
  a block that is not open) come back as `ToolResult(ok=False, error=...)` and are recorded as
  `AgentStepFailed` on the task's stream (the `agents` stream when no task is named).
- The contract is enforced here and below: candidates are checked against the scope by the
  loop's own rule (`decision.out_of_scope`); no tool edits a task definition or its gates;
  files are written only under the task's worktrees or its scratch directory
  (`FORGE_HOME/scratch/<task>`), and commands run only there (harness/guard/task_dirs.py:
  `write_in_task`, `dir_in_task`, never through a link).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ...ledger import events as E
from ...ledger import sizes
from ...ledger.errors import LedgerError, NotFoundError
from ...ledger.sizes import capped, capped_json
from ...ledger.streams import AGENTS_STREAM
from ...ledger.workspace import Workspace
from ...projections.errors import ProjectionError
from ...projections.memory import read_memory, task_summary
from ...repos.errors import RepoError
from ..errors import HarnessError
from ..guard.task_dirs import dir_in_task, write_in_task
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


TOOLS: dict[str, AgentTool] = {}


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


def tool(name: str, description: str, params: type[BaseModel], *, writes: bool = False
         ) -> Callable[[Callable[[ToolContext, Any], Any]], Callable[[ToolContext, Any], Any]]:
    """Register a handler as the agent tool `name`."""

    def deco(fn: Callable[[ToolContext, Any], Any]) -> Callable[[ToolContext, Any], Any]:
        if name in TOOLS:
            raise TypeError(f"agent tool {name!r} registered twice")
        TOOLS[name] = AgentTool(name, description, params, fn, writes)
        return fn

    return deco


def available(ctx: ToolContext | None = None) -> dict[str, AgentTool]:
    return {**TOOLS, **(ctx.extra if ctx else {})}


def openai_schemas(ctx: ToolContext | None = None, names: list[str] | None = None
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


# --- the task tools ----------------------------------------------------------------------


class TaskArgs(Args):
    task_id: str = Field(description="the task (its id)")


@tool("task_memory", "The task's memory: current block, last handoff, best so far, rejected "
      "directions, the execution record.", TaskArgs)
def _memory(ctx: ToolContext, a: TaskArgs) -> Any:
    mem, _ = read_memory(ctx.ws.ledger, a.task_id)
    return mem.model_dump(mode="json")


@tool("task_show", "The task: definition (goal, scope, contract with its gates, exit "
      "criteria), status and blocks.", TaskArgs)
def _show(ctx: ToolContext, a: TaskArgs) -> Any:
    return task_summary(ctx.ws.ledger, a.task_id)


class StartArgs(TaskArgs):
    sub_goal: str = Field(min_length=1, max_length=2000, description="what this block tries")
    candidate: dict[str, Any] = Field(default_factory=dict, description=(
        "the change this block tries: scope keys (engine.<flag>, …) or code.<member> = a "
        "commit, `worktree`, `patch:<file>` or `upstream`; {} measures the baseline"))


@tool("block_start", "Start the next loop block with a sub-goal and a candidate inside the "
      "task's scope.", StartArgs, writes=True)
def _start(ctx: ToolContext, a: StartArgs) -> Any:
    from ..loop.manual import start_block

    return start_block(ctx.ws, a.task_id, a.sub_goal, a.candidate, actor=ctx.actor)


@tool("block_verify", "Verify the open block: the task's verification path, the contract's "
      "gates judged on its measurements against the baseline.", TaskArgs, writes=True)
def _verify(ctx: ToolContext, a: TaskArgs) -> Any:
    from ..loop.manual import verify_block

    return verify_block(ctx.ws, a.task_id, actor=ctx.actor)


class HandoffArgs(TaskArgs):
    state_reached: str = Field(min_length=1, max_length=sizes.STATE_CHARS)
    findings: list[Annotated[str, Field(max_length=sizes.FINDING_CHARS)]] = Field(
        default_factory=list, max_length=sizes.MAX_FINDINGS)
    next_sub_goal: str | None = Field(None, max_length=sizes.NEXT_CHARS)
    outcome: str = Field("progress", pattern="^(progress|no-progress|failed|delivered)$")


@tool("block_handoff", "Close the open block with a handoff note: the state reached, "
      "findings, the next sub-goal.", HandoffArgs, writes=True)
def _handoff(ctx: ToolContext, a: HandoffArgs) -> Any:
    from ..loop.manual import handoff_block

    return handoff_block(ctx.ws, a.task_id, state_reached=a.state_reached,
                         findings=a.findings, next_sub_goal=a.next_sub_goal,
                         outcome=a.outcome, actor=ctx.actor)


class RunArgs(TaskArgs):
    argv: list[str] = Field(min_length=1, max_length=200)
    cwd: str | None = Field(None, description="inside the task's worktrees or scratch "
                            "directory (default: the scratch directory)")


@tool("run_command", "Run a command as a recorded tool call of the open block (in the task's "
      "worktree or scratch directory).", RunArgs, writes=True)
def _run(ctx: ToolContext, a: RunArgs) -> Any:
    from ..loop.manual import run_command

    cwd = dir_in_task(ctx.ws, a.task_id, a.cwd or ".", "cwd")
    return run_command(ctx.ws, a.task_id, a.argv, cwd=str(cwd), tee=False, actor=ctx.actor)


class WriteArgs(TaskArgs):
    path: str = Field(min_length=1, max_length=1000)
    content: str = Field(max_length=2_000_000)


@tool("write_file", "Write a file under the task's worktrees or scratch directory (nothing "
      "else: not the task definition, not its gates).", WriteArgs, writes=True)
def _write(ctx: ToolContext, a: WriteArgs) -> Any:
    read_memory(ctx.ws.ledger, a.task_id)  # the task exists
    data = a.content.encode("utf-8")
    p = write_in_task(ctx.ws, a.task_id, a.path, data)
    return {"path": str(p), "bytes": len(data)}


class MeasureArgs(TaskArgs):
    metrics: dict[str, float] = Field(min_length=1)
    source: str = Field("agent", max_length=200)


@tool("measure", "Record a measurement (metrics by name) in the open block.", MeasureArgs,
      writes=True)
def _measure(ctx: ToolContext, a: MeasureArgs) -> Any:
    from ..loop.manual import record_measurement

    return record_measurement(ctx.ws, a.task_id, a.metrics, source=a.source, actor=ctx.actor)


# Registry modules: importing them registers their tools, so whoever uses TOOLS has them.
from ..guard import approval_tool as _approval_tool  # noqa: E402, F401  (request_approval)
from . import skills as _skills  # noqa: E402, F401  (registers skills_list, skills_get)
