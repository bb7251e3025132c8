"""The loop's steps as agent tools, and every agent tool the MCP server offers.

- `block_start`, `block_verify`, `block_handoff`, `run_command`, `measure`: the manual path's
  functions (harness/loop/manual.py), the agent as the actor; a candidate outside the
  task's scope, a block that is not open, a `cwd` outside the task's directories (made
  without following a link: harness/guard/task_dirs.py `dir_in_task`) are refused there.
- `run_command` answers what the manual path's does: the call's digests and exit code and
  the tail of its output (harness/tool_calls/calls.py `output_tail`).
- `TOOLS`: the registry the server assembles, in the order it lists them: the task tools
  (agents/task_tools.py, `artifact_read` among them) with these steps, the approval request
  (agents/approval_tool.py), the skills (agents/skills.py). The server adds its session's
  own (session_tools.py).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from ...ledger import sizes
from ..agents import approval_tool, skills
from ..agents.task_tools import (
    ARTIFACT_READ,
    TASK_MEMORY,
    TASK_SHOW,
    WRITE_FILE,
    RunArgs,
    TaskArgs,
)
from ..agents.tool_registry import AgentTool, ToolContext, registry
from ..guard.task_dirs import dir_in_task
from ..loop.manual import (
    handoff_block,
    record_measurement,
    run_command,
    start_block,
    verify_block,
)


class StartArgs(TaskArgs):
    sub_goal: str = Field(min_length=1, max_length=2000, description="what this block tries")
    candidate: dict[str, Any] = Field(default_factory=dict, description=(
        "the change this block tries: scope keys (engine.<flag>, …) or code.<member> = a "
        "commit, `worktree`, `patch:<file>` or `upstream`; {} measures the baseline"))


def _start(ctx: ToolContext, a: StartArgs) -> Any:
    return start_block(ctx.ws, a.task_id, a.sub_goal, a.candidate, actor=ctx.actor)


def _verify(ctx: ToolContext, a: TaskArgs) -> Any:
    return verify_block(ctx.ws, a.task_id, actor=ctx.actor)


class HandoffArgs(TaskArgs):
    state_reached: str = Field(min_length=1, max_length=sizes.STATE_CHARS)
    findings: list[Annotated[str, Field(max_length=sizes.FINDING_CHARS)]] = Field(
        default_factory=list, max_length=sizes.MAX_FINDINGS)
    next_sub_goal: str | None = Field(None, max_length=sizes.NEXT_CHARS)
    outcome: str = Field("progress", pattern="^(progress|no-progress|failed|delivered)$")


def _handoff(ctx: ToolContext, a: HandoffArgs) -> Any:
    return handoff_block(ctx.ws, a.task_id, state_reached=a.state_reached,
                         findings=a.findings, next_sub_goal=a.next_sub_goal,
                         outcome=a.outcome, actor=ctx.actor)


def _run(ctx: ToolContext, a: RunArgs) -> Any:
    cwd = dir_in_task(ctx.ws, a.task_id, a.cwd or ".", "cwd")
    return run_command(ctx.ws, a.task_id, a.argv, cwd=str(cwd), tee=False, actor=ctx.actor)


class MeasureArgs(TaskArgs):
    metrics: dict[str, float] = Field(min_length=1)
    source: str = Field("agent", max_length=200)


def _measure(ctx: ToolContext, a: MeasureArgs) -> Any:
    return record_measurement(ctx.ws, a.task_id, a.metrics, source=a.source, actor=ctx.actor)


LOOP_TOOLS = [
    AgentTool("block_start", "Start the next loop block with a sub-goal and a candidate "
              "inside the task's scope.", StartArgs, _start, writes=True),
    AgentTool("block_verify", "Verify the open block: the task's verification path, the "
              "contract's gates judged on its measurements against the baseline.", TaskArgs,
              _verify, writes=True),
    AgentTool("block_handoff", "Close the open block with a handoff note: the state reached, "
              "findings, the next sub-goal.", HandoffArgs, _handoff, writes=True),
    AgentTool("run_command", "Run a command as a recorded tool call of the open block (in the "
              "task's worktree or scratch directory). Answers its exit code and the end of "
              "its output, redacted (stdout, stderr: the last 8 KB each; *_cut: the bytes "
              "left out before them); artifact_read reads the whole by its *_digest.",
              RunArgs, _run, writes=True),
]
MEASURE = AgentTool("measure", "Record a measurement (metrics by name) in the open block.",
                    MeasureArgs, _measure, writes=True)

TOOLS = registry([TASK_MEMORY, TASK_SHOW], LOOP_TOOLS, [ARTIFACT_READ, WRITE_FILE, MEASURE],
                 approval_tool.TOOLS, skills.TOOLS)
