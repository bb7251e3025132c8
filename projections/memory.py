"""Task Memory: what a loop (or a person, or an agent) needs to decide the next block.

Derived from a task stream's events only — never a mutable file. The stream is folded once,
by the task aggregate (`ledger.task`: status, exits, blocks with their records, handoffs and
decisions, accepted and rejected, model usage); Task Memory is then computed from that
state (`memory_of`, pure), with its views:

- the current (open) loop block, the last handoff, the next loop block (index and the
  sub-goal the last handoff proposed);
- the baseline and best-so-far on the contract's primary metric (`Contract.primary`), each
  verification judged on the samples its gates judged (a contaminated run the host limits
  left out, a block's unsteady first runs: harness/loop/gates.py), else on the runs valid
  when it was recorded (the fold keeps what each saw);
- accepted deliverables with their evidence, the effective-config digests already tried,
  the trailing no-progress streak, the time spent exited before a reopen.

`build_memory(events)` is a pure fold; `read_memory(ledger, task_id)` reads the stream and
folds it (the loop, `forge task memory`); `list_tasks` (the fold alone, `read_task`) and
`task_summary` are the read queries of `forge task list` and `forge task show`. The
`task list` and `task memory` commands read them through projections/fast_reads.py, which
keeps their rows and JSON for the reads that follow.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..ledger import events as E
from ..ledger.correctness import correctness_of
from ..ledger.errors import NotFoundError
from ..ledger.ids import LEDGER_CONTEXT, shown, unknown_id_hint
from ..ledger.store import Ledger, OnError, Undecodable
from ..ledger.streams import task_of, task_stream
from ..ledger.task import Block, Task, VerificationRecord, fold, median_of, runs_of

BlockRecord = Block  # one block of the execution record: the aggregate's own block


class TaskMemory(BaseModel):
    """Fields marked `exclude` serve the loop (reopened tasks, the writer's checks) and are
    not part of the `forge task memory` output."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    task_id: str | None = None
    status: str = "undefined"  # undefined | defined | running | exited
    exit_state: str | None = None
    exit_reason: str | None = None
    definition: dict[str, Any] = Field(default_factory=dict)
    definition_hash: str | None = None
    point_hash: str | None = None
    profile_hash: str | None = None
    contract_hash: str | None = None
    primary_metric: str | None = None
    primary_direction: str | None = None  # at_least (higher is better) | at_most
    current_block: Block | None = None
    last_handoff: dict[str, Any] | None = None
    next_block: dict[str, Any] | None = None
    execution_record: list[Block] = Field(default_factory=list)
    baseline: dict[str, Any] | None = None
    best_so_far: dict[str, Any] | None = None
    accepted: list[dict[str, Any]] = Field(default_factory=list)
    rejected: list[dict[str, Any]] = Field(default_factory=list)
    tried: list[str] = Field(default_factory=list)
    no_progress_streak: int = 0
    first_block_at: str | None = None
    # The task's model calls (ModelCalled, any block or none): what its budgets count.
    model_calls: int = 0
    model_tokens_in: int = 0
    model_tokens_out: int = 0
    model_cost_usd: float = 0.0
    exits: list[dict[str, Any]] = Field(default_factory=list, exclude=True)  # the fold's
    reopened_after: int | None = Field(None, exclude=True)  # blocks at the last reopen
    paused_s: float = Field(0.0, exclude=True)  # time spent exited before a reopen
    task: Task = Field(default_factory=Task, exclude=True)  # the folded task it was made of

    def block(self, block_id: str | None) -> Block | None:
        for b in reversed(self.execution_record):
            if b.block_id == block_id:
                return b
        return None

    def baseline_block(self) -> Block | None:
        """The latest measured baseline block (a reopened task may measure it again)."""
        for b in reversed(self.execution_record):
            if b.is_baseline and b.measurements:
                return b
        return None

    def before_reopen(self, b: Block) -> bool:
        """Whether block `b` ran before the task was last reopened."""
        return self.reopened_after is not None and any(
            x is b for x in self.execution_record[:self.reopened_after])


def _primary(definition: dict[str, Any]) -> tuple[str | None, str | None]:
    """The contract's primary metric and its direction (None: no contract, or not a task
    loop's definition: a graph node's, say)."""
    # For start-up time: the specs (and YAML) load for a memory, not for `forge task list`.
    from ..ledger.specs import Contract

    try:
        gate = Contract.model_validate(definition.get("contract"), context=LEDGER_CONTEXT).primary
    except ValidationError:
        return None, None
    if gate is None:
        return None, None
    return gate.metric, "at_least" if gate.at_least is not None else "at_most"


def _judged_median(v: VerificationRecord, metric: str) -> float | None:
    """The median of `metric` over the samples a gate of this verification judged (the
    runs the host limits kept, the steady tail: harness/loop/gates.py), None when no gate
    recorded samples of it."""
    for g in v["gates"]:
        if g.get("metric") == metric and g.get("samples"):
            return statistics.median(float(x) for x in g["samples"])
    return None


def _best(task: Task, primary: str | None, direction: str | None
          ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The baseline and the best so far: each verification of a block, in order, judged on
    the runs it saw (its block's measurements then, less those invalidated before it). A
    baseline verified again after a reopen replaces a best that had no median; a candidate
    that broke a gate other than the primary one is not "better", however fast."""
    baseline: dict[str, Any] | None = None
    best: dict[str, Any] | None = None
    gone: set[int] = set()  # measurements invalidated (with a reason) so far, by identity
    marked = 0
    for seen in task.seen:
        for m, reason in task.marks[marked:seen.marks]:
            if reason:
                gone.add(id(m))
            else:  # an empty reason left the run valid
                gone.discard(id(m))
        marked = seen.marks
        b, v = seen.block, seen.verification
        if not primary:
            med = None
        else:  # the runs its gates judged, else the runs it saw
            med = _judged_median(v, primary)
            if med is None:
                med = median_of(runs_of(m for m in b.measurements[:seen.measurements]
                                        if id(m) not in gone), primary)
        if b.is_baseline:
            baseline = {"block_id": b.block_id, "metric": primary, "median": med,
                        "verdict": v["verdict"]}
            if best is None or (best["median"] is None and med is not None):
                best = {"block_id": b.block_id, "candidate": {}, "metric": primary,
                        "median": med, "verdict": "baseline"}
            continue
        if not primary:
            continue
        other_failed = any(g.get("verdict") == "fail" and g.get("metric") != primary
                           for g in v["gates"])
        if other_failed or med is None:
            continue
        top = (best or {}).get("median")
        higher = direction == "at_least"
        if top is None or (med > top if higher else med < top):
            best = {"block_id": b.block_id, "candidate": dict(b.candidate), "metric": primary,
                    "median": med, "verdict": v["verdict"]}
    return baseline, best


def _next_block(task: Task) -> dict[str, Any] | None:
    """After a handoff, the block it proposes; after a reopen, one without a sub-goal; none
    while a block runs, before the first handoff, or after an exit."""
    if task.last_turn == "handed-off":
        return {"index": len(task.blocks) + 1,
                "sub_goal": None if task.last_handoff is None
                else task.last_handoff["next_sub_goal"]}
    if task.last_turn == "reopened":
        return {"index": len(task.blocks) + 1, "sub_goal": None}
    if task.status == "defined" and not task.blocks:  # a successor: its predecessor's next
        start = (task.definition.get("context") or {}).get("start_from") or {}
        if start.get("next_sub_goal"):
            return {"index": 1, "sub_goal": start["next_sub_goal"]}
    return None


def memory_of(task: Task) -> TaskMemory:
    """Task Memory of a folded task (pure; the memory shares the task's blocks and lists)."""
    primary, direction = _primary(task.definition)
    baseline, best = _best(task, primary, direction)
    paused = 0.0
    for exited, reopened in task.pauses:
        if reopened is not None:
            paused += max(0.0, (datetime.fromisoformat(reopened)
                                - datetime.fromisoformat(exited)).total_seconds())
    blocks = task.blocks
    return TaskMemory.model_construct(
        task_id=task.task_id, status=task.status, exit_state=task.exit_state,
        exit_reason=task.exit_reason, definition=task.definition,
        definition_hash=task.definition_hash, point_hash=task.point_hash,
        profile_hash=task.profile_hash, contract_hash=task.contract_hash,
        primary_metric=primary, primary_direction=direction,
        current_block=task.open_block,
        last_handoff=None if task.last_handoff is None else dict(task.last_handoff),
        next_block=_next_block(task), execution_record=blocks, baseline=baseline,
        best_so_far=best, accepted=task.accepted, rejected=task.rejected,
        tried=list(dict.fromkeys(b.config_digest for b in blocks if b.config_digest)),
        no_progress_streak=task.no_progress_streak,
        first_block_at=blocks[0].started_at if blocks else None,
        model_calls=task.model_calls, model_tokens_in=task.model_tokens_in,
        model_tokens_out=task.model_tokens_out, model_cost_usd=task.model_cost_usd,
        exits=task.exits, reopened_after=task.reopened_after, paused_s=paused, task=task)


def build_memory(events: Iterable[E.Event]) -> TaskMemory:
    """Fold the events with the task fold (`ledger.task`), then compute Task Memory."""
    return memory_of(fold(events))


def read_memory(ledger: Ledger, task_id: str, on_error: OnError = None
                ) -> tuple[TaskMemory, int]:
    """The task's memory and its stream's version (what a save appends after). An
    undecodable event raises, naming its position (a loop must not act on part of a
    history), or, given `on_error` (readers), is handed to it and left out."""
    task, version = read_task(ledger, task_id, on_error)
    return memory_of(task), version


def read_task(ledger: Ledger, task_id: str, on_error: OnError = None) -> tuple[Task, int]:
    """The task's folded stream (`ledger.task`) and its version, read as `read_memory`
    reads it, without the views Task Memory computes from it."""
    bad: list[Undecodable] = []
    records = ledger.stream(task_stream(task_id),
                            on_error=None if on_error is None else bad.append)
    if not records and not bad:
        raise NotFoundError(f"unknown task {shown(task_id)}{unknown_id_hint(task_id)} "
                            "(define it with forge task new FILE.yaml)")
    for u in bad:
        on_error(u)  # type: ignore[misc]
    version = max([r.version for r in records[-1:]] + [u.version for u in bad[-1:]])
    return fold(r.event for r in records), version


def task_memory(ledger: Ledger, task_id: str, on_error: OnError = None) -> TaskMemory:
    """`forge task memory`: the task's memory from its stream (see `read_memory`)."""
    return read_memory(ledger, task_id, on_error)[0]


# --- read queries over task streams: `forge task list`, `forge task show` ------------------


def list_tasks(ledger: Ledger, on_error: OnError = None) -> list[dict[str, Any]]:
    """Every task with its status. Undecodable events raise, or, given `on_error`, are
    handed to it and left out (a task whose definition is damaged is still listed)."""
    return [row for row, _version in task_rows(ledger, on_error)]


def task_rows(ledger: Ledger, on_error: OnError = None) -> list[tuple[dict[str, Any], int]]:
    """`list_tasks`' rows, each with the version of the task stream it was folded from
    (what projections/fast_reads.py keeps them under)."""
    ids = []
    # The task ids are the streams' names: no need to decode the definitions to list them.
    for _pos, stream, version, _topic, _state in ledger.rows(types=[E.TaskDefined.TYPE]):
        tid = task_of(stream)
        if tid is not None and version == 1:
            ids.append(tid)
    out = []
    for tid in ids:
        damaged: list[Undecodable] = []
        # The fold alone: the row needs none of Task Memory's views (nor the specs they load).
        t, version = read_task(ledger, tid, None if on_error is None else damaged.append)
        for u in damaged:
            on_error(u)  # type: ignore[misc]
        row = list_row(tid, t)
        if damaged:
            row["damaged_events"] = [u.position for u in damaged]
        out.append((row, version))
    return out


def list_row(task_id: str, t: Task) -> dict[str, Any]:
    """A task's row in `forge task list`, from its fold."""
    return {"task_id": task_id, "type": t.definition.get("type"),
            "status": t.status, "exit_state": t.exit_state,
            "blocks": len(t.blocks), "accepted": len(t.accepted),
            "rejected": len(t.rejected), "goal": t.definition.get("goal")}


def prior_tasks_of(definition: dict[str, Any]) -> list[str]:
    """The ids a task definition (as stored) names in `context.prior_tasks`."""
    context = definition.get("context") or {}
    return [str(t) for t in context.get("prior_tasks") or []]


def prior_brief(ledger: Ledger, task_id: str) -> dict[str, Any]:
    """What a successor reads of a prior task: its goal, exit (state, reason, handoff), last
    block handoff and best result. A task the ledger does not hold (a definition recorded
    before ids were checked) reads as status "unknown"; damaged events are left out."""
    try:
        mem, _ = read_memory(ledger, task_id, on_error=lambda u: None)
    except NotFoundError:
        return {"task_id": task_id, "status": "unknown"}
    return {"task_id": task_id, "goal": mem.definition.get("goal"), "status": mem.status,
            "exit_state": mem.exit_state, "exit_reason": mem.exit_reason,
            "exit_handoff": mem.task.exit_handoff, "last_handoff": mem.last_handoff,
            "primary_metric": mem.primary_metric, "baseline": mem.baseline,
            "best_so_far": mem.best_so_far,
            "accepted": [{"candidate": a.get("candidate"), "summary": a.get("summary")}
                         for a in mem.accepted]}


def task_summary(ledger: Ledger, task_id: str, on_error: OnError = None) -> dict[str, Any]:
    mem, version = read_memory(ledger, task_id, on_error)
    return {"task_id": task_id, "status": mem.status, "exit_state": mem.exit_state,
            "exit_reason": mem.exit_reason, "definition": mem.definition,
            "definition_hash": mem.definition_hash, "point_hash": mem.point_hash,
            "profile_hash": mem.profile_hash, "contract_hash": mem.contract_hash,
            "version": version,
            "blocks": [{"block_id": b.block_id, "sub_goal": b.sub_goal,
                        "candidate": b.candidate, "routing": b.routing, "status": b.status,
                        "measurements": len(b.measurements), "tool_calls": len(b.tool_calls),
                        "verdict": b.verdict,
                        "differs": b.verification["differs"] if b.verification else [],
                        "decision": b.decision,
                        "outcome": b.handoff["outcome"] if b.handoff else None}
                       for b in mem.execution_record],
            "best_so_far": mem.best_so_far,
            # which correctness gate judges it, and where it came from (`forge task show`,
            # the agents' `task_show`)
            "correctness": correctness_of(mem.definition),
            "prior_tasks": [prior_brief(ledger, t) for t in prior_tasks_of(mem.definition)]}
