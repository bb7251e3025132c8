"""Replay's view of a task: what `forge replay` prints and fingerprints (no I/O).

The task's state is the aggregate of `ledger.task` (one fold, its rules); this module shapes
it as `forge replay` has always shown it: the task's status, exit history, blocks with
their verdicts, latest verification path and handoff, what was accepted or rejected, counts
of measurements and tool calls. The view is computed after the fold (`view(task)`, from a
task folded with or without records), so the aggregate can keep more (Task Memory's
records) while this format, and the fingerprint over it, stay what they were:
`fingerprint` is a stable hash of the view, so rebuilding twice (or on another machine) can
be compared byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from . import events as E
from .clock import digest
from .task import Block, Task, fold


class BlockState(BaseModel):
    """One loop block as replay shows it."""

    model_config = ConfigDict(extra="forbid")

    block_id: str
    index: int
    sub_goal: str
    routing: dict[str, Any] = Field(default_factory=dict)
    candidate: dict[str, Any] = Field(default_factory=dict)
    status: str = "running"  # running | handed-off
    tool_calls: int = 0
    measurements: int = 0
    verifications: list[str] = Field(default_factory=list)  # verdicts in order
    steps: list[dict[str, str]] = Field(default_factory=list)  # latest verification's path
    handoff: dict[str, Any] | None = None


class TaskState(BaseModel):
    """A task as replay shows it. `exits` is its exit history, oldest first: each exit's
    state and reason, and the reason it was reopened (None while the exit stands)."""

    model_config = ConfigDict(extra="forbid")

    task_id: str | None = None
    title: str = ""
    task_type: str = ""
    goal: str = ""
    definition_hash: str | None = None
    point_hash: str | None = None
    status: str = "undefined"  # undefined | defined | running | exited
    exit_state: str | None = None
    exit_reason: str | None = None
    blocks: list[BlockState] = Field(default_factory=list)
    measurements: int = 0
    invalidated: list[str] = Field(default_factory=list)
    accepted: list[dict[str, Any]] = Field(default_factory=list)
    rejected: list[dict[str, Any]] = Field(default_factory=list)
    last_position: int = 0
    version: int = 0
    exits: list[dict[str, Any]] = Field(default_factory=list)

    def block(self, block_id: str | None) -> BlockState | None:
        """The latest block with this id (as the view had it before the aggregate moved)."""
        return next((b for b in reversed(self.blocks) if b.block_id == block_id), None)


def _block(b: Block) -> BlockState:
    return BlockState.model_construct(
        block_id=b.block_id, index=b.index, sub_goal=b.sub_goal, routing=dict(b.routing),
        candidate=dict(b.candidate), status=b.status, tool_calls=b.tool_call_count,
        measurements=b.measurement_count, verifications=list(b.verdicts),
        steps=[dict(x) for x in b.steps],
        handoff=None if b.handoff is None else {
            k: x for k, x in b.handoff.items() if k != "block_id"})


def view(task: Task) -> TaskState:
    """Replay's view of the folded task (a copy: the task may go on folding)."""
    return TaskState.model_construct(
        task_id=task.task_id, title=task.title, task_type=task.task_type, goal=task.goal,
        definition_hash=task.definition_hash, point_hash=task.point_hash, status=task.status,
        exit_state=task.exit_state, exit_reason=task.exit_reason,
        blocks=[_block(b) for b in task.blocks], measurements=task.measurements,
        invalidated=list(task.invalidated),
        accepted=[{"block_id": a["block_id"], "candidate": dict(a["candidate"]),
                   "summary": a["summary"]} for a in task.accepted],
        rejected=[dict(r) for r in task.rejected], last_position=task.last_position,
        version=task.version, exits=[dict(x) for x in task.exits])


def replay(events: Iterable[E.Event]) -> TaskState:
    """Replay's view of the task after `events`."""
    return view(fold(events, Task(records=False)))


def fingerprint(state: BaseModel) -> str:
    return digest(state.model_dump(mode="json"))
