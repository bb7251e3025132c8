"""The task tools an agent reads and writes with, below the loop: `task_memory`, `task_show`
(Task Memory and the task's summary, read-only) and `write_file` (a file under the task's
worktrees or scratch directory, through harness/guard/task_dirs.py `write_in_task`: never
the task definition, never its gates, never through a link). `TOOLS` in that order; the
loop's steps as tools (`block_start`, …, `run_command`, `measure`) are harness/mcp/loop_tools.py's.
`RunArgs` is the arguments of every `run_command` (the MCP's, the agent executor's own).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ...projections.memory import read_memory, task_summary
from ..guard.task_dirs import write_in_task
from .tool_registry import AgentTool, Args, ToolContext


class TaskArgs(Args):
    task_id: str = Field(description="the task (its id)")


def _memory(ctx: ToolContext, a: TaskArgs) -> Any:
    mem, _ = read_memory(ctx.ws.ledger, a.task_id)
    return mem.model_dump(mode="json")


def _show(ctx: ToolContext, a: TaskArgs) -> Any:
    return task_summary(ctx.ws.ledger, a.task_id)


class RunArgs(TaskArgs):
    argv: list[str] = Field(min_length=1, max_length=200)
    cwd: str | None = Field(None, description="inside the task's worktrees or scratch "
                            "directory (default: the scratch directory)")


class WriteArgs(TaskArgs):
    path: str = Field(min_length=1, max_length=1000)
    content: str = Field(max_length=2_000_000)


def _write(ctx: ToolContext, a: WriteArgs) -> Any:
    read_memory(ctx.ws.ledger, a.task_id)  # the task exists
    data = a.content.encode("utf-8")
    p = write_in_task(ctx.ws, a.task_id, a.path, data)
    return {"path": str(p), "bytes": len(data)}


TASK_MEMORY = AgentTool(
    "task_memory", "The task's memory: current block, last handoff, best so far, rejected "
    "directions, the execution record.", TaskArgs, _memory)
TASK_SHOW = AgentTool(
    "task_show", "The task: definition (goal, scope, contract with its gates, exit "
    "criteria), status and blocks.", TaskArgs, _show)
WRITE_FILE = AgentTool(
    "write_file", "Write a file under the task's worktrees or scratch directory (nothing "
    "else: not the task definition, not its gates).", WriteArgs, _write, writes=True)

TOOLS = [TASK_MEMORY, TASK_SHOW, WRITE_FILE]
