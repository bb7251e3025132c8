"""The task tools an agent reads and writes with, below the loop: `task_memory`, `task_show`
(Task Memory and the task's summary, read-only), `artifact_read` and `write_file` (a file
under the task's worktrees or scratch directory, through harness/guard/task_dirs.py
`write_in_task`: never the task definition, never its gates, never through a link). `TOOLS`
in that order; the loop's steps as tools (`block_start`, …, `run_command`, `measure`) are
harness/mcp/loop_tools.py's. `RunArgs` is the arguments of every `run_command` (the MCP's,
the agent executor's own).

- `task_memory` answers Task Memory in brief (projections/memory_brief.py: a few KB however
  long the task) unless `detail` asks for the whole (refused when it is over what one tool
  result holds, `MAX_RESULT_CHARS`: it would arrive cut, as broken JSON), or `block_id` for
  one block's whole record.
- `artifact_read` reads an artifact the task's own events reference
  (projections/task_artifacts.py; in the agent executor also the tool calls its decision has
  not saved yet), a page at a time (`offset`, `limit` in bytes of the stored artifact; a
  page starts and ends on a character boundary, and is shortened until its JSON fits in one
  tool result; `next_offset` None at the end), text only
  (a compressed archive, a NUL byte or bytes that are not UTF-8 are refused), redacted again
  with the workspace's redactor (a secret configured since it was stored). A digest outside
  the task's scope is refused, as every refusal is recorded (`AgentStepFailed`).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from ...ledger import archives
from ...ledger.clock import utcnow
from ...projections.memory import read_memory, task_summary
from ...projections.memory_brief import brief
from ...projections.task_artifacts import task_artifacts
from ..errors import HarnessError
from ..guard.task_dirs import write_in_task
from .tool_registry import MAX_RESULT_CHARS, AgentTool, Args, ToolContext


class TaskArgs(Args):
    task_id: str = Field(description="the task (its id)")


class MemoryArgs(TaskArgs):
    detail: bool = Field(False, description="the whole memory: every block with its tool "
                         "calls, measurements (each run's metrics) and verification (large)")
    block_id: str | None = Field(None, max_length=100, description="only this block's whole "
                                 "record (b1, b2, …)")


def _memory(ctx: ToolContext, a: MemoryArgs) -> Any:
    mem, _ = read_memory(ctx.ws.ledger, a.task_id)
    if a.block_id is not None:
        b = mem.block(a.block_id)
        if b is None:
            raise HarnessError(f"task {a.task_id} has no block {a.block_id[:100]!r} (blocks: "
                               f"b1..b{len(mem.execution_record)})" if mem.execution_record
                               else f"task {a.task_id} has no blocks yet")
        return b.model_dump(mode="json")
    if not a.detail:
        return brief(mem, utcnow())
    whole = mem.model_dump(mode="json")
    size = len(json.dumps(whole, sort_keys=True, default=str))
    if size > MAX_RESULT_CHARS:  # cut, it would reach the agent as broken JSON
        raise HarnessError(f"task {a.task_id}'s whole memory is {size} characters, over the "
                           f"{MAX_RESULT_CHARS} a tool result holds: ask for one block's "
                           f"record (block_id: b1..b{len(mem.execution_record)})")
    return whole


PAGE_BYTES = 16 << 10  # an artifact page by default
MAX_PAGE_BYTES = 32 << 10  # and at most (a tool result is capped at 60,000 characters)


class ReadArgs(TaskArgs):
    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$", description="an artifact the "
                        "task's events name: a run_command's stdout_digest or stderr_digest, "
                        "a measurement's artifact, an engine's log")
    offset: int = Field(0, ge=0, description="the byte to start at (a previous page's "
                        "next_offset)")
    limit: int = Field(PAGE_BYTES, ge=64, le=MAX_PAGE_BYTES, description="bytes to read")


def _page_text(digest: str, data: bytes, offset: int, at_end: bool) -> tuple[str, int, int]:
    """A page's text, how many bytes it skipped at its start (past `offset` 0: the rest of a
    character the previous page ended before) and how many it used; HarnessError when it is
    not text."""
    skip = 0
    while offset and skip < min(3, len(data)) and 0x80 <= data[skip] < 0xC0:
        skip += 1
    body = data[skip:]
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        # A character cut by the page's end is left for the next page.
        if at_end or e.reason != "unexpected end of data" or e.start < len(body) - 3:
            raise HarnessError(f"artifact {digest} is not text (not UTF-8 at byte "
                               f"{e.start + skip}): artifact_read reads text only") from None
        body = body[:e.start]
        text = body.decode("utf-8")
    if "\x00" in text:
        raise HarnessError(f"artifact {digest} is not text (a NUL byte): artifact_read "
                           "reads text only")
    return text, skip, len(body)


def _read(ctx: ToolContext, a: ReadArgs) -> Any:
    refs = task_artifacts(ctx.ws.ledger, a.task_id, ctx.collect or ())
    if a.digest not in refs:
        raise HarnessError(f"artifact {a.digest} is not referenced by task {a.task_id}'s "
                           "events (its tool calls' output, its measurements' records, its "
                           "engines' logs, its model calls): out of the task's scope")
    store = ctx.ws.artifacts
    head, size = store.read(a.digest, 0, 512)
    kind = archives.kind_of(head)
    if kind is not None:
        raise HarnessError(f"artifact {a.digest} is a {kind} archive: artifact_read reads "
                           "text only")
    if a.offset > size:
        raise HarnessError(f"offset {a.offset} is past the end of artifact {a.digest} "
                           f"({size} bytes)")
    limit = a.limit
    while True:
        data, _ = store.read(a.digest, a.offset, limit)
        end_of_file = a.offset + len(data) >= size
        text, skip, used = _page_text(a.digest, data, a.offset, end_of_file)
        start, end = a.offset + skip, a.offset + skip + used
        out = {"digest": a.digest, "size": size, "offset": start, "bytes": used,
               "next_offset": end if end < size else None,
               "text": ctx.ws.ledger.redactor.text(text),
               "referenced_by": [r.to_dict() for r in refs[a.digest][:3]]}
        # As JSON, a character outside ASCII or a control is written as up to 12: a page
        # must still fit in one tool result whole, or the agent gets it cut.
        chars = len(json.dumps(out, sort_keys=True, default=str))
        if chars <= MAX_RESULT_CHARS or limit <= 64:
            return out
        limit = max(64, int(limit * MAX_RESULT_CHARS / chars * 0.9))


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
    "task_memory", "The task's memory in brief: current block, baseline, best so far, "
    "rejections with their reasons, what to try next, the budget left. block_id gives one "
    "block's whole record (its runs' metrics, tool calls, verification); detail: true the "
    "whole execution record (large).", MemoryArgs, _memory)
TASK_SHOW = AgentTool(
    "task_show", "The task: definition (goal, scope, contract with its gates, exit "
    "criteria), status and blocks.", TaskArgs, _show)
ARTIFACT_READ = AgentTool(
    "artifact_read", "Read an artifact of this task by digest (a run_command's stdout_digest "
    "or stderr_digest, a measurement's artifact, an engine's log): text, redacted, a page at "
    "a time (offset, limit; next_offset is where the next page starts).", ReadArgs, _read)
WRITE_FILE = AgentTool(
    "write_file", "Write a file under the task's worktrees or scratch directory (nothing "
    "else: not the task definition, not its gates).", WriteArgs, _write, writes=True)

TOOLS = [TASK_MEMORY, TASK_SHOW, ARTIFACT_READ, WRITE_FILE]
