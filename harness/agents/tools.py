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
  loop's own rule (`executors.out_of_scope`); no tool edits a task definition or its gates;
  files are written only under the task's worktrees or its scratch directory
  (`FORGE_HOME/scratch/<task>`), and commands run only there. A file is written, and a
  command's directory made, beneath a held descriptor of its root, each directory opened
  without following a link (`write_in_task`, `dir_in_task`): what an agent's processes swap
  in meanwhile (a link to elsewhere) is refused, never followed.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
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


# --- where an agent may write and run ----------------------------------------------------


def scratch_dir(ws: Workspace, task_id: str) -> Path:
    return ws.home / "scratch" / task_id


def worktree_root(ws: Workspace, task_id: str) -> Path:
    """The directory of the task's worktrees (as configured, not resolved)."""
    from ...repos.commands import worktree_base

    return worktree_base(ws) / task_id


def allowed_roots(ws: Workspace, task_id: str) -> list[Path]:
    """The task's worktrees and its scratch directory: the only places an agent writes."""
    return [worktree_root(ws, task_id).resolve(), scratch_dir(ws, task_id).resolve()]


def inside_task(ws: Workspace, task_id: str, path: str | Path, what: str) -> Path:
    """`path` (relative: to the scratch directory) resolved, when inside the task's roots;
    else HarnessError naming the path and the roots. A check of names only: a file or
    directory an agent's process can change may be swapped for a link after it, so writes
    and directories made go through `write_in_task` and `dir_in_task`, not this."""
    roots = allowed_roots(ws, task_id)
    p = Path(path)
    p = (p if p.is_absolute() else roots[1] / p).resolve()
    if not any(p == r or p.is_relative_to(r) for r in roots):
        raise _outside(what, path, roots)
    return p


def _outside(what: str, path: str | Path, roots: list[Path]) -> HarnessError:
    return HarnessError(f"{what} {str(path)[:200]!r} is outside the task's directories "
                        f"({', '.join(str(r) for r in roots)}): the task definition, its "
                        "contract and everything else are not the agent's to change")


def _below_root(ws: Workspace, task_id: str, path: str | Path, what: str
                ) -> tuple[Path, Path, tuple[str, ...]]:
    """`(root, shown, names)`: the task's root `path` is under, the path as reported, and the
    names below the root, by the path's text alone (nothing on disk is followed); `..` and
    paths outside the roots are refused."""
    roots = allowed_roots(ws, task_id)
    raw = Path(path)
    if "\0" in str(path):
        raise HarnessError(f"{what} {str(path)[:200]!r} holds a NUL byte")
    if ".." in raw.parts:
        raise HarnessError(f"{what} {str(path)[:200]!r} has a '..' component: name a path "
                           "inside the task's directories without one")
    if not raw.is_absolute():
        return roots[1], roots[1] / raw, raw.parts
    unresolved = [(worktree_root(ws, task_id), roots[0]), (scratch_dir(ws, task_id), roots[1])]
    for form, root in [*((r, r) for r in roots), *unresolved]:
        if raw == form or raw.is_relative_to(form):
            names = raw.relative_to(form).parts
            return root, root.joinpath(*names), names
    raise _outside(what, path, roots)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_dirs(root: Path, names: tuple[str, ...], shown: Path, what: str) -> int:
    """A descriptor of the directory `names` lead to below `root`, each made when missing and
    each opened beneath the one before without following a link (an agent's process may
    swap any of them for a link to elsewhere at any time: openat with O_NOFOLLOW holds)."""
    root.mkdir(parents=True, exist_ok=True)  # forge's own directories, out of a call's reach
    fd = os.open(root, _DIR_FLAGS)
    try:
        for name in names:
            try:
                os.mkdir(name, 0o777, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                raise _refused(what, shown, name, e) from None
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refused(what: str, shown: Path, name: str, e: OSError) -> HarnessError:
    if e.errno in (errno.ELOOP, errno.ENOTDIR):  # O_NOFOLLOW met a link (or a file)
        why = "is a symbolic link or not a directory: no write follows a link (it could " \
              "lead outside the task's directories)"
    else:
        why = f"cannot be written: {e.strerror or e}"
    return HarnessError(f"{what} {str(shown)[:200]!r}: {name!r} {why}")


def dir_in_task(ws: Workspace, task_id: str, path: str | Path, what: str) -> Path:
    """The task's directory `path` (relative: to the scratch directory), made when missing
    without following a link; HarnessError when outside the roots or through a link."""
    root, shown, names = _below_root(ws, task_id, path, what)
    os.close(_open_dirs(root, names, shown, what))
    return shown


def write_in_task(ws: Workspace, task_id: str, path: str | Path, data: bytes) -> Path:
    """Write `data` to the task's file `path` (relative: to the scratch directory): its
    directories opened beneath the root without following links (`_open_dirs`), the bytes
    into a new file beside it, renamed over the name in that directory: a link or hard link
    there is replaced, never written through, and a reader sees the old bytes or the new.
    An existing file keeps its permission bits. HarnessError for a path outside the roots,
    through a link, or that cannot be written; nothing half-written is left."""
    root, shown, names = _below_root(ws, task_id, path, "path")
    if not names:
        raise HarnessError(f"path {str(path)[:200]!r} is a directory of the task, not a file")
    parent = _open_dirs(root, names[:-1], shown, "path")
    name = names[-1]
    tmp = f".{name[:200]}.{secrets.token_hex(6)}.forge-tmp"
    try:
        try:
            old = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        if old is not None and stat.S_ISDIR(old.st_mode):
            raise HarnessError(f"path {str(shown)[:200]!r} is a directory, not a file")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o666, dir_fd=parent)
        except OSError as e:
            raise _refused("path", shown, name, e) from None
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                if old is not None and stat.S_ISREG(old.st_mode):
                    os.fchmod(f.fileno(), stat.S_IMODE(old.st_mode))
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException as e:
            try:
                os.unlink(tmp, dir_fd=parent)
            except OSError:
                pass
            if isinstance(e, OSError):
                raise _refused("path", shown, name, e) from None
            raise
    finally:
        os.close(parent)
    return shown


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
